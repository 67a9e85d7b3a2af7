"""One VM's VFs, devices and domain on this host: the steps several actions
share (deploy, NICs, save/restore, migration and its destination), so no
action imports another."""

from __future__ import annotations

import os
import sqlite3

from ..domain import domain_xml, hotplug, hpc_profile
from ..errors import DriverError
from ..ivshmem import host as ivshmem_host, table as ivshmem_table
from ..opennebula import log
from ..vf import intents, numa
from ..vf.pool import Transaction, read_only
from .host import Allocation, Host


def destroy_if_running(host: Host, name: str) -> None:
    """No half-started domain: a stock deploy or restore that failed after
    starting the domain (killed, say) must not leave it running with VFs the
    pool is about to free. An undo step: the undo stack logs its error."""
    dom = host.hypervisor.lookup(name)
    if dom is not None and host.hypervisor.is_active(dom):
        host.hypervisor.destroy(dom)


def records(allocations: list[Allocation], bridges: dict[str, str],
            spaces: dict = None) -> list[domain_xml.NicRecord]:
    """Metadata records for a domain being built (bridges: MAC -> BRIDGE,
    spaces: MAC -> the network its GUID was derived with)."""
    return [domain_xml.NicRecord(a.request.mac, bridges.get(a.request.mac, ""), a.vf.address, a.vf.pf,
                                 (spaces or {}).get(a.request.mac))
            for a in allocations]


def live_xml(dom):
    """The running domain's XML as it is now, parsed once per state: what an
    action reads of it (VFs present, records, shared memory, NUMA) comes
    from this one tree until a hot-plug or new metadata changes it."""
    return domain_xml.parse(dom.XMLDesc(0), f"live XML of {dom.name()}")


def with_vfs(dom, allocations: list[Allocation], new_bridges: dict[str, str] = None,
             drop: str = "", new_spaces: dict = None, live=None) -> list[domain_xml.NicRecord]:
    """The live domain's VF NIC records, updated: NICs in allocations have
    their VF, every other recorded NIC has none (detached) but stays known;
    new_bridges (MAC -> BRIDGE) adds hot-plugged NICs (new_spaces: their
    GUIDs' networks), drop removes one. live: the domain's XML as it is now,
    parsed already (None: read here)."""
    by_mac = {a.request.mac: a for a in allocations}
    known = domain_xml.recorded_nics(live_xml(dom) if live is None else live)
    bridges = {r.mac: r.bridge for r in known}
    spaces = {**(new_spaces or {}), **domain_xml.guid_spaces(known)}
    bridges.update({m: b for m, b in (new_bridges or {}).items() if m not in bridges})
    out = []
    for mac, bridge in bridges.items():
        if mac == drop:
            continue
        a = by_mac.get(mac)
        out.append(domain_xml.NicRecord(mac, bridge, a.vf.address if a else "", a.vf.pf if a else "",
                                        spaces.get(mac)))
    return out


def recorded_bridges(live) -> dict[str, str]:
    """MAC -> BRIDGE of the VF NICs a live domain's metadata records (live:
    its XML, live_xml)."""
    return {r.mac: r.bridge for r in domain_xml.recorded_nics(live)}


def vf_state(host: Host, vm_id: int) -> bool:
    """Does the pool hold VFs or whole PFs of this VM, a shared-memory region
    it uses, or an operation on it?"""
    seen = _vf_state_read_only(host, vm_id)
    if seen is not None:
        return seen
    with host.pool.transaction() as txn:
        return _holds(txn, vm_id)


def _holds(txn: Transaction, vm_id: int, ivshmem_tables: bool = True, pf_table: bool = True) -> bool:
    """The VM's VFs or whole PFs, an operation on it, or its shared-memory
    region (only asked where those tables exist: user_of would make them;
    a pool older than whole PFs has no pf_assignment)."""
    return (bool(txn.assignments(vm_id)) or intents.of_vm(txn, vm_id) is not None
            or (pf_table and bool(txn.pf_assignments(vm_id)))
            or (ivshmem_tables and ivshmem_table.user_of(txn.db, vm_id) is not None))


def _vf_state_read_only(host: Host, vm_id: int) -> bool | None:
    """vf_state without the pool lock, asked by every action of every VM: a
    read-only look (WAL reader: one committed state, no waiting in the pool's
    queue behind writers, no set-up). No database at all: nothing of the VM
    is in it. None: no such look to be had; ask in a transaction."""
    path = host.config.pool_db
    if not os.path.lexists(path):
        return False
    db = read_only(path, host.config.lock_seconds)
    if db is None:
        return None
    try:
        db.execute("BEGIN")  # the reads see one state
        # the shared-memory tables are made on first use: none, no user
        made = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ivshmem_user'").fetchone()
        pfs = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pf_assignment'").fetchone()
        return _holds(Transaction(db), vm_id, ivshmem_tables=made is not None, pf_table=pfs is not None)
    except sqlite3.Error:
        return None  # e.g. the schema is being made right now
    finally:
        db.close()


def restore_guids(host: Host, vm_id: int) -> None:
    """Best effort on a path that is already failing: never hide the first error."""
    try:
        host.restore_guids(vm_id)
    except DriverError as exc:
        log("WARN", f"could not restore the GUIDs of VM {vm_id}: {exc}")


def running_domain(host: Host, deploy_id: str):
    dom = host.hypervisor.lookup(deploy_id)
    if dom is None or not host.hypervisor.is_active(dom):
        return None
    return dom


def release_all(host: Host, vm_id: int) -> None:
    """The VM's VFs leave it: original GUIDs back, then free in the pool;
    its whole PFs go back to the host with their VFs (Host.release_vm)."""
    restore_guids(host, vm_id)
    for a in host.release_vm(vm_id):
        log("INFO", f"released VF {a.vf} (NIC {a.mac or '?'})")


def comeback_numa_wish(host: Host, root, vm) -> tuple:
    """(the VM's NUMA nodes or None, NUMA policy) for a VM that keeps the domain
    it had (restore, the migration destination): the nodes it is bound to in
    that domain (the HPC profile pinned it at deploy) and its KVM_SRIOV_NUMA
    (vm: OpenNebula's VM, from the action XML), else the host's."""
    return numa.vm_nodes(root, host.numa_nodes), (hpc_profile.template_options(vm).numa
                                                    or host.config.numa_policy)


# -- VFs and the shared-memory device off and back around a save or a move ---------
def held_in(host: Host, vm_id: int, live) -> list[Allocation]:
    """The VM's pool VFs that the live domain (live: its XML, live_xml)
    really holds, with their NIC."""
    present = domain_xml.pci_hostdevs(live)
    return [a for a in host.allocations_of(vm_id, recorded_bridges(live)) if a.vf.address in present]


def detach_for_move(host: Host, deploy_id: str, dom, held: list[Allocation], op, undo,
                    said: str) -> None:
    """Take the VFs off a running domain (confirmed). Its undo goes on the
    stack first, so a half-done detach is undone too: the VM, if it still
    runs here, gets the VFs back and runs as before (said: what the log
    says then)."""
    op.step("detaching", vfs=[a.vf.address for a in held])
    undo.push(vfs_back, host, deploy_id, dom, held, said)
    hotplug.detach(dom, [a.vf.address for a in held], host.config.hotplug_seconds,
                   host.config.detach_retry_seconds)
    host.hypervisor.set_metadata(dom, with_vfs(dom, []))
    op.step("detached")


def reattach(host: Host, dom, held: list[Allocation]) -> None:
    """Undo a detach: the VM gets the same VFs back."""
    try:
        hotplug.attach(dom, [(a.vf, a.request.mac) for a in held], host.config.hotplug_seconds)
        host.hypervisor.set_metadata(dom, with_vfs(dom, held))
    except DriverError as exc:
        log("ERROR", f"could not give {dom.name()} its VFs back: {exc}")
        raise


def vfs_back(host: Host, deploy_id: str, dom, held: list[Allocation], said: str) -> None:
    """Undo a detach: the VM, if it still runs here, gets its VFs back."""
    if running_domain(host, deploy_id) is not None:
        reattach(host, dom, held)
        log("ERROR", said)


def region_back(host: Host, deploy_id: str, dom, shared) -> None:
    """Undo unplug_region: the VM, if it still runs here, gets its device back."""
    if running_domain(host, deploy_id) is not None:
        replug_region(host, dom, shared)


def unplug_region(host: Host, dom, shared, op) -> None:
    """The shared-memory device comes off before a save or migration
    (docs/ivshmem.md: libvirt refuses both with an ivshmem peer, and the
    region is the group's, not the VM's state); on failure the caller's undo
    gives the VFs back."""
    if shared is None:
        return
    ivshmem_host.unplug(dom, shared, host.config.hotplug_seconds, host.config.detach_retry_seconds)
    op.step("ivshmem-unplugged")


def replug_region(host: Host, dom, shared) -> None:
    if shared is None:
        return
    try:
        ivshmem_host.plug(dom, shared, host.config.hotplug_seconds)
    except DriverError as exc:
        log("ERROR", f"could not give {dom.name()} its shared-memory region back: {exc}")
