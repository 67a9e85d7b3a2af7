"""Rung 1: the migration destination (kvm_sriov/actions/peer.py). Its
reserve gives the reserved VFs the VM's GUIDs there and then, before the
source unplugs its own, when vfio-pci holds them (a VF that is unbound or on
a host driver waits for the attach), and answers how long that took; its
attach then only plugs, and still programs what an older source or peer
left without GUIDs. Every way a reservation ends without the VM (a reserve
failing halfway, the source's release, a lease its dead source left) gives
the VFs back with the GUIDs they had. The attach answers how long its GUID
programming and its hot-plug took there, timed on its own monotonic clock:
durations only, which the source keeps beside its own figures of the VM's
InfiniBand outage (actions/migrate.py)."""

import time

import pytest

from kvm_sriov import cli
from kvm_sriov.actions import peer
from kvm_sriov.domain import domain_xml, hotplug
from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.errors import DriverError, InputError
from kvm_sriov.ib import guid
from kvm_sriov.node.host import Host
from kvm_sriov.vf import intents
from kvm_sriov.vf.policy import VfRequest
from tests.support.actions_in_process import deployment
from tests.support.fake_sysfs import ALL_F

STEP = 0.02


def test_attach_answers_its_guid_and_hotplug_durations(run, monkeypatch):
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds: time.sleep(STEP))
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


# -- pre-warm: the reserve gives the VFs the VM's GUIDs, before the source unplugs ----------
MAC, MAC2 = "02:00:0a:64:00:2a", "02:00:0a:64:00:2b"
NET5 = guid.port_guid(MAC, 5)  # the GUID the VM carries on the source: its NIC's network is 5


@pytest.fixture
def dest(fake_host, make_config, conn, monkeypatch):
    """The destination: the fake host with every IB VF on ``vf_driver``
    (vfio-pci unless a test says otherwise), libvirt's test driver, a guest
    whose plugs are recorded. dest.host(**sections): a Host on it."""
    plugged = []
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds: plugged.extend(vf.address for vf, _ in vfs))

    def host(vf_driver="vfio-pci", **sections):
        for vf in fake_host["mlx5_vfs"] + fake_host["mlx4_vfs"]:
            fake_host["fs"].bind(vf, vf_driver)
        return Host(make_config(fake_host["root"], libvirt={"uri": "test:///default"}, **sections),
                    Hypervisor("test:///default"))
    host.plugged = plugged
    return host


def _arrived(conn, *records):
    """The domain libvirt's migration brought here, with its record (GUID network 5)."""
    root = domain_xml.parse(deployment(nics=0))
    domain_xml.record_nics(root, list(records or [domain_xml.NicRecord(MAC, "ib-sriov", space=5)]))
    conn.createXML(domain_xml.to_string(root), 0)


def _entry(mac=MAC, **more):
    return {"mac": mac, "bridge": "ib-sriov", "numa_nodes": None, "numa_policy": "ignore", **more}


def _port(host, vf):
    v = host.inventory.vf(vf)
    return guid.backend_for(host.sysfs, host.inventory.pf(v.pf), v.index).read()


def _programmed(monkeypatch):
    """Every VF guid.program is asked to program, in order."""
    calls, real = [], guid.program
    monkeypatch.setattr(guid, "program", lambda db, sysfs, inv, vf, *a, **kw: calls.append(vf.address)
                        or real(db, sysfs, inv, vf, *a, **kw))
    return calls


def _ports(host):
    """What every IB VF of the host carries (port, node GUID, policy)."""
    return {v.address: _port(host, v.address) for v in host.inventory.vfs
            if guid.backend_for(host.sysfs, host.inventory.pf(v.pf), v.index)}


def _given_back(host, before):
    """The VFs are free again, every VF carries what it did ``before``,
    nothing of the VM is left."""
    assert host.assignments(42) == [] and host.guid_records() == []
    assert _ports(host) == before
    with host.pool.transaction() as txn:
        assert intents.all_intents(txn) == []  # no lease left either


def test_reserve_gives_vfio_vfs_the_vms_guids_and_answers_how_long(dest):
    host = dest()
    [taken] = peer._reserve(host, 42, "one-42", [_entry(guid_space=5)])
    assert taken["guid_seconds"] >= 0
    [rec] = host.guid_records()
    assert (rec.vf, rec.vm_id, rec.port_guid) == (taken["vf"], 42, NET5)
    assert _port(host, taken["vf"]) == (NET5, guid.from_mac(MAC, 5)[1], "Follow")
    assert [a.state for a in host.assignments(42)] == ["reserved"]  # still a reservation, under its lease


def test_attach_then_only_plugs(dest, conn, monkeypatch):
    host = dest()
    [taken] = peer._reserve(host, 42, "one-42", [_entry(guid_space=5)])
    _arrived(conn)
    programmed = _programmed(monkeypatch)
    answer = peer._attach(host, 42, "one-42")
    assert programmed == [] and dest.plugged == [taken["vf"]]
    assert set(answer) == {"guid_seconds", "hotplug_seconds"}
    assert _port(host, taken["vf"]).port == NET5
    assert [a.state for a in host.assignments(42)] == ["attached"]


@pytest.mark.parametrize("older", ["source", "peer"])
def test_attach_still_programs_what_an_older_source_or_peer_reserved(dest, conn, monkeypatch, older):
    """An older source sends no GUID networks; an older peer's reserve only
    reserved: no GUID record for the VF, so the attach programs it as before."""
    host = dest()
    if older == "source":
        [taken] = peer._reserve(host, 42, "one-42", [_entry()])
        assert "guid_seconds" not in taken
        vf = taken["vf"]
    else:
        [a] = host.reserve(42, "one-42", [VfRequest(MAC)], op="migrate-in", lease_seconds=60)
        vf = a.vf.address
    assert host.guid_records() == [] and _port(host, vf).port == ALL_F
    _arrived(conn)
    programmed = _programmed(monkeypatch)
    peer._attach(host, 42, "one-42")
    assert programmed == [vf] and dest.plugged == [vf] and _port(host, vf).port == NET5


def test_attach_reprograms_a_vf_whose_guid_is_not_the_domain_records(dest, conn, monkeypatch):
    """The reserve's GUID network is checked against the domain that arrived."""
    host = dest()
    [taken] = peer._reserve(host, 42, "one-42", [_entry(guid_space=6)])
    _arrived(conn)
    programmed = _programmed(monkeypatch)
    peer._attach(host, 42, "one-42")
    assert programmed == [taken["vf"]] and _port(host, taken["vf"]).port == NET5
    assert [r.port_guid for r in host.guid_records()] == [NET5]


@pytest.mark.parametrize("driver", [None, "mlx5_core"])
def test_a_vf_not_on_vfio_pci_is_not_prewarmed(dest, conn, monkeypatch, capsys, driver):
    """Unbound, or held by a host driver (which may bring its port up): its
    GUIDs wait for the attach, as before."""
    host = dest(vf_driver=driver)
    [taken] = peer._reserve(host, 42, "one-42", [_entry(guid_space=5)])
    assert host.guid_records() == [] and _port(host, taken["vf"]).port == ALL_F
    assert f"VF {taken['vf']} is {'on mlx5_core' if driver else 'unbound'}, not on vfio-pci: " \
           f"its GUIDs are set at attach" in capsys.readouterr().err
    _arrived(conn)
    programmed = _programmed(monkeypatch)
    peer._attach(host, 42, "one-42")
    assert programmed == [taken["vf"]] and _port(host, taken["vf"]).port == NET5


def test_only_the_vfio_vfs_of_a_reserve_are_prewarmed(dest, fake_host, conn, monkeypatch):
    host = dest()
    taken = peer._reserve(host, 42, "one-42", [_entry(guid_space=5), _entry(MAC2, guid_space=5)])
    peer._release(host, 42)
    fake_host["fs"].bind(taken[1]["vf"], None)  # the VF the second NIC gets is unbound now
    host = Host(host.config, Hypervisor("test:///default"))
    again = peer._reserve(host, 42, "one-42", [_entry(guid_space=5), _entry(MAC2, guid_space=5)])
    assert [t["vf"] for t in again] == [t["vf"] for t in taken]  # the same choice
    assert [r.vf for r in host.guid_records()] == [taken[0]["vf"]]
    _arrived(conn, domain_xml.NicRecord(MAC, "ib-sriov", space=5), domain_xml.NicRecord(MAC2, "ib-sriov", space=5))
    programmed = _programmed(monkeypatch)
    peer._attach(host, 42, "one-42")
    assert programmed == [taken[1]["vf"]]
    assert sorted(r.port_guid for r in host.guid_records()) == sorted([NET5, guid.port_guid(MAC2, 5)])


@pytest.mark.parametrize("when", ["writing the second VF", "after both were written"])
def test_a_reserve_that_fails_while_programming_gives_the_vfs_back(dest, monkeypatch, when):
    host = dest()
    real = host.program_guids
    if when == "writing the second VF":
        calls, program = [], guid.program

        def failing(db, sysfs, inv, vf, *a, **kw):
            calls.append(vf.address)
            if len(calls) == 2:
                raise DriverError(f"cannot write {NET5} to the port of VF {vf.address}: Input/output error")
            return program(db, sysfs, inv, vf, *a, **kw)
        monkeypatch.setattr(guid, "program", failing)
    else:
        def failing(vm_id, allocations, spaces=None):
            real(vm_id, allocations, spaces)
            assert len(host.guid_records()) == 2  # both VFs carry the VM's GUIDs now
            raise DriverError("the peer failed after the GUIDs")
        monkeypatch.setattr(host, "program_guids", failing)
    before = _ports(host)
    with pytest.raises(DriverError):
        peer._reserve(host, 42, "one-42", [_entry(guid_space=5), _entry(MAC2, guid_space=5)])
    _given_back(host, before)


def test_a_release_restores_the_prewarmed_guids_and_frees_the_vfs(dest):
    """What the source sends when its migrate fails after the reserve (the
    unplug, the stock migrate, its own reserve call: actions/migrate.py)."""
    host = dest()
    before = _ports(host)
    peer._reserve(host, 42, "one-42", [_entry(guid_space=5), _entry(MAC2, guid_space=5)])
    assert len(host.guid_records()) == 2 and _ports(host) != before
    peer._release(host, 42)
    _given_back(host, before)


def test_a_reservation_its_source_abandoned_gets_its_guids_back_at_reconcile(dest):
    """The source died before the attach and nobody releases: once the lease
    is over, kvm-sriov reconcile here frees the VF and restores its GUIDs."""
    host = dest(timeouts={"migrate_seconds": 0.01}, pool={"reservation_grace_seconds": 0})
    before = _ports(host)
    [taken] = peer._reserve(host, 42, "one-42", [_entry(guid_space=5)])
    assert _port(host, taken["vf"]).port == NET5
    time.sleep(0.05)
    assert cli.cmd_reconcile(host.config, type("Args", (), {"dry_run": False})()) == 0
    _given_back(host, before)


@pytest.mark.parametrize("space", [-1, True, "5", 10 ** 10, 1.5])
def test_a_bad_guid_network_from_the_source_is_refused_before_anything_is_taken(dest, space):
    host = dest()
    with pytest.raises(InputError, match="bad GUID space from the source host"):
        peer._reserve(host, 42, "one-42", [_entry(guid_space=space)])
    assert host.assignments(42) == [] and host.guid_records() == []


def test_the_source_sends_each_records_guid_network(monkeypatch):
    from kvm_sriov.node.peer import Peer
    sent = []
    monkeypatch.setattr(Peer, "_run", lambda self, argv, payload=None: sent.append(payload) or [])
    Peer.__new__(Peer).reserve(42, "one-42", [domain_xml.NicRecord(MAC, "ib-sriov", space=5),
                                              domain_xml.NicRecord(MAC2, "ib-sriov")])
    assert [(e["mac"], e["guid_space"]) for e in sent[0]] == [(MAC, 5), (MAC2, None)]
