"""Rung 1: this host's PFs passed through whole (node/whole_pfs.py through
Host): reserved with their VFs switched off, given back with them switched
on, every failure unwound, reconcile finishing what a dead action left; on
the fake sysfs whose kernel makes VFs appear and disappear, and libvirt's
test driver."""

import pytest

from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.errors import DriverError, PoolExhausted
from kvm_sriov.node.host import Host
from kvm_sriov.vf import whole_pf
from kvm_sriov.vf.policy import VfRequest
from kvm_sriov.vf.sysfs import Sysfs

PF = "0000:03:00.0"
MAC = "02:00:0a:64:00:2a"


@pytest.fixture
def host(fake_host, make_config, monkeypatch, conn):
    """The reference host with its mlx5 PF 03:00.0 free to go whole (not the
    host's: netdevs down, no VF in host use) and the fake kernel; the
    VF-less mlx5_1 stays the host's (ib2 up)."""
    fs = fake_host["fs"]
    fs.free_to_go_whole(monkeypatch, PF)
    cfg = make_config(fake_host["root"], pool={"whole_pfs": True})
    h = Host(cfg, Hypervisor("test:///default"))
    h.fs = fs
    yield h
    h.close()


def vfs_of(host, pf=PF):
    return [v.address for v in Host(host.config).inventory.vfs if v.pf == pf]


def domain_with(conn, name, *addresses):
    """A running domain of libvirt's test driver holding these PCI devices."""
    devs = "".join(
        f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' "
        f"bus='0x{a[5:7]}' slot='0x{a[8:10]}' function='0x{a[11]}'/></source></hostdev>" for a in addresses)
    return conn.createXML(f"<domain type='test'><name>{name}</name><memory>1024</memory><os><type>hvm</type>"
                          f"</os><devices>{devs}</devices></domain>", 0)


def test_a_whole_pf_reserved_has_its_vfs_off_and_its_count_recorded(host):
    [a] = host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    assert (a.vf.address, whole_pf.is_whole(a.vf)) == (PF, True)
    assert vfs_of(host) == []
    [row] = host.pf_assignments()
    assert (row.pf, row.vm_id, row.state, row.num_vfs) == (PF, 7, "reserved", 4)
    host.mark_attached([a], op="deploy")
    assert host.pf_assignments()[0].state == "attached"
    assert host.allocations_of(7, {MAC: "ib-pf"}) == [a]
    assert host.program_guids(7, [a]) == [] and host.guid_records() == []   # burned in: nothing written
    host.release([a])
    assert vfs_of(host) == [f"0000:03:00.{i}" for i in range(1, 5)] and host.pf_assignments() == []


def test_no_vf_of_a_whole_pf_and_no_whole_pf_with_a_vf_held(host):
    """A VM holding a VF of 03:00 keeps that PF; the PF another VM holds
    whole offers no VF (its VFs are gone, and the pool would refuse them)."""
    [vf] = host.reserve(5, "one-5", [VfRequest("02:00:00:00:00:05", "ib0")], op="deploy")
    with pytest.raises(PoolExhausted, match=rf"{PF}: 1 of its VFs held \({vf.vf.address}\); "
                                            r"0000:04:00.0: in use on the host \(ib2 is up\); "
                                            r"0000:81:00.0: in use on the host \(ib1 is up\)$"):
        host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    assert [p for p in host.pf_assignments()] == [] and len(vfs_of(host)) == 4
    host.release([vf])
    host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    with pytest.raises(PoolExhausted, match=r"free: 3 on 0000:81:00.0"):     # 81:00.4 shares its group
        host.reserve(8, "one-8", [VfRequest("02:00:00:00:00:08")] * 4, op="deploy")


def test_a_vm_with_both_gets_no_vf_of_its_whole_pf(host):
    got = host.reserve(7, "one-7", [VfRequest("02:00:00:00:00:01"), VfRequest(MAC, None, True)], op="deploy")
    assert [(a.vf.address, a.vf.pf) for a in got] == [("0000:81:00.1", "0000:81:00.0"), (PF, PF)]


def test_a_pf_whose_vfs_cannot_go_is_given_back_and_the_reservation_undone(host):
    """The kernel refuses (a driver without sriov_configure): nothing stays
    held, the PF keeps its VFs, the error is one line."""
    host.fs.SRIOV_CONFIGURE = ()
    with pytest.raises(DriverError, match=rf"^PF {PF}: cannot switch its VFs off: .*sriov_numvfs: "
                                          r"No such file or directory$"):
        host.reserve(7, "one-7", [VfRequest("02:00:00:00:00:01"), VfRequest(MAC, None, True)], op="deploy")
    assert host.pf_assignments() == [] and host.assignments() == [] and len(vfs_of(host)) == 4


def test_a_pf_a_running_domain_holds_is_never_given_back(host, conn):
    [a] = host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    dom = domain_with(conn, "one-7", PF)
    with pytest.raises(DriverError, match=rf"^PF {PF} is in running domain one-7: not given back"):
        host.release([a])
    assert vfs_of(host) == [] and len(host.pf_assignments()) == 1
    dom.destroy()
    host.release_vm(7)
    assert len(vfs_of(host)) == 4 and host.pf_assignments() == []


def test_reconcile_gives_back_the_pf_of_a_vm_whose_action_died(host, conn):
    """A deploy killed after its row and the switch-off, before its domain:
    its intent is abandoned (no VM lock), reconcile gives the PF back."""
    from kvm_sriov.vf import intents
    host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    with host.pool.transaction() as txn:
        intents.record(txn, 7, "deploy", "reserved", {})
    changes = Host(host.config, Hypervisor("test:///default")).reconcile()
    assert [(c.kind, c.vf, c.vm_id) for c in changes] == [("free", PF, 7)]
    assert len(vfs_of(host)) == 4 and host.pf_assignments() == []


def test_reconcile_keeps_a_running_vms_pf_and_retries_one_it_could_not_give_back(host, conn):
    a, = host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    host.mark_attached([a], op="deploy")
    dom = domain_with(conn, "one-7", PF)
    assert Host(host.config, Hypervisor("test:///default")).reconcile() == []
    dom.destroy()
    host.fs.bind(PF, None)
    host.fs.home[PF] = None                                          # its driver gone: cannot switch on
    Host(host.config, Hypervisor("test:///default")).reconcile()
    assert len(host.pf_assignments()) == 1                           # kept, for the next try
    host.fs.home[PF] = "mlx5_core"
    Host(host.config, Hypervisor("test:///default")).reconcile()
    assert host.pf_assignments() == [] and len(vfs_of(host)) == 4


def test_a_pf_left_on_vfio_pci_is_taken_off_it(host):
    """libvirt gives a managed PF back when the VM ends; after a crash it
    may not have: the give-back does."""
    a, = host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    host.fs.bind(PF, "vfio-pci")
    host.release([a])
    assert host.fs.driver_of(PF) == "mlx5_core" and len(vfs_of(host)) == 4


def test_leftovers_of_an_earlier_life_are_given_back_by_the_next_reservation(host):
    host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")    # its domain never ran
    got = host.reserve(7, "one-7", [VfRequest("02:00:00:00:00:01")], op="deploy")
    assert host.pf_assignments() == [] and len(vfs_of(host)) == 4
    assert [a.vf.pf for a in got] == [PF]                            # and its VFs are offered again


def test_a_stale_give_back_does_not_touch_the_pf_another_vm_has_now(host):
    a, = host.reserve(7, "one-7", [VfRequest(MAC, None, True)], op="deploy")
    [old] = host.pf_assignments()
    host.release([a])
    host.reserve(8, "one-8", [VfRequest(MAC, None, True)], op="deploy")
    from kvm_sriov.node import whole_pfs
    whole_pfs.give_back(host, [old])                                 # decided from VM 7's row
    assert vfs_of(host) == [] and [p.vm_id for p in host.pf_assignments()] == [8]


def test_the_destination_of_a_migration_reserves_and_releases_a_whole_pf(host, monkeypatch):
    """kvm-sriov-peer reserve/release (actions/peer.py) with a whole-PF NIC:
    the record's BRIDGE says so (domain_xml.NicRecord.request)."""
    from kvm_sriov.actions import peer
    monkeypatch.setattr(Host, "close", lambda self: None)
    answer = peer._reserve(host, 7, "one-7", [{"mac": MAC, "bridge": "ib-pf"}])
    assert [(e["mac"], e["vf"], e["pf"]) for e in answer] == [(MAC, PF, PF)]
    assert vfs_of(host) == [] and host.pf_assignments()[0].vm_id == 7
    peer._release(host, 7)
    assert host.pf_assignments() == [] and len(vfs_of(host)) == 4
    assert Sysfs(host.config.sysfs_root).link_name(
        Sysfs(host.config.sysfs_root).at("bus", "pci", "devices", PF, "driver")) == "mlx5_core"
