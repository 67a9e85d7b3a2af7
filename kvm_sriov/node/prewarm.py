"""A live migration's destination made ready before the VM's InfiniBand
outage starts: at ``reserve`` (actions/peer.py), while the VM still runs on
the source with its own VFs, the VFs reserved here are bound to vfio-pci and
given the VM's GUIDs, so the outage is the hot-plug alone.

Bound through libvirt (nodedev detach), not by hand, so libvirt keeps the VF
in its list of devices it took from their host driver: the managed hot-plug
then finds it on vfio-pci and binds nothing (virPCIDeviceBindToStub returns
at "already bound"), and hands it back to its host driver when it leaves the
domain, as with every managed VF. (libvirt keeps that list in memory: after a
libvirtd restart between reserve and attach the VF stays on vfio-pci once the
VM leaves, which the pool offers all the same.) A VF on vfio-pci already is
left there.

Bound first, GUIDs second: no host driver runs the VF while it carries the
VM's GUID, which the VM still has on the source. A VF libvirt cannot bind
ahead gets its GUIDs at the attach, right before its hot-plug, as before.

Undone (:func:`revert`) by the release, by a failed reserve or attach, and by
reconcile once the reservation's lease has run out (node/host.py): GUIDs
first, then the driver. What the pre-warm moved to vfio-pci is written in the
reservation's intent before the drivers change, so a kill leaves what
undoes it.
"""

from __future__ import annotations

import time
from typing import Iterable, Optional, Sequence

from ..domain.hypervisor import libvirt_module
from ..errors import DriverError, HypervisorError
from ..ib import guid
from ..opennebula import log
from ..vf import intents

VFIO = "vfio-pci"
KEY = "prewarm"  # in the reservation's intent: the VFs the pre-warm moved to vfio-pci


def driver_of(host, vf: str) -> Optional[str]:
    return host.sysfs.link_name(host.sysfs.at("bus", "pci", "devices", vf, "driver"))


def node_device(vf: str) -> str:
    """libvirt's node device name of a PCI address: pci_0000_03_00_2."""
    return "pci_" + vf.replace(":", "_").replace(".", "_")


def _bind(host, vf: str) -> None:
    libvirt = libvirt_module()
    try:
        host.hypervisor.conn.nodeDeviceLookupByName(node_device(vf)).detachFlags("vfio", 0)
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"libvirt could not bind VF {vf} to vfio-pci: "
                              f"{exc.get_error_message() or exc}") from None


def _give_back(host, vf: str) -> None:
    """What libvirt does with a managed VF leaving a domain: off vfio-pci,
    its host driver probed again."""
    libvirt = libvirt_module()
    try:
        host.hypervisor.conn.nodeDeviceLookupByName(node_device(vf)).reAttach()
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"libvirt could not give VF {vf} back to its host driver: "
                              f"{exc.get_error_message() or exc}") from None


def moved_by(intent) -> list[str]:
    """The VFs a migrate-in intent says the pre-warm moved to vfio-pci."""
    value = intent.data.get(KEY) if intent is not None and intent.action == "migrate-in" else None
    return [vf for vf in value if isinstance(vf, str)] if isinstance(value, list) else []


def recorded(host, vm_id: int) -> list[str]:
    """What the VM's reservation here moved to vfio-pci (its intent), read
    before an operation on the VM replaces that intent with its own."""
    with host.pool.transaction() as txn:
        return moved_by(intents.of_vm(txn, vm_id))


def prepare(host, vm_id: int, allocations: Sequence, spaces: Optional[dict], undo) -> float:
    """Bind the reserved VFs to vfio-pci, then set their GUIDs (spaces: MAC ->
    the network the VM's GUIDs are derived with; None: the source did not
    say, the attach sets them). Pushes its undo on ``undo``; returns the
    seconds it took."""
    started = time.monotonic()
    vfs = [a.vf.address for a in allocations]
    moving = [vf for vf in vfs if driver_of(host, vf) != VFIO]
    with host.pool.transaction() as txn:
        intents.advance(txn, vm_id, "reserved", **{KEY: moving})
    undo.push(revert, host, vfs, moving)
    for vf in moving:
        try:
            _bind(host, vf)
        except DriverError as exc:
            log("WARN", f"{exc}: its hot-plug binds it, and its GUIDs are set then")
    if spaces is not None:
        host.program_guids(vm_id, [a for a in allocations if driver_of(host, a.vf.address) == VFIO], spaces)
    return time.monotonic() - started


def unprogrammed(host, vm_id: int, allocations: Sequence, spaces: dict) -> list:
    """The allocations whose VF does not carry the GUIDs of its NIC yet
    (spaces: MAC -> network, the domain's record): none after a pre-warm
    from the same record."""
    if host.config.guid_policy == "none":
        return []
    done = {r.vf: r.port_guid for r in host.guid_records() if r.vm_id == vm_id}
    return [a for a in allocations
            if done.get(a.vf.address) != guid.port_guid(a.request.mac, spaces.get(a.request.mac))]


def revert(host, vfs: Iterable[str], moved: Iterable[str]) -> None:
    """:func:`revert_in`, in a pool transaction of its own."""
    with host.pool.transaction() as txn:
        revert_in(host, txn, vfs, moved)


def revert_in(host, txn, vfs: Iterable[str], moved: Iterable[str]) -> None:
    """Inside a pool transaction, for VFs that are still the VM's and in no
    domain: their original GUIDs back, then those in ``moved`` back to their
    host driver, each on its own (a refusal is logged: the VF stays on
    vfio-pci, which the pool offers all the same). A VF whose GUIDs could not
    be restored (their record stays, for the next GUID change or kvm-sriov
    reconcile) stays on vfio-pci too: a host driver would bring the VM's GUID
    up on the fabric beside the VM's own."""
    vfs, moved = list(vfs), set(moved)
    if not vfs:
        return
    guid.restore(txn.db, host.sysfs, host.inventory, vfs, host.config.ip_command, log)
    carrying = {r.vf for r in guid.records(txn.db)}
    for vf in vfs:
        if vf in moved and vf not in carrying and driver_of(host, vf) == VFIO:
            try:
                _give_back(host, vf)
            except DriverError as exc:
                log("WARN", f"{exc}: it stays on vfio-pci")
