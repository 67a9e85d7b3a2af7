"""One VM's VFs, devices and domain on this host: the steps several actions
share (deploy, NICs, save/restore, migration and its destination), so no
action imports another."""

from __future__ import annotations

import os
import sqlite3
from typing import Optional

from ..domain import domain_xml, hotplug, hpc_profile, pcie_switch
from ..errors import DriverError, InputError
from ..ivshmem import host as ivshmem_host, table as ivshmem_table
from ..opennebula import log
from ..vf import gpu_affinity, intents, numa, policy, topology
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


# -- GPUs: VFs close to them on the host, and beside them in the guest ---------------
def gpu_wish(host: Host, root, vm) -> Optional[gpu_affinity.GpuWish]:
    """What the VM asks (KVM_SRIOV_GPU_AFFINITY of vm, OpenNebula's VM) for
    its passed-through GPUs (read from root, its domain XML, before its VFs
    are put in) and how close each pool PF is to them; None when it asks
    nothing or passes no GPU of this host through (its VFs are then chosen
    as without the attribute). Every path that takes VFs for a VM asks it."""
    level = hpc_profile.gpu_affinity(vm)
    if level == policy.NO_GPU_AFFINITY:
        return None
    asked = f'{hpc_profile.GPU_AFFINITY_ATTRIBUTE} = "{level}"'
    try:
        devices = domain_xml.passed_through(root, topology.MAX_RAILS)
        found = topology.vm_gpus(host.sysfs, devices, host.inventory.pfs) if devices else None
    except InputError as exc:
        raise InputError(f"{asked}: {exc}") from None
    if found is None or not found.gpus:
        log("INFO", f"{asked}: the VM passes through no GPU of this host; VFs chosen without it")
        return None
    for problem in found.problems:
        log("WARN", f"{asked}: a PF is left out, where it sits is unknown: {problem}")
    return gpu_affinity.GpuWish(level, found.gpus, found.closeness)


def served_gpu(gpus: Optional[gpu_affinity.GpuWish], nics: int, i: int, pf: str) -> str:
    """', switch-close to GPU 0000:07:00.0' for NIC i's log line ('' without a GPU wish)."""
    if gpus is None:
        return ""
    c = gpu_affinity.served(gpus, nics, i, pf)
    return "" if c is None else f", {c.level}-close to GPU {c.gpu}"


def plug_vfs(host: Host, dom, vfs, live=None) -> None:
    """Hot-plug (VF, NIC MAC) pairs into the running domain, each VF on its
    NIC's switch port where switch_ports allows it (live: the domain's XML
    as it is now, read here when None)."""
    hotplug.attach(dom, vfs, host.config.hotplug_seconds,
                   switch_ports(host, live_xml(dom) if live is None else live, vfs))


def switch_ports(host: Host, live, vfs) -> dict[str, int]:
    """NIC MAC -> the guest bus of the switch port deploy made for the NIC,
    for each (VF, MAC) of vfs whose VF is as close on the host to the GPU on
    that switch as deploy shows pairs (gpu_affinity.GUEST_SWITCH_LEVELS);
    any other VF (a far one taken after a save, a hot-plug or a move) goes
    where libvirt puts it, never beside a GPU it is far from. live: the
    domain's XML (live_xml)."""
    ports = pcie_switch.vf_ports(live)
    out = {}
    for vf, mac in vfs:
        port = ports.get(pcie_switch.vf_port_alias(mac))
        if port is None:
            continue
        gpu, _ = topology.read_place(host.sysfs, port.gpu) if port.gpu else (None, None)
        pf, _ = topology.read_place(host.sysfs, vf.pf)
        if (gpu is not None and pf is not None
                and topology.closeness(gpu, pf).level in gpu_affinity.GUEST_SWITCH_LEVELS):
            out[mac] = port.bus
        else:
            log("INFO", f"NIC {mac}: VF {vf.address} is not close to GPU {port.gpu or '(none)'} on this host; "
                        f"the guest sees it apart from that GPU's switch")
    return out


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
        plug_vfs(host, dom, [(a.vf, a.request.mac) for a in held])
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
