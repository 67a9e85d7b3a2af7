"""kvm-sriov qualify --write-test (kvm_sriov/node/qualify.py): one free VF per
PF taken through the pool, a GUID written and read back with the driver's
own GUID code (kvm_sriov/ib/guid.py), restored, the VF given back, failures
midway included. Rung 1: the fixture hosts of tests/fixtures/qualify, whose
VF GUID files are mlx5_core's ``<PF>/sriov/<n>/{node,port,policy}``
(tests/support/fake_sysfs.py; the layout and its values, all-F and
``Down`` for a VF nobody set: /work/shared/notes/sriov-sysfs-and-libvirt.md),
and libvirt's test driver (test:///default: one running domain, no hostdev).
No ConnectX here: that a real mlx5 firmware takes the write is not proven.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvm_sriov.ib import guid
from kvm_sriov.node import qualify
from kvm_sriov.vf import pool as pool_mod
from tests.conftest import REPO
from tests.unit.kvm_sriov.node import test_qualify as base
from tests.unit.kvm_sriov.node.test_qualify import by_name, qualify_args

fake_qemu, host = base.fake_qemu, base.host   # test_qualify's fixture hosts

PF = "0000:41:00.0"
NAME = f"PF {PF} GUID write test"
WRITTEN = guid.port_guid(qualify.WRITE_TEST_MAC)


def guid_files(cfg) -> dict:
    """Every VF GUID file of the fixture's PF, by path: what must come back."""
    sriov = cfg.sysfs_root / "sys/bus/pci/devices" / PF / "sriov"
    return {str(f.relative_to(sriov)): f.read_text().strip() for f in sorted(sriov.glob("*/*"))}


def pool_left(cfg) -> tuple[list, list, list]:
    """(assignments, GUID records, intents) the pool keeps after the run."""
    db = pool_mod.read_only(cfg.pool_db)
    if db is None:
        return [], [], []
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return (db.execute("SELECT vf, vm_id FROM assignment").fetchall(),
                db.execute("SELECT vf, port_guid FROM guid").fetchall() if "guid" in tables else [],
                db.execute("SELECT vm_id, action FROM intent").fetchall())
    finally:
        db.close()


def test_the_default_run_writes_nothing(host):
    cfg = host("connectx7")
    before = guid_files(cfg)
    assert "GUID write test" not in " ".join(c.name for c in qualify.run(cfg))
    assert guid_files(cfg) == before
    assert not cfg.state_dir.exists()   # not even the pool: nothing taken, nothing made


def test_a_guid_written_read_back_restored_and_the_vf_given_back(host, monkeypatch):
    cfg = host("connectx7")
    before = guid_files(cfg)
    seen = []
    real = qualify._guid_state

    def watching(backend):   # the pool's view each time the VF's GUID is read
        seen.append((real(backend).port, pool_left(cfg)[0]))
        return real(backend)
    monkeypatch.setattr(qualify, "_guid_state", watching)
    got = by_name(qualify.run(cfg, write=True))[NAME]
    assert got.status == "PASS", got
    vf_index = got.detail.split()[1]   # 'VF 0000:41:00.<n+1> (...)': what that VF had is what it has again
    had = before[f"{int(vf_index[-1]) - 1}/policy"]
    assert f"{WRITTEN} written, read back, restored to {guid.ALL_F} ({had}); the VF is free again" in got.detail
    written = [held for port, held in seen if port == WRITTEN]
    assert written and all(held and held[0][1] == qualify.WRITE_TEST_VM for held in written)   # held meanwhile
    assert guid_files(cfg) == before
    assert pool_left(cfg) == ([], [], [])


def test_a_write_the_vf_ignores_fails_and_leaves_everything_as_it_was(host, monkeypatch):
    cfg = host("connectx7")
    before = guid_files(cfg)
    real_write = guid.Mlx5Sysfs.write
    monkeypatch.setattr(guid.Mlx5Sysfs, "write", lambda self, port, node, policy:  # the port file keeps its value
                        real_write(self, None, node, policy))
    got = by_name(qualify.run(cfg, write=True))[NAME]
    assert got.status == "FAIL" and f"wrote port GUID {WRITTEN} but it reads back {guid.ALL_F}" in got.detail
    assert guid_files(cfg) == before
    assert pool_left(cfg) == ([], [], [])


@pytest.mark.parametrize("error", [RuntimeError("a bug between write and restore"), KeyboardInterrupt()])
def test_a_failure_after_the_write_still_restores_and_releases(host, monkeypatch, error):
    cfg = host("connectx7")
    before = guid_files(cfg)
    real = qualify._guid_state

    def failing(backend):
        state = real(backend)
        if state.port == WRITTEN:
            raise error
        return state
    monkeypatch.setattr(qualify, "_guid_state", failing)
    if isinstance(error, KeyboardInterrupt):     # not caught: it goes on up, after the clean-up
        with pytest.raises(KeyboardInterrupt):
            qualify.run(cfg, write=True)
    else:
        got = by_name(qualify.run(cfg, write=True))[NAME]
        assert got.status == "FAIL" and "RuntimeError: a bug between write and restore" in got.detail
    assert guid_files(cfg) == before
    assert pool_left(cfg) == ([], [], [])


def test_a_restore_that_fails_is_a_fail_the_record_kept_for_reconcile(host, monkeypatch):
    cfg = host("connectx7")
    real_write = guid.Mlx5Sysfs.write

    def no_restore(self, port, node, policy):
        if port == guid.ALL_F:
            raise guid.DriverError(f"cannot write {port} to {self.folder}/port: Device or resource busy")
        real_write(self, port, node, policy)
    monkeypatch.setattr(guid.Mlx5Sysfs, "write", no_restore)
    got = by_name(qualify.run(cfg, write=True))[NAME]
    assert got.status == "FAIL" and f"GUID {WRITTEN} written and read back, but not restored" in got.detail
    assert "kvm-sriov reconcile" in got.fix
    assignments, records, intents = pool_left(cfg)
    assert assignments == [] and intents == []                 # the VF is free again ...
    assert [port for _vf, port in records] == [WRITTEN]        # ... and its record restores it later


def test_no_free_vf_is_a_warn_and_takes_nothing(host):
    cfg = host("connectx7")
    pool = pool_mod.VfPool(cfg.pool_db)
    vfs = ["0000:41:00.1", "0000:41:00.2", "0000:41:00.3", "0000:41:00.4"]
    with pool.transaction() as txn:   # four deploys that have reserved and not yet started their domains
        for n, vf in enumerate(vfs):
            txn.add(vf, PF, 100 + n, f"one-{100 + n}", f"02:00:0a:00:00:0{n}", "reserved", "deploy")
    pool.close()
    before = guid_files(cfg)
    got = by_name(qualify.run(cfg, write=True))[NAME]
    assert got.status == "WARN" and got.detail.startswith("no VF taken")
    assert guid_files(cfg) == before
    assert sorted(vf for vf, _ in pool_left(cfg)[0]) == vfs


def test_write_test_needs_libvirt_and_the_driver_writing_guids(host):
    cfg = host("connectx7")
    got = by_name(qualify.run(cfg, libvirt_check=False, write=True))["GUID write test"]
    assert got.status == "FAIL" and "--no-libvirt" in got.detail
    got = by_name(qualify.run(cfg._replace(guid_policy="none"), write=True))["GUID write test"]
    assert got.status == "SKIP"
    assert not cfg.state_dir.exists()


def test_the_option_on_both_command_lines(host, capsys):
    cfg = host("connectx7")
    assert qualify_args([]).write_test is False
    assert qualify.run_command(cfg, qualify_args(["--write-test"])) == 0
    assert f"[PASS] {NAME}" in capsys.readouterr().out
    done = subprocess.run([sys.executable, str(REPO / "bin" / "kvm-sriov"), "qualify", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--write-test" in done.stdout


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_planted_guid_files_are_never_written_through(host, tmp_path, plant):
    """The library opens a VF's GUID files for writing as they are: under a
    root qualify is pointed at, a link would carry the write elsewhere and a
    FIFO would block it. qualify looks first."""
    import os
    cfg = host("connectx7")
    target = tmp_path / "not-sysfs.txt"
    target.write_text("precious\n")
    sriov = cfg.sysfs_root / "sys/bus/pci/devices" / PF / "sriov"
    for port in sriov.glob("*/port"):
        port.unlink()
        os.symlink(target, port) if plant == "link" else os.mkfifo(port)
    got = by_name(qualify.run(cfg, write=True))[NAME]
    assert got.status == "FAIL" and "nothing written" in got.detail
    assert target.read_text() == "precious\n"
    assert pool_left(cfg)[:2] == ([], [])
