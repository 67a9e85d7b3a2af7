"""attach_nic / detach_nic: NICs on the driver's networks are hot-plugged
as VFs (or, on a whole-PF network, as a whole PF); every other NIC goes to
OpenNebula's own kvm driver."""

from __future__ import annotations

from ..domain import hotplug
from ..errors import DriverError
from ..ib import guid
from ..node import traffic, whole_pfs
from ..node.host import Host
from ..node.vm import gpu_wish, live_xml, plug_vfs, recorded_bridges, running_domain, served_gpu, with_vfs
from ..oned import action_xml
from ..opennebula import Call, log
from ..vf import policy
from .delegate import Sent, hand_over
from .undo import Undo


def involves_vfs(host: Host, call: Call, sent: Sent) -> bool:
    return True  # decided by each action from its NIC


def attach_nic(host: Host, call: Call, sent: Sent):
    mac = call.mac.lower()
    request = policy.nic_request(mac, call.bridge, host.config.bridge)
    if request is None:
        return hand_over(host.remotes_dir, sent)
    vm = action_xml.vm_template(sent.document(action_xml.WHAT)) if sent.text else None
    spaces = guid.new_nic_spaces(vm.address_spaces() if vm else None,  # a whole PF's GUID is its own
                                 [] if request.whole_pf else [mac], host.config.guid_policy)
    with host.operation(call.vm_id, "attach_nic", mac=mac) as op, Undo("attach_nic") as undo:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            raise DriverError(f"domain {call.deploy_id} is not running on {call.host}")
        live = live_xml(dom)
        bridges = recorded_bridges(live)
        if mac in bridges and any(a.mac == mac for a in host.assignments(call.vm_id)):
            raise DriverError(f"NIC {mac} already has a VF in {dom.name()}")
        gpus = gpu_wish(host, live, vm) if not request.whole_pf else None  # as deploy chose
        [alloc] = host.reserve(call.vm_id, dom.name(), [request], op="attach_nic", gpus=gpus,
                               carried=traffic.known_totals(vm.root) if vm is not None else None)
        undo.push(host.release, [alloc])
        op.step("reserved", vfs=[alloc.vf.address])
        undo.push(host.restore_vf_guids, [alloc.vf.address])  # runs before the release
        host.program_guids(call.vm_id, [alloc], spaces)
        plug_vfs(host, dom, [(alloc.vf, mac)], live)
        op.step("attached")
        bridges[mac] = call.bridge
        held = host.allocations_of(call.vm_id, bridges)
        host.hypervisor.set_metadata(dom, with_vfs(dom, held, {mac: call.bridge}, new_spaces=spaces))
        host.mark_attached([alloc], op="attach_nic")
        log("INFO", f"NIC {mac} -> " + (f"PF {alloc.vf.address} (whole)" if request.whole_pf else
                                        f"VF {alloc.vf.address} (PF {alloc.vf.pf}{served_gpu(gpus, 1, 0, alloc.vf.pf)})"))


def detach_nic(host: Host, call: Call, sent: Sent):
    mac = call.mac.lower()
    dom = running_domain(host, call.deploy_id)
    held = [a for a in host.assignments(call.vm_id) if a.mac == mac]
    whole = [h for h in host.pf_assignments(call.vm_id) if h.mac == mac]
    if not held and not whole and (dom is None or mac not in recorded_bridges(live_xml(dom))):
        return hand_over(host.remotes_dir, sent)
    with host.operation(call.vm_id, "detach_nic", mac=mac) as op:
        if dom is not None:
            hotplug.detach(dom, [a.vf for a in held] + [h.pf for h in whole], host.config.hotplug_seconds,
                           host.config.detach_retry_seconds)
            op.step("detached")
            live = live_xml(dom)  # without the VF now
            remaining = [a for a in host.allocations_of(call.vm_id, recorded_bridges(live))
                         if a.request.mac != mac]
            host.hypervisor.set_metadata(dom, with_vfs(dom, remaining, drop=mac, live=live))
        host.restore_vf_guids([a.vf for a in held])
        with host.pool.transaction() as txn:
            txn.release([a.vf for a in held])
        for a in held:
            log("INFO", f"released VF {a.vf} (NIC {mac})")
        whole_pfs.give_back(host, whole)  # its VFs back; raises (the PF stays held) when it cannot be
