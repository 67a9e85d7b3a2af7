"""Rung 1: the host's figures (kvm_sriov/metrics/host.py) on the fake sysfs host:
VFs per PF and NUMA node, VFs left assigned (reconcile's answer), operations in
flight, shared-memory regions; read-only, without the pool's lock."""

import os
import sqlite3
import threading
import time

import pytest

from kvm_sriov.domain.hypervisor import DomainRef, LiveState
from kvm_sriov.errors import DriverError, HypervisorError
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.ivshmem.device import Request
from kvm_sriov.metrics import host
from kvm_sriov.vf import intents
from kvm_sriov.vf.pool import VfPool

MLX5, MLX4 = "0000:03:00.0", "0000:81:00.0"


class Libvirt:
    """What libvirt runs: domain name -> the VFs it holds."""

    def __init__(self, domains=None, down=False):
        self.domains, self.down, self.asked = domains or {}, down, 0

    def live_state(self):
        self.asked += 1
        if self.down:
            raise HypervisorError("cannot connect to libvirt at qemu:///system: Failed to connect socket")
        refs = {name: DomainRef(name, f"uuid-{name}") for name in self.domains}
        return LiveState(refs, {vf: refs[name] for name, vfs in self.domains.items() for vf in vfs})


def pool_of(cfg):
    return VfPool(cfg.pool_db, cfg.lock_seconds)


def add(cfg, *rows, intent=None):
    """rows: (vf, pf, vm, state, seconds ago)."""
    p = pool_of(cfg)
    with p.transaction() as txn:
        for vf, pf, vm, state, ago in rows:
            txn.add(vf, pf, vm, f"one-{vm}", f"02:00:00:00:00:{vm:02x}", state, "deploy", now=time.time() - ago)
        for vm in intent or ():
            intents.record(txn, vm, "deploy", "begin", {})
    p.close()


def by_pf(figures):
    return {p.pf: (p.numa_node, p.free, p.used) for p in figures.pfs}


def test_no_pool_is_zeros_and_libvirt_is_not_asked(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    libvirt = Libvirt()
    figures = host.read(cfg, libvirt)
    # the usable VFs: 03:00.3 is in host use, 81:00.4 shares its IOMMU group; 04:00.0 has none enabled
    assert by_pf(figures) == {MLX5: (0, 3, 0), MLX4: (1, 3, 0), "0000:04:00.0": (0, 0, 0)}
    assert figures.left_assigned == {MLX5: 0, MLX4: 0, "0000:04:00.0": 0}
    assert figures.libvirt_up is None and libvirt.asked == 0
    assert figures.operations == {"active": 0, "abandoned": 0}
    assert figures.regions == {} and figures.budget_mb > 0
    assert not os.path.exists(cfg.state_dir)   # nothing made


def test_left_assigned_is_what_reconcile_would_free_because_the_domain_is_not_running(fake_host, make_config):
    cfg = make_config(fake_host["root"], pool={"reservation_grace_seconds": 300})
    add(cfg,
        ("0000:03:00.1", MLX5, 5, "attached", 10),    # running, holds it
        ("0000:03:00.2", MLX5, 6, "reserved", 10),    # a deploy about to start its domain: within the grace
        ("0000:03:00.4", MLX5, 7, "attached", 10),    # its domain is gone: left at once
        ("0000:81:00.1", MLX4, 8, "reserved", 900),   # reserved long ago, never started: left
        ("0000:81:00.2", MLX4, 5, "attached", 10))
    figures = host.read(cfg, Libvirt({"one-5": ["0000:03:00.1", "0000:81:00.2"]}))
    assert by_pf(figures) == {MLX5: (0, 0, 3), MLX4: (1, 1, 2), "0000:04:00.0": (0, 0, 0)}
    assert figures.left_assigned == {MLX5: 1, MLX4: 1, "0000:04:00.0": 0}
    assert figures.libvirt_up is True


def test_a_vm_an_action_works_on_is_left_alone_and_an_abandoned_one_gets_no_grace(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    add(cfg, ("0000:03:00.1", MLX5, 5, "attached", 10),   # shutdown in progress: domain gone, VM lock held
        ("0000:81:00.1", MLX4, 6, "reserved", 5),          # its deploy died (intent, no lock): no grace
        intent=(5, 6))
    with intents.VmLock(cfg.state_dir, 5, timeout=1):
        figures = host.read(cfg, Libvirt())
    assert figures.operations == {"active": 1, "abandoned": 1}
    assert figures.left_assigned == {MLX5: 0, MLX4: 1, "0000:04:00.0": 0}


def test_libvirt_unreachable_says_so_and_claims_nothing_about_left_vfs(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    add(cfg, ("0000:03:00.1", MLX5, 5, "attached", 10))
    figures = host.read(cfg, Libvirt(down=True))
    assert figures.libvirt_up is False and figures.left_assigned is None
    names = [f.name for f in host.families(figures)]
    assert "kvm_sriov_vfs_left_assigned" not in names
    assert [f.samples[0].value for f in host.families(figures) if f.name == "kvm_sriov_libvirt_up"] == [0]


def test_regions_and_the_budget_in_bytes(fake_host, make_config):
    cfg = make_config(fake_host["root"], ivshmem={"max_host_mb": 1024})
    p = pool_of(cfg)
    with p.transaction() as txn:
        ivshmem_table.add_user(txn.db, Request(3, 10, 256), 5, "one-5")
        ivshmem_table.add_user(txn.db, Request(3, 10, 256), 6, "one-6")   # joins the same region
        ivshmem_table.add_user(txn.db, Request(4, 11, 64), 7, "one-7")
    p.close()
    figures = host.read(cfg, Libvirt())
    assert figures.regions == {"kvm-sriov-ivshmem-u3-g10": 256, "kvm-sriov-ivshmem-u4-g11": 64}
    values = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in host.families(figures) for s in f.samples}
    assert values[("kvm_sriov_ivshmem_regions", ())] == 2
    assert values[("kvm_sriov_ivshmem_used_bytes", ())] == 320 << 20
    assert values[("kvm_sriov_ivshmem_budget_bytes", ())] == 1024 << 20
    assert values[("kvm_sriov_ivshmem_region_size_bytes", (("region", "kvm-sriov-ivshmem-u4-g11"),))] == 64 << 20



def test_a_pf_held_whole_is_named_with_its_vm_also_from_a_pool_older_than_whole_pfs(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    p = pool_of(cfg)
    with p.transaction() as txn:
        txn.add_pf("0000:04:00.0", 44, "one-44", "02:00:00:00:00:2c", "attached", "deploy", num_vfs=2)
    p.close()
    figures = host.read(cfg, Libvirt())
    assert figures.whole_pfs == {"0000:04:00.0": 44}
    values = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in host.families(figures) for s in f.samples}
    assert values[("kvm_sriov_whole_pf_assigned", (("pf", "0000:04:00.0"), ("vm", "44")))] == 1
    db = sqlite3.connect(cfg.pool_db)
    db.execute("DROP TABLE pf_assignment")     # as a pool made before whole PFs
    db.commit()
    db.close()
    figures = host.read(cfg, Libvirt())
    assert figures.whole_pfs == {} and by_pf(figures)[MLX5] == (0, 3, 0)


def files(folder):
    """name -> (size, mtime) of what is in the folder; SQLite's shared-memory index
    (-shm, where readers mark what they read) by name only."""
    return {f: (None if f.endswith("-shm") else (st.st_size, st.st_mtime_ns))
            for f, st in ((f, os.stat(folder / f)) for f in os.listdir(folder))}


def test_reading_takes_no_pool_lock_and_changes_no_file(fake_host, make_config):
    """A writer holds the pool (its flock and an open write transaction) the
    whole time: the figures still come, from the last committed state."""
    cfg = make_config(fake_host["root"])
    add(cfg, ("0000:03:00.1", MLX5, 5, "attached", 10))
    holding, done = threading.Event(), threading.Event()

    def writer():
        p = pool_of(cfg)
        with p.transaction() as txn:
            txn.add("0000:03:00.2", MLX5, 9, "one-9", "", "reserved", "deploy")   # not committed yet
            holding.set()
            done.wait(30)
        p.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert holding.wait(30)
        before = files(cfg.state_dir)
        figures = host.read(cfg, Libvirt({"one-5": ["0000:03:00.1"]}))
        after = files(cfg.state_dir)
    finally:
        done.set()
        t.join()
    assert by_pf(figures)[MLX5] == (0, 2, 1)   # VM 9's VF is not committed
    assert after == before


def test_a_pool_folder_of_another_user_is_one_clear_error(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    add(cfg, ("0000:03:00.1", MLX5, 5, "attached", 10))
    os.chmod(cfg.state_dir, 0o770)   # group-writable: another user could plant files
    with pytest.raises(DriverError, match="writable by group or others"):
        host.read(cfg, Libvirt())
