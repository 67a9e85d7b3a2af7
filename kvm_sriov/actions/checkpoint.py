"""save and restore: VFs come off before the memory image is written (libvirt
refuses to save a domain with a VFIO device) and new ones go on after the
image is read back, possibly on another host."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import action_xml, domain_xml, hotplug
from ..errors import DriverError, HypervisorError
from ..host import Allocation, Host
from ..opennebula import Call, log
from .delegate import Sent
from .lifecycle import (recorded_bridges, records, release_all, restore_guids, running_domain, vf_state,
                        with_vfs)


def involves_vfs(host: Host, call: Call, sent: Sent) -> bool:
    if call.action == "restore" and not sent.text:
        return True  # the NICs needing VFs are known only from the image's record
    if call.action == "restore" and action_xml.sriov_records(sent.text, host.config.bridge):
        return True
    return vf_state(host, call.vm_id)


def held_in(host: Host, vm_id: int, dom) -> list[Allocation]:
    """The VM's pool VFs that the live domain really holds, with their NIC."""
    live = hotplug.present(dom)
    return [a for a in host.allocations_of(vm_id, recorded_bridges(dom)) if a.vf.address in live]


def detach_for_move(host: Host, dom, held: list[Allocation], op) -> None:
    """Take the VFs off a running domain (confirmed); on failure put back the
    ones that did come off, so the VM runs exactly as before."""
    op.step("detaching", vfs=[a.vf.address for a in held])
    try:
        hotplug.detach(dom, [a.vf.address for a in held], host.config.hotplug_seconds,
                           host.config.detach_retry_seconds)
    except DriverError:
        reattach(host, dom, held)
        raise
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


def _set_aside(path: Path) -> None:
    """Like OpenNebula's kvm driver: an old checkpoint is moved, not lost."""
    if path.exists():
        aside = path.with_name(f"{path.name}.{int(time.time())}")
        os.replace(path, aside)
        log("INFO", f"moved old checkpoint {path} to {aside}")


def save(host: Host, call: Call, sent: Sent) -> None:
    path = Path(call.checkpoint_file)
    with host.operation(call.vm_id, "save", checkpoint=str(path)) as op:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            raise DriverError(f"domain {call.deploy_id} is not running on {call.host}")
        held = held_in(host, call.vm_id, dom)
        detach_for_move(host, dom, held, op)
        try:
            _set_aside(path)
            host.hypervisor.save(dom, str(path))
        except (DriverError, OSError) as exc:
            reattach(host, dom, held)
            raise DriverError(f"{exc}; the VM keeps running with its VFs") from None
        op.step("saved")
        release_all(host, call.vm_id)


def _fix_datastore_paths(root, checkpoint: Path, vm_id: int) -> bool:
    """The system datastore may have changed since the save (like the stock
    kvm restore): disk paths .../datastores/<any>/<vmid>/ point at the
    datastore that now holds the checkpoint. True if a path changed."""
    changed = False
    vm_dir = checkpoint.parent
    ds_root = vm_dir.parent.parent
    for source in root.iterfind("devices/disk/source"):
        for attr in ("file", "dev"):
            value = source.get(attr)
            if not value:
                continue
            p = Path(value)
            parts = p.parts
            for i in range(len(parts) - 2):
                if Path(*parts[:i + 1]) == ds_root and parts[i + 2] == str(vm_id):
                    fixed = str(Path(vm_dir, *parts[i + 3:]))
                    if fixed != value:
                        source.set(attr, fixed)
                        changed = True
                    break
    return changed


def restore(host: Host, call: Call, sent: Sent) -> None:
    stdin = sent.text
    path = Path(call.checkpoint_file)
    root = domain_xml.parse(host.hypervisor.saved_image_xml(str(path)), f"checkpoint {path}")
    name = domain_xml.domain_name(root)
    # oned's view of the VM's NICs wins; the image's own record is the fallback
    nics = (action_xml.sriov_records(stdin, host.config.bridge) if stdin
            else domain_xml.recorded_nics(root))
    running = running_domain(host, name)
    if running is not None:
        raise DriverError(f"domain {name} is already running on {call.host}")
    # a replacement XML costs libvirt ~0.1 s more (measured): only when needed
    new_xml = domain_xml.to_string(root) if _fix_datastore_paths(root, path, call.vm_id) else None

    with host.operation(call.vm_id, "restore", checkpoint=str(path)) as op:
        allocations = host.reserve(call.vm_id, name, [r.request for r in nics], op="restore")
        op.step("reserved", vfs=[a.vf.address for a in allocations])
        dom = None
        try:
            host.program_guids(call.vm_id, allocations)  # this host's VFs get the NICs' GUIDs
            dom = host.hypervisor.restore(str(path), name, new_xml)
            op.step("restored")
            if allocations:
                hotplug.attach(dom, [(a.vf, a.request.mac) for a in allocations],
                               host.config.hotplug_seconds)
                host.hypervisor.set_metadata(dom, records(allocations, {r.mac: r.bridge for r in nics}))
            op.step("attached")
            host.mark_attached(allocations, op="restore")
        except BaseException:
            if dom is not None:  # no half-restored VM: the checkpoint stays for a retry
                try:
                    host.hypervisor.destroy(dom)
                except HypervisorError as exc:
                    log("ERROR", str(exc))
            restore_guids(host, call.vm_id)
            host.release(allocations)
            raise
        try:
            path.unlink()
        except OSError as exc:
            log("WARN", f"restored, but could not remove {path}: {exc.strerror}")
