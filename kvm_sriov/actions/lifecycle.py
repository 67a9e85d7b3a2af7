"""deploy, shutdown, cancel: OpenNebula's kvm scripts with the VFs around them.

deploy reserves the VFs, programs their GUIDs and puts them in the domain XML
as <hostdev>s; the stock deploy writes that XML as the deployment file, sets
up NVRAM, vTPM and snapshots and starts the domain; then the VFs count as
attached. shutdown and cancel stop the domain the stock way, and the VFs go
back to the pool only once libvirt no longer runs the VM.
"""

from __future__ import annotations

import sys

from ..domain import domain_xml, hpc_profile, pcie_switch
from ..errors import DriverError
from ..ib import guid
from ..ivshmem import device as ivshmem, host as ivshmem_host
from ..node import traffic, whole_pfs
from ..node.host import Host
from ..node.vm import destroy_if_running, gpu_wish, records, release_all, restore_guids, served_gpu, vf_state
from ..oned import versions, vm_template
from ..opennebula import Call, log
from ..vf import gpu_affinity, numa, policy
from .delegate import Delegated, Sent, run_stock
from .undo import Undo

DEPLOYMENT_FILE = "deployment file"  # stdin's document in errors


def involves_vfs(host: Host, call: Call, sent: Sent) -> bool:
    if call.action == "deploy":
        if not sent.text:
            return False  # nothing to put VFs into: the stock script says what is wrong
        root = sent.document(DEPLOYMENT_FILE)
        if domain_xml.sriov_nics(root, host.config.bridge) or _has_options(root):
            return True
        vm = vm_document(call, sent, only_naming=(
            hpc_profile.HPC_ATTRIBUTE, hpc_profile.NUMA_ATTRIBUTE, ivshmem.ATTRIBUTE))
        return (hpc_profile.template_options(vm) != hpc_profile.VmOptions()
                or ivshmem_request(vm, root) is not None or vf_state(host, call.vm_id))
    return vf_state(host, call.vm_id)


def vm_document(call: Call, sent: Sent, only_naming: tuple[str, ...] = ()):
    """vm.xml beside the deployment file (vm_template.load), parsed at most
    once per deploy: involves_vfs asks only for the attributes it reads (and
    may leave it unparsed), deploy for all of it."""
    if vm_template.FILE_NAME in sent.derived:
        return sent.derived[vm_template.FILE_NAME]
    vm = vm_template.load(call.deployment_file, only_naming)
    if vm is not None or not only_naming:  # None after only_naming: not read, not known to be absent
        sent.derived[vm_template.FILE_NAME] = vm
    return vm


def ivshmem_request(vm, root) -> "ivshmem.Request | None":
    """The VM's shared-memory request, from vm.xml (oned writes it next to the
    deployment file before deploy); the owner is the deployment file's."""
    return ivshmem.request_of(vm, ivshmem.deployment_uid(root))


def _has_options(root) -> bool:
    """Per-VM options (HPC profile, NUMA policy) make it our deploy even without a VF."""
    return any(p.find(hpc_profile.OPTIONS) is not None for p in [root, *root.findall("metadata")])


def _untested_stock(host: Host) -> None:
    """Say, in the VM's log, when the stock kvm scripts deploy composes with
    are of an OpenNebula release kvm-sriov was not tested with."""
    try:
        version = versions.stock_version(host.remotes_dir) if host.remotes_dir else None
        if version and not versions.is_supported(version):
            log("WARN", versions.warning(host.remotes_dir))
    except OSError:  # no list of tested versions: nothing to compare with
        pass


def deploy(host: Host, call: Call, sent: Sent) -> None:
    _untested_stock(host)
    root = sent.document(DEPLOYMENT_FILE)  # changed in place below: it becomes the domain
    name = domain_xml.domain_name(root)
    vm = vm_document(call, sent)
    options = hpc_profile.merged(hpc_profile.template_options(vm), hpc_profile.take_options(root))
    nics = domain_xml.sriov_nics(root, host.config.bridge)
    spaces = guid.new_nic_spaces(vm.address_spaces() if vm else None,  # a whole PF's GUID is its own
                                 [n.request.mac for n in nics if not n.request.whole_pf],
                                 host.config.guid_policy)
    bridges = {n.request.mac: n.element.find("source").get("bridge") for n in nics}
    existing = host.hypervisor.lookup(name)
    if existing is not None and host.hypervisor.is_active(existing):
        raise DriverError(f"domain {name} is already running on {call.host}")

    hpc, nodes, numa_policy = _numa_wish(host, root, options)
    gpus = gpu_wish(host, root, vm) if nics else None
    shared = ivshmem_request(vm, root)  # refused before anything is taken
    if shared is not None:
        ivshmem_host.check_budget(host, shared)
    with host.operation(call.vm_id, "deploy") as op, Undo("deploy") as undo:
        allocations = host.reserve(call.vm_id, name, [n.request for n in nics], op="deploy",
                                   numa_nodes=nodes, numa_policy=numa_policy, gpus=gpus,
                                   carried=traffic.known_totals(vm.root) if vm is not None else None)
        undo.push(host.release, allocations)
        op.step("reserved", vfs=[a.vf.address for a in allocations])
        _report_numa(allocations, nodes, numa_policy)
        undo.push(restore_guids, host, call.vm_id)  # runs before the release
        host.program_guids(call.vm_id, allocations, spaces)
        if hpc:
            _apply_hpc(host, root, allocations)
        hostdevs = []
        for i, (nic, alloc) in enumerate(zip(nics, allocations)):
            hostdevs.append(domain_xml.replace_with_hostdev(nic, alloc.vf))
            if alloc.request.whole_pf:  # the PF itself: its VFs are off while the VM has it
                log("INFO", f"NIC {alloc.request.mac} -> PF {alloc.vf.address} (whole)")
                continue
            log("INFO", f"NIC {alloc.request.mac} -> VF {alloc.vf.address} (PF {alloc.vf.pf}"
                        f"{served_gpu(gpus, len(allocations), i, alloc.vf.pf)})")
        pairs = gpu_affinity.guest_pairs(gpus, [a.vf.pf for a in allocations])
        for level, line in pcie_switch.place(root, pairs, hostdevs):
            log(level, line)
        if allocations:
            domain_xml.record_nics(root, records(allocations, bridges, spaces))
        if shared is not None:
            ivshmem.add_device(root, shared)
            undo.push(ivshmem_host.leave, host, call.vm_id)  # also after a half-done join
            ivshmem_host.join(host, call.vm_id, name, shared)
            op.step("ivshmem-joined")
        undo.push(destroy_if_running, host, name)  # before the VFs go back to the pool
        stock = run_stock(host.remotes_dir, sent, (domain_xml.to_string(root) + "\n").encode(),
                          capture=True)
        if stock.code != 0:
            raise Delegated(stock.code)  # the stock script has said why
        dom = host.hypervisor.lookup(stock.stdout.strip() or name)
        if dom is None or not host.hypervisor.is_active(dom):
            raise DriverError(f"OpenNebula's kvm deploy succeeded, but domain {name} does not run")
        op.step("created")
        host.mark_attached(allocations, op="deploy")
        if shared is not None:
            ivshmem_host.attached(host, call.vm_id)
    sys.stdout.write(stock.stdout)  # the deploy id, as the stock script printed it


# -- InfiniBand: NUMA wish, HPC profile, GUIDs ---------------------------------
def _numa_wish(host: Host, root, options: hpc_profile.VmOptions):
    """(HPC profile on?, the VM's NUMA nodes or policy.AUTO or None, NUMA policy)."""
    hpc = host.config.hpc_profile if options.hpc is None else options.hpc
    numa_policy = options.numa or host.config.numa_policy
    nodes = numa.vm_nodes(root, host.numa_nodes)
    if nodes is None and hpc:
        nodes = policy.AUTO  # unpinned HPC VM: one node, the one with the most free VFs
    return hpc, nodes, numa_policy


def _report_numa(allocations, nodes, numa_policy: str) -> None:
    if numa_policy == "ignore" or not isinstance(nodes, frozenset):
        return
    wanted = ", ".join(map(str, sorted(nodes)))
    for a in allocations:
        if a.vf.numa_node not in nodes:
            log("WARN", f"NUMA policy '{numa_policy}' not met: VF {a.vf.address} for NIC "
                        f"{a.request.mac} is on NUMA node {a.vf.numa_node}, the VM on {wanted}")


def _apply_hpc(host: Host, root, allocations) -> None:
    node = next((a.vf.numa_node for a in allocations if a.vf.numa_node is not None), None)
    if node is None:
        pinned = numa.vm_nodes(root, host.numa_nodes)
        node = min(pinned) if pinned else (min(host.numa_nodes) if host.numa_nodes else None)
    if node is None or not host.numa_nodes.get(node):
        log("WARN", "HPC profile skipped: this host reports no NUMA node with CPUs")
        return
    for line in hpc_profile.apply(root, node, host.numa_nodes[node], host.config.hpc_hugepages,
                                  host.config.hpc_hugepage_size_kib):
        log("INFO", f"HPC profile: {line}")


def release_once_stopped(host: Host, call: Call) -> None:
    """Give the VM's VFs back only if libvirt really no longer runs it: a
    deploy id that names another domain, or a stop that did not happen,
    must not free (and reset the GUID of) a VF a running domain uses."""
    live = host.hypervisor.live_state()
    ours = f"one-{call.vm_id}"
    still = [r.name for r in live.domains.values()
             if r.name in (ours, call.deploy_id) or r.uuid == call.deploy_id.lower()]
    if still:
        raise DriverError(f"domain {still[0]} still runs on {call.host}; VM {call.vm_id} keeps its VFs")
    held = host.assignments(call.vm_id)
    in_use = [a for a in held if a.vf in live.hostdevs]
    for a in in_use:  # the next reconcile settles who owns it; its GUID stays as the domain uses it
        log("WARN", f"VF {a.vf} of VM {call.vm_id} is used by running domain "
                    f"{live.hostdevs[a.vf].name}; left for reconcile")
    try:
        if not in_use:
            release_all(host, call.vm_id)
            return
        free = [a.vf for a in held if a.vf not in live.hostdevs]
        host.restore_vf_guids(free)
        with host.pool.transaction() as txn:
            txn.release(free)
        for vf in free:
            log("INFO", f"released VF {vf}")
        try:  # its whole PFs back to the host, but one a running domain holds
            whole_pfs.give_back(host, host.pf_assignments(call.vm_id), live)
        except DriverError:
            pass  # said in the VM log; that PF stays held, for reconcile
    finally:  # libvirt runs no domain of this VM any more; after its VFs, never raises
        ivshmem_host.leave(host, call.vm_id)


def _stop(host: Host, call: Call, sent: Sent) -> None:
    with host.operation(call.vm_id, call.action) as op:
        stock = run_stock(host.remotes_dir, sent)
        if stock.code != 0:  # the domain may still run: it keeps its VFs
            raise Delegated(stock.code)
        op.step("stopped")
        release_once_stopped(host, call)


def shutdown(host: Host, call: Call, sent: Sent) -> None:
    """ACPI power-off, forced per kvmrc (SHUTDOWN_TIMEOUT, FORCE_DESTROY)."""
    _stop(host, call, sent)


def cancel(host: Host, call: Call, sent: Sent) -> None:
    _stop(host, call, sent)
