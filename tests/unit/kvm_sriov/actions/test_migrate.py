"""Rung 1: the InfiniBand outage of a live migration (kvm_sriov/actions/migrate.py),
in-process against libvirt's test driver on the fake host: from the start of
the VF unplug on the source until a VF is plugged again (on the destination,
or back on the source after a failure), one line in the VM log and one record
in the source's state folder (node/outage.py), for a migration that succeeds
and for one that fails after the unplug. A VM without VFs is handed to the
stock migrate with nothing of it: not even node/outage.py is imported."""

import os
import sys
import time

import pytest

from kvm_sriov.actions import migrate
from kvm_sriov.actions.delegate import StockResult
from kvm_sriov.domain import hotplug
from kvm_sriov.errors import DriverError, HypervisorError
from kvm_sriov.node import outage
from kvm_sriov.opennebula import LOG_LINE
from tests.support import actions_in_process as actions

UUID = actions.UUID
STEP = 0.02  # each faked step takes at least this long: the phases are told apart


class Guest:
    """The VFs the running domain holds, as the hot-plug engine sees them
    (the test driver cannot hot-plug): detach takes them off, attach puts
    them back, present() reads them."""

    def __init__(self, monkeypatch, attach_fails=False):
        self.vfs = set()
        self.attach_fails = attach_fails
        monkeypatch.setattr(hotplug, "detach", self.detach)
        monkeypatch.setattr(hotplug, "attach", self.attach)
        monkeypatch.setattr(hotplug, "present", lambda dom: set(self.vfs))

    def detach(self, dom, vfs, seconds, retry):
        time.sleep(STEP)
        self.vfs -= set(vfs)

    def attach(self, dom, vfs, seconds, ports=None):
        time.sleep(STEP)
        if self.attach_fails:
            raise HypervisorError(f"libvirt refused to attach VF to {dom.name()}")
        self.vfs |= {vf.address for vf, _ in vfs}


class Peer:
    """The destination (kvm-sriov-peer there): answers as actions/peer.py does."""
    calls = []
    answer = {"guid_seconds": 0.004, "hotplug_seconds": 0.6}
    prewarm = 0.8  # its reserve's pre-warm (prewarm_seconds in each entry), None: an older destination
    attach_error = None
    spaces = None  # the guid_spaces the source sent

    def __init__(self, config, host):
        pass

    def reserve(self, vm_id, name, nics, nodes, numa_policy, carried=None, guid_spaces=None):
        Peer.calls.append("reserve")
        Peer.spaces = guid_spaces
        said = {} if Peer.prewarm is None else {"prewarm_seconds": Peer.prewarm}
        return [{"vf": "0000:03:00.2", **said} for _ in nics]

    def attach(self, vm_id, name):
        Peer.calls.append("attach")
        time.sleep(STEP)
        if Peer.attach_error:
            raise DriverError(Peer.attach_error)
        return Peer.answer

    def release(self, vm_id):
        Peer.calls.append("release")


@pytest.fixture
def moving(run, monkeypatch):
    """A deployed VM with two VFs, a guest holding them, a destination and a
    stock migrate (code: its exit code) that takes STEP."""
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))[0] == 0
    guest = Guest(monkeypatch)
    guest.vfs = {vf for vf, _, _ in run.pool()}
    for name, value in (("calls", []), ("answer", dict(Peer.answer)), ("attach_error", None), ("prewarm", 0.8),
                        ("spaces", None)):
        monkeypatch.setattr(Peer, name, value)  # this test's own
    monkeypatch.setattr(migrate, "Peer", Peer)
    stock = {"code": 0}

    def run_stock(remotes, sent, *a, **kw):
        time.sleep(STEP)
        return StockResult(stock["code"], "")
    monkeypatch.setattr(migrate, "run_stock", run_stock)
    run.guest, run.stock_code = guest, stock
    return run


def _migrate(run):
    return run("migrate", UUID, "host2", "host1", "42", "host1")  # no action XML: the domain's records


def _recorded(run):
    return outage.migration_outages(run.host().config.state_dir)


def _line(err):
    lines = [LOG_LINE.match(l) for l in err.splitlines() if "IB outage" in l]
    assert len(lines) == 1, err
    return lines[0]


def _check_figures(record):
    phases = [record[f"{p}_seconds"] for p in ("unplug", "migration", "plug")]
    assert all(p >= 0 for p in phases) and record["outage_seconds"] >= 0
    assert abs(sum(phases) - record["outage_seconds"]) < 0.005  # each rounded to ms


def test_a_migration_records_its_outage_split_into_unplug_migration_and_plug(moving):
    before = time.time()
    code, _, err = _migrate(moving)
    assert code == 0, err
    assert Peer.calls == ["reserve", "attach"]
    [record] = _recorded(moving)
    assert record["vm_id"] == 42 and record["outcome"] == "migrated"
    assert (record["source"], record["destination"]) == ("host1", "host2")
    _check_figures(record)
    # each phase holds its own step: the guest's unplug, the stock migrate, the destination's attach
    assert min(record["unplug_seconds"], record["migration_seconds"], record["plug_seconds"]) >= STEP - 0.001
    # the destination's own figures (its clock's durations), kept beside: its pre-warm, before the outage
    assert (record["destination_guid_seconds"], record["destination_hotplug_seconds"]) == (0.004, 0.6)
    assert record["destination_prewarm_seconds"] == 0.8
    assert before - 1 <= record["ended"] <= time.time() + 1  # when it ended, on the source's clock
    # the VM log: one INFO line, which OpenNebula's log protocol takes as a log line
    line = _line(err)
    assert line.group(1) == "INFO"
    assert line.group(3) == (f"kvm-sriov: IB outage {record['outage_seconds']:.2f} s "
                             f"(unplug {record['unplug_seconds']:.2f} s, migration {record['migration_seconds']:.2f} s, "
                             f"plug {record['plug_seconds']:.2f} s)")
    assert moving.pool() == []  # freed here as before


def test_an_older_destination_without_figures_still_gives_a_record(moving):
    Peer.answer, Peer.prewarm = None, None  # its attach printed null, its reserve's entries had no figure
    assert _migrate(moving)[0] == 0
    [record] = _recorded(moving)
    assert record["outcome"] == "migrated" and "destination_hotplug_seconds" not in record
    assert "destination_prewarm_seconds" not in record


def test_the_source_sends_the_guid_networks_of_its_domains_record(moving, run):
    """What the destination sets at reserve is what its attach would derive
    from the record the domain brings: the record's networks, per MAC."""
    from kvm_sriov.domain import domain_xml
    host = run.host()
    dom = host.hypervisor.lookup(UUID)
    recorded = domain_xml.recorded_nics(domain_xml.parse(dom.XMLDesc(0)))
    records = [r._replace(space=5 + i) for i, r in enumerate(recorded)]
    host.hypervisor.set_metadata(dom, records)
    assert _migrate(moving)[0] == 0
    assert Peer.spaces == {r.mac: r.space for r in records} and len(records) == 2


@pytest.mark.parametrize("answer, prewarm", [({"guid_seconds": -1, "hotplug_seconds": "0.5"}, -1),
                                             ({"guid_seconds": True, "hotplug_seconds": float("nan")}, True),
                                             (["x"], "0.8")])
def test_what_the_destination_answers_is_kept_only_as_a_duration(moving, answer, prewarm):
    Peer.answer, Peer.prewarm = answer, prewarm
    assert _migrate(moving)[0] == 0
    [record] = _recorded(moving)
    assert not [k for k in record if k.startswith("destination_") and k != "destination"]


def test_a_stock_migrate_that_fails_after_the_unplug_records_the_outage_back_on_the_source(moving):
    moving.stock_code["code"] = 7
    before = moving.pool()
    code, _, err = _migrate(moving)
    assert code == 7  # the stock script's own failure, as before
    assert moving.guest.vfs == {vf for vf, _, _ in before}  # its VFs back
    assert moving.pool() == before and Peer.calls == ["reserve", "release"]
    [record] = _recorded(moving)
    assert record["outcome"] == "back-on-source"
    _check_figures(record)
    # the stock migrate's time is the migration; the way back here is the plug
    assert record["migration_seconds"] >= STEP - 0.001 and record["plug_seconds"] >= STEP - 0.001
    line = _line(err)
    assert line.group(1) == "INFO" and line.group(3).endswith("migration failed: VFs back on host1")


def test_a_failed_unplug_is_an_outage_too_and_its_error_is_the_one_reported(moving, monkeypatch):
    def half_detach(dom, vfs, seconds, retry):
        moving.guest.vfs.discard(vfs[0])  # the guest let one go
        raise HypervisorError(f"the guest of {dom.name()} did not release VF {vfs[1]} within 1s")
    monkeypatch.setattr(hotplug, "detach", half_detach)
    code, _, err = _migrate(moving)
    assert code != 0 and err.rstrip().splitlines()[-1].startswith("the guest of one-42 did not release VF")
    [record] = _recorded(moving)
    assert record["outcome"] == "back-on-source" and record["migration_seconds"] == 0
    _check_figures(record)


def test_vfs_that_cannot_be_given_back_are_recorded_without_vfs(moving):
    moving.stock_code["code"] = 1
    moving.guest.attach_fails = True
    code, _, err = _migrate(moving)
    assert code == 1
    [record] = _recorded(moving)
    assert record["outcome"] == "without-vfs"
    _check_figures(record)
    line = _line(err)
    assert line.group(1) == "ERROR" and line.group(3).endswith("the VM is still without its VFs")


def test_a_destination_that_cannot_attach_records_the_way_back(moving, monkeypatch):
    """After the stock migrate the destination's attach fails: the VM migrates
    back and gets its VFs here again; the outage runs until then."""
    Peer.attach_error = "on host2: VF 0000:03:00.2 did not appear in one-42"
    back = []

    def bring_back(host, call, name, held, peer, nics, cause, copy_storage):
        time.sleep(STEP)
        moving.guest.vfs |= {a.vf.address for a in held}
        back.append(str(cause))
    monkeypatch.setattr(migrate, "_bring_back", bring_back)
    code, _, err = _migrate(moving)
    assert code == 1
    assert "VFs could not be attached on host2: on host2: VF 0000:03:00.2 did not appear" in err
    assert "the VM was migrated back to host1 with its VFs" in err and len(back) == 1
    [record] = _recorded(moving)
    assert record["outcome"] == "back-on-source"
    _check_figures(record)
    assert record["plug_seconds"] >= 2 * STEP - 0.001  # the failed attach, then the way back


def test_a_way_back_that_fails_is_recorded_without_vfs(moving, monkeypatch):
    Peer.attach_error = "on host2: no such domain"

    def bring_back(*args, **kw):
        raise DriverError("domain one-42 is not on host2 after the migration")
    monkeypatch.setattr(migrate, "_bring_back", bring_back)
    code, _, err = _migrate(moving)
    assert code == 1 and "is not on host2 after the migration" in err
    [record] = _recorded(moving)
    assert record["outcome"] == "without-vfs"


def test_the_last_migration_replaces_the_record(moving):
    assert _migrate(moving)[0] == 0
    first = _recorded(moving)[0]
    folder = moving.host().config.state_dir / outage.FOLDER
    outage.keep(moving.host().config.state_dir, 42, dict(first, outage_seconds=9.5))
    assert [r["outage_seconds"] for r in _recorded(moving)] == [9.5]
    assert sorted(os.listdir(folder)) == ["vm-42.json"]  # no temporary file left


def test_a_record_that_cannot_be_kept_does_not_fail_the_migration(moving, monkeypatch):
    def refused(*args):
        raise DriverError("state folder /var/lib/one/kvm-sriov/migration-outage is a link: remove it")
    monkeypatch.setattr(outage, "keep", refused)
    code, _, err = _migrate(moving)
    assert code == 0, err
    assert "WARN: could not keep the migration outage of VM 42: state folder" in err
    assert "kvm-sriov: IB outage" in err  # the VM log still has it


def test_an_unexpected_error_keeping_the_record_never_skips_the_release(moving, monkeypatch):
    def broken(*args):
        raise TypeError("a bug")
    monkeypatch.setattr(outage, "keep", broken)
    code, _, err = _migrate(moving)
    assert code == 0, err
    assert "WARN: could not keep the migration outage of VM 42: TypeError('a bug')" in err
    assert moving.pool() == []  # the source's VFs were freed after it


def test_a_vm_without_vfs_goes_to_the_stock_migrate_with_nothing_recorded(run, monkeypatch):
    """Its migrate is the stock script's, untouched: no outage built, nothing
    written, nothing said."""
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=0))[0] == 0

    monkeypatch.delitem(sys.modules, "kvm_sriov.node.outage")
    from tests.support.driver_env import action_xml
    stdin = action_xml("migrate", ib_nic=False)
    code, out, err = run("migrate", UUID, "host2", "host1", "42", "host1", stdin=stdin)
    assert (code, out, err) == (0, "", "")
    assert run.stock.calls[-1][:2] == ("migrate", [UUID, "host2", "host1", "42", "host1"])
    assert "kvm_sriov.node.outage" not in sys.modules  # not even imported
    assert not (run.host().config.state_dir / outage.FOLDER).exists()


# -- a whole PF (BRIDGE = "ib-pf") moves as a VF does ------------------------------------------
@pytest.mark.parametrize("attach_error", [None, "the guest there did not take the PF"])
def test_a_whole_pf_vm_migrates_and_its_pf_gets_its_vfs_back_here(run, fake_host, conn, monkeypatch, attach_error):
    """Unplugged here (confirmed), reserved there by its record's BRIDGE, its
    VFs back on the source once the VM runs there; a failed attach there
    brings the VM back and plugs the same PF again, still without its VFs."""
    pf, fs = "0000:03:00.0", fake_host["fs"]
    run.configure(whole_pfs=True)
    fs.free_to_go_whole(monkeypatch, pf)
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(bridge="ib-pf"))[0] == 0
    guest = Guest(monkeypatch)
    guest.vfs = {pf}
    for name, value in (("calls", []), ("answer", dict(Peer.answer)), ("attach_error", attach_error),
                        ("prewarm", 0.8), ("spaces", None)):
        monkeypatch.setattr(Peer, name, value)
    monkeypatch.setattr(migrate, "Peer", Peer)

    def run_stock(remotes, sent, *a, **kw):   # the domain leaves (and, after a failed attach, is back)
        if attach_error is None:
            conn.lookupByName("one-42").destroy()
        return StockResult(0, "")
    monkeypatch.setattr(migrate, "run_stock", run_stock)
    monkeypatch.setattr(migrate, "_bring_back", lambda host, call, name, held, *a, **kw: migrate.reattach(
        host, host.hypervisor.lookup(name), held))

    def pf_state():
        host = run.host()
        return ([(p.pf, p.state) for p in host.pool.pf_assignments()],
                len([v for v in host.inventory.vfs if v.pf == pf]))
    code, _, err = _migrate(run)
    if attach_error is None:
        assert code == 0, err
        assert Peer.calls == ["reserve", "attach"] and pf_state() == ([], 4)
    else:
        assert code == 1 and "migrated back to host1" in err
        assert guest.vfs == {pf} and pf_state() == ([(pf, "attached")], 0)
