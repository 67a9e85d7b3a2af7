"""libvirt domain XML: find the NICs that become VFs, swap them for
``<hostdev>`` elements, and read hostdevs back out of live domains.

Parsed and written with lxml only (no string splicing); the parser refuses
DTDs and never resolves entities or touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from lxml import etree

from .discovery import VirtualFunction
from .errors import InputError
from .policy import VfRequest

METADATA_NS = "urn:kvm-sriov:metadata:1"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                          dtd_validation=False, huge_tree=False, strip_cdata=False,
                          remove_blank_text=False)


def parse(text: str, what: str = "domain XML") -> etree._Element:
    if not text or not text.strip():
        raise InputError(f"{what} is empty")
    try:
        root = etree.fromstring(text.strip().encode(), _PARSER)
    except etree.XMLSyntaxError as exc:
        raise InputError(f"{what} is not well-formed XML: {exc}") from None
    if root.getroottree().docinfo.doctype:
        raise InputError(f"{what} carries a DOCTYPE, which is refused")
    return root


def to_string(root: etree._Element) -> str:
    return etree.tostring(root, encoding="unicode")


def domain_name(root: etree._Element) -> str:
    if root.tag != "domain":
        raise InputError(f"expected a libvirt <domain>, got <{root.tag}>")
    name = (root.findtext("name") or "").strip()
    if not name:
        raise InputError("the domain XML has no <name>")
    return name


@dataclass(frozen=True)
class SriovNic:
    """An ``<interface>`` that the VF pool must serve."""
    element: etree._Element
    request: VfRequest


def bridge_selector(bridge: str, marker: str) -> tuple[bool, Optional[str]]:
    """'ib-sriov' -> (True, None); 'ib-sriov:mlx5_0' -> (True, 'mlx5_0')."""
    if bridge == marker:
        return True, None
    if bridge.startswith(marker + ":") and bridge[len(marker) + 1:].strip():
        return True, bridge[len(marker) + 1:].strip()
    return False, None


def sriov_nics(root: etree._Element, marker: str) -> list[SriovNic]:
    nics = []
    for iface in root.iterfind("devices/interface"):
        source = iface.find("source")
        bridge = source.get("bridge", "") if source is not None else ""
        ours, selector = bridge_selector(bridge, marker)
        if not ours:
            continue
        mac_el = iface.find("mac")
        mac = (mac_el.get("address", "") if mac_el is not None else "").lower()
        if not mac:
            raise InputError(f"an interface on bridge {bridge!r} has no MAC address")
        nics.append(SriovNic(iface, VfRequest(mac=mac, pf_selector=selector)))
    return nics


def alias_for(mac: str) -> str:
    """A libvirt user alias ('ua-' prefix) naming the NIC a hostdev stands for."""
    return "ua-sriov-" + mac.replace(":", "")


def hostdev_element(vf: VirtualFunction, mac: str) -> etree._Element:
    dom, bus, slot, fn = vf.pci_parts
    hostdev = etree.Element("hostdev", mode="subsystem", type="pci", managed="yes")
    source = etree.SubElement(hostdev, "source")
    etree.SubElement(source, "address", domain=f"0x{dom:04x}", bus=f"0x{bus:02x}",
                     slot=f"0x{slot:02x}", function=f"0x{fn:x}")
    etree.SubElement(hostdev, "alias", name=alias_for(mac))
    return hostdev


def replace_with_hostdev(nic: SriovNic, vf: VirtualFunction) -> etree._Element:
    """Put the VF where the interface was; keep its boot order, if any."""
    hostdev = hostdev_element(vf, nic.request.mac)
    boot = nic.element.find("boot")
    if boot is not None:
        hostdev.append(etree.fromstring(etree.tostring(boot)))
    hostdev.tail = nic.element.tail
    nic.element.getparent().replace(nic.element, hostdev)
    return hostdev


@dataclass(frozen=True)
class NicRecord:
    """What <metadata> remembers of one VF NIC: it survives save/restore and
    migration with the domain, so the VM's VF NICs are known without oned."""
    mac: str
    bridge: str
    vf: str = ""   # empty while the VF is detached (saved, migrating)
    pf: str = ""

    @property
    def request(self) -> VfRequest:
        return VfRequest(self.mac, self.bridge.partition(":")[2].strip() or None)


def metadata_element(records: Iterable[NicRecord], namespaced: bool = True) -> etree._Element:
    """Our <metadata> block; libvirt's setMetadata wants it without the
    namespace, which it adds itself."""
    ns = f"{{{METADATA_NS}}}" if namespaced else ""
    block = etree.Element(f"{ns}sriov", nsmap={"sriov": METADATA_NS} if namespaced else None)
    for r in records:
        etree.SubElement(block, f"{ns}nic", mac=r.mac, bridge=r.bridge, vf=r.vf, pf=r.pf)
    return block


def record_nics(root: etree._Element, records: Iterable[NicRecord]) -> None:
    """Write the records into a domain XML's <metadata> (replacing ours only)."""
    metadata = root.find("metadata")
    if metadata is None:
        metadata = etree.SubElement(root, "metadata")
    for old in metadata.findall(f"{{{METADATA_NS}}}sriov"):
        metadata.remove(old)
    metadata.append(metadata_element(records))


def recorded_nics(root: etree._Element) -> list[NicRecord]:
    block = root.find(f"metadata/{{{METADATA_NS}}}sriov")
    if block is None:
        return []
    # libvirt's setMetadata may leave the children without the namespace
    return [NicRecord(n.get("mac", ""), n.get("bridge", ""), n.get("vf", ""), n.get("pf", ""))
            for n in block if etree.QName(n).localname == "nic" and n.get("mac")]


def hostdev_address(hostdev: etree._Element) -> Optional[str]:
    """'0000:03:00.1' for a PCI <hostdev>, None for anything else."""
    addr = hostdev.find("source/address")
    if hostdev.get("type") != "pci" or addr is None:
        return None
    try:
        return "{:04x}:{:02x}:{:02x}.{:x}".format(
            int(addr.get("domain", "0"), 0), int(addr.get("bus"), 0),
            int(addr.get("slot"), 0), int(addr.get("function"), 0))
    except (TypeError, ValueError):
        return None


def pci_hostdevs(root: etree._Element) -> dict[str, etree._Element]:
    """Every PCI hostdev of a domain, by host PCI address."""
    found = {}
    for hostdev in root.iterfind("devices/hostdev"):
        address = hostdev_address(hostdev)
        if address:
            found[address] = hostdev
    return found
