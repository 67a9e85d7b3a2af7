"""Rung 1: each VM's InfiniBand traffic (kvm_sriov/metrics/traffic.py) from the
VM monitoring probe's state file, made by the real node/traffic.py: counters
per VM the pool gives VFs here now (not the VMs gone from here the file still
names), receive/transmit in the probe's order, nothing without VMs or without
a state file, nothing from one the probe would drop, and a file the state
folder's rules refuse is one line."""

import os

import pytest

from kvm_sriov import cli
from kvm_sriov.errors import DriverError
from kvm_sriov.files import atomic_write
from kvm_sriov.metrics import traffic as traffic_metrics
from kvm_sriov.node import traffic
from kvm_sriov.vf.pool import VfPool

PF = "0000:03:00.0"
VF = "0000:03:00.1"


@pytest.fixture
def cfg(make_config, fake_host):
    cfg = make_config(fake_host["root"])
    os.mkdir(cfg.state_dir, 0o750)
    return cfg


def holds(cfg, *rows):
    """The pool: rows of (vf, vm, state)."""
    pool = VfPool(cfg.pool_db)
    with pool.transaction() as txn:
        for vf, vm, state in rows:
            txn.add(vf, PF, vm, f"one-{vm}", f"02:00:00:00:00:{vm % 256:02x}", state, "deploy")
    pool.close()


def state_path(cfg):
    return os.path.join(cfg.state_dir, traffic.STATE_FILE)


def probe_wrote(cfg, vms):
    """The state file as the probe writes it (dump_state, 0600)."""
    atomic_write(state_path(cfg), traffic.dump_state(traffic.State(vms, {})), mode=0o600)


def entry(total, vfs=(VF,)):
    return traffic.VmEntry(total, {vf: (100.0, (1, 2, 3, 4)) for vf in vfs}, 200.0)


def samples(totals):
    return {(s.name, s.labels["vm"]): s.value for f in traffic_metrics.families(totals) for s in f.samples}


def test_no_state_folder_no_vm_or_no_state_file_is_no_series(make_config, fake_host):
    cfg = make_config(fake_host["root"])
    assert traffic_metrics.read(cfg) == {}
    assert not os.path.exists(cfg.state_dir)
    holds(cfg, (VF, 5, "attached"))
    assert traffic_metrics.read(cfg) == {}                  # the probe has counted nothing yet
    assert samples({}) == {}
    assert [f.type for f in traffic_metrics.families({})] == ["counter"] * 4


def test_the_vms_holding_vfs_here_now_in_the_probes_order(cfg):
    holds(cfg, (VF, 5, "attached"), ("0000:03:00.2", 6, "attached"), ("0000:03:00.4", 8, "reserved"))
    probe_wrote(cfg, {
        5: entry((1000, 2000, 10, 20)),
        6: entry((1, 1, 1, 1), vfs=()),       # at the probe's last run it had none yet: its total still counts
        8: entry((3, 3, 3, 3)),               # reserved now (a deploy starting): not attached, not counting
        9: entry((7, 7, 7, 7)),               # gone from here since the probe's last run
    })
    totals = traffic_metrics.read(cfg)
    assert totals == {5: (1000, 2000, 10, 20), 6: (1, 1, 1, 1)}
    assert samples({5: totals[5]}) == {("kvm_sriov_vm_ib_receive_bytes_total", "5"): 1000,
                                       ("kvm_sriov_vm_ib_transmit_bytes_total", "5"): 2000,
                                       ("kvm_sriov_vm_ib_receive_packets_total", "5"): 10,
                                       ("kvm_sriov_vm_ib_transmit_packets_total", "5"): 20}
    assert oct(os.stat(state_path(cfg)).st_mode & 0o777) == "0o600"   # read-only: as the probe left it


def test_a_host_whose_vms_all_left_has_no_series_and_does_not_read_the_file(cfg, monkeypatch):
    probe_wrote(cfg, {5: entry((1000, 2000, 10, 20))})    # the probe's last run, with VM 5 here
    holds(cfg, (VF, 5, "attached"))
    assert traffic_metrics.read(cfg) == {5: (1000, 2000, 10, 20)}
    pool = VfPool(cfg.pool_db)
    with pool.transaction() as txn:                         # VM 5 left: the probe no longer runs its count
        txn.release_vm(5)
    pool.close()
    monkeypatch.setattr(traffic, "load_state", lambda *args: pytest.fail("the state file was read"))
    assert traffic_metrics.read(cfg) == {}


def test_the_probes_own_order_is_ours():
    assert traffic.ATTRIBUTES == ("IB_RX_BYTES", "IB_TX_BYTES", "IB_RX_PACKETS", "IB_TX_PACKETS")
    assert [name for name, _ in traffic_metrics.COUNTERS] == [
        "kvm_sriov_vm_ib_receive_bytes", "kvm_sriov_vm_ib_transmit_bytes",
        "kvm_sriov_vm_ib_receive_packets", "kvm_sriov_vm_ib_transmit_packets"]


@pytest.mark.parametrize("body", [
    b"", b"\x00garbage", b"[]", b'{"vms": []}', b"[" * 100000,
    b'{"vms": {}, "pad": "' + b"x" * traffic.MAX_STATE_BYTES + b'"}',           # over the reader's bound
    b'{"vms": {"05": {"total": [1, 2, 3, 4], "seen": 5.0, "vfs": {}}}}',
    b'{"vms": {"5": {"total": [-1, 2, 3, 4], "seen": 5.0, "vfs": {}}}}',
])
def test_a_state_file_the_probe_would_drop_gives_no_series_and_no_error(cfg, body):
    holds(cfg, (VF, 5, "attached"))
    with open(state_path(cfg), "wb") as fh:
        fh.write(body)
    assert traffic_metrics.read(cfg) == {}


def test_the_reader_is_bounded_as_the_probes(cfg):
    many = {vm: traffic.VmEntry((vm, 0, 0, 0), {}, float(vm)) for vm in range(traffic.MAX_VMS + 20)}
    with open(state_path(cfg), "wb") as fh:   # more VMs than the probe keeps: the reader keeps the newest
        fh.write(traffic.dump_state(traffic.State(many, {})))
    totals = traffic.vm_totals(cfg.state_dir)
    assert len(totals) == traffic.MAX_VMS and min(totals) == 20


def test_a_planted_state_file_fails_the_run_in_one_line_and_is_not_followed(cfg, tmp_path, capsys):
    holds(cfg, (VF, 5, "attached"))
    victim = tmp_path / "victim"
    victim.write_text('{"vms": {}, "free": {}}')
    os.symlink(victim, state_path(cfg))
    with pytest.raises(DriverError, match="is a link"):
        traffic_metrics.read(cfg)
    os.unlink(state_path(cfg))
    os.link(victim, state_path(cfg))
    with pytest.raises(DriverError, match="2 names"):
        traffic_metrics.read(cfg)
    os.unlink(state_path(cfg))
    os.mkfifo(state_path(cfg))                          # would hang a reader that blocks
    config_file = tmp_path / "kvm-sriov.toml"
    config_file.write_text(f'[sysfs]\nroot = "{cfg.sysfs_root}"\n[pool]\nstate_dir = "{cfg.state_dir}"\n'
                           '[libvirt]\nuri = "test:///default"\n')
    (tmp_path / "textfile").mkdir()
    assert cli.main(["--config", str(config_file), "metrics", "--textfile-dir", str(tmp_path / "textfile")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "not a regular file" in err and err.count("\n") == 1
    assert os.listdir(tmp_path / "textfile") == []


def test_a_state_folder_others_can_write_is_refused(cfg):
    holds(cfg, (VF, 5, "attached"))
    probe_wrote(cfg, {5: entry((1, 2, 3, 4))})
    os.chmod(cfg.state_dir, 0o777)
    with pytest.raises(DriverError, match="writable by group or others"):
        traffic_metrics.read(cfg)
