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


@pytest.fixture
def run(fake_host, make_config, conn, capsys, monkeypatch, tmp_path):
    """run(action, *argv, stdin=""): an action in-process against libvirt's test
    driver on the fake host, with stand-ins for OpenNebula's kvm scripts
    (tests/support/stock_standin.py) -> (exit code, stdout, stderr)."""
    import io

    from kvm_sriov.actions import main
    from kvm_sriov.domain.hypervisor import Hypervisor
    from kvm_sriov.node.host import Host
    from tests.support.stock_standin import StockOnTestDriver

    cfg = make_config(fake_host["root"])
    stock = StockOnTestDriver(conn).install(monkeypatch)

    def run(action, *argv, stdin=""):
        host = Host(cfg, Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")
        code = main(action, list(argv), stdin=io.StringIO(stdin), host=host)
        out, err = capsys.readouterr()
        return code, out, err

    def configure(**changes):
        """Change the config of the actions from here on (e.g. whole_pfs=True)."""
        nonlocal cfg
        cfg = cfg._replace(**changes)

    run.configure = configure
    run.host = lambda: Host(cfg, Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")
    run.pool = lambda: [(a.vf, a.vm_id, a.state) for a in Host(cfg).pool.assignments()]
    run.stock = stock
    run.dep = lambda vm=42: str(tmp_path / "datastores" / "0" / str(vm) / "deployment.0")
    run.guids = lambda: Host(cfg).guid_records()
    return run
