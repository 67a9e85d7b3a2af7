"""Rung 2: the installed action scripts, called the way OpenNebula calls
them, against a real libvirtd + QEMU (TCG) that this suite starts."""

import os
import subprocess
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO
from tests.support.driver_env import domain_active, pool_rows, wait_for
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
    """`rake install` into a host's /var/tmp/one, as `onehost sync` leaves it."""
    dest = tmp_path_factory.mktemp("host1") / "var" / "tmp" / "one"
    subprocess.run(["rake", "install", f"REMOTES={dest}"], cwd=REPO, check=True,
                   capture_output=True)
    return dest


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

    def call(action, args, vmid=42, stdin="", local=False):
        env = dict(os.environ, KVM_SRIOV_CONFIG=str(cfg["path"]))
        return one_call(remotes, action, args, vmid, "host1", stdin, env=env, local=local)

    def reconfigure(**kw):
        cfg["path"] = configure(**kw)

    call.configure = reconfigure
    call.pool_db = state / "pool.sqlite3"
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
    r = driver("deploy", ["/var/lib/one//datastores/0/42/deployment.0", "host1"], stdin=xml)
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == uuid
    assert domain_active(lvhost.uri, uuid)
    live = lvhost.open().lookupByUUIDString(uuid).XMLDesc(0)
    assert interface_macs(live, "user") == ["02:00:0a:00:00:2a"]   # other NIC untouched
    assert wait_for(lambda: boots(serial) == 1, 90), "guest never booted"

    r = driver("shutdown", [uuid, "host1"], stdin=(FIXTURES / "opennebula/action-shutdown.xml").read_text())
    assert r.code == 0, r.stderr
    assert not domain_active(lvhost.uri, uuid)
    assert "powering off" in serial.read_text()


def test_reboot_and_reset_restart_the_guest(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    assert driver("deploy", ["f", "host1"], stdin=xml).code == 0
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


def test_shutdown_timeout_fails_clearly_then_cancel(driver, lvhost, tmp_path):
    driver.configure(shutdown_seconds=3)
    uuid, serial, xml = new_vm(tmp_path, None, ib_nics=0)   # no OS: ACPI is ignored
    assert driver("deploy", ["f", "host1"], stdin=xml).code == 0
    r = driver("shutdown", [uuid, "host1"])
    assert r.code != 0
    assert "did not power off within 3s" in r.reason
    assert domain_active(lvhost.uri, uuid)
    r = driver("cancel", [uuid, "host1"], local=True,
               stdin=(FIXTURES / "opennebula/action-cancel.xml").read_text())
    assert r.code == 0, r.stderr
    assert not domain_active(lvhost.uri, uuid)


def test_exhausted_pool_fails_deploy_and_leaves_no_domain(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=1)
    r = driver("deploy", ["f", "host1"], stdin=xml)   # this machine has no SR-IOV PF
    assert r.code != 0
    assert "not enough free SR-IOV VFs" in r.reason and r.stdout == ""
    assert not domain_active(lvhost.uri, uuid)
    assert pool_rows(driver.pool_db.parent) == []


def test_libvirt_refusal_releases_the_vfs(driver, lvhost, image, tmp_path):
    """The fake VF does not exist for the real libvirt: it refuses to start
    the domain, and the driver must give the VF back and leave nothing."""
    standard_host(tmp_path / "fake")
    driver.configure(sysfs=tmp_path / "fake")
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=2)
    r = driver("deploy", ["f", "host1"], stdin=xml)
    assert r.code != 0
    assert "libvirt could not start the domain" in r.reason
    assert not domain_active(lvhost.uri, uuid)
    assert pool_rows(driver.pool_db.parent) == []


def test_cancel_and_shutdown_of_gone_domain_succeed(driver, lvhost):
    gone = str(uuidlib.uuid4())
    for action in ("cancel", "shutdown"):
        r = driver(action, [gone, "host1"])
        assert r.code == 0, r.stderr
        assert "is not running" in r.stderr


def test_reboot_of_gone_domain_fails(driver):
    r = driver("reboot", [str(uuidlib.uuid4()), "host1"])
    assert r.code != 0 and "is not running" in r.reason


def test_base64_stdin_of_local_actions(driver, lvhost, image, tmp_path):
    uuid, serial, xml = new_vm(tmp_path, image, ib_nics=0)
    r = driver("deploy", ["f", "host1"], stdin=xml, local=True)
    assert r.code == 0 and r.stdout.strip() == uuid, r.stderr
    assert driver("cancel", [uuid, "host1"], local=True).code == 0
