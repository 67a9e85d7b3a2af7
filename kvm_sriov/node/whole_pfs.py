"""This host's PFs passed through whole, with its pool and its libvirt.

vf/whole_pf.py has the rule and the sysfs steps; here they meet the pool
(the rows, written before a PF's VFs go and removed once they are back),
the running domains (a PF a domain holds is never touched) and the GUID
records (a VF with a record still has a VM's GUID to give back: its PF
stays). Host (host.py) calls these around its reservations, releases and
reconciliation (``host``: the Host; it imports this module).
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..domain.hypervisor import LiveState
from ..errors import DriverError
from ..ib import guid
from ..opennebula import log
from ..vf import whole_pf
from ..vf.pool import PfAssignment, Transaction


def refusals(host, txn: Transaction, taken: Iterable[str], held_pfs: dict[str, int]) -> dict[str, str]:
    """Pool PF -> why it cannot be passed through whole now (policy.choose_all's
    why_not). taken: VFs held in the pool or by a running domain."""
    inv = host.inventory
    held = set(taken) | {r.vf for r in guid.records(txn.db)}
    out = {}
    for pf in inv.pfs:
        why = whole_pf.why_not_free(pf, [v for v in inv.vfs if v.pf == pf.address],
                                    host.config.skip_vfs_in_host_use, held, held_pfs, host.config.whole_pfs)
        if why:
            out[pf.address] = why
    return out


def switch_off(host, allocations) -> None:
    """The reserved whole PFs' VFs go (their rows are committed: a crash
    from here leaves rows that reconcile gives back). On a failure all of
    this reservation is given back and the error raised."""
    whole = [a for a in allocations if whole_pf.is_whole(a.vf)]
    try:
        for a in whole:
            whole_pf.switch_off(host.sysfs, a.vf.address)
            log("INFO", f"PF {a.vf.address}: its VFs switched off, passed through whole for NIC {a.request.mac}")
    except BaseException:
        host.release(allocations)
        raise
    finally:
        if whole:
            host.forget_inventory()


def give_back_in(host, txn: Transaction, row: PfAssignment, live: LiveState) -> None:
    """Inside a pool transaction: the PF back to the host with its VFs, then
    its row goes. DriverError (the row stays, for the next try) when a
    running domain holds it or it cannot be switched back."""
    if row not in txn.pf_assignments(row.vm_id):
        return  # given back already (and maybe another VM's now): nothing of this row to do
    holder = live.hostdevs.get(row.pf)
    if holder is not None:
        raise DriverError(f"PF {row.pf} is in running domain {holder.name}: not given back to the host")
    try:
        whole_pf.switch_on(host.sysfs, row.pf, row.num_vfs)
    finally:
        host.forget_inventory()
    txn.release_pf(row)
    log("INFO", f"PF {row.pf} back to the host with its {row.num_vfs} VFs (VM {row.vm_id})")


def give_back(host, rows: Iterable[PfAssignment], live: Optional[LiveState] = None) -> None:
    """Each PF back to the host, in its own transaction (under the pool lock:
    no action decides from a PF half given back); every one is tried, the
    first error is raised after."""
    rows = list(rows)
    if not rows:
        return
    live = live if live is not None else host.hypervisor.live_state()
    first = None
    for row in rows:
        try:
            with host.pool.transaction() as txn:
                give_back_in(host, txn, row, live)
        except DriverError as exc:
            log("ERROR", f"VM {row.vm_id}: {exc}; kvm-sriov reconcile tries again")
            first = first or exc
    if first is not None:
        raise first


def give_back_planned(host, txn: Transaction, changes, held: Iterable[PfAssignment],
                      live: LiveState) -> None:
    """Reconcile's give-backs (reconcile.apply_pfs), inside its transaction;
    one that fails is a WARN line and its row stays for the next reconcile."""
    rows = {h.pf: h for h in held}
    for c in changes:
        try:
            give_back_in(host, txn, rows[c.vf], live)
        except DriverError as exc:
            log("WARN", f"VM {c.vm_id}: {exc}")


def give_back_unused(host, vm_id: int) -> None:
    """The VM's whole PFs here that no running domain holds, back to the host
    (a migration's destination dropping its reservation)."""
    live = host.hypervisor.live_state()
    give_back(host, [h for h in host.pf_assignments(vm_id) if h.pf not in live.hostdevs], live)
