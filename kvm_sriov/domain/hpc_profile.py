"""Per-VM options and the HPC profile, applied to the libvirt domain XML.

Per-VM options are plain attributes of the VM template, which any user may
set (read from vm.xml, which oned writes next to the deployment file, by
vm_template.py; the scheduler's placement policy reads the same names):

    KVM_SRIOV_HPC  = "yes"        # yes|no (default: the host's hpc.profile)
    KVM_SRIOV_NUMA = "require"    # prefer|require|ignore (default: pool.numa_policy)
    KVM_SRIOV_GPU_AFFINITY = "switch"   # switch|root|numa|none (default none): each IB
                                        # NIC's VF from a PF that close to a passed-through
                                        # GPU (docs/gpu.md; template attribute only)

The older form, one element in the deployment file through OpenNebula's RAW
section, is still read (the driver removes it before libvirt sees the
domain); it needs RAW/DATA, which oned.conf restricts to administrators and
should keep so, since it lets a template inject any domain XML. Where both
give an option, the attribute wins:

    RAW = [ TYPE = "kvm", DATA = "<metadata><sriov:options xmlns:sriov='urn:kvm-sriov:metadata:1'
                                   hpc='yes' numa='require'/></metadata>" ]

The HPC profile (docs/infiniband.md has the trade-offs): host-passthrough
CPU, every vCPU pinned to a CPU of the VF's NUMA node and the emulator to
that node, ``numatune`` strict on it, hugepages, no memory balloon. Pins
that OpenNebula already wrote (TOPOLOGY/PIN_POLICY) are kept.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..errors import InputError
from ..opennebula import shown
from ..vf.numa import format_cpuset
from ..vf.policy import GPU_AFFINITIES, NO_GPU_AFFINITY, NUMA_POLICIES
from .domain_xml import METADATA_NS, parse

OPTIONS = f"{{{METADATA_NS}}}options"
YES, NO = ("yes", "true", "1", "on"), ("no", "false", "0", "off")


class VmOptions(NamedTuple):
    hpc: Optional[bool] = None        # None: host default
    numa: Optional[str] = None        # None: host default


HPC_ATTRIBUTE = "KVM_SRIOV_HPC"
NUMA_ATTRIBUTE = "KVM_SRIOV_NUMA"
GPU_AFFINITY_ATTRIBUTE = "KVM_SRIOV_GPU_AFFINITY"


def _hpc(text: Optional[str], where: str) -> Optional[bool]:
    """where: how the user wrote it, '{}' standing for the value."""
    t = (text or "").strip().lower()
    if t and t not in YES + NO:
        raise InputError(f"{where.format(shown(t))}: use yes or no")
    return (t in YES) if t else None


def _numa(text: Optional[str], where: str) -> Optional[str]:
    t = (text or "").strip().lower() or None
    if t is not None and t not in NUMA_POLICIES:
        raise InputError(f"{where.format(shown(t))}: use one of {', '.join(NUMA_POLICIES)}")
    return t


def template_options(vm) -> VmOptions:
    """KVM_SRIOV_HPC / KVM_SRIOV_NUMA of a vm_template.VmTemplate (None: no vm.xml)."""
    if vm is None:
        return VmOptions()
    return VmOptions(_hpc(vm.attribute(HPC_ATTRIBUTE), HPC_ATTRIBUTE + ' = "{}"'),
                     _numa(vm.attribute(NUMA_ATTRIBUTE), NUMA_ATTRIBUTE + ' = "{}"'))


def gpu_affinity(vm) -> str:
    """KVM_SRIOV_GPU_AFFINITY of a vm_template.VmTemplate: switch, root, numa
    or none (absent, empty, or no vm.xml)."""
    t = ((vm.attribute(GPU_AFFINITY_ATTRIBUTE) if vm is not None else None) or "").lower()
    if t and t not in GPU_AFFINITIES:
        raise InputError(f"{GPU_AFFINITY_ATTRIBUTE} = {shown(t)!r}: use one of {', '.join(GPU_AFFINITIES)}")
    return t or NO_GPU_AFFINITY


def merged(attribute: VmOptions, raw: VmOptions) -> VmOptions:
    """Each option from the template attribute when it is set, else from RAW."""
    return VmOptions(*(a if a is not None else r for a, r in zip(attribute, raw)))


def take_options(root: ET.Element) -> VmOptions:
    """Read (and remove) the VM's <sriov:options> element, top level or in <metadata>."""
    found = [(parent, el) for parent in [root, *root.findall("metadata")]
             for el in parent.findall(OPTIONS)]
    if len(found) > 1:
        raise InputError("the domain carries more than one <sriov:options> element")
    if not found:
        return VmOptions()
    parent, el = found[0]
    parent.remove(el)
    if parent is not root and len(parent) == 0 and not (parent.text or "").strip():
        root.remove(parent)  # RAW's own <metadata> wrapper: libvirt keeps only one <metadata>
    return VmOptions(_hpc(el.get("hpc"), "<sriov:options hpc='{}'>"),
                     _numa(el.get("numa"), "<sriov:options numa='{}'>"))


# the namespaces oned declares on the deployment file's <domain>, which RAW DATA may use
_DOMAIN_NAMESPACES = "xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"


def raw_options(vm) -> VmOptions:
    """The <sriov:options> of a vm_template.VmTemplate's RAW sections (TYPE
    kvm), read as deploy reads them once oned has copied them into the
    deployment file (take_options): the placer's view of the same element.
    A DATA that does not parse gives none (oned checked it against libvirt's
    schema: that would be this reader's shortfall, not the user's)."""
    text = "\n".join(raw.findtext("DATA") or "" for raw in vm.root.iterfind("TEMPLATE/RAW")
                     if (raw.findtext("TYPE") or "").strip().lower() == "kvm")
    if METADATA_NS not in text:
        return VmOptions()
    try:
        root = parse(f"<domain {_DOMAIN_NAMESPACES}>{text}</domain>", "RAW DATA")
    except InputError:
        return VmOptions()
    return take_options(root)


def vm_options(vm) -> VmOptions:
    """Both forms of a VM's options from OpenNebula's VM document alone
    (the placer has no deployment file), the attribute winning as in deploy."""
    return merged(template_options(vm), raw_options(vm) if vm is not None else VmOptions())


MAX_VCPUS = 4096  # KVM's own limit (KVM_MAX_VCPUS): a pin per vCPU beyond it is only work


def vcpu_count(text: Optional[str]) -> int:
    t = (text or "1").strip()
    if not re.fullmatch(r"[0-9]{1,6}", t) or not 1 <= int(t) <= MAX_VCPUS:
        raise InputError(f"HPC profile: <vcpu> must be a number of vCPUs from 1 to {MAX_VCPUS}, "
                         f"got {shown(t)!r}")
    return int(t)


def _child(parent: ET.Element, tag: str) -> ET.Element:
    el = parent.find(tag)
    return el if el is not None else ET.SubElement(parent, tag)


def apply(root: ET.Element, node: int, node_cpus, hugepages: bool = True,
          hugepage_size_kib: int = 0) -> list[str]:
    """Edit the domain for HPC on NUMA node ``node``; returns what was done (for the log)."""
    done = []
    cpus = sorted(node_cpus)
    if not cpus:
        raise InputError(f"HPC profile: NUMA node {node} has no CPUs on this host")

    cpu = _child(root, "cpu")
    for attr in list(cpu.attrib):
        if attr not in ("mode",):
            del cpu.attrib[attr]
    cpu.set("mode", "host-passthrough")
    cpu.set("check", "none")
    for model in cpu.findall("model") + cpu.findall("vendor") + cpu.findall("feature"):
        cpu.remove(model)
    done.append("host-passthrough CPU")

    vcpu_el = root.find("vcpu")
    vcpus = vcpu_count(vcpu_el.text if vcpu_el is not None else "1")
    cputune = _child(root, "cputune")
    if cputune.find("vcpupin") is None:
        pins = []
        for i in range(vcpus):
            pins.append(ET.Element("vcpupin", vcpu=str(i), cpuset=str(cpus[i % len(cpus)])))
        _insert_cputune(cputune, pins)
        done.append(f"{vcpus} vCPUs pinned to CPUs {format_cpuset(cpus[:vcpus])} of node {node}")
        if vcpus > len(cpus):
            done.append(f"WARNING: {vcpus} vCPUs share the {len(cpus)} CPUs of node {node}")
    else:
        done.append("vCPU pins from OpenNebula kept")
    if cputune.find("emulatorpin") is None:
        _insert_cputune(cputune, [ET.Element("emulatorpin", cpuset=format_cpuset(cpus))])
        done.append(f"emulator pinned to node {node}")

    numatune = _child(root, "numatune")
    memory = numatune.find("memory")
    if memory is None:
        memory = ET.Element("memory")
        numatune.insert(0, memory)
    memory.set("mode", "strict")
    if not memory.get("nodeset") and numatune.find("memnode") is None:
        memory.set("nodeset", str(node))
    done.append(f"memory strict on node(s) {memory.get('nodeset') or node}")

    if hugepages:
        backing = _child(root, "memoryBacking")
        pages = backing.find("hugepages")
        if pages is None:
            pages = ET.Element("hugepages")
            backing.insert(0, pages)
        if hugepage_size_kib and pages.find("page") is None:
            ET.SubElement(pages, "page", size=str(hugepage_size_kib), unit="KiB")
        done.append("hugepages" + (f" of {hugepage_size_kib} KiB" if hugepage_size_kib else ""))

    devices = root.find("devices")
    if devices is None:
        devices = ET.SubElement(root, "devices")
    for all_devices in root.findall("devices"):
        for balloon in all_devices.findall("memballoon"):
            all_devices.remove(balloon)
    ET.SubElement(devices, "memballoon", model="none")
    done.append("no memory balloon")
    return done


def _insert_cputune(cputune: ET.Element, elements) -> None:
    """libvirt's schema wants vcpupin/emulatorpin after shares/period/quota... order-free
    in practice, but keep them first-after-shares for people reading the XML."""
    anchor = None
    for tag in ("shares", "period", "quota", "global_period", "global_quota"):
        if cputune.find(tag) is not None:
            anchor = cputune.find(tag)
    index = list(cputune).index(anchor) + 1 if anchor is not None else 0
    existing_pins = cputune.findall("vcpupin")
    if existing_pins:
        index = list(cputune).index(existing_pins[-1]) + 1
    for offset, el in enumerate(elements):
        cputune.insert(index + offset, el)
