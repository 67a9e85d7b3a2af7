"""Rung 2: shared memory between co-resident VMs (ivshmem-plain) through the
installed action scripts, as OpenNebula calls them, on a real libvirtd +
QEMU (TCG) next to OpenNebula's own kvm scripts. vm.xml is written next to
the deployment file, as oned does before every deploy."""

import os
import struct
import subprocess
import uuid as uuidlib
from pathlib import Path

import pytest

from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region, table as ivshmem_table
from tests.conftest import REPO
from tests.support.driver_env import domain_active, wait_for
from tests.support.runnable import runnable_deployment
from tests.ivshmem.guest import PATTERN, has_read, reads, writes

pytestmark = pytest.mark.libvirt

SHM = ivshmem_region.SHM_DIR


@pytest.fixture(scope="module")
def image():
    from tests.ivshmem.guest import ensure_ivshmem_guest
    return ensure_ivshmem_guest()


@pytest.fixture(autouse=True)
def no_regions_left(driver):
    """Every test starts and ends with no region of ours in /dev/shm."""
    for f in SHM.glob(f"{ivshmem.PREFIX}-*"):
        f.unlink()
    yield
    leftovers = sorted(f.name for f in SHM.glob(f"{ivshmem.PREFIX}-*"))
    for f in SHM.glob(f"{ivshmem.PREFIX}-*"):
        f.unlink()
    assert leftovers == [], "regions left in /dev/shm"


def vm_xml(vmid, uid=0, group="7", size="4"):
    attr = "" if size is None else f"<KVM_SRIOV_IVSHMEM><SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM>"
    grp = "" if group is None else f"<VMGROUP><ROLE>ranks</ROLE><VMGROUP_ID>{group}</VMGROUP_ID></VMGROUP>"
    return (f"<VM><ID>{vmid}</ID><UID>{uid}</UID><TEMPLATE>{grp}</TEMPLATE>"
            f"<USER_TEMPLATE>{attr}</USER_TEMPLATE></VM>")


class Vm:
    def __init__(self, driver, tmp_path, image, vmid, uid=0, probe="", **request):
        self.driver, self.vmid = driver, vmid
        self.uuid = str(uuidlib.uuid4())
        self.serial = tmp_path / f"serial-{vmid}.log"
        cmdline = f"console=ttyS0 panic=-1 quiet no_timer_check {probe}".strip()
        xml = runnable_deployment(f"one-{vmid}", self.uuid, self.serial, image, ib_nics=0, cmdline=cmdline)
        self.deployment = xml.replace("<one:uid>0</one:uid>", f"<one:uid>{uid}</one:uid>")
        self.dep = Path(driver.dep(vmid))
        self.dep.parent.mkdir(parents=True, exist_ok=True)
        (self.dep.parent / "vm.xml").write_text(vm_xml(vmid, uid, **request))

    def __call__(self, action, *args, **kw):
        return self.driver(action, list(args) + ["host1"], vmid=self.vmid, **kw)

    def deploy(self, **kw):
        return self("deploy", str(self.dep), stdin=self.deployment, **kw)

    def console(self):
        return self.serial.read_text(errors="replace") if self.serial.exists() else ""


def live_shmem(lvhost, vm):
    from kvm_sriov.domain import domain_xml
    dom = lvhost.open().lookupByUUIDString(vm.uuid)
    return ivshmem.live_regions(domain_xml.parse(dom.XMLDesc(0)))


def header(name):
    return ivshmem_region.read_header((SHM / name).read_bytes()[:ivshmem_region.HEADER_BYTES])


def tables(driver):
    import sqlite3
    if not driver.pool_db.exists():
        return {}, []
    with sqlite3.connect(driver.pool_db) as db:
        return ivshmem_table.regions(db), [(u.vm_id, u.region, u.state) for u in ivshmem_table.users(db)]


def test_a_group_shares_one_region_another_owner_gets_its_own_and_the_last_user_removes_it(
        driver, lvhost, image, tmp_path):
    a = Vm(driver, tmp_path, image, 51, probe=writes())
    b = Vm(driver, tmp_path, image, 52, probe=reads())
    other = Vm(driver, tmp_path, image, 53, uid=5)
    for vm in (a, b, other):
        r = vm.deploy()
        assert (r.code, r.stdout) == (0, vm.uuid + "\n"), r.stderr
    ours, theirs = "kvm-sriov-ivshmem-u0-g7", "kvm-sriov-ivshmem-u5-g7"
    assert live_shmem(lvhost, a) == live_shmem(lvhost, b) == [ours]
    assert live_shmem(lvhost, other) == [theirs]
    assert header(ours)["vms"] == [51, 52] and header(theirs)["vms"] == [53]
    assert (SHM / ours).stat().st_size == 4 << 20
    # one guest writes, the other reads it, through the region
    assert wait_for(lambda: has_read(b.console()), 150), b.console()[-2000:]
    assert "ivshmem-guest: header magic 0x4952534B" in b.console()
    data = (SHM / ours).read_bytes()[ivshmem_region.HEADER_BYTES:ivshmem_region.HEADER_BYTES + 4]
    assert struct.unpack("<I", data)[0] == PATTERN
    assert (SHM / theirs).read_bytes()[ivshmem_region.HEADER_BYTES:ivshmem_region.HEADER_BYTES + 4] == b"\0" * 4

    assert a("cancel", a.uuid).code == 0
    assert (SHM / ours).exists() and header(ours)["vms"] == [52]   # b still uses it
    r = b("shutdown", b.uuid)
    assert r.code == 0, r.stderr
    assert not (SHM / ours).exists()
    assert other("cancel", other.uuid).code == 0 and not (SHM / theirs).exists()
    assert tables(driver) == ({}, [])


@pytest.mark.parametrize("request_, why", [
    ({"size": "0"}, "power of two"), ({"size": "131072"}, "power of two"),
    ({"size": "3"}, "power of two"), ({"size": "lots"}, "whole number of MB"),
    ({"group": None}, "in no VM group")])
def test_a_bad_request_fails_clearly_and_changes_nothing(driver, lvhost, image, tmp_path, request_, why):
    vm = Vm(driver, tmp_path, image, 54, **request_)
    r = vm.deploy()
    assert r.code != 0 and r.stdout == "" and why in r.reason, r.stderr
    assert not domain_active(lvhost.uri, vm.uuid)
    assert not vm.dep.exists()   # the stock deploy never ran
    assert tables(driver) == ({}, [])


def reconcile(driver):
    env = dict(os.environ, KVM_SRIOV_CONFIG=str(driver.pool_db.parent.parent / "kvm-sriov.toml"))
    p = subprocess.run(["/usr/bin/python3", "-m", "kvm_sriov.cli", "reconcile"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def consistent(driver, lvhost):
    """No region without a user, none missing: the tables, libvirt and /dev/shm agree."""
    regions, users = tables(driver)
    from kvm_sriov.domain import domain_xml
    conn = lvhost.open()
    live = {}
    for dom in conn.listAllDomains():
        if dom.isActive():
            live[dom.name()] = ivshmem.live_regions(domain_xml.parse(dom.XMLDesc(0)))
    files = sorted(f.name for f in SHM.glob(f"{ivshmem.PREFIX}-*"))
    used = sorted({n for names in live.values() for n in names})
    assert sorted(regions) == files == used, (regions, files, live)
    assert sorted((f"one-{vm}", name) for vm, name, state in users) == sorted(
        (d, n) for d, names in live.items() for n in names)
    assert all(state == "attached" for *_, state in users)
    for name in regions:
        assert header(name)["vms"] == sorted(vm for vm, n, _ in users if n == name)


@pytest.mark.parametrize("kill_at", ["deploy:begin", "deploy:ivshmem-joined", "deploy:created",
                                     "cancel:begin", "cancel:stopped"])
def test_kill_9_at_each_step_then_reconcile_converges(driver, lvhost, image, tmp_path, monkeypatch, kill_at):
    peer = Vm(driver, tmp_path, image, 61)
    vm = Vm(driver, tmp_path, image, 62)
    assert peer.deploy().code == 0
    action = kill_at.split(":")[0]
    if action == "cancel":
        assert vm.deploy().code == 0
    monkeypatch.setenv("KVM_SRIOV_KILL_AT", kill_at)
    r = vm.deploy() if action == "deploy" else vm("cancel", vm.uuid)
    assert r.code != 0
    monkeypatch.delenv("KVM_SRIOV_KILL_AT")
    reconcile(driver)
    consistent(driver, lvhost)
    assert header("kvm-sriov-ivshmem-u0-g7")["vms"][0] == 61   # the peer's region stayed
    # the last user killed while stopping: reconcile removes the region
    for v in (vm, peer):
        if domain_active(lvhost.uri, v.uuid):
            monkeypatch.setenv("KVM_SRIOV_KILL_AT", "cancel:stopped")
            assert v("cancel", v.uuid).code != 0
            monkeypatch.delenv("KVM_SRIOV_KILL_AT")
    reconcile(driver)
    consistent(driver, lvhost)
    assert tables(driver) == ({}, [])


def test_save_and_restore_leave_and_rejoin_the_region(driver, lvhost, image, tmp_path):
    a = Vm(driver, tmp_path, image, 71)
    b = Vm(driver, tmp_path, image, 72)
    for vm in (a, b):
        assert vm.deploy().code == 0
    name = "kvm-sriov-ivshmem-u0-g7"
    assert wait_for(lambda: "simhost-guest: up" in a.console(), 120)
    ckpt = a.dep.parent / "checkpoint"
    r = a("save", a.uuid, str(ckpt))
    assert r.code == 0, r.stderr
    assert not domain_active(lvhost.uri, a.uuid) and ckpt.exists()
    assert header(name)["vms"] == [72]
    r = a("restore", str(ckpt), a.uuid)
    assert r.code == 0, r.stderr
    assert live_shmem(lvhost, a) == [name] and header(name)["vms"] == [71, 72]
    consistent(driver, lvhost)
    for vm in (a, b):
        assert vm("cancel", vm.uuid).code == 0
    assert not (SHM / name).exists() and tables(driver) == ({}, [])
