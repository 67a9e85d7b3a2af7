"""Rung 1: actions of VMs with a shared-memory region (KVM_SRIOV_IVSHMEM),
in-process against libvirt's test driver with the stock-script stand-ins,
/dev/shm stood for by a temporary folder. What a guest writes into the
region and what another local account puts into /dev/shm is hostile: it
must never leave a VF assigned, block another VM or reconcile."""

import io
import os
import struct

import pytest

from kvm_sriov.ivshmem import region as ivshmem_region, table as ivshmem_table
from kvm_sriov.actions import main
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from tests.support.stock_standin import StockOnTestDriver
from tests.support.actions_in_process import deployment

REGION = "kvm-sriov-ivshmem-u0-g7"   # the deployment fixture's owner is uid 0


def vm_xml(vmid, group=7, size=4):
    nic = (f"<NIC><NIC_ID>0</NIC_ID><BRIDGE>ib-sriov</BRIDGE><MAC>02:00:0a:64:00:{vmid:02x}</MAC>"
           f"<NETWORK_ID>5</NETWORK_ID></NIC>")   # as oned writes it: the NIC's network named
    return (f"<VM><ID>{vmid}</ID><UID>0</UID><TEMPLATE><VMGROUP><ROLE>ranks</ROLE>"
            f"<VMGROUP_ID>{group}</VMGROUP_ID></VMGROUP>{nic}</TEMPLATE><USER_TEMPLATE>"
            f"<KVM_SRIOV_IVSHMEM><SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>")


def uuid(vmid):
    return f"00000000-0000-0000-0000-{vmid:012d}"


@pytest.fixture
def shm(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir(mode=0o1777)
    monkeypatch.setattr(ivshmem_region, "SHM_DIR", d)
    return d


@pytest.fixture
def vm(fake_host, make_config, conn, capsys, monkeypatch, tmp_path, shm):
    """vm(id).deploy(), .cancel(), ...; vm.host() for a Host of its own."""
    overrides = {}
    stock = StockOnTestDriver(conn).install(monkeypatch)

    def host():
        cfg = make_config(fake_host["root"], **overrides)
        return Host(cfg, Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")

    def run(action, *argv, stdin=""):
        code = main(action, list(argv), stdin=io.StringIO(stdin), host=host())
        out, err = capsys.readouterr()
        return code, out, err

    class Vm:
        def __init__(self, vmid, nics=1, **request):
            self.vmid = vmid
            self.dep = tmp_path / "datastores" / "0" / str(vmid) / "deployment.0"
            self.dep.parent.mkdir(parents=True, exist_ok=True)
            (self.dep.parent / "vm.xml").write_text(vm_xml(vmid, **request))
            self.xml = deployment(nics=nics, name=f"one-{vmid}", uuid=uuid(vmid)).replace(
                "02:00:0a:64:00:2a", f"02:00:0a:64:00:{vmid:02x}")  # a MAC (so a GUID) of its own

        def deploy(self):
            return run("deploy", str(self.dep), "h", str(self.vmid), "h", stdin=self.xml)

        def __call__(self, action, *extra):
            return run(action, uuid(self.vmid), *extra, "h", str(self.vmid), "h")

    Vm.host = staticmethod(host)
    Vm.overrides = overrides
    Vm.stock = stock
    Vm.pool = staticmethod(lambda: [(a.vf, a.vm_id, a.state) for a in host().pool.assignments()])
    Vm.guids = staticmethod(lambda: host().guid_records())
    return Vm


def tables(host):
    with host.pool.transaction() as txn:
        return ivshmem_table.regions(txn.db), [(u.vm_id, u.region) for u in ivshmem_table.users(txn.db)]


def header(shm, name=REGION):
    return ivshmem_region.read_header((shm / name).read_bytes()[:ivshmem_region.HEADER_BYTES])


def poison(shm, name=REGION):
    """What any guest of the group can do: its BAR2 is the whole region."""
    with open(shm / name, "r+b") as f:
        f.write(b"KSRIVSHM" + struct.pack("<IIII", 0xFFFFFFFF, 0xFFFFFFFD, 7, 0xFFFFFFFF))


def test_a_poisoned_header_never_fails_a_stop_and_the_vf_is_freed(vm, shm, conn):
    guids = vm.guids()
    a, b = vm(42), vm(43)
    assert a.deploy()[0] == 0 and b.deploy()[0] == 0
    assert header(shm)["vms"] == [42, 43]
    poison(shm)
    code, _, err = a("cancel")
    assert code == 0, err
    assert [vm_id for _, vm_id, _ in vm.pool()] == [43]
    assert header(shm)["vms"] == [43] and header(shm)["generation"] % 2 == 0
    # other VMs' joins and reconcile are not blocked by it
    poison(shm)
    c = vm(44, group=7)
    code, _, err = c.deploy()
    assert code == 0, err
    assert header(shm)["vms"] == [43, 44]
    vm.host().reconcile()
    for v in (b, c):
        assert v("cancel")[0] == 0
    assert vm.pool() == [] and vm.guids() == guids
    assert tables(vm.host()) == ({}, []) and not (shm / REGION).exists()


def test_a_region_error_at_a_stop_is_logged_after_the_vfs_are_freed(vm, shm, monkeypatch):
    guids = vm.guids()
    a = vm(42)
    assert a.deploy()[0] == 0

    def broken(*args, **kw):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(ivshmem_table, "drop_user", broken)
    code, _, err = a("cancel")
    assert code == 0, err
    assert "could not leave its region" in err
    assert vm.pool() == [] and vm.guids() == guids        # VF free, GUID back
    monkeypatch.undo()
    monkeypatch.setattr(ivshmem_region, "SHM_DIR", shm)
    vm.host().reconcile()                                 # settles the region
    assert tables(vm.host()) == ({}, []) and not (shm / REGION).exists()


def test_save_of_a_poisoned_region_succeeds_once_the_stock_save_did(vm, shm, monkeypatch, tmp_path):
    from kvm_sriov.ivshmem import host as ivshmem_host
    monkeypatch.setattr(ivshmem_host, "unplug", lambda *a, **kw: None)  # the test driver cannot hot-plug
    a, b = vm(42, nics=0), vm(43, nics=0)
    assert a.deploy()[0] == 0 and b.deploy()[0] == 0
    poison(shm)
    code, _, err = a("save", str(a.dep.parent / "checkpoint"))
    assert code == 0, err
    assert (a.dep.parent / "checkpoint").exists()
    assert tables(vm.host())[1] == [(43, REGION)] and header(shm)["vms"] == [43]


def test_a_foreign_region_file_refuses_only_its_group(vm, shm, conn):
    foreign = shm / "kvm-sriov-ivshmem-u0-g8"
    foreign.write_text("someone else's")
    os.chown(foreign, 54321, 54321)
    guids = vm.guids()
    code, out, err = vm(42, group=8).deploy()
    assert code != 0 and out == "" and "not made by this driver" in err and "Traceback" not in err
    assert foreign.read_text() == "someone else's"         # left alone
    assert vm.pool() == [] and vm.guids() == guids and tables(vm.host()) == ({}, [])
    assert "one-42" not in [d.name() for d in conn.listAllDomains() if d.isActive()]
    # another group deploys, reconcile runs, after any grace
    vm.overrides["pool"] = {"reservation_grace_seconds": 0}
    b = vm(43, group=7)
    assert b.deploy()[0] == 0
    vm.host().reconcile()
    assert b("cancel")[0] == 0 and tables(vm.host()) == ({}, []) and foreign.exists()


def test_a_size_above_the_hosts_cap_is_refused_before_anything_is_taken(vm, shm, conn):
    vm.overrides["ivshmem"] = {"max_region_mb": 8}
    code, out, err = vm(42, size=16).deploy()
    assert code != 0 and "above this host's limit of 8 MB per region" in err
    assert vm.stock.calls == [] and vm.pool() == [] and list(shm.iterdir()) == []
    vm.overrides["ivshmem"] = {"max_region_mb": 8, "max_host_mb": 12, "max_owner_mb": 12}
    assert vm(43, size=8).deploy()[0] == 0
    code, out, err = vm(44, size=8, group=9).deploy()   # a second region: 16 MB > 12
    assert code != 0 and "8 of 12 MB in use" in err
    assert [v for _, v, _ in vm.pool()] == [43] and sorted(p.name for p in shm.iterdir()) == [REGION]
    assert vm(45, size=8).deploy()[0] == 0              # joining the existing region costs nothing


def test_a_failed_reservation_is_a_clear_refusal_with_nothing_left(vm, shm, conn, monkeypatch):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    guids = vm.guids()
    code, out, err = vm(42).deploy()
    assert code != 0 and "cannot reserve 4 MB" in err and "No space left" in err
    assert vm.stock.calls == [] and vm.pool() == [] and vm.guids() == guids
    assert list(shm.iterdir()) == [] and tables(vm.host()) == ({}, [])


def test_the_region_is_reserved_at_the_join(vm, shm):
    assert vm(42).deploy()[0] == 0
    st = (shm / REGION).stat()
    assert st.st_size == 4 << 20 and st.st_blocks * 512 >= 4 << 20   # not sparse


def test_reconcile_adopts_only_domains_our_record_names(vm, shm, conn):
    from xml.etree import ElementTree as ET
    from kvm_sriov.ivshmem import device as ivshmem
    root = ET.fromstring(deployment(nics=0, name="one-50", uuid=uuid(50)))
    ivshmem.add_device(root, ivshmem.Request(0, 7, 4))
    root.find("metadata").remove(root.find(f"metadata/{{{ivshmem.METADATA_NS}}}ivshmem"))
    conn.createXML(ET.tostring(root, encoding="unicode"), 0)   # a device, but no record of ours
    vm.host().reconcile()
    assert tables(vm.host()) == ({}, [])
