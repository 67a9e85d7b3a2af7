"""NUMA facts: the host's nodes and CPUs (sysfs) and where a VM is pinned (domain XML).

Pure reads; the choice itself is in :mod:`kvm_sriov.vf.policy`.
"""

from __future__ import annotations

from typing import Optional

from ..errors import InputError
from .sysfs import Sysfs


def parse_cpuset(text: str) -> set[int]:
    """libvirt/kernel cpusets: '0-3,8,^2' -> {0, 1, 3, 8}."""
    add, drop = set(), set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        target = drop if part.startswith("^") else add
        part = part.lstrip("^")
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                target.update(range(int(lo), int(hi) + 1))
            else:
                target.add(int(part))
        except ValueError:
            raise InputError(f"not a CPU/node set: {text!r}") from None
    return add - drop


def format_cpuset(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def host_nodes(sysfs: Sysfs) -> dict[int, set[int]]:
    """NUMA node -> its CPUs (empty dict on a host without NUMA information)."""
    nodes = {}
    base = sysfs.path("devices", "system", "node")
    for name in sysfs.listdir(base):
        if name.startswith("node") and name[4:].isdigit():
            cpus = sysfs.read(base / name / "cpulist")
            nodes[int(name[4:])] = parse_cpuset(cpus) if cpus else set()
    return nodes


def vm_nodes(root, nodes: dict[int, set[int]]) -> Optional[frozenset[int]]:
    """The NUMA nodes a domain is bound to: its numatune memory nodeset, else the
    nodes of its pinned vCPUs (cputune/vcpupin, then <vcpu cpuset>); None if unpinned."""
    mem = root.find("numatune/memory")
    if mem is not None and mem.get("nodeset"):
        return frozenset(parse_cpuset(mem.get("nodeset")))
    memnodes = root.findall("numatune/memnode")
    if memnodes:
        return frozenset(n for m in memnodes for n in parse_cpuset(m.get("nodeset", "")))
    cpus: set[int] = set()
    for pin in root.findall("cputune/vcpupin"):
        cpus |= parse_cpuset(pin.get("cpuset", ""))
    vcpu = root.find("vcpu")
    if not cpus and vcpu is not None and vcpu.get("cpuset"):
        cpus = parse_cpuset(vcpu.get("cpuset"))
    if not cpus:
        return None
    found = frozenset(n for n, node_cpus in nodes.items() if cpus & node_cpus)
    return found or None
