"""An upgrade from the flat kvm_sriov/ layout: flat modules left behind
beside the new packages (a copy made by hand, say) are never imported."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the flat layout's module names (each now lives in a subpackage: vf/, ib/, domain/, ...)
FLAT_MODULES = ("sysfs", "discovery", "pool", "policy", "numa", "availability", "intents", "guid",
                "partitions", "opensm_check", "domain_xml", "hypervisor", "hotplug", "hpc_profile",
                "ivshmem", "ivshmem_region", "ivshmem_table", "ivshmem_host", "action_xml", "vm_template",
                "oned_defaults", "oned_conf", "versions", "monitor", "probe", "placement",
                "placement_program", "host", "reconcile", "doctor", "peer")


def test_stale_flat_modules_beside_the_packages_are_never_imported(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(ROOT / "kvm_sriov", lib / "kvm_sriov", ignore=shutil.ignore_patterns("__pycache__"))
    for old in FLAT_MODULES:  # e.g. kvm_sriov/pool.py beside kvm_sriov/vf/pool.py
        (lib / "kvm_sriov" / f"{old}.py").write_text("raise ImportError('a stale flat module was imported')\n")
    names = sorted(".".join(p.relative_to(lib).with_suffix("").parts).removesuffix(".__init__")
                   for p in (lib / "kvm_sriov").rglob("*.py") if p.stem not in FLAT_MODULES
                   or p.parent != lib / "kvm_sriov")
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "import kvm_sriov.ivshmem\n"
            "print(kvm_sriov.ivshmem.__file__)\n")
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": f"{lib}:{':'.join(p for p in sys.path if 'dist-packages' in p)}"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("kvm_sriov/ivshmem/__init__.py")


def test_rake_install_over_the_flat_layout_leaves_no_flat_module(tmp_path):
    from tests.support.install import rake_install
    if os.geteuid() != 0 or not shutil.which("rake"):
        pytest.skip("needs root and rake")
    remotes = tmp_path / "remotes"
    old = remotes / "vmm" / "kvm-sriov" / "lib" / "kvm_sriov"
    old.mkdir(parents=True)
    for name in FLAT_MODULES:  # what an install of the flat layout left
        (old / f"{name}.py").write_text("raise ImportError('stale')\n")
    done = rake_install(remotes)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in old.glob("*.py") if p.stem in FLAT_MODULES) == []
    assert (old / "vf" / "pool.py").is_file() and (old / "ivshmem" / "device.py").is_file()
