"""Rung 1: the VMs' last migration outages (kvm_sriov/metrics/outage.py) from
the records the real node/outage.py keeps: whole, per phase and when; only
the recent ones (the bound), malformed or odd records left out, nothing
without records, and a record the state folder's rules refuse is one line."""

import json
import os
import time

import pytest

from kvm_sriov import cli
from kvm_sriov.errors import DriverError
from kvm_sriov.metrics import outage as outage_metrics
from kvm_sriov.node import outage

NOW = 1764257000.0
DAY = outage_metrics.MAX_AGE_SECONDS


def record(vm_id, outcome="migrated", ago=60.0, **changes):
    return dict({"vm_id": vm_id, "outcome": outcome, "source": "kvm1", "destination": "kvm2",
                 "ended": NOW - ago, "outage_seconds": 2.31, "unplug_seconds": 0.4,
                 "migration_seconds": 1.51, "plug_seconds": 0.4}, **changes)


@pytest.fixture
def cfg(make_config, fake_host):
    cfg = make_config(fake_host["root"])
    os.mkdir(cfg.state_dir, 0o750)
    return cfg


def samples(outages):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in outage_metrics.families(outages) for s in f.samples}


def test_no_state_folder_or_no_record_is_no_series_and_nothing_made(make_config, fake_host):
    cfg = make_config(fake_host["root"])
    assert outage_metrics.read(cfg, NOW) == []
    assert not os.path.exists(cfg.state_dir)
    os.mkdir(cfg.state_dir, 0o750)
    assert outage_metrics.read(cfg, NOW) == []
    assert not os.path.exists(os.path.join(cfg.state_dir, outage.FOLDER))
    assert samples([]) == {}


def test_each_vms_last_outage_whole_per_phase_and_when(cfg):
    outage.keep(cfg.state_dir, 7, record(7))
    outage.keep(cfg.state_dir, 42, record(42, "without-vfs", destination="kvm3", outage_seconds=31.0,
                                          unplug_seconds=0.5, migration_seconds=0.5, plug_seconds=30.0,
                                          destination_guid_seconds=0.01))
    got = samples(outage_metrics.read(cfg, NOW))
    seven = (("destination", "kvm2"), ("outcome", "migrated"), ("vm", "7"))
    lost = (("destination", "kvm3"), ("outcome", "without-vfs"), ("vm", "42"))
    assert got[("kvm_sriov_migration_outage_seconds", seven)] == 2.31
    assert got[("kvm_sriov_migration_outage_timestamp_seconds", seven)] == NOW - 60
    assert {phase: got[("kvm_sriov_migration_outage_phase_seconds", tuple(sorted(seven + (("phase", phase),))))]
            for phase in outage.PHASES} == {"unplug": 0.4, "migration": 1.51, "plug": 0.4}
    assert got[("kvm_sriov_migration_outage_seconds", lost)] == 31.0
    # one series per VM and family: 2 VMs, 3 phases each
    assert len(got) == 2 + 2 * 3 + 2


def test_only_records_younger_than_the_bound_are_exported(cfg):
    outage.keep(cfg.state_dir, 1, record(1, ago=DAY - 1))
    outage.keep(cfg.state_dir, 2, record(2, ago=DAY))          # a day old: the VM has not left from here since
    outage.keep(cfg.state_dir, 3, record(3, ago=400 * DAY))
    outage.keep(cfg.state_dir, 4, record(4, ago=-2 * DAY))     # from the future: a clock set back
    outage.keep(cfg.state_dir, 5, record(5, ago=-60))          # a minute ahead: fine
    assert [o.vm for o in outage_metrics.read(cfg, NOW)] == [1, 5]
    assert len(os.listdir(os.path.join(cfg.state_dir, outage.FOLDER))) == 5   # read-only: nothing removed


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps(record(8)),                                   # another VM's record under vm-9's name
    json.dumps(record(9, outage_seconds=-1)),
    json.dumps(record(9, outcome="lost")),
    json.dumps(record(9, plug_seconds=None)),
    json.dumps(record(9, ended="yesterday")),
    json.dumps(dict(record(9), pad="x" * 5000)),            # over the reader's size bound
    json.dumps(record(9, destination=None)),
    json.dumps(record(9, destination="")),
    json.dumps(record(9, destination="x" * 256)),
    json.dumps(record(9, destination="kvm2\nkvm_sriov_vfs 1")),
    json.dumps(record(9, destination=["kvm2"])),
])
def test_malformed_records_are_left_out_and_the_others_kept(cfg, content):
    outage.keep(cfg.state_dir, 42, record(42))
    with open(os.path.join(cfg.state_dir, outage.FOLDER, "vm-9.json"), "w") as fh:
        fh.write(content)
    assert [o.vm for o in outage_metrics.read(cfg, NOW)] == [42]


def test_a_planted_link_fails_the_run_in_one_line_and_is_not_followed(cfg, tmp_path, capsys):
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA key\n")
    folder = os.path.join(cfg.state_dir, outage.FOLDER)
    os.mkdir(folder, 0o750)
    os.symlink(target, os.path.join(folder, "vm-42.json"))
    with pytest.raises(DriverError, match="is a link"):
        outage_metrics.read(cfg, NOW)
    config_file = tmp_path / "kvm-sriov.toml"
    config_file.write_text(f'[sysfs]\nroot = "{cfg.sysfs_root}"\n[pool]\nstate_dir = "{cfg.state_dir}"\n')
    (tmp_path / "textfile").mkdir()
    assert cli.main(["--config", str(config_file), "metrics", "--textfile-dir", str(tmp_path / "textfile")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kvm-sriov metrics: ") and "is a link" in err and err.count("\n") == 1
    assert os.listdir(tmp_path / "textfile") == [] and target.read_text() == "ssh-ed25519 AAAA key\n"


def test_the_state_folders_rules_apply_only_where_there_are_records(cfg):
    os.chmod(cfg.state_dir, 0o770)
    assert outage_metrics.read(cfg, NOW) == []          # no record folder: nothing is read, nothing checked
    os.chmod(cfg.state_dir, 0o750)
    outage.keep(cfg.state_dir, 7, record(7))
    os.chmod(cfg.state_dir, 0o770)
    with pytest.raises(DriverError, match="writable by group or others"):
        outage_metrics.read(cfg, NOW)


def test_the_written_file_carries_them(cfg, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from kvm_sriov import metrics
    outage.keep(cfg.state_dir, 7, record(7, ago=NOW - time.time() + 60))   # ended a minute ago, really
    path = metrics.write_textfile(cfg, tmp_path)
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert families["kvm_sriov_migration_outage_seconds"].type == "gauge"
    assert [(s.labels, s.value) for s in families["kvm_sriov_migration_outage_seconds"].samples] == \
        [({"vm": "7", "outcome": "migrated", "destination": "kvm2"}, 2.31)]
    assert len(families["kvm_sriov_migration_outage_phase_seconds"].samples) == len(outage.PHASES)
