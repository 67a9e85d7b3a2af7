"""save and restore around OpenNebula's kvm scripts: VFs come off (confirmed)
before the stock save writes the memory image (libvirt refuses to save a
domain with a VFIO device), and new ones go on after the stock restore has
read it back (paths fixed for the datastore, snapshots redefined), possibly
on another host."""

from __future__ import annotations

import os
from pathlib import Path

from ..domain import domain_xml
from ..errors import DriverError
from ..ivshmem import device as ivshmem, host as ivshmem_host
from ..node import traffic
from ..node.host import Host
from ..node.vm import (comeback_numa_wish, destroy_if_running, detach_for_move, gpu_wish, held_in, live_xml,
                       plug_vfs, records, region_back, release_all, restore_guids, running_domain,
                       unplug_region, vf_state)
from ..oned import action_xml
from ..opennebula import Call
from .delegate import Delegated, Sent, run_stock
from .undo import Undo


def involves_vfs(host: Host, call: Call, sent: Sent) -> bool:
    if call.action == "restore" and not sent.text:
        return True  # the NICs needing VFs are known only from the image's record
    if call.action == "restore" and action_xml.sriov_records(sent.document(action_xml.WHAT),
                                                             host.config.bridge):
        return True
    if call.action == "restore" and ivshmem.ATTRIBUTE in sent.text:
        return True  # the region is joined on this host
    return vf_state(host, call.vm_id)


def save(host: Host, call: Call, sent: Sent) -> None:
    path = Path(call.checkpoint_file)
    with host.operation(call.vm_id, "save", checkpoint=str(path)) as op, Undo("save") as undo:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            raise DriverError(f"domain {call.deploy_id} is not running on {call.host}")
        live = live_xml(dom)
        held = held_in(host, call.vm_id, live)
        shared = ivshmem.recorded(live)
        detach_for_move(host, call.deploy_id, dom, held, op, undo, "the VM keeps running with its VFs")
        unplug_region(host, dom, shared, op)
        undo.push(region_back, host, call.deploy_id, dom, shared)
        stock = run_stock(host.remotes_dir, sent)  # moves an old checkpoint aside, saves
        if stock.code != 0:
            raise Delegated(stock.code)  # the stock script has said why
        undo.commit()  # the memory image is written: the domain is gone
        op.step("saved")
        release_all(host, call.vm_id)
        ivshmem_host.leave(host, call.vm_id)


def _keep(path: Path) -> Path:
    """The stock restore removes the checkpoint once libvirt has read it; a
    restore that then fails (no VF can be plugged) must leave it for a retry."""
    kept = path.with_name(path.name + ".kvm-sriov-kept")
    kept.unlink(missing_ok=True)
    os.link(path, kept)
    return kept


def restore(host: Host, call: Call, sent: Sent) -> None:
    path = Path(call.checkpoint_file)
    root = domain_xml.parse(host.hypervisor.saved_image_xml(str(path)), f"checkpoint {path}")
    name = domain_xml.domain_name(root)
    shared = ivshmem.recorded(root)  # saved without the device; it joins this host's region
    # oned's view of the VM's NICs wins; the image's own record is the fallback
    action = sent.document(action_xml.WHAT) if sent.text else None
    nics = (action_xml.sriov_records(action, host.config.bridge) if action is not None
            else domain_xml.recorded_nics(root))
    if running_domain(host, name) is not None:
        raise DriverError(f"domain {name} is already running on {call.host}")
    spaces = domain_xml.guid_spaces(domain_xml.recorded_nics(root))  # GUIDs as at deploy
    vm = action_xml.vm_template(action) if action is not None else None
    nodes, numa_policy = comeback_numa_wish(host, root, vm)
    gpus = gpu_wish(host, root, vm) if nics else None  # the image keeps the GPUs' hostdevs
    ivshmem_host.keyed_at_deploy(call.vm_id, shared, vm)

    with host.operation(call.vm_id, "restore", checkpoint=str(path)) as op, Undo("restore") as undo:
        allocations = host.reserve(call.vm_id, name, [r.request for r in nics], op="restore",
                                   numa_nodes=nodes, numa_policy=numa_policy, gpus=gpus,
                                   carried=traffic.known_totals(vm.root) if vm is not None else None)
        undo.push(host.release, allocations)
        op.step("reserved", vfs=[a.vf.address for a in allocations])
        kept = _keep(path)
        undo.push(os.replace, kept, path)  # the checkpoint stays for a retry
        if shared is not None:
            undo.push(ivshmem_host.leave, host, call.vm_id)  # also after a half-done join
            ivshmem_host.join(host, call.vm_id, name, shared.request)
            op.step("ivshmem-joined")
        undo.push(restore_guids, host, call.vm_id)
        host.program_guids(call.vm_id, allocations, spaces)  # this host's VFs get the NICs' GUIDs
        undo.push(destroy_if_running, host, name)
        stock = run_stock(host.remotes_dir, sent)
        if stock.code != 0:
            raise Delegated(stock.code)  # the stock script has said why
        dom = running_domain(host, name)
        if dom is None:
            raise DriverError(f"OpenNebula's kvm restore succeeded, but domain {name} does not run")
        op.step("restored")
        if allocations:
            plug_vfs(host, dom, [(a.vf, a.request.mac) for a in allocations])
            host.hypervisor.set_metadata(dom, records(allocations, {r.mac: r.bridge for r in nics},
                                                            spaces))
        if shared is not None:
            ivshmem_host.plug(dom, shared, host.config.hotplug_seconds)
        op.step("attached")
        host.mark_attached(allocations, op="restore")
        if shared is not None:
            ivshmem_host.attached(host, call.vm_id)
    kept.unlink(missing_ok=True)

