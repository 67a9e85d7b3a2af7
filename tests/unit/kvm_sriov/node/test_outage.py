"""Rung 1: a live migration's InfiniBand outage (kvm_sriov/node/outage.py):
its phases on one monotonic clock (never negative, adding up to the whole),
the VM log's line as OpenNebula's log protocol takes it, and the record in
the state folder an exporter reads (the driver user's files only, one per
VM, replaced whole, anything else left out). The action around it:
tests/unit/kvm_sriov/actions/test_migrate.py."""

import json
import os
from types import SimpleNamespace

import pytest

from kvm_sriov.errors import DriverError
from kvm_sriov.node import outage
from kvm_sriov.opennebula import LOG_LINE


def _outage(tmp_path, monkeypatch, clock, prewarm=None):
    """An Outage on a clock the test moves (clock: a one-item list of seconds)."""
    monkeypatch.setattr(outage.time, "monotonic", lambda: clock[0])
    host = SimpleNamespace(config=SimpleNamespace(state_dir=tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o750, exist_ok=True)
    call = SimpleNamespace(vm_id=42, src_host="h1", dest_host="h2", deploy_id="one-42")
    return outage.Outage(host, call, prewarm=prewarm)


def test_the_phases_add_up_to_the_outage(tmp_path, monkeypatch, capsys):
    clock = [100.0]
    o = _outage(tmp_path, monkeypatch, clock)
    clock[0] = 100.4
    o.lap()          # unplugged
    clock[0] = 101.91
    o.lap()          # migrated
    clock[0] = 102.31
    o.end("migrated", {"guid_seconds": 0.002, "hotplug_seconds": 0.35})
    [record] = outage.migration_outages(tmp_path / "state")
    assert (record["unplug_seconds"], record["migration_seconds"], record["plug_seconds"],
            record["outage_seconds"]) == (0.4, 1.51, 0.4, 2.31)
    assert (record["destination_guid_seconds"], record["destination_hotplug_seconds"]) == (0.002, 0.35)
    m = LOG_LINE.match(capsys.readouterr().err.strip())
    assert m.group(1) == "INFO"
    assert m.group(3) == "kvm-sriov: IB outage 2.31 s (unplug 0.40 s, migration 1.51 s, plug 0.40 s)"


@pytest.mark.parametrize("outcome", ["migrated", "back-on-source"])
def test_the_destinations_prewarm_is_kept_beside_the_outage_not_in_it(tmp_path, monkeypatch, capsys, outcome):
    """The pre-warm at reserve ran before the unplug: its own field, whatever
    the outcome; the outage, its phases and the VM log's line are as before."""
    clock = [100.0]
    o = _outage(tmp_path, monkeypatch, clock, prewarm=0.8123)
    clock[0] = 100.4
    o.lap()
    clock[0] = 101.9
    o.lap()
    clock[0] = 102.0
    o.end(outcome, {"guid_seconds": 0.0004, "hotplug_seconds": 0.1})
    [record] = outage.migration_outages(tmp_path / "state")
    assert record["destination_prewarm_seconds"] == 0.812
    assert (record["outage_seconds"], record["destination_guid_seconds"]) == (2.0, 0.0)
    assert "prewarm" not in LOG_LINE.match(capsys.readouterr().err.strip()).group(3)


@pytest.mark.parametrize("prewarm", [None, -0.1, True, "0.8", float("nan"), 1e7, [0.8]])
def test_a_prewarm_figure_that_is_not_a_duration_is_left_out(tmp_path, monkeypatch, prewarm):
    o = _outage(tmp_path, monkeypatch, [1.0], prewarm=prewarm)
    o.end("migrated", {"prewarm_seconds": 0.5})  # an attach answer never stands in for it
    [record] = outage.migration_outages(tmp_path / "state")
    assert "destination_prewarm_seconds" not in record


def test_a_failure_in_the_unplug_leaves_the_migration_at_zero_and_ends_once(tmp_path, monkeypatch, capsys):
    clock = [5.0]
    o = _outage(tmp_path, monkeypatch, clock)
    clock[0] = 6.0
    o.failed()       # the guest did not let go: what follows is the way back
    o.failed()       # said again by the undo step: nothing more
    clock[0] = 6.5
    o.end("back-on-source")
    clock[0] = 9.0
    o.end("without-vfs")  # once only
    [record] = outage.migration_outages(tmp_path / "state")
    assert record["outcome"] == "back-on-source"
    assert (record["unplug_seconds"], record["migration_seconds"], record["plug_seconds"]) == (1.0, 0, 0.5)
    assert capsys.readouterr().err.count("IB outage") == 1


def test_durations_are_never_negative_on_a_monotonic_clock(tmp_path, monkeypatch):
    clock = [7.0]
    o = _outage(tmp_path, monkeypatch, clock)
    for step in (o.lap, o.lap, lambda: o.end("migrated")):
        step()       # no time passes at all
    [record] = outage.migration_outages(tmp_path / "state")
    assert all(record[f"{p}_seconds"] == 0 for p in ("outage", *outage.PHASES))


def test_the_log_line_format():
    record = {"outcome": "migrated", "source": "h1", "outage_seconds": 2.314, "unplug_seconds": 0.4,
              "migration_seconds": 1.507, "plug_seconds": 0.407}
    assert outage.line(record) == "kvm-sriov: IB outage 2.31 s (unplug 0.40 s, migration 1.51 s, plug 0.41 s)"
    assert outage.line(dict(record, outcome="back-on-source")) == (
        "kvm-sriov: IB outage 2.31 s (unplug 0.40 s, migration 1.51 s, plug 0.41 s), "
        "migration failed: VFs back on h1")
    assert outage.line(dict(record, outcome="without-vfs")).endswith(
        "plug 0.41 s), migration failed: the VM is still without its VFs")


# -- the record in the state folder: what an exporter reads -------------------------
def _record(vm_id=42, **changes):
    return dict({"vm_id": vm_id, "outcome": "migrated", "source": "h1", "destination": "h2",
                 "ended": 1764257000.5, "outage_seconds": 2.31, "unplug_seconds": 0.4,
                 "migration_seconds": 1.51, "plug_seconds": 0.4}, **changes)


def test_records_are_the_driver_users_files_and_read_back_by_vm(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    assert outage.migration_outages(state) == []  # none yet: no folder made by reading
    assert not (state / outage.FOLDER).exists()
    outage.keep(state, 7, _record(7))
    outage.keep(state, 42, _record(42, outcome="back-on-source"))
    folder = state / outage.FOLDER
    assert oct(folder.stat().st_mode & 0o777) == "0o750"
    assert oct((folder / "vm-7.json").stat().st_mode & 0o777) == "0o640"
    assert [(r["vm_id"], r["outcome"]) for r in outage.migration_outages(state)] == \
        [(7, "migrated"), (42, "back-on-source")]


@pytest.mark.parametrize("name,content", [
    ("vm-9.json", "{not json"),
    ("vm-9.json", json.dumps(_record(10))),                     # another VM's record under this name
    ("vm-9.json", json.dumps(_record(9, outage_seconds=-1))),   # a negative duration
    ("vm-9.json", json.dumps(_record(9, outcome="lost"))),
    ("vm-9.json", json.dumps(_record(9, plug_seconds=None))),
    ("vm-9.json", json.dumps(dict(_record(9), pad="x" * 5000))),  # over the size bound
    ("vm-9.json", "[" * 4000),
    (".vm-9.json.kvm-sriov.0123456789abcdef", json.dumps(_record(9))),  # a write in progress
    ("vm-x.json", json.dumps(_record(9))),
])
def test_what_is_not_a_record_is_left_out(tmp_path, name, content):
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    outage.keep(state, 42, _record())
    (state / outage.FOLDER / name).write_text(content)
    assert [r["vm_id"] for r in outage.migration_outages(state)] == [42]


def test_a_link_planted_at_a_record_is_neither_followed_nor_read(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA key\n")
    folder = state / outage.FOLDER
    folder.mkdir(mode=0o750)
    (folder / "vm-42.json").symlink_to(target)
    with pytest.raises(DriverError, match="is a link"):
        outage.keep(state, 42, _record())
    with pytest.raises(DriverError, match="is a link"):
        outage.migration_outages(state)
    assert target.read_text() == "ssh-ed25519 AAAA key\n"


def test_a_record_folder_others_can_write_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    (state / outage.FOLDER).mkdir(mode=0o750)
    os.chmod(state / outage.FOLDER, 0o777)
    with pytest.raises(DriverError, match="writable by group or others"):
        outage.keep(state, 42, _record())
    assert not (state / outage.FOLDER / "vm-42.json").exists()
