import pytest

from kvm_sriov import config
from tests.support.fake_sysfs import standard_host


@pytest.fixture
def fake_host(tmp_path):
    info = standard_host(tmp_path / "root")
    info["root"] = tmp_path / "root"
    return info


@pytest.fixture
def make_config(tmp_path):
    def make(root, **sections):
        sections.setdefault("sysfs", {})["root"] = str(root)
        sections.setdefault("pool", {}).setdefault("state_dir", str(tmp_path / "state"))
        return config.load(files=[], overrides=sections)
    return make
