"""The destination side of a live migration: ``kvm-sriov-peer``, run on
this host by a migration source (kvm_sriov/node/peer.py is that source's
end). It reserves VFs for the incoming VM in this host's own pool and makes
them ready there (bound to vfio-pci, the VM's GUIDs: node/prewarm.py) while
the VM still runs on the source, attaches them once the domain runs here,
releases what is left, and joins the VM's shared-memory region.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional, Sequence, TextIO

from .. import config as config_mod
from .. import opennebula
from ..domain import domain_xml
from ..errors import DriverError, InputError
from ..ib import guid
from ..ivshmem import host as ivshmem_host
from ..node import prewarm, traffic, whole_pfs
from ..node.host import Host
from ..node.vm import live_xml, plug_vfs, recorded_bridges, with_vfs
from ..vf import intents
from ..vf.policy import NUMA_POLICIES
from .undo import Undo


def _reserve(host: Host, vm_id: int, domain: str, nics) -> list[dict]:
    """One VF per NIC, made ready for the VM before its outage starts
    (prewarm.prepare); all or nothing. Each entry of the answer says how long
    the pre-warm took here (prewarm_seconds: the whole reservation's, on this
    host's monotonic clock); the answer stays the list older sources read."""
    if not isinstance(nics, list) or not all(
            isinstance(n, dict) and isinstance(n.get("mac"), str) and isinstance(n.get("bridge"), str) for n in nics):
        raise InputError(f"bad NIC list from the source host: {str(nics)[:120]}")
    records = [domain_xml.NicRecord(n["mac"], n["bridge"]) for n in nics]
    nodes, numa_policy = _numa_wish(nics[0] if nics else {})
    carried, spaces = _carried(nics[0] if nics else {}), _guid_spaces(nics)
    with intents.VmLock(host.config.state_dir, vm_id, host.config.lock_seconds), Undo("migrate-in") as undo:
        if host.assignments(vm_id):  # an earlier reservation's, left here: its pre-warm undone
            prewarm.revert(host, _unused(host, vm_id), prewarm.recorded(host, vm_id))
        allocations = host.reserve(vm_id, domain, [r.request for r in records], op="migrate-in",
                                   lease_seconds=host.config.migrate_seconds,
                                   numa_nodes=nodes, numa_policy=numa_policy, carried=carried)
        undo.push(_drop, host, vm_id, allocations)
        seconds = round(prewarm.prepare(host, vm_id, allocations, spaces, undo), 3) if allocations else 0.0
    if allocations:
        opennebula.log("INFO", f"VM {vm_id}: VF {', '.join(a.vf.address for a in allocations)} made ready "
                               f"in {seconds:.2f}s, before the VM's outage")
    return [{"mac": a.request.mac, "vf": a.vf.address, "pf": a.vf.pf, "prewarm_seconds": seconds}
            for a in allocations]


def _drop(host: Host, vm_id: int, allocations) -> None:
    """Undo a reservation: its VFs and its intent (the lease) go."""
    with host.pool.transaction() as txn:
        txn.release([a.vf.address for a in allocations])
        intents.clear(txn, vm_id)
    whole_pfs.give_back_unused(host, vm_id)  # a whole PF's VFs back


def _unused(host: Host, vm_id: int) -> list[str]:
    """The VM's VFs here that no running domain holds."""
    live = host.hypervisor.live_state()
    return [a.vf for a in host.assignments(vm_id) if a.vf not in live.hostdevs]


def _guid_spaces(nics: list[dict]) -> Optional[dict]:
    """MAC -> the network the VM's GUIDs are derived with (its domain's
    record on the source: Peer.reserve); None from an older source, whose
    VM gets its GUIDs at the attach, from the record the domain brings."""
    if not nics or any("guid_space" not in n for n in nics):
        return None
    spaces = {}
    for n in nics:
        space = n["guid_space"]
        if not (space is None or (isinstance(space, int) and not isinstance(space, bool) and guid.space_fits(space))):
            raise InputError(f"bad GUID network from the source host: {str(space)[:40]}")
        spaces[n["mac"]] = space
    return spaces


def _carried(entry: dict) -> Optional[tuple]:
    """The IB traffic totals the source sent (Peer.reserve); None from an older source."""
    value = entry.get("ib_traffic")
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 4 and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < traffic.MAX_CARRIED for v in value)):
        raise InputError(f"bad IB traffic totals from the source host: {str(value)[:120]}")
    return tuple(value)


def _numa_wish(entry: dict) -> tuple:
    """(nodes or None, policy) the source sent (Peer.reserve); none: any VF."""
    nodes, numa_policy = entry.get("numa_nodes"), entry.get("numa_policy") or "ignore"
    if numa_policy not in NUMA_POLICIES or not (nodes is None or (
            isinstance(nodes, list) and all(isinstance(n, int) and 0 <= n < 1024 for n in nodes))):
        raise InputError(f"bad NUMA wish from the source host: {str(entry)[:120]}")
    return (frozenset(nodes) if nodes else None), numa_policy


def _attach(host: Host, vm_id: int, domain: str) -> dict:
    """The VFs reserved for the VM that just arrived go into its domain;
    answers how long the GUIDs and the hot-plug took here (this host's
    monotonic clock: durations only, for the source's outage record). The
    GUIDs were set at reserve already (prewarm.prepare) but where that could
    not be: from an older source, or on a VF libvirt did not bind ahead."""
    dom = host.hypervisor.lookup(domain)
    if dom is None or not host.hypervisor.is_active(dom):
        raise DriverError(f"domain {domain} is not running here")
    live = live_xml(dom)
    bridges = recorded_bridges(live)
    moved = prewarm.recorded(host, vm_id)
    with host.operation(vm_id, "migrate-in", **{prewarm.KEY: moved}), Undo("migrate-in") as undo:
        allocations = host.allocations_of(vm_id, bridges)
        # the GUIDs it had on the source: the domain brought its record along
        spaces = domain_xml.guid_spaces(domain_xml.recorded_nics(live))
        undo.push(prewarm.revert, host, [a.vf.address for a in allocations], moved)
        started = time.monotonic()
        host.program_guids(vm_id, prewarm.unprogrammed(host, vm_id, allocations, spaces), spaces)
        programmed = time.monotonic()
        plug_vfs(host, dom, [(a.vf, a.request.mac) for a in allocations], live)
        plugged = time.monotonic()
        undo.commit()  # the VFs are in the domain: their GUIDs stay
        host.hypervisor.set_metadata(dom, with_vfs(dom, allocations))
        host.mark_attached(allocations, op="migrate-in")
    return {"guid_seconds": round(programmed - started, 3), "hotplug_seconds": round(plugged - programmed, 3)}


def _release(host: Host, vm_id: int) -> None:
    """Drop the VM's reservation here, but never a VF its domain really holds
    (the source may be cleaning up after a migration that did finish): the
    pre-warm undone, then the VFs freed, each step whatever the other did."""
    moved = prewarm.recorded(host, vm_id)
    with host.operation(vm_id, "migrate-in", **{prewarm.KEY: moved}):
        unused = _unused(host, vm_id)
        try:
            prewarm.revert(host, unused, moved)
        finally:
            with host.pool.transaction() as txn:
                txn.release(unused)
            whole_pfs.give_back_unused(host, vm_id)  # a whole PF's VFs back


def _ivshmem_join(host: Host, vm_id: int, domain: str) -> None:
    """A VM that just arrived joins its group's region here (the record in
    its domain metadata names it) and gets the device back."""
    dom = host.hypervisor.lookup(domain)
    if dom is None or not host.hypervisor.is_active(dom):
        raise DriverError(f"domain {domain} is not running here")
    record = ivshmem_host.record_of(dom)
    if record is None:
        raise DriverError(f"domain {domain} has no shared-memory record")
    with host.operation(vm_id, "migrate-in"), Undo("migrate-in") as undo:
        ivshmem_host.join(host, vm_id, domain, record.request)
        undo.push(ivshmem_host.leave, host, vm_id)
        ivshmem_host.plug(dom, record, host.config.hotplug_seconds)
        undo.commit()  # the device is in the domain: the VM stays in its region
        ivshmem_host.attached(host, vm_id)


def main(argv: Sequence[str], remotes_dir=None, stdin: Optional[TextIO] = None) -> int:
    try:
        if not argv or argv[0] not in ("reserve", "attach", "release", "ivshmem-join"):
            raise InputError("usage: kvm-sriov-peer reserve|attach|release|ivshmem-join VMID [DOMAIN]")
        cmd, args = argv[0], list(argv[1:])
        if not args:
            raise InputError(f"{cmd}: VMID must be a non-negative integer")
        vm_id = opennebula.vm_id(args[0], f"{cmd}: VMID")
        host = Host(config_mod.load(remotes_dir))
        try:
            if cmd == "reserve":
                result = _reserve(host, vm_id, args[1], json.load(stdin or sys.stdin) or [])
            elif cmd == "attach":
                result = _attach(host, vm_id, args[1])
            elif cmd == "ivshmem-join":
                result = _ivshmem_join(host, vm_id, args[1])
            else:
                result = _release(host, vm_id)
        finally:
            host.close()
    except (DriverError, IndexError, KeyError, ValueError) as exc:
        return opennebula.fail(str(exc) or repr(exc))
    print(json.dumps(result))
    return 0
