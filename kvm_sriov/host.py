"""This host as the actions see it: its VFs, its pool and its libvirt.

Every pool change that depends on libvirt happens inside one pool
transaction that first reconciles with libvirt, so concurrent actions (and
actions after a crash) always decide from the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

from . import discovery, guid, numa, policy, reconcile
from .config import Config
from .discovery import HostInventory, VirtualFunction
from .hypervisor import Hypervisor
from .pool import Assignment, VfPool
from .sysfs import Sysfs


@dataclass(frozen=True)
class Allocation:
    request: policy.VfRequest
    vf: VirtualFunction


class Host:
    def __init__(self, config: Config, hypervisor: Optional[Hypervisor] = None):
        self.config = config
        self._hypervisor = hypervisor

    @cached_property
    def sysfs(self) -> Sysfs:
        return Sysfs(self.config.sysfs_root)

    @cached_property
    def inventory(self) -> HostInventory:
        return discovery.discover(self.sysfs, self.config.pfs, self.config.skip_vfs_in_host_use)

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
        if self._hypervisor is not None:
            self._hypervisor.close()

    def _pool_vfs(self) -> dict[str, str]:
        return {vf.address: vf.pf for vf in self.inventory.vfs}

    def reconcile(self, dry_run: bool = False) -> list[reconcile.Change]:
        with self.pool.transaction() as txn:
            live = self.hypervisor.live_state()
            changes = reconcile.plan(txn.assignments(), live, self._pool_vfs(),
                                     self.config.reservation_grace_seconds)
            if not dry_run:
                reconcile.apply(txn, changes)
        return changes

    def reserve(self, vm_id: int, domain: str, requests: Sequence[policy.VfRequest],
                op: str, numa_nodes=None, numa_policy: str = "ignore") -> list[Allocation]:
        """Take one VF per request for a VM that is not running yet.

        All or nothing: on any error the pool is exactly as before.
        """
        if not requests:
            return []
        with self.pool.transaction() as txn:
            live = self.hypervisor.live_state()
            reconcile.apply(txn, reconcile.plan(txn.assignments(), live, self._pool_vfs(),
                                                self.config.reservation_grace_seconds))
            if domain not in live.domains:
                txn.release_vm(vm_id)  # leftovers of an earlier life of this VM
            taken = txn.held() | set(live.hostdevs)
            free = [vf for vf in self.inventory.eligible_vfs() if vf.address not in taken]
            pfs = {pf.address: pf for pf in self.inventory.pfs}
            chosen = policy.choose(requests, free, pfs, numa_nodes, numa_policy)
            for req, vf in zip(requests, chosen):
                txn.add(vf.address, vf.pf, vm_id, domain, req.mac, "reserved", op)
        return [Allocation(r, v) for r, v in zip(requests, chosen)]

    def mark_attached(self, allocations: Sequence[Allocation], op: str) -> None:
        with self.pool.transaction() as txn:
            txn.set_state([a.vf.address for a in allocations], "attached", op)

    def release(self, allocations: Sequence[Allocation]) -> None:
        with self.pool.transaction() as txn:
            txn.release([a.vf.address for a in allocations])

    def release_vm(self, vm_id: int) -> list[Assignment]:
        with self.pool.transaction() as txn:
            return txn.release_vm(vm_id)

    def assignments(self, vm_id: Optional[int] = None) -> list[Assignment]:
        with self.pool.transaction() as txn:
            return txn.assignments(vm_id)

    # -- InfiniBand (issue 4): GUIDs of the VFs, NUMA facts -------------------
    @cached_property
    def numa_nodes(self) -> dict[int, set[int]]:
        return numa.host_nodes(self.sysfs)

    def _log(self, level: str, message: str) -> None:
        from .opennebula import log
        log(level, message)

    def program_guids(self, vm_id: int, allocations: Sequence[Allocation]) -> list[guid.GuidRecord]:
        """Set each allocated VF's port/node GUID from its NIC's MAC (before the VM starts).

        All or nothing: on a collision or a write error the VFs already done
        get their old GUIDs back and the error is raised.
        """
        if self.config.guid_policy == "none" or not allocations:
            return []
        with self.pool.transaction() as txn:
            guid.restore_orphans(txn.db, self.sysfs, self.inventory, self.config.ip_command, self._log)
            done = []
            try:
                for a in allocations:
                    rec = guid.program(txn.db, self.sysfs, self.inventory, a.vf, a.request.mac,
                                       vm_id, self.config.ip_command, self._log)
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

    def guid_records(self) -> list[guid.GuidRecord]:
        with self.pool.transaction() as txn:
            return guid.records(txn.db)
