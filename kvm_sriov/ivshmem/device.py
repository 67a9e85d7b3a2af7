"""IVShmem: one host shared-memory region per (owner, VM group), shown to
each of that group's VMs on this host as a QEMU ``ivshmem-plain`` PCI device
(libvirt ``<shmem>``), so co-resident MPI ranks can talk through memory
instead of down to the HCA and back (docs/ivshmem.md).

This module: the request (``KVM_SRIOV_IVSHMEM = [ SIZE = "<MB>" ]`` in the
VM template), the region's name and the device in the domain XML. The
region's name comes only from what oned controls (the owner's UID and the
VM group's ID), never from a string a user chose, so no tenant can name,
and so join, another one's region. Region files: region.py; who uses
which region: table.py; the actions' use: host.py.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..errors import InputError

ATTRIBUTE = "KVM_SRIOV_IVSHMEM"
PREFIX = "kvm-sriov-ivshmem"
NAME = re.compile(rf"^{PREFIX}-u(\d+)-g(\d+)$")
MAX_SIZE_MB = 65536            # libvirt: a power of two; more would be a typo, not a wish
MAX_ID = 2**31 - 1             # oned's IDs (owner, VM group, VM) are non-negative int32
METADATA_NS = "urn:kvm-sriov:ivshmem:1"
ET.register_namespace("ivshmem", METADATA_NS)

class Request(NamedTuple):
    uid: int
    vmgroup: int
    size_mb: int

    @property
    def name(self) -> str:
        return f"{PREFIX}-u{self.uid}-g{self.vmgroup}"


# -- the request -----------------------------------------------------------
def size_mb(text: Optional[str]) -> int:
    if text is None or not re.fullmatch(r"[0-9]{1,6}", text):
        raise InputError(f"{ATTRIBUTE}: SIZE must be a whole number of MB, got {str(text)[:40]!r}")
    size = int(text)
    if size < 1 or size > MAX_SIZE_MB or size & (size - 1):
        raise InputError(f"{ATTRIBUTE}: SIZE {size} MB must be a power of two from 1 to {MAX_SIZE_MB} "
                         f"(libvirt and the PCI BAR need a power of two)")
    return size


def request_of(vm, uid: Optional[int] = None) -> Optional[Request]:
    """The VM's request from its OpenNebula VM document (a
    vm_template.VmTemplate: vm.xml, or an action's VM), None without the
    attribute. uid: the owner as the deployment file says (wins)."""
    if vm is None:
        return None
    vector = vm.vector(ATTRIBUTE)
    if vector is None:
        return None
    size = size_mb(vector.get("SIZE"))
    if vm.vmgroup_id is None:
        raise InputError(f"{ATTRIBUTE}: the VM is in no VM group; VMs share a region through "
                         f"their OpenNebula VM group (VMGROUP = [ VMGROUP_ID = ..., ROLE = ... ])")
    uid = vm.uid if uid is None else uid
    if uid is None:
        raise InputError(f"{ATTRIBUTE}: the VM XML names no owner (UID)")
    return Request(bounded_id(uid, "owner UID"), bounded_id(vm.vmgroup_id, "VMGROUP_ID"), size)


def bounded_id(value: int, what: str) -> int:
    """An ID as oned has them (int32, non-negative); anything else is refused."""
    if not 0 <= value <= MAX_ID:
        raise InputError(f"{ATTRIBUTE}: {what} {str(value)[:20]} is not an OpenNebula ID (0..{MAX_ID})")
    return value


def deployment_uid(root: ET.Element) -> Optional[int]:
    """<metadata><one:vm><one:uid> of OpenNebula's deployment file."""
    for el in root.iter():
        if str(el.tag).endswith("}uid") and "opennebula.org" in str(el.tag):
            text = (el.text or "").strip()
            return int(text) if re.fullmatch(r"[0-9]{1,10}", text) else None
    return None


# -- the device in the domain XML -----------------------------------------
class Placement(NamedTuple):
    """Where the device sits: a root port of its own (q35: PCIe slots are
    hot-pluggable only behind one), or a free slot of the PCI bus (pc)."""
    bus: int
    slot: int
    root_port: Optional[int]  # the controller index we add, None on pc


def _pci_addresses(root: ET.Element) -> set[tuple[int, int]]:
    out = set()
    for a in root.iter("address"):
        if a.get("type") == "pci" and a.get("bus") and a.get("slot"):
            try:
                out.add((int(a.get("bus"), 0), int(a.get("slot"), 0)))
            except ValueError:
                continue
    return out


def placement_for(root: ET.Element) -> Placement:
    machine = (root.find("os/type").get("machine", "") if root.find("os/type") is not None else "")
    devices = root.find("devices")
    if "q35" in machine:
        used = [int(c.get("index", "0")) for c in devices.findall("controller") if c.get("type") == "pci"]
        index = max(used, default=0) + 1
        return Placement(index, 0, index)
    taken = {slot for bus, slot in _pci_addresses(root) if bus == 0}
    for slot in range(0x1f, 0x02, -1):
        if slot not in taken:
            return Placement(0, slot, None)
    raise InputError(f"{ATTRIBUTE}: no free PCI slot on bus 0 for the shared-memory device")


def shmem_element(name: str, size: int, where: Placement) -> ET.Element:
    shmem = ET.Element("shmem", name=name)
    ET.SubElement(shmem, "model", type="ivshmem-plain")
    ET.SubElement(shmem, "size", unit="M").text = str(size)
    ET.SubElement(shmem, "address", type="pci", domain="0x0000", bus=f"0x{where.bus:02x}",
                  slot=f"0x{where.slot:02x}", function="0x0")
    return shmem


def add_device(root: ET.Element, request: Request) -> Placement:
    """Put the region's device (and its root port on q35) into a deployment
    file, and our record of it into <metadata>."""
    where = placement_for(root)
    devices = root.find("devices")
    if where.root_port is not None:
        ET.SubElement(devices, "controller", type="pci", index=str(where.root_port), model="pcie-root-port")
    devices.append(shmem_element(request.name, request.size_mb, where))
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.SubElement(root, "metadata")
    metadata.append(record_element(request, where))
    return where


def record_element(request: Request, where: Placement, namespaced: bool = True) -> ET.Element:
    ns = f"{{{METADATA_NS}}}" if namespaced else ""
    return ET.Element(f"{ns}ivshmem", region=request.name, uid=str(request.uid),
                      vmgroup=str(request.vmgroup), size_mb=str(request.size_mb),
                      bus=str(where.bus), slot=str(where.slot))


class Record(NamedTuple):
    request: Request
    where: Placement


def recorded(root: ET.Element) -> Optional[Record]:
    """Our record in a domain's (or saved image's) metadata, None if none."""
    el = root.find(f"metadata/{{{METADATA_NS}}}ivshmem")
    if el is None:
        return None
    try:
        request = Request(bounded_id(int(el.get("uid")), "owner UID"),
                          bounded_id(int(el.get("vmgroup")), "VMGROUP_ID"), size_mb(el.get("size_mb")))
        where = Placement(int(el.get("bus")), int(el.get("slot")), None)
    except (TypeError, ValueError, InputError):
        raise InputError("the domain's ivshmem record is damaged") from None
    if el.get("region") != request.name:
        raise InputError("the domain's ivshmem record names another region than its owner's group")
    return Record(request, where)


def live_regions(root: ET.Element) -> list[str]:
    """Names of our regions a domain XML has devices for."""
    return [s.get("name") for s in root.findall("devices/shmem") if NAME.match(s.get("name") or "")]


