"""deploy, shutdown, cancel, reboot, reset."""

from __future__ import annotations

from pathlib import Path

from .. import domain_xml, hpc_profile, policy
from ..errors import DriverError, InputError
from ..host import Allocation, Host
from ..opennebula import Call, log


def _deployment_xml(call: Call, stdin: str) -> str:
    """OpenNebula >= 5.0 pipes the deployment file; older ones only name it."""
    if stdin:
        return stdin
    try:
        return Path(call.deployment_file).read_text()
    except OSError as exc:
        raise InputError(f"no domain XML on stdin and cannot read {call.deployment_file}: "
                         f"{exc.strerror}") from None


def records(allocations: list[Allocation], bridges: dict[str, str]) -> list[domain_xml.NicRecord]:
    """Metadata records for a domain being built (bridges: MAC -> BRIDGE)."""
    return [domain_xml.NicRecord(a.request.mac, bridges.get(a.request.mac, ""), a.vf.address, a.vf.pf)
            for a in allocations]


def with_vfs(dom, allocations: list[Allocation], new_bridges: dict[str, str] = None,
             drop: str = "") -> list[domain_xml.NicRecord]:
    """The live domain's VF NIC records, updated: NICs in allocations have
    their VF, every other recorded NIC has none (detached) but stays known;
    new_bridges (MAC -> BRIDGE) adds hot-plugged NICs, drop removes one."""
    by_mac = {a.request.mac: a for a in allocations}
    known = domain_xml.recorded_nics(domain_xml.parse(dom.XMLDesc(0)))
    bridges = {r.mac: r.bridge for r in known}
    bridges.update({m: b for m, b in (new_bridges or {}).items() if m not in bridges})
    out = []
    for mac, bridge in bridges.items():
        if mac == drop:
            continue
        a = by_mac.get(mac)
        out.append(domain_xml.NicRecord(mac, bridge, a.vf.address if a else "", a.vf.pf if a else ""))
    return out


def recorded_bridges(dom) -> dict[str, str]:
    """MAC -> BRIDGE of the VF NICs a live domain's metadata records."""
    return {r.mac: r.bridge for r in domain_xml.recorded_nics(domain_xml.parse(dom.XMLDesc(0)))}


def deploy(host: Host, call: Call, stdin: str) -> str:
    root = domain_xml.parse(_deployment_xml(call, stdin), "deployment file")
    name = domain_xml.domain_name(root)
    options = hpc_profile.take_options(root)
    nics = domain_xml.sriov_nics(root, host.config.bridge)
    bridges = {n.request.mac: n.element.find("source").get("bridge") for n in nics}
    existing = host.hypervisor.lookup(name)
    if existing is not None and host.hypervisor.is_active(existing):
        raise DriverError(f"domain {name} is already running on {call.host}")

    hpc, nodes, numa_policy = _numa_wish(host, root, options)
    with host.operation(call.vm_id, "deploy") as op:
        allocations = host.reserve(call.vm_id, name, [n.request for n in nics], op="deploy",
                                   numa_nodes=nodes, numa_policy=numa_policy)
        op.step("reserved", vfs=[a.vf.address for a in allocations])
        try:
            _report_numa(allocations, nodes, numa_policy)
            host.program_guids(call.vm_id, allocations)
            if hpc:
                _apply_hpc(host, root, allocations)
            for nic, alloc in zip(nics, allocations):
                domain_xml.replace_with_hostdev(nic, alloc.vf)
                log("INFO", f"NIC {alloc.request.mac} -> VF {alloc.vf.address} (PF {alloc.vf.pf})")
            if allocations:
                domain_xml.record_nics(root, records(allocations, bridges))
            dom = host.hypervisor.create(domain_xml.to_string(root))
        except BaseException:
            restore_guids(host, call.vm_id)
            host.release(allocations)
            raise
        op.step("created")
        try:
            host.mark_attached(allocations, op="deploy")
            return dom.UUIDString()
        except BaseException:
            host.hypervisor.destroy(dom)  # no half-deployed VM: it is not in the pool
            restore_guids(host, call.vm_id)
            host.release(allocations)
            raise


# -- InfiniBand (issue 4): NUMA wish, HPC profile, GUIDs -----------------------
def _numa_wish(host: Host, root, options: hpc_profile.VmOptions):
    """(HPC profile on?, the VM's NUMA nodes or policy.AUTO or None, NUMA policy)."""
    from .. import numa
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
        from .. import numa
        pinned = numa.vm_nodes(root, host.numa_nodes)
        node = min(pinned) if pinned else (min(host.numa_nodes) if host.numa_nodes else None)
    if node is None or not host.numa_nodes.get(node):
        log("WARN", "HPC profile skipped: this host reports no NUMA node with CPUs")
        return
    for line in hpc_profile.apply(root, node, host.numa_nodes[node], host.config.hpc_hugepages,
                                  host.config.hpc_hugepage_size_kib):
        log("INFO", f"HPC profile: {line}")


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
    """The VM's VFs leave it: original GUIDs back, then free in the pool."""
    restore_guids(host, vm_id)
    for a in host.release_vm(vm_id):
        log("INFO", f"released VF {a.vf} (NIC {a.mac or '?'})")


def shutdown(host: Host, call: Call, stdin: str) -> None:
    with host.operation(call.vm_id, "shutdown") as op:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            log("INFO", f"domain {call.deploy_id} is not running")
        elif not host.hypervisor.shutdown(dom, host.config.shutdown_seconds):
            raise DriverError(
                f"domain {call.deploy_id} did not power off within "
                f"{host.config.shutdown_seconds:.0f}s of the ACPI shutdown request; it still runs "
                f"and keeps its VFs (use a hard shutdown, or raise timeouts.shutdown_seconds)")
        op.step("stopped")
        release_all(host, call.vm_id)


def cancel(host: Host, call: Call, stdin: str) -> None:
    with host.operation(call.vm_id, "cancel") as op:
        dom = running_domain(host, call.deploy_id)
        if dom is None:
            log("INFO", f"domain {call.deploy_id} is not running")
        else:
            host.hypervisor.destroy(dom)
        op.step("stopped")
        release_all(host, call.vm_id)


def _running(host: Host, call: Call):
    dom = running_domain(host, call.deploy_id)
    if dom is None:
        raise DriverError(f"domain {call.deploy_id} is not running on {call.host}")
    return dom


def reboot(host: Host, call: Call, stdin: str) -> None:
    """ACPI reboot: the guest restarts, its VFs stay assigned."""
    host.hypervisor.reboot(_running(host, call))


def reset(host: Host, call: Call, stdin: str) -> None:
    """Hard reset: the guest restarts at once, its VFs stay assigned."""
    host.hypervisor.reset(_running(host, call))
