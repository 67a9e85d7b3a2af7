"""This host as the actions see it: its VFs, its pool and its libvirt.

Every pool change that depends on libvirt happens inside one pool
transaction that first reconciles with libvirt, so concurrent actions (and
actions after a crash) always decide from the truth. Multi-step actions run
inside :meth:`Host.operation`, which holds the VM's lock and records what
they are doing (intents.py), so a crash at any step can be undone.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, Sequence

from .. import failpoints
from ..config import Config
from ..domain.hypervisor import Hypervisor, LiveState
from ..errors import DriverError
from ..ib import guid
from ..ivshmem import host as ivshmem_host, table as ivshmem_table
from ..opennebula import log
from ..vf import discovery, intents, numa, policy, whole_pf
from ..vf.discovery import HostInventory, PhysicalFunction, VirtualFunction
from ..vf.gpu_affinity import GpuWish
from ..vf.pool import Assignment, PfAssignment, Transaction, VfPool
from ..vf.sysfs import Sysfs
from . import monitor, prewarm, reconcile, traffic, whole_pfs


class _Index(NamedTuple):
    inventory: HostInventory
    pool_vfs: dict[str, str]                              # VF -> PF, every VF of the pool's PFs
    pfs: dict[str, PhysicalFunction]                      # by address
    by_pf: dict[str, tuple[VirtualFunction, ...]]         # eligible VFs per PF, by index
    pf_of: dict[str, str]                                 # eligible VF -> PF


class Allocation(NamedTuple):
    request: policy.VfRequest
    vf: VirtualFunction


class Operation:
    """One action on one VM: steps are recorded, and are kill points for tests."""

    def __init__(self, host: "Host", vm_id: int, action: str):
        self.host, self.vm_id, self.action = host, vm_id, action

    def step(self, name: str, **data) -> None:
        with self.host.pool.transaction() as txn:
            intents.advance(txn, self.vm_id, name, **data)
        failpoints.reached(self.action, name)


class Host:
    def __init__(self, config: Config, hypervisor: Optional[Hypervisor] = None,
                 remotes_dir: Optional[Path] = None):
        self.config = config
        self._hypervisor = hypervisor
        self.remotes_dir = remotes_dir  # where OpenNebula's own kvm driver sits too

    @cached_property
    def sysfs(self) -> Sysfs:
        return Sysfs(self.config.sysfs_root)

    @cached_property
    def inventory(self) -> HostInventory:
        return discovery.discover(self.sysfs, self.config.pfs, self.config.skip_vfs_in_host_use,
                                  self.config.exclude_vfs)

    def forget_inventory(self) -> None:
        """A PF's VFs went or came back: the next look reads sysfs again."""
        self.__dict__.pop("inventory", None)

    @cached_property
    def pool(self) -> VfPool:
        return VfPool(self.config.pool_db, self.config.lock_seconds)

    @property
    def hypervisor(self) -> Hypervisor:
        if self._hypervisor is None:
            self._hypervisor = Hypervisor(self.config.libvirt_uri)
        return self._hypervisor

    def close(self) -> None:
        if "pool" in self.__dict__:
            self.pool.close()
            if self.pool.changed:  # every pool-changing action ends here
                monitor.refresh(config=self.config)
        if self._hypervisor is not None:
            self._hypervisor.close()

    # -- operations and reconciliation ------------------------------------
    @contextmanager
    def operation(self, vm_id: int, action: str, **data) -> Iterator[Operation]:
        with intents.VmLock(self.config.state_dir, vm_id, self.config.lock_seconds):
            with self.pool.transaction() as txn:
                intents.record(txn, vm_id, action, "begin", data)
            failpoints.reached(action, "begin")
            try:
                yield Operation(self, vm_id, action)
            finally:
                with self.pool.transaction() as txn:
                    intents.clear(txn, vm_id)

    def _inventory_index(self) -> "_Index":
        """What every reservation needs while it holds the pool lock (which
        every other action on this host is waiting for), built once per
        inventory."""
        inv = self.inventory
        index = self.__dict__.get("_index")
        if index is None or index.inventory is not inv:
            eligible = inv.eligible_vfs()
            by_pf: dict[str, list[VirtualFunction]] = {}
            for vf in sorted(eligible, key=lambda v: (v.pf, v.index)):
                by_pf.setdefault(vf.pf, []).append(vf)
            index = _Index(inv, {v.address: v.pf for v in inv.vfs},
                           {pf.address: pf for pf in inv.pfs},
                           {pf: tuple(vfs) for pf, vfs in by_pf.items()},
                           {v.address: v.pf for v in eligible})
            self.__dict__["_index"] = index
        return index

    def _reconcile_in(self, txn: Transaction, live: LiveState, dry_run: bool = False
                      ) -> tuple[list[reconcile.Change], LiveState, list[Assignment]]:
        """Reconcile with ``live``, a snapshot taken before the pool lock (to
        keep the lock short). An action that finished in between (a deploy
        that started its domain and marked its VF attached) would look like
        a VF whose domain is gone: so whatever the early snapshot would
        free is decided again from one taken now, under the lock. Returns
        the changes, the snapshot they were decided from and the pool's
        assignments before them."""
        now = time.time()
        pending = intents.all_intents(txn)
        busy = frozenset(i.vm_id for i in pending if intents.is_active(i, self.config.state_dir, now))
        abandoned = frozenset(i.vm_id for i in pending) - busy
        pool_vfs = self._inventory_index().pool_vfs
        assignments = txn.assignments()
        grace = self.config.reservation_grace_seconds
        held_whole = txn.pf_assignments()
        whole = frozenset(h.pf for h in held_whole)
        changes = reconcile.plan(assignments, live, pool_vfs, grace, now, busy, abandoned, whole)
        pf_changes = reconcile.plan_pfs(held_whole, live, grace, now, busy, abandoned)
        if any(c.kind == "free" for c in changes + pf_changes):
            live = self.hypervisor.live_state()
            changes = reconcile.plan(assignments, live, pool_vfs, grace, now, busy, abandoned, whole)
            pf_changes = reconcile.plan_pfs(held_whole, live, grace, now, busy, abandoned)
        if not dry_run:
            for i in pending:  # an incoming migration given up (its lease ran out): its pre-warm undone first
                if i.vm_id in abandoned and i.action == "migrate-in":
                    prewarm.revert_in(self, txn, [a.vf for a in assignments if a.vm_id == i.vm_id
                                                  and a.vf not in live.hostdevs], prewarm.moved_by(i))
            reconcile.apply(txn, changes, now)
            whole_pfs.give_back_planned(self, txn, reconcile.apply_pfs(txn, pf_changes, now), held_whole, live)
            for i in pending:  # remote leftovers are cleared once the peer has let go
                if i.vm_id in abandoned and not intents.remote_pending(i) and not ivshmem_table.user_of(txn.db, i.vm_id):
                    intents.clear(txn, i.vm_id)  # (a region user's is cleared by its reconcile)
        return changes + pf_changes, live, assignments

    def reconcile(self, dry_run: bool = False) -> list:
        """Pool := libvirt's truth; also undoes what dead migrations left on
        their destinations, and settles shared-memory regions (ivshmem)."""
        live = self.hypervisor.live_state()
        with self.pool.transaction() as txn:
            changes, _, _ = self._reconcile_in(txn, live, dry_run)
            remote = [i for i in intents.all_intents(txn) if intents.remote_pending(i)
                      and not intents.is_active(i, self.config.state_dir)]
        if not dry_run:
            self._release_remote_reservations(remote)
        return changes + ivshmem_host.reconcile(self, dry_run)

    def _release_remote_reservations(self, abandoned) -> None:
        """A migration source that died may have left VFs reserved on the
        destination under a lease: give back those its domain does not hold."""
        from .peer import Peer  # here: its subprocess import is ~2 ms of every action
        for intent in abandoned:
            try:
                Peer(self.config, intent.data["dest"]).release(intent.vm_id)
            except Exception as exc:  # kept for the next reconcile; the lease expires anyway
                self._log("WARN", f"could not release VM {intent.vm_id}'s reservation on "
                                  f"{intent.data['dest']}: {exc}")
                continue
            with self.pool.transaction() as txn:
                intents.clear(txn, intent.vm_id)

    # -- the pool ------------------------------------------------------------
    def reserve(self, vm_id: int, domain: str, requests: Sequence[policy.VfRequest],
                op: str, lease_seconds: Optional[float] = None, numa_nodes=None,
                numa_policy: str = "ignore", gpus: Optional[GpuWish] = None,
                carried: Optional[tuple] = None) -> list[Allocation]:
        """Take one VF per request for a VM (a whole PF per whole_pf request:
        its VFs switched off once its row is committed); all or nothing.

        gpus: the VM's passed-through GPUs and how close each PF is to them,
        when it asks for VFs close to them (policy.choose).

        carried: the IB traffic totals oned shows for the VM (traffic.known_totals),
        kept with its VFs so this host's probe goes on from them (traffic.carry).

        lease_seconds: keep the reservation (as an intent with a lease) while
        another host drives the work, e.g. an incoming live migration.
        """
        if not requests:
            return []
        # Asked before taking the pool lock, to keep the lock short: a domain
        # that starts meanwhile holds VFs the pool already has, and nothing
        # is freed on this snapshot's word alone (_reconcile_in).
        live = self.hypervisor.live_state()
        index = self._inventory_index()
        with self.pool.transaction() as txn:
            changes, live, before = self._reconcile_in(txn, live)
            # leftovers of an earlier life of this VM (a new VM has none: its
            # rows are the ones read above or given to it by reconcile)
            earlier_pfs = txn.pf_assignments(vm_id) if domain not in live.domains else []
            if domain not in live.domains and (any(a.vm_id == vm_id for a in before)
                                               or any(c.vm_id == vm_id for c in changes) or earlier_pfs):
                txn.release_vm(vm_id)
                for row in earlier_pfs:
                    whole_pfs.give_back_in(self, txn, row, live)
            if "inventory" not in self.__dict__:  # a PF given back above: its VFs are there again
                index = self._inventory_index()
            taken = txn.held()
            taken.update(live.hostdevs)
            held_whole = {h.pf: h.vm_id for h in txn.pf_assignments()}
            free = policy.FreeVfs(index.by_pf, taken, index.pf_of)  # no pass over every VF
            for pf in held_whole:
                free.take_pf(pf)  # its VFs are gone, or going
            why_not = whole_pfs.refusals(self, txn, taken, held_whole) if any(r.whole_pf for r in requests) else {}
            chosen = policy.choose_all(requests, free, index.pfs, why_not, numa_nodes, numa_policy, gpus)
            for req, vf in zip(requests, chosen):
                if whole_pf.is_whole(vf):
                    txn.add_pf(vf.address, vm_id, domain, req.mac, "reserved", op,
                               whole_pf.num_vfs(self.sysfs, vf.address))
                else:
                    txn.add(vf.address, vf.pf, vm_id, domain, req.mac, "reserved", op)
            traffic.carry(txn, vm_id, carried)
            if lease_seconds is not None:
                intents.record(txn, vm_id, op, "reserved", {"vfs": [v.address for v in chosen]},
                               expires=time.time() + lease_seconds)
        allocations = [Allocation(r, v) for r, v in zip(requests, chosen)]
        whole_pfs.switch_off(self, allocations)
        return allocations

    def mark_attached(self, allocations: Sequence[Allocation], op: str) -> None:
        with self.pool.transaction() as txn:
            txn.set_state([a.vf.address for a in allocations if not whole_pf.is_whole(a.vf)], "attached", op)
            txn.set_pf_state([a.vf.address for a in allocations if whole_pf.is_whole(a.vf)], "attached", op)

    def release(self, allocations: Sequence[Allocation]) -> None:
        """Free the VFs; the whole PFs back to the host (raises when one cannot be)."""
        whole = {a.vf.address for a in allocations if whole_pf.is_whole(a.vf)}
        with self.pool.transaction() as txn:
            txn.release([a.vf.address for a in allocations if a.vf.address not in whole])
            rows = [h for h in txn.pf_assignments() if h.pf in whole]
        whole_pfs.give_back(self, rows)

    def release_vm(self, vm_id: int) -> list[Assignment]:
        """Free the VM's VFs, then give its whole PFs back to the host (one
        that cannot be is said in the VM log and stays held: kvm-sriov
        reconcile tries again); returns the VFs."""
        with self.pool.transaction() as txn:
            gone = txn.release_vm(vm_id)
            rows = txn.pf_assignments(vm_id)
        try:
            whole_pfs.give_back(self, rows)
        except DriverError:
            pass  # logged, the PF still held: never a VF or PF given twice
        return gone

    def pf_assignments(self, vm_id: Optional[int] = None) -> list[PfAssignment]:
        with self.pool.transaction() as txn:
            return txn.pf_assignments(vm_id)

    def assignments(self, vm_id: Optional[int] = None) -> list[Assignment]:
        with self.pool.transaction() as txn:
            return txn.assignments(vm_id)

    def allocations_of(self, vm_id: int, bridges: dict[str, str]) -> list[Allocation]:
        """The VM's current VFs and whole PFs as allocations (bridges: MAC -> BRIDGE)."""
        out = []
        with self.pool.transaction() as txn:
            held, whole = txn.assignments(vm_id), txn.pf_assignments(vm_id)
        for a in held:
            vf = self.inventory.vf(a.vf)
            if vf is not None:
                selector = bridges.get(a.mac, "").partition(":")[2] or None
                out.append(Allocation(policy.VfRequest(a.mac, selector), vf))
        for h in whole:
            pf = self.inventory.pf(h.pf)
            if pf is not None:
                selector = bridges.get(h.mac, "").partition(":")[2] or None
                out.append(Allocation(policy.VfRequest(h.mac, selector, True), whole_pf.as_device(pf)))
        return out

    # -- InfiniBand: GUIDs of the VFs, NUMA facts -----------------------------
    @cached_property
    def numa_nodes(self) -> dict[int, set[int]]:
        return numa.host_nodes(self.sysfs)

    def _log(self, level: str, message: str) -> None:
        log(level, message)

    def program_guids(self, vm_id: int, allocations: Sequence[Allocation],
                      spaces: Optional[dict] = None) -> list[guid.GuidRecord]:
        """Set each allocated VF's port/node GUID from its NIC's MAC and the
        network that leases it (spaces: MAC -> network ID, guid.from_mac;
        a MAC without one gets the MAC-only GUID), before the VM starts.

        All or nothing: on a collision or a write error the VFs already done
        get their old GUIDs back and the error is raised. A whole PF's
        port GUID is its own (burned in): nothing is written to it.
        """
        allocations = [a for a in allocations if not whole_pf.is_whole(a.vf)]
        if self.config.guid_policy == "none" or not allocations:
            return []
        with self.pool.transaction() as txn:
            guid.restore_orphans(txn.db, self.sysfs, self.inventory, self.config.ip_command, self._log)
            done = []
            try:
                for a in allocations:
                    rec = guid.program(txn.db, self.sysfs, self.inventory, a.vf, a.request.mac,
                                       vm_id, self.config.ip_command, self._log,
                                       space=(spaces or {}).get(a.request.mac))
                    if rec is not None:
                        done.append(rec)
            except BaseException:
                guid.restore(txn.db, self.sysfs, self.inventory, [r.vf for r in done],
                             self.config.ip_command, self._log)
                raise
        return done

    def restore_guids(self, vm_id: int) -> list[guid.GuidRecord]:
        """Give the VM's VFs their original GUIDs back (policy Down when unknown)."""
        with self.pool.transaction() as txn:
            return guid.restore_vm(txn.db, self.sysfs, self.inventory, vm_id,
                                   self.config.ip_command, self._log)

    def restore_vf_guids(self, vfs: Sequence[str]) -> list[guid.GuidRecord]:
        """Original GUIDs back for these VFs only (one NIC leaving a VM)."""
        with self.pool.transaction() as txn:
            return guid.restore(txn.db, self.sysfs, self.inventory, list(vfs),
                                self.config.ip_command, self._log)

    def guid_records(self) -> list[guid.GuidRecord]:
        with self.pool.transaction() as txn:
            return guid.records(txn.db)
