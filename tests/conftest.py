import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Copies of ../shared/fixtures (real OpenNebula 7.4 inputs), so a clone is self-contained.
FIXTURES = REPO / "tests" / "fixtures"


# -- fixtures shared by the driver and InfiniBand suites ----------------------
import pytest  # noqa: E402


@pytest.fixture
def fake_host(tmp_path):
    """The rung-1 reference host (tests/support/fake_sysfs.standard_host)."""
    from tests.support.fake_sysfs import standard_host
    info = standard_host(tmp_path / "root")
    info["root"] = tmp_path / "root"
    return info


@pytest.fixture
def make_config(tmp_path):
    """Config for a fake sysfs root; the pool lives in tmp_path/<state>."""
    from kvm_sriov import config

    def make(root, state="state", **sections):
        sections.setdefault("sysfs", {})["root"] = str(root)
        sections.setdefault("pool", {}).setdefault("state_dir", str(tmp_path / state))
        return config.load(files=[], overrides=sections)
    return make


@pytest.fixture
def conn():
    """libvirt's own test driver, in-process; domains are destroyed after."""
    import libvirt
    c = libvirt.open("test:///default")
    yield c
    for d in c.listAllDomains():
        if d.name() != "test" and d.isActive():
            d.destroy()
