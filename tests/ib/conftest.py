import shutil
from pathlib import Path

import pytest

from kvm_sriov import config
from tests.support.fake_sysfs import standard_host

SUPPORT = Path(__file__).resolve().parent.parent / "support"


@pytest.fixture
def fake_host(tmp_path):
    info = standard_host(tmp_path / "root")
    info["root"] = tmp_path / "root"
    return info


@pytest.fixture
def fake_ip(tmp_path):
    """A copy of tests/support/fake_ip (a real executable) with its own state."""
    d = tmp_path / "fake-ip"
    d.mkdir()
    shutil.copy(SUPPORT / "fake_ip", d / "ip")
    return d


@pytest.fixture
def make_config(tmp_path):
    def make(root, state="state", **sections):
        sections.setdefault("sysfs", {})["root"] = str(root)
        sections.setdefault("pool", {}).setdefault("state_dir", str(tmp_path / state))
        return config.load(files=[], overrides=sections)
    return make
