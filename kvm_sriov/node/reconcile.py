"""Make the pool agree with libvirt, which is the truth.

- A VF in a running domain's hostdevs is in use, by that domain.
- A VF the pool gives to a VM whose domain is not running is freed:
  at once when it was attached, after the grace period when it was only
  reserved (a deploy may be about to start the domain).
- A VF the pool gives to a running VM that does not hold it is freed after
  the grace period (it was unplugged behind our back).
- A VM whose action died midway (see intents.py) gets no grace period.

A PF passed through whole (pool.PfAssignment) follows the same rules
(plan_pfs); "free" then means given back: its VFs switched on again, then
its row removed (node/whole_pfs.py), which the caller does since it
touches sysfs. A PF found in a running domain without a row is not
adopted: the VF count it had is unknown, and nothing else can take it
while it sits on vfio-pci (whole_pf.problems).
"""

from __future__ import annotations

import time
from typing import Iterable, NamedTuple, Optional

from ..domain.hypervisor import LiveState
from ..vf.pool import Assignment, PfAssignment, Transaction


class Change(NamedTuple):
    kind: str   # free | attach | adopt | reassign
    vf: str
    pf: str
    vm_id: int
    domain: str
    why: str

    def __str__(self) -> str:
        return f"{self.kind:8} {self.vf} (VM {self.vm_id}, {self.domain}): {self.why}"


def plan(assignments: Iterable[Assignment], live: LiveState, pool_vfs: dict[str, str],
         grace: float, now: Optional[float] = None, busy_vms: frozenset = frozenset(),
         abandoned_vms: frozenset = frozenset(), whole_pfs: frozenset = frozenset()) -> list[Change]:
    """pool_vfs: VF address -> PF address for every VF of the pool's PFs.

    busy_vms: VMs an action is working on right now: left alone.
    abandoned_vms: VMs whose action died midway: no grace period for them.
    whole_pfs: PFs held whole: a VF of theirs in a domain is not adopted
    (the pool refuses it; their VFs are switched off or about to be).
    """
    now = time.time() if now is None else now
    changes = []
    assignments = list(assignments)
    known = {a.vf for a in assignments}
    for a in assignments:
        if a.vm_id in busy_vms:
            continue
        holder = live.hostdevs.get(a.vf)
        age = now - a.since + (grace + 1 if a.vm_id in abandoned_vms else 0)
        if holder is not None:
            if holder.name != a.domain:
                changes.append(Change("reassign", a.vf, a.pf, holder.vm_id, holder.name,
                                      f"libvirt shows it in {holder.name}, not {a.domain}"))
            elif a.state != "attached":
                changes.append(Change("attach", a.vf, a.pf, a.vm_id, a.domain, "running in its domain"))
        elif a.domain not in live.domains:
            if a.state == "attached" or age > grace:
                changes.append(Change("free", a.vf, a.pf, a.vm_id, a.domain,
                                      f"domain not running ({a.state} {age:.0f}s ago)"))
        elif age > grace:
            changes.append(Change("free", a.vf, a.pf, a.vm_id, a.domain,
                                  f"domain runs without it for {age:.0f}s"))
    for vf, holder in sorted(live.hostdevs.items()):
        if vf in pool_vfs and vf not in known and holder.vm_id not in busy_vms and pool_vfs[vf] not in whole_pfs:
            changes.append(Change("adopt", vf, pool_vfs[vf], holder.vm_id, holder.name,
                                  "in a running domain but not in the pool"))
    return changes


def plan_pfs(held: Iterable[PfAssignment], live: LiveState, grace: float, now: Optional[float] = None,
             busy_vms: frozenset = frozenset(), abandoned_vms: frozenset = frozenset()) -> list[Change]:
    """plan() for the PFs held whole ("free": give it back)."""
    rows = [Assignment(h.pf, h.pf, h.vm_id, h.domain, h.mac, h.state, h.since, h.op) for h in held]
    return plan(rows, live, {}, grace, now, busy_vms, abandoned_vms)


def apply_pfs(txn: Transaction, changes: Iterable[Change], now: Optional[float] = None) -> list[Change]:
    """The PF changes but giving back; returns those to give back."""
    back = []
    for c in changes:
        if c.kind == "free":
            back.append(c)
        elif c.kind == "attach":
            txn.set_pf_state([c.vf], "attached", "reconcile", now)
        elif c.kind == "reassign":
            txn.reassign_pf(c.vf, c.vm_id, c.domain, "reconcile")
            txn.set_pf_state([c.vf], "attached", "reconcile", now)
    return back


def apply(txn: Transaction, changes: Iterable[Change], now: Optional[float] = None) -> None:
    for c in changes:
        if c.kind == "free":
            txn.release([c.vf])
        elif c.kind == "attach":
            txn.set_state([c.vf], "attached", "reconcile", now)
        elif c.kind == "reassign":
            txn.reassign(c.vf, c.vm_id, c.domain, "reconcile")
            txn.set_state([c.vf], "attached", "reconcile", now)
        elif c.kind == "adopt":
            txn.add(c.vf, c.pf, c.vm_id, c.domain, "", "attached", "reconcile", now)
