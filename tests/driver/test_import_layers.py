"""The library's imports run one way (dev-tools/check_imports.py, in ./dev lint)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "dev-tools" / "check_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / "kvm_sriov" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "kvm_sriov"


def test_an_upward_import_and_a_circle_are_both_reported(tmp_path):
    package = _tree(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "actions/__init__.py": "from ..vf import pool\n",
        "vf/__init__.py": "",
        # upward, and inside a function
        "vf/pool.py": "def f():\n    from ..actions import lifecycle\n",
        "actions/lifecycle.py": "from ..errors import DriverError\n",
        # a circle inside one package
        "ib/__init__.py": "",
        "ib/guid.py": "from . import partitions\n",
        "ib/partitions.py": "from .guid import program\n",
    })
    offences = _checker().check(package)
    upward = [o for o in offences if "upward import" in o]
    circles = [o for o in offences if o.startswith("circle:")]
    assert len(upward) == 1 and "vf/pool.py:2" in upward[0] and "kvm_sriov.actions.lifecycle" in upward[0]
    assert circles == ["circle: kvm_sriov.ib.guid -> kvm_sriov.ib.partitions -> kvm_sriov.ib.guid"]
    assert len(offences) == 2


def test_a_package_not_in_the_layer_order_is_reported(tmp_path):
    package = _tree(tmp_path, {"__init__.py": "", "errors.py": "", "extra/__init__.py": "from .. import errors\n"})
    [offence] = _checker().check(package)
    assert "extra is not in the layer order" in offence


def test_the_library_imports_run_one_way():
    assert _checker().check(ROOT / "kvm_sriov") == []
