"""Rung 2: the installed action scripts, called the way OpenNebula calls
them, against a real libvirtd + QEMU (TCG) that this suite starts, next to
OpenNebula's own kvm scripts (from its source), run inside the simulated
host where kvmrc's qemu:///system is that host's libvirtd."""

import uuid as uuidlib
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.support.driver_env import domain_active, install_remotes, node_env, pool_rows, wait_for
from tests.support.fake_sysfs import standard_host
from simhost.opennebula_call import one_call
from tests.support.runnable import interface_macs, runnable_deployment

pytestmark = pytest.mark.libvirt

simhost = pytest.importorskip("simhost.libvirt_host")
from simhost.guest_image import ensure_guest_image  # noqa: E402


@pytest.fixture(scope="module")
def lvhost(tmp_path_factory):
    with simhost.LibvirtHost("h1", tmp_path_factory.mktemp("hosts")) as h:
        yield h


@pytest.fixture(scope="module")
def image():
    return ensure_guest_image()


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    """The host's /var/tmp/one as `onehost sync` leaves it: stock kvm and kvm-sriov."""
    return install_remotes(tmp_path_factory.mktemp("host1"))


@pytest.fixture
def driver(lvhost, remotes, tmp_path):
    """Configure the driver for this test and return a caller."""
    sysfs_root = Path("/")
    state = tmp_path / "state"

    def configure(sysfs=None, shutdown_seconds=60, pfs=()):
        root = sysfs or sysfs_root
        pf_list = ", ".join(f'"{p}"' for p in pfs)
        cfg = tmp_path / "kvm-sriov.toml"
        cfg.write_text(f"""
[pool]
pfs = [{pf_list}]
state_dir = "{state}"
[libvirt]
uri = "{lvhost.uri}"
[timeouts]
shutdown_seconds = {shutdown_seconds}
[sysfs]
root = "{root}"
""")
        return cfg

    cfg = {"path": configure()}

    def call(action, args, vmid=42, stdin="", local=False, driver="kvm-sriov"):
        env = node_env(remotes, KVM_SRIOV_CONFIG=str(cfg["path"]))
        return one_call(remotes, action, args, vmid, "host1", stdin, env=env, local=local,
                        wrapper=lvhost.nsenter(), driver=driver)

    def reconfigure(**kw):
        cfg["path"] = configure(**kw)

    call.configure = reconfigure
    call.pool_db = state / "pool.sqlite3"
    call.dep = lambda vmid=42: str(tmp_path / "datastores" / "0" / str(vmid) / "deployment.0")
    yield call
    conn = lvhost.open()
    for d in conn.listAllDomains():
        if d.isActive():
            d.destroy()
    conn.close()


def new_vm(tmp_path, image, vmid=42, **kw):
    uuid = str(uuidlib.uuid4())
    serial = tmp_path / f"serial-{vmid}.log"
    return uuid, serial, runnable_deployment(f"one-{vmid}", uuid, serial, image, **kw)


def boots(serial):
    return serial.read_text(errors="replace").count("simhost-guest: up") if serial.exists() else 0


def test_deploy_plain_vm_then_acpi_shutdown(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    r = driver("deploy", [driver.dep(), "host1"], stdin=xml)
    assert (r.code, r.stdout) == (0, uuid + "\n"), r.stderr
    assert domain_active(lvhost.uri, uuid)
    assert open(driver.dep()).read().strip() == xml.strip()  # written on the host, as the stock deploy does
    live = lvhost.open().lookupByUUIDString(uuid).XMLDesc(0)
    assert interface_macs(live, "user") == ["02:00:0a:00:00:2a"]   # other NIC untouched
    assert wait_for(lambda: boots(serial) == 1, 90), "guest never booted"

    r = driver("shutdown", [uuid, "host1"], stdin=(FIXTURES / "opennebula/action-shutdown.xml").read_text())
    assert r.code == 0, r.stderr
    assert not domain_active(lvhost.uri, uuid)
    assert "powering off" in serial.read_text()


def test_a_vm_without_vfs_gets_the_stock_driver_byte_for_byte(driver, lvhost, image, tmp_path):
    """Same calls through vmm/kvm and vmm/kvm-sriov: same stdout, stderr, exit code."""
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    gone = str(uuidlib.uuid4())
    calls = [("deploy", [driver.dep(), "host1"], xml),
             ("reboot", [uuid, "host1"], ""),
             ("exec", [uuid, "host1"], (FIXTURES / "opennebula/action-reboot.xml").read_text()),
             ("cancel", [uuid, "host1"], (FIXTURES / "opennebula/action-cancel.xml").read_text()),
             ("shutdown", [gone, "host1"], ""),
             ("reboot", [gone, "host1"], "")]
    results = {}
    for drv in ("kvm", "kvm-sriov"):
        results[drv] = [driver(action, args, stdin=data, driver=drv) for action, args, data in calls]
        assert not domain_active(lvhost.uri, uuid)
    for (action, _, _), stock, ours in zip(calls, results["kvm"], results["kvm-sriov"]):
        assert (ours.code, ours.stdout, ours.stderr) == (stock.code, stock.stdout, stock.stderr), action
    assert results["kvm"][0].code == 0 and results["kvm"][-1].code != 0
    assert pool_rows(driver.pool_db.parent) == []


def test_reboot_and_reset_restart_the_guest(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    assert driver("deploy", [driver.dep(), "host1"], stdin=xml).code == 0
    assert wait_for(lambda: boots(serial) == 1, 90)
    action = (FIXTURES / "opennebula/action-reboot.xml").read_text()
    r = driver("reboot", [uuid, "host1"], stdin=action)
    assert r.code == 0, r.stderr
    assert wait_for(lambda: boots(serial) == 2, 90), "ACPI reboot did not restart the guest"
    assert domain_active(lvhost.uri, uuid)
    r = driver("reset", [uuid, "host1"], stdin=(FIXTURES / "opennebula/action-reset.xml").read_text())
    assert r.code == 0, r.stderr
    assert wait_for(lambda: boots(serial) == 3, 90), "reset did not restart the guest"
    assert driver("cancel", [uuid, "host1"]).code == 0
    assert not domain_active(lvhost.uri, uuid)


@pytest.fixture
def short_shutdown_timeout(remotes):
    """The operator's kvmrc: SHUTDOWN_TIMEOUT down from 180 s (FORCE_DESTROY=yes stays)."""
    kvmrc = remotes / "etc" / "vmm" / "kvm" / "kvmrc"
    before = kvmrc.read_text()
    kvmrc.write_text(before.replace("SHUTDOWN_TIMEOUT=180", "SHUTDOWN_TIMEOUT=4"))
    yield
    kvmrc.write_text(before)


def test_shutdown_of_a_guest_ignoring_acpi_is_forced_per_kvmrc(driver, lvhost, tmp_path, short_shutdown_timeout):
    uuid, serial, xml = new_vm(tmp_path, None, ib_nics=0)   # no OS: ACPI is ignored
    assert driver("deploy", [driver.dep(), "host1"], stdin=xml).code == 0
    r = driver("shutdown", [uuid, "host1"])
    assert r.code == 0, r.stderr
    assert "Timeout shutting down" in r.stderr and "Destroying it" in r.stderr
    assert not domain_active(lvhost.uri, uuid)


def test_exhausted_pool_fails_deploy_and_leaves_no_domain(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=1)
    r = driver("deploy", [driver.dep(), "host1"], stdin=xml)   # this machine has no SR-IOV PF
    assert r.code != 0
    assert "not enough free SR-IOV VFs" in r.reason and r.stdout == ""
    assert not domain_active(lvhost.uri, uuid)
    assert pool_rows(driver.pool_db.parent) == []


def test_libvirt_refusal_releases_the_vfs(driver, lvhost, image, tmp_path):
    """The fake VF does not exist for the real libvirt: the stock deploy
    cannot start the domain, and the driver must give the VFs back."""
    standard_host(tmp_path / "fake")
    driver.configure(sysfs=tmp_path / "fake")
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=2)
    r = driver("deploy", [driver.dep(), "host1"], stdin=xml)
    assert r.code != 0 and r.stdout == ""
    assert "Could not create domain" in r.reason
    assert "<hostdev" in open(driver.dep()).read()  # what the stock deploy was given
    assert not domain_active(lvhost.uri, uuid)
    assert pool_rows(driver.pool_db.parent) == []


def test_cancel_and_shutdown_of_gone_domain_succeed(driver, lvhost):
    gone = str(uuidlib.uuid4())
    for action in ("cancel", "shutdown"):
        r = driver(action, [gone, "host1"])
        assert r.code == 0, r.stderr


def test_reboot_of_gone_domain_fails(driver):
    r = driver("reboot", [str(uuidlib.uuid4()), "host1"])
    assert r.code != 0


def test_base64_stdin_of_local_actions(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    r = driver("deploy", [driver.dep(), "host1"], stdin=xml)
    assert r.code == 0 and r.stdout.strip() == uuid, r.stderr
    assert driver("cancel", [uuid, "host1"], local=True).code == 0
    assert not domain_active(lvhost.uri, uuid)
