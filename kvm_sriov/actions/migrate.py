"""Live migration (runs on the source host), around OpenNebula's kvm migrate.

Order matters for never losing a VF: reserve on the destination first,
detach here (confirmed), the stock migrate (shared or local datastore,
kvmrc MIGRATE_OPTIONS, snapshots dropped and redefined, time sync), attach
on the destination, and only then free the VFs here. Any failure puts the
VM back as it was, where it was.

The VM's InfiniBand outage, from the VF unplug here until a VF is plugged
again (there, or here after a failure), goes to the VM log as one line and
into the state folder (node/outage.py).
"""

from __future__ import annotations

from ..domain import domain_xml
from ..domain.hypervisor import Hypervisor
from ..errors import DriverError
from ..ivshmem import device as ivshmem, host as ivshmem_host
from ..node import traffic
from ..node.host import Host
from ..node.peer import Peer
from ..node.vm import (comeback_numa_wish, detach_for_move, held_in, live_xml, reattach, region_back, release_all,
                       running_domain, unplug_region, vf_state)
from ..oned import action_xml
from ..opennebula import Call, log
from .delegate import Delegated, Sent, run_stock
from .undo import Undo


def involves_vfs(host: Host, call: Call, sent: Sent) -> bool:
    """A VM without VF NICs migrates the stock way, whatever its datastore."""
    if not sent.text or action_xml.sriov_records(sent.document(action_xml.WHAT), host.config.bridge):
        return True
    return vf_state(host, call.vm_id)


def migrate(host: Host, call: Call, sent: Sent) -> None:
    action = sent.document(action_xml.WHAT) if sent.text else None
    vm = action_xml.vm_template(action) if action is not None else None
    with host.operation(call.vm_id, "migrate", dest=call.dest_host) as op, Undo("migrate") as undo:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            raise DriverError(f"domain {call.deploy_id} is not running on {call.src_host}")
        name = dom.name()
        live = live_xml(dom)
        nics = (action_xml.sriov_records(action, host.config.bridge) if action is not None
                else domain_xml.recorded_nics(live))
        held = held_in(host, call.vm_id, live)
        shared = ivshmem.recorded(live)
        if shared is not None and action is not None:
            ivshmem_host.keyed_at_deploy(call.vm_id, shared, vm)
        peer = Peer(host.config, call.dest_host)

        if nics:  # abort here, before touching the VM, if the destination has no VF
            nodes, numa_policy = comeback_numa_wish(host, live, vm)
            # the GUIDs it has here, from its domain's record: the destination sets them before the unplug
            taken = peer.reserve(call.vm_id, name, nics, nodes, numa_policy,
                                 traffic.known_totals(vm.root) if vm is not None else None,
                                 guid_spaces=domain_xml.guid_spaces(domain_xml.recorded_nics(live)))
            undo.push(_release_remote, peer, call, nics)
            op.step("reserved-remote", dest_vfs=[t["vf"] for t in taken])
        outage = None
        if nics and held:  # the VM's IB outage starts with the unplug below
            from ..node.outage import Outage  # here: a VM without VFs imports nothing more
            outage = Outage(host, call, prewarm=taken[0].get("prewarm_seconds") if taken else None)
            undo.push(outage.undone, dom, held)  # unwound after the VFs' own undo: are they back?
        try:
            detach_for_move(host, call.deploy_id, dom, held, op, undo,
                            f"the VM stays on {call.src_host} with its VFs")
            if outage is not None:
                outage.lap()  # unplugged
            unplug_region(host, dom, shared, op)
            undo.push(region_back, host, call.deploy_id, dom, shared)
            stock = run_stock(host.remotes_dir, sent)  # any datastore: local ones copy the disks along
            if stock.code != 0:
                raise Delegated(stock.code)  # the stock script has said why
        except BaseException:
            if outage is not None:
                outage.failed()
            raise
        undo.commit()  # the VM runs on the destination: _bring_back is the way back from here
        if outage is not None:
            outage.lap()  # migrated
        op.step("migrated")
        if nics:
            try:
                answer = peer.attach(call.vm_id, name)
            except DriverError as exc:
                try:
                    _bring_back(host, call, name, held, peer, nics, exc,
                                copy_storage=action is not None and not action_xml.system_datastore_shared(action))
                except BaseException:
                    if outage is not None:
                        outage.end("without-vfs")
                    raise
                if outage is not None:
                    outage.end("back-on-source")
                raise DriverError(f"VFs could not be attached on {call.dest_host}: {exc}; "
                                  f"the VM was migrated back to {call.src_host} with its VFs")
            if outage is not None:
                outage.end("migrated", answer)
        if shared is not None:
            _join_there(peer, call, name)
        op.step("attached-remote")
        release_all(host, call.vm_id)
        ivshmem_host.leave(host, call.vm_id)


def _join_there(peer: Peer, call: Call, name: str) -> None:
    """The VM joins its group's region on the destination. Without it the VM
    still runs (its MPI falls back to the network), so a failure is logged,
    not undone by migrating back."""
    try:
        peer.ivshmem_join(call.vm_id, name)
    except DriverError as exc:
        log("ERROR", f"VM {call.vm_id} runs on {call.dest_host} without its shared-memory region: {exc}")


def _release_remote(peer: Peer, call: Call, nics) -> None:
    if not nics:
        return
    try:
        peer.release(call.vm_id)
    except DriverError as exc:  # its reservation lease expires anyway
        log("WARN", f"could not release the VFs reserved on {call.dest_host}: {exc}")


def _bring_back(host: Host, call: Call, name: str, held, peer: Peer, nics, cause: Exception,
                copy_storage: bool) -> None:
    """The destination could not give the VM its VFs: a VM must not run
    without them, so it migrates back and gets its old VFs again (returns
    once it has them; raises when it has not)."""
    log("ERROR", f"attaching VFs on {call.dest_host} failed ({cause}); migrating back")
    there = Hypervisor(host.config.dest_uri.replace("{host}", call.dest_host))
    try:
        moved = there.lookup(name)
        if moved is None:
            raise DriverError(f"domain {name} is not on {call.dest_host} after the migration; "
                              f"its VFs on {call.src_host} stay reserved for it")
        back = host.hypervisor.migrate(moved, host.hypervisor.conn, host.config.live_migration, copy_storage)
    finally:
        there.close()
    reattach(host, back, held)
    _release_remote(peer, call, nics)
