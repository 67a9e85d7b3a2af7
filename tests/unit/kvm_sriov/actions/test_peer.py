"""Rung 1: the migration destination (kvm_sriov/actions/peer.py). Its attach
answers how long its GUID programming and its hot-plug took there, timed on
its own monotonic clock: durations only, which the source keeps beside its
own figures of the VM's InfiniBand outage (actions/migrate.py). Its reserve
makes the VFs ready before the outage (node/prewarm.py: bound to vfio-pci
through libvirt, then the VM's GUIDs), and everything it did is undone by
the release, a failed reserve or attach, and reconcile once the lease is
over, on libvirt's test driver and the fake sysfs (libvirt's nodedev calls
stood in for by their effect on sysfs)."""

import json
import time

import pytest

from kvm_sriov.actions import peer
from kvm_sriov.domain import domain_xml, hotplug
from kvm_sriov.errors import DriverError, HypervisorError, InputError
from kvm_sriov.ib import guid
from kvm_sriov.node import prewarm
from kvm_sriov.node.host import Host
from kvm_sriov.vf import intents
from tests.support.actions_in_process import deployment

STEP = 0.02


def test_attach_answers_its_guid_and_hotplug_durations(run, monkeypatch):
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: time.sleep(STEP))
    answer = peer._attach(run.host(), 42, "test")  # the test driver's running domain
    assert set(answer) == {"guid_seconds", "hotplug_seconds"}
    assert answer["guid_seconds"] >= 0 and answer["hotplug_seconds"] >= STEP - 0.001


def test_the_answer_is_the_peers_one_json_document(run, monkeypatch, capsys):
    monkeypatch.setattr(peer, "_attach", lambda host, vm_id, domain: {"guid_seconds": 0.001,
                                                                       "hotplug_seconds": 0.5})
    monkeypatch.setattr(peer, "Host", lambda cfg: run.host())
    monkeypatch.setattr(peer.config_mod, "load", lambda remotes: None)
    assert peer.main(["attach", "42", "one-42"]) == 0
    assert capsys.readouterr().out == '{"guid_seconds": 0.001, "hotplug_seconds": 0.5}\n'


def test_the_source_gets_the_answer_and_an_older_destinations_null(tmp_path):
    """node/peer.py's Peer.attach returns what kvm-sriov-peer printed there."""
    import stat

    from kvm_sriov import config
    from kvm_sriov.node.peer import Peer
    script = tmp_path / "remotes" / "vmm" / "kvm-sriov" / "kvm-sriov-peer"
    script.parent.mkdir(parents=True)
    cfg = config.load(files=[], overrides={"migration": {
        "peer_command": ["/usr/bin/env"], "peer_remotes": str(tmp_path / "remotes")}})
    for printed, answer in (('{"guid_seconds": 0.001, "hotplug_seconds": 0.5}',
                             {"guid_seconds": 0.001, "hotplug_seconds": 0.5}), ("null", None)):
        script.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{printed}'\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        assert Peer(cfg, "h2").attach(42, "one-42") == answer


# -- the pre-warm at reserve (kvm_sriov/node/prewarm.py) --------------------------------
MAC = "02:00:0a:64:00:2a"


def nic(space=5, **more):
    """One NIC entry of the reserve payload as Peer.reserve sends it."""
    return {"mac": MAC, "bridge": "ib-sriov", "numa_nodes": None, "numa_policy": "ignore", "ib_traffic": None,
            "guid_space": space, **more}


def port_of(host, vf):
    v = host.inventory.vf(vf)
    return guid.backend_for(host.sysfs, host.inventory.pf(v.pf), v.index).read().port


def intent_of(host, vm_id=42):
    with host.pool.transaction() as txn:
        return intents.of_vm(txn, vm_id)


class Nodedev:
    """libvirt's nodedev detach / re-attach, as the kernel would show them in
    the fake sysfs; each call notes the VF's port GUID at that moment."""

    def __init__(self, fake_host, run, monkeypatch):
        self.fs, self.run, self.calls, self.refuse = fake_host["fs"], run, [], set()
        monkeypatch.setattr(prewarm, "_bind", self.bind)
        monkeypatch.setattr(prewarm, "_give_back", self.give_back)

    def bind(self, host, vf):
        self.calls.append(("bind", vf, port_of(host, vf)))
        if ("bind", vf) in self.refuse:
            raise HypervisorError(f"libvirt could not bind VF {vf} to vfio-pci: no node device")
        self.fs.bind(vf, "vfio-pci")

    def give_back(self, host, vf):
        self.calls.append(("give back", vf, port_of(host, vf)))
        if ("give back", vf) in self.refuse:
            raise HypervisorError(f"libvirt could not give VF {vf} back to its host driver: busy")
        self.fs.bind(vf, "mlx5_core")


@pytest.fixture
def dest(run, fake_host, monkeypatch, conn):
    """The destination: its host, a libvirt nodedev on the fake sysfs, a
    hot-plug that works, and the arrived domain with its record (network 5)."""
    run.nodedev = Nodedev(fake_host, run, monkeypatch)
    run.plugged = []
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: run.plugged.extend(vf.address for vf, _ in vfs))
    run.driver = lambda vf: prewarm.driver_of(run.host(), vf)

    def arrive(space=5):
        root = domain_xml.parse(deployment(nics=0))
        domain_xml.record_nics(root, [domain_xml.NicRecord(MAC, "ib-sriov", space=space)])
        conn.createXML(domain_xml.to_string(root), 0)
    run.arrive = arrive
    return run


def test_reserve_binds_the_vf_ahead_then_gives_it_the_vms_guids(dest):
    host = dest.host()
    vf = host.inventory.eligible_vfs()[0].address
    original = port_of(host, vf)
    assert original != guid.port_guid(MAC, 5) and dest.driver(vf) != "vfio-pci"
    [taken] = peer._reserve(host, 42, "one-42", [nic(5)])
    assert taken["vf"] == vf
    assert dest.nodedev.calls == [("bind", vf, original)]  # bound while it still had its own GUID
    assert dest.driver(vf) == "vfio-pci" and port_of(dest.host(), vf) == guid.port_guid(MAC, 5)
    assert [(r.vf, r.vm_id, r.mac) for r in dest.guids()] == [(vf, 42, MAC)]
    assert taken["prewarm_seconds"] >= 0 and set(taken) == {"mac", "vf", "pf", "prewarm_seconds"}
    intent = intent_of(host)
    assert (intent.action, intent.expires is not None, intent.data[prewarm.KEY]) == ("migrate-in", True, [vf])
    assert dest.pool() == [(vf, 42, "reserved")]


def test_the_attach_after_a_prewarm_sets_no_guid(dest, monkeypatch):
    [taken] = peer._reserve(dest.host(), 42, "one-42", [nic(5)])
    dest.arrive(5)
    programmed = []
    monkeypatch.setattr(guid, "program", lambda *a, **kw: programmed.append(a[3].address))
    answer = peer._attach(dest.host(), 42, "one-42")
    assert programmed == [] and dest.plugged == [taken["vf"]]
    assert dest.pool() == [(taken["vf"], 42, "attached")] and intent_of(dest.host()) is None
    assert answer["guid_seconds"] < 1  # a read of the GUID records, nothing written


def test_the_domains_record_wins_over_what_the_source_said(dest):
    """The record the domain brings is the truth the attach goes by: a VF
    set from another network is set again."""
    [taken] = peer._reserve(dest.host(), 42, "one-42", [nic(6)])
    dest.arrive(5)
    peer._attach(dest.host(), 42, "one-42")
    assert port_of(dest.host(), taken["vf"]) == guid.port_guid(MAC, 5)


def test_an_older_sources_vm_gets_its_guids_at_the_attach(dest):
    entry = nic()
    del entry["guid_space"]  # an older source says nothing of GUIDs
    [taken] = peer._reserve(dest.host(), 42, "one-42", [entry])
    assert dest.driver(taken["vf"]) == "vfio-pci" and dest.guids() == []  # bound ahead all the same
    dest.arrive(5)
    peer._attach(dest.host(), 42, "one-42")
    assert port_of(dest.host(), taken["vf"]) == guid.port_guid(MAC, 5)


def test_a_vf_libvirt_cannot_bind_ahead_gets_its_guids_at_the_attach(dest, capsys):
    """No host driver runs a VF that carries the VM's GUID: a VF left on its
    driver is set right before its hot-plug, as before."""
    host = dest.host()
    free = [v.address for v in host.inventory.eligible_vfs()]
    dest.nodedev.refuse |= {("bind", vf) for vf in free}
    [taken] = peer._reserve(host, 42, "one-42", [nic(5)])
    assert dest.guids() == [] and dest.driver(taken["vf"]) != "vfio-pci"
    assert "no node device: its hot-plug binds it, and its GUIDs are set then" in capsys.readouterr().err
    dest.arrive(5)
    peer._attach(dest.host(), 42, "one-42")
    assert port_of(dest.host(), taken["vf"]) == guid.port_guid(MAC, 5)


def test_release_gives_the_guids_back_then_the_driver_then_frees_the_vf(dest):
    host = dest.host()
    vf = host.inventory.eligible_vfs()[0].address
    original = port_of(host, vf)
    [taken] = peer._reserve(host, 42, "one-42", [nic(5)])
    assert taken["vf"] == vf
    peer._release(dest.host(), 42)
    assert dest.nodedev.calls[-1] == ("give back", vf, original)  # its GUID was back before its driver
    assert port_of(dest.host(), vf) == original and dest.driver(vf) == "mlx5_core"
    assert dest.pool() == [] and dest.guids() == [] and intent_of(dest.host()) is None


def test_a_vf_on_vfio_pci_already_stays_there(dest):
    host = dest.host()
    for v in host.inventory.eligible_vfs():
        dest.nodedev.fs.bind(v.address, "vfio-pci")
    [taken] = peer._reserve(dest.host(), 42, "one-42", [nic(5)])
    assert port_of(dest.host(), taken["vf"]) == guid.port_guid(MAC, 5)
    assert intent_of(dest.host()).data[prewarm.KEY] == []
    peer._release(dest.host(), 42)
    assert dest.nodedev.calls == [] and dest.driver(taken["vf"]) == "vfio-pci" and dest.guids() == []


def test_a_prewarm_that_fails_leaves_nothing_reserved_bound_or_set(dest, monkeypatch):
    def collision(self, vm_id, allocations, spaces=None):
        raise DriverError(f"GUID {guid.port_guid(MAC, 5)} of NIC {MAC} is already carried by mlx5_0 port 1")
    monkeypatch.setattr(Host, "program_guids", collision)
    vf = dest.host().inventory.eligible_vfs()[0].address
    before = dest.driver(vf)
    with pytest.raises(DriverError, match="already carried"):
        peer._reserve(dest.host(), 42, "one-42", [nic(5)])
    assert dest.pool() == [] and intent_of(dest.host()) is None and dest.guids() == []
    assert [c[:2] for c in dest.nodedev.calls] == [("bind", vf), ("give back", vf)]
    assert before is None and dest.driver(vf) == "mlx5_core"  # what libvirt's re-attach probes


def test_a_failed_attach_gives_back_the_guids_and_the_drivers(dest, monkeypatch):
    [taken] = peer._reserve(dest.host(), 42, "one-42", [nic(5)])
    dest.arrive(5)
    original = dest.nodedev.calls[0][2]
    monkeypatch.setattr(hotplug, "attach", _refused)
    with pytest.raises(HypervisorError, match="did not appear"):
        peer._attach(dest.host(), 42, "one-42")
    assert port_of(dest.host(), taken["vf"]) == original and dest.driver(taken["vf"]) == "mlx5_core"
    assert dest.pool() == [(taken["vf"], 42, "reserved")]  # the source's release frees it
    peer._release(dest.host(), 42)
    assert dest.pool() == [] and [c[0] for c in dest.nodedev.calls] == ["bind", "give back"]


def _refused(dom, vfs, seconds, ports=None):
    raise HypervisorError(f"VF {', '.join(vf.address for vf, _ in vfs)} did not appear in {dom.name()}")


def test_every_clean_up_step_runs_whatever_another_one_did(dest, monkeypatch, capsys):
    """Two VFs: the first cannot be given back, the second still is; the GUIDs
    of both are back; and a clean-up that raises still frees the VFs."""
    two = [nic(5), nic(5, mac="02:00:0a:64:00:2b")]
    taken = [t["vf"] for t in peer._reserve(dest.host(), 42, "one-42", two)]
    dest.nodedev.refuse.add(("give back", taken[0]))
    peer._release(dest.host(), 42)
    assert "busy: it stays on vfio-pci" in capsys.readouterr().err
    assert [dest.driver(vf) for vf in taken] == ["vfio-pci", "mlx5_core"]
    assert dest.pool() == [] and dest.guids() == []

    taken = [t["vf"] for t in peer._reserve(dest.host(), 42, "one-42", two)]
    monkeypatch.setattr(prewarm, "revert_in", lambda *a: (_ for _ in ()).throw(OSError("sysfs gone")))
    with pytest.raises(OSError, match="sysfs gone"):
        peer._release(dest.host(), 42)
    assert dest.pool() == []  # freed all the same (their GUID records stay, for the next change or reconcile)


def test_a_vf_whose_guid_cannot_be_restored_stays_on_vfio_pci(dest, monkeypatch):
    """A host driver on it would bring the VM's GUID up on the fabric beside
    the VM's own: the VF stays bound, free in the pool, its record kept."""
    [taken] = peer._reserve(dest.host(), 42, "one-42", [nic(5)])
    monkeypatch.setattr(guid.Mlx5Sysfs, "write", lambda self, *a: (_ for _ in ()).throw(
        DriverError("cannot write to port: Device or resource busy")))
    peer._release(dest.host(), 42)
    assert dest.driver(taken["vf"]) == "vfio-pci" and [c[0] for c in dest.nodedev.calls] == ["bind"]
    assert dest.pool() == [] and [r.vf for r in dest.guids()] == [taken["vf"]]


def test_a_reservation_whose_lease_ran_out_is_undone_by_reconcile(dest):
    """The source never came back: once the lease is over, the next
    reconcile here (any action's, or kvm-sriov reconcile) undoes the
    pre-warm, GUIDs first, and frees the VF."""
    host = dest.host()
    vf = host.inventory.eligible_vfs()[0].address
    original = port_of(host, vf)
    peer._reserve(host, 42, "one-42", [nic(5)])
    dest.host().reconcile()
    assert dest.pool() == [(vf, 42, "reserved")]  # the lease holds it
    with dest.host().pool.transaction() as txn:
        txn.db.execute("UPDATE intent SET expires = 1 WHERE vm_id = 42")
    dest.host().reconcile()
    assert dest.pool() == [] and dest.guids() == [] and intent_of(dest.host()) is None
    assert dest.nodedev.calls[-1] == ("give back", vf, original) and dest.driver(vf) == "mlx5_core"


def test_an_earlier_reservation_left_here_is_undone_by_the_next(dest):
    """A reservation the source could not release (its lease still on) and a
    new migration of the same VM: the first one's pre-warm is undone."""
    first = peer._reserve(dest.host(), 42, "one-42", [nic(5)])[0]["vf"]
    dest.nodedev.fs.bind(first, "vfio-pci")
    second = peer._reserve(dest.host(), 42, "one-42", [nic(5)])[0]["vf"]
    assert dest.pool() == [(second, 42, "reserved")] and [r.vf for r in dest.guids()] == [second]
    assert ("give back", first) in [c[:2] for c in dest.nodedev.calls]
    assert intent_of(dest.host()).data[prewarm.KEY] == [second]


@pytest.mark.parametrize("space", [-1, guid.MAX_SPACE + 1, True, "5", 5.0, [5]])
def test_a_bad_guid_network_from_the_source_is_refused_before_anything(dest, space):
    with pytest.raises(InputError, match="bad GUID network from the source host"):
        peer._reserve(dest.host(), 42, "one-42", [nic(space)])
    assert dest.pool() == [] and dest.nodedev.calls == []


@pytest.mark.parametrize("nics", [{"mac": MAC}, ["02:00:0a:64:00:2a"], [{"mac": 1, "bridge": "ib-sriov"}],
                                  [{"bridge": "ib-sriov"}]])
def test_a_bad_nic_list_is_one_line_and_exit_1(dest, monkeypatch, capsys, nics):
    import io
    monkeypatch.setattr(peer, "Host", lambda cfg: dest.host())
    monkeypatch.setattr(peer.config_mod, "load", lambda remotes: None)
    assert peer.main(["reserve", "42", "one-42"], stdin=io.StringIO(json.dumps(nics))) == 1
    err = capsys.readouterr().err
    assert "bad NIC list from the source host" in err and "Traceback" not in err
    assert dest.pool() == []
