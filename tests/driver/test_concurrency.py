"""Rung 1: OpenNebula runs actions in parallel (-p); the pool must never
give one VF to two VMs, whatever the interleaving."""

import multiprocessing

from kvm_sriov.errors import PoolExhausted
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.vf.policy import VfRequest


def _reserve(cfg, vm_id, start, out):
    start.wait()
    host = Host(cfg, Hypervisor("test:///default"))
    try:
        got = host.reserve(vm_id, f"one-{vm_id}", [VfRequest(f"02:00:00:00:00:{vm_id:02x}")], "deploy")
        out.put((vm_id, got[0].vf.address))
    except PoolExhausted:
        out.put((vm_id, None))
    finally:
        host.close()


def test_parallel_reservations_never_share_a_vf(fake_host, make_config):
    cfg = make_config(fake_host["root"])
    start, out = multiprocessing.Event(), multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_reserve, args=(cfg, vm, start, out)) for vm in range(1, 11)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    granted = [vf for _, vf in results if vf]
    assert len(granted) == 6                      # the 6 eligible VFs of the reference host
    assert len(set(granted)) == len(granted)      # none twice
    rows = Host(cfg).assignments()
    assert sorted(a.vf for a in rows) == sorted(granted)


def _open_new_pool(path, start, out):
    from kvm_sriov.vf.pool import VfPool
    start.wait()
    pool = VfPool(path)
    try:
        with pool.transaction() as txn:
            txn.assignments()
        out.put(None)
    except Exception as exc:  # reported, not raised: the parent says which
        out.put(f"{type(exc).__name__}: {exc}")
    finally:
        pool.close()


def test_many_processes_opening_a_brand_new_pool_at_once(tmp_path):
    """The first actions on a fresh host all create the pool database at the
    same instant: setting it up (WAL mode, tables) must not fail any of them
    with 'database is locked'."""
    errors = []
    for attempt in range(30):
        path = tmp_path / f"fresh-{attempt}" / "pool.sqlite3"
        start, out = multiprocessing.Event(), multiprocessing.Queue()
        procs = [multiprocessing.Process(target=_open_new_pool, args=(path, start, out)) for _ in range(16)]
        for p in procs:
            p.start()
        start.set()
        errors += [e for e in (out.get(timeout=60) for _ in procs) if e]
        for p in procs:
            p.join()
    assert errors == []
