"""This host's figures: VFs per PF and NUMA node, PFs held whole, VFs left
assigned, operations in flight and shared-memory regions against their budget.

Read-only, as the monitoring probe reads: the pool through a read-only SQLite
connection (one committed state, no pool lock, nothing written; no pool yet is
zeros), VFs through availability.scan (the one definition of usable and free),
libvirt's running domains only when the pool holds VFs. Which VFs are "left
assigned" is reconcile.plan's answer, not a rule of this module: the VFs it
would free because their domain is not running (attached ones at once, reserved
ones after the grace period, none of a VM an action is working on).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from typing import NamedTuple, Optional

from ..config import Config
from ..errors import ConfigError, DriverError
from ..ivshmem import region as ivshmem_region
from ..node import reconcile
from ..vf import availability, intents, pool
from ..vf.pool import Assignment, Transaction

MB = 1 << 20


class PfVfs(NamedTuple):
    pf: str
    numa_node: int          # -1: unknown
    free: int
    used: int               # usable VFs the pool holds


class PoolState(NamedTuple):
    assignments: list[Assignment]
    whole_pfs: dict[str, int]  # PF passed through whole -> its VM
    intents: list[intents.Intent]
    regions: dict[str, int]  # shared-memory region -> size in MB


class HostFigures(NamedTuple):
    pfs: list[PfVfs]
    left_assigned: Optional[dict[str, int]]  # PF -> VFs; None: libvirt could not be asked
    libvirt_up: Optional[bool]               # None: not asked (the pool holds no VF)
    operations: dict[str, int]               # active | abandoned -> count
    regions: dict[str, int]
    budget_mb: int
    whole_pfs: dict[str, int]                # PF passed through whole -> its VM (its VFs are off)


def read_pool(db_path) -> PoolState:
    """Assignments, intents and regions of one committed state; empty when
    there is no pool yet. DriverError when it cannot be read."""
    db = pool.read_only(db_path, timeout=2)
    if db is None:
        if not os.path.lexists(db_path):
            return PoolState([], {}, [], {})
        raise DriverError(f"cannot read the VF pool {db_path}: not a pool database (yet)")
    try:
        db.execute("BEGIN")
        txn = Transaction(db)
        regions = {}
        # a pool made before shared memory has no region table (ivshmem/table.py makes it)
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ivshmem_region'").fetchone():
            regions = dict(db.execute("SELECT name, size_mb FROM ivshmem_region"))
        # nor one made before whole PFs a pf_assignment table (pool.py makes it on the next action)
        whole = dict(db.execute("SELECT pf, vm_id FROM pf_assignment")) if db.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'pf_assignment'").fetchone() else {}
        return PoolState(txn.assignments(), whole, intents.all_intents(txn), regions)
    except sqlite3.Error as exc:
        raise DriverError(f"cannot read the VF pool {db_path}: {exc}") from None
    finally:
        db.close()


def read(cfg: Config, hypervisor=None, now: Optional[float] = None) -> HostFigures:
    """hypervisor: anything with live_state() (default: libvirt at cfg.libvirt_uri)."""
    now = time.time() if now is None else now
    state = read_pool(cfg.pool_db)
    host = availability.scan(cfg)
    if host.error:
        raise ConfigError(host.error)
    held = {a.vf for a in state.assignments}
    pfs = []
    for entry in host.pfs:
        n = availability.counts(entry.vfs, held)
        node = entry.pf.numa_node if entry.pf.numa_node is not None else -1
        pfs.append(PfVfs(entry.pf.address, node, n.free, n.total - n.free))
    active = {i.vm_id for i in state.intents if intents.is_active(i, cfg.state_dir, now)}
    operations = {"active": len(active), "abandoned": len(state.intents) - len(active)}
    left: Optional[dict[str, int]] = {p.pf: 0 for p in pfs}
    libvirt_up = None
    if state.assignments:
        pool_vfs = {v.address: entry.pf.address for entry in host.pfs for v in entry.vfs}
        try:
            live = _live_state(cfg, hypervisor)
            libvirt_up = True
        except (DriverError, ImportError):  # libvirt down, or no python3-libvirt (a front-end)
            left, libvirt_up = None, False
        else:
            abandoned = frozenset(i.vm_id for i in state.intents) - active
            changes = reconcile.plan(state.assignments, live, pool_vfs, cfg.reservation_grace_seconds,
                                     now, frozenset(active), abandoned)
            left.update(Counter(c.pf for c in changes if c.kind == "free" and c.domain not in live.domains))
    return HostFigures(pfs, left, libvirt_up, operations, state.regions,
                       ivshmem_region.host_budget_mb(cfg.ivshmem_max_host_mb),
                       state.whole_pfs)


def _live_state(cfg: Config, hypervisor):
    if hypervisor is not None:
        return hypervisor.live_state()
    from ..domain.hypervisor import Hypervisor
    hv = Hypervisor(cfg.libvirt_uri)
    try:
        return hv.live_state()
    finally:
        hv.close()


def families(figures: HostFigures) -> list:
    """The metric families (prometheus_client) of these figures."""
    from prometheus_client.core import GaugeMetricFamily
    vfs = GaugeMetricFamily("kvm_sriov_vfs", "Usable VFs of a pool PF, free or used (held in the VF pool)",
                            labels=["pf", "numa_node", "state"])
    for p in figures.pfs:
        vfs.add_metric([p.pf, str(p.numa_node), "free"], p.free)
        vfs.add_metric([p.pf, str(p.numa_node), "used"], p.used)
    out = [vfs]
    # a PF a VM holds whole shows no VFs above: this says why
    whole = GaugeMetricFamily("kvm_sriov_whole_pf_assigned",
                              "1 while a VM holds the PF passed through whole (its VFs switched off)",
                              labels=["pf", "vm"])
    for pf, vm in sorted(figures.whole_pfs.items()):
        whole.add_metric([pf, str(vm)], 1)
    out.append(whole)
    if figures.left_assigned is not None:
        left = GaugeMetricFamily("kvm_sriov_vfs_left_assigned",
                                 "VFs the pool gives to a VM libvirt does not run, which reconcile frees",
                                 labels=["pf"])
        for pf, n in sorted(figures.left_assigned.items()):
            left.add_metric([pf], n)
        out.append(left)
    if figures.libvirt_up is not None:
        out.append(GaugeMetricFamily("kvm_sriov_libvirt_up",
                                     "1 when libvirt answered the driver's user (asked when the pool holds VFs)",
                                     value=int(figures.libvirt_up)))
    ops = GaugeMetricFamily("kvm_sriov_operations_in_flight",
                            "Multi-step actions recorded in the pool's intents: active (its action holds the "
                            "VM lock or a lease) or abandoned (its action died; reconcile converges it)",
                            labels=["state"])
    for state in ("active", "abandoned"):
        ops.add_metric([state], figures.operations.get(state, 0))
    out.append(ops)
    out.append(GaugeMetricFamily("kvm_sriov_ivshmem_regions", "Shared-memory regions on this host",
                                 value=len(figures.regions)))
    sizes = GaugeMetricFamily("kvm_sriov_ivshmem_region_size_bytes", "Size of a shared-memory region",
                              labels=["region"])
    for name, mb in sorted(figures.regions.items()):
        sizes.add_metric([name], mb * MB)
    out.append(sizes)
    out.append(GaugeMetricFamily("kvm_sriov_ivshmem_used_bytes", "What all shared-memory regions take",
                                 value=sum(figures.regions.values()) * MB))
    out.append(GaugeMetricFamily("kvm_sriov_ivshmem_budget_bytes",
                                 "What all regions may take together (ivshmem.max_host_mb, 0: half of /dev/shm)",
                                 value=figures.budget_mb * MB))
    return out
