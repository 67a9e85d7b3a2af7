"""libvirt domain XML: find the NICs that become VFs, swap them for
``<hostdev>`` elements, and read hostdevs back out of live domains.

Parsed and written as element trees (no string splicing) with the standard
library's ElementTree: every action pays for its imports, and lxml alone
costs more start-up than all of virsh. The parser refuses DTDs, so no
entity is ever declared, expanded or fetched; namespace prefixes are kept
as written (OpenNebula's monitoring reads ``one:vm`` by that prefix).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..errors import InputError
from ..vf.discovery import VirtualFunction
from ..vf import policy
from ..vf.policy import VfRequest, is_whole_pf_bridge, nic_request

METADATA_NS = "urn:kvm-sriov:metadata:1"
ET.register_namespace("sriov", METADATA_NS)
# Far above any real domain or action XML (tens of KB, depth ~10), far below
# what costs: a 200 MB document took 2.1 GB, 20,000 levels a RecursionError.
MAX_XML_CHARS = 8 * 1024 * 1024
MAX_XML_DEPTH = 64


class _Builder(ET.TreeBuilder):
    """Keeps comments and processing instructions; refuses a DOCTYPE;
    remembers the document's namespace prefixes for writing it back."""

    def __init__(self, what: str):
        super().__init__(insert_comments=True, insert_pis=True)
        self.what = what
        self.depth = 0

    def start(self, tag, attrs):
        self.depth += 1
        if self.depth > MAX_XML_DEPTH:
            raise InputError(f"{self.what} nests elements more than {MAX_XML_DEPTH} deep")
        return super().start(tag, attrs)

    def end(self, tag):
        self.depth -= 1
        return super().end(tag)

    def doctype(self, name, pubid, system):
        raise InputError(f"{self.what} carries a DOCTYPE, which is refused")

    def start_ns(self, prefix, uri):
        if prefix and not prefix.startswith("ns"):  # ElementTree reserves ns<N>
            ET.register_namespace(prefix, uri)


def parse(text: str, what: str = "domain XML") -> ET.Element:
    if not text or not text.strip():
        raise InputError(f"{what} is empty")
    if len(text) > MAX_XML_CHARS:
        raise InputError(f"{what} is larger than {MAX_XML_CHARS // (1024 * 1024)} MiB")
    parser = ET.XMLParser(target=_Builder(what))
    try:
        parser.feed(text.strip())
        return parser.close()
    except ET.ParseError as exc:
        raise InputError(f"{what} is not well-formed XML: {exc}") from None


def parse_live(text: str) -> ET.Element:
    """libvirt's own XML of a running domain, only to be read: it never
    carries a DOCTYPE and is never written back, so the C tree builder
    reads it (about 3x faster than parse(); live_state reads every domain
    on the host, some of it while other actions wait for the pool)."""
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError(f"libvirt's domain XML is not well-formed XML: {exc}") from None


def to_string(root: ET.Element) -> str:
    return ET.tostring(root, encoding="unicode")


def domain_name(root: ET.Element) -> str:
    if root.tag != "domain":
        raise InputError(f"expected a libvirt <domain>, got <{root.tag}>")
    name = (root.findtext("name") or "").strip()
    if not name:
        raise InputError("the domain XML has no <name>")
    return name


class SriovNic(NamedTuple):
    """An ``<interface>`` that the VF pool must serve, and where it sits."""
    element: ET.Element
    parent: ET.Element
    request: VfRequest


def bridge_selector(bridge: str, marker: str) -> tuple[bool, Optional[str]]:
    """'ib-sriov' -> (True, None); 'ib-sriov:mlx5_0' -> (True, 'mlx5_0')."""
    return policy.bridge_selector(bridge, marker)


def sriov_nics(root: ET.Element, marker: str) -> list[SriovNic]:
    nics = []
    for devices in root.iterfind("devices"):
        nics += _sriov_nics_in(devices, marker)
    return nics


def _sriov_nics_in(devices: ET.Element, marker: str) -> list[SriovNic]:
    nics = []
    for iface in devices.iterfind("interface"):
        source = iface.find("source")
        bridge = source.get("bridge", "") if source is not None else ""
        request = nic_request("", bridge, marker)  # a VF, or a whole PF ("ib-pf")
        if request is None:
            continue
        mac_el = iface.find("mac")
        mac = (mac_el.get("address", "") if mac_el is not None else "").lower()
        if not mac:
            raise InputError(f"an interface on bridge {bridge!r} has no MAC address")
        nics.append(SriovNic(iface, devices, request._replace(mac=mac)))
    return nics


def alias_for(mac: str) -> str:
    """A libvirt user alias ('ua-' prefix) naming the NIC a hostdev stands for."""
    return "ua-sriov-" + mac.replace(":", "")


def hostdev_element(vf: VirtualFunction, mac: str) -> ET.Element:
    dom, bus, slot, fn = vf.pci_parts
    hostdev = ET.Element("hostdev", mode="subsystem", type="pci", managed="yes")
    source = ET.SubElement(hostdev, "source")
    ET.SubElement(source, "address", domain=f"0x{dom:04x}", bus=f"0x{bus:02x}",
                     slot=f"0x{slot:02x}", function=f"0x{fn:x}")
    ET.SubElement(hostdev, "alias", name=alias_for(mac))
    return hostdev


def replace_with_hostdev(nic: SriovNic, vf: VirtualFunction) -> ET.Element:
    """Put the VF where the interface was; keep its boot order, if any."""
    hostdev = hostdev_element(vf, nic.request.mac)
    boot = nic.element.find("boot")
    if boot is not None:
        ET.SubElement(hostdev, "boot", dict(boot.attrib))
    hostdev.tail = nic.element.tail
    siblings = nic.parent
    siblings[list(siblings).index(nic.element)] = hostdev
    return hostdev


class NicRecord(NamedTuple):
    """What <metadata> remembers of one VF NIC: it survives save/restore and
    migration with the domain, so the VM's VF NICs are known without oned."""
    mac: str
    bridge: str
    vf: str = ""   # empty while the VF is detached (saved, migrating)
    pf: str = ""
    # the network whose GUID the NIC's VF carries (guid.from_mac): kept with
    # the domain so restore and migration give the same GUID; None (also
    # every record older than the rule) is the MAC-only GUID
    space: Optional[int] = None

    @property
    def request(self) -> VfRequest:
        return VfRequest(self.mac, self.bridge.partition(":")[2].strip() or None,
                         is_whole_pf_bridge(self.bridge))


def metadata_element(records: Iterable[NicRecord], namespaced: bool = True) -> ET.Element:
    """Our <metadata> block; libvirt's setMetadata wants it without the
    namespace, which it adds itself."""
    ns = f"{{{METADATA_NS}}}" if namespaced else ""
    block = ET.Element(f"{ns}sriov")
    for r in records:
        nic = ET.SubElement(block, f"{ns}nic", mac=r.mac, bridge=r.bridge, vf=r.vf, pf=r.pf)
        if r.space is not None:
            nic.set("guid-space", str(r.space))
    return block


def record_nics(root: ET.Element, records: Iterable[NicRecord]) -> None:
    """Write the records into a domain XML's <metadata> (replacing ours only)."""
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.SubElement(root, "metadata")
    for old in metadata.findall(f"{{{METADATA_NS}}}sriov"):
        metadata.remove(old)
    metadata.append(metadata_element(records))


def recorded_nics(root: ET.Element) -> list[NicRecord]:
    block = root.find(f"metadata/{{{METADATA_NS}}}sriov")
    if block is None:
        return []
    # libvirt's setMetadata may leave the children without the namespace
    return [NicRecord(n.get("mac", ""), n.get("bridge", ""), n.get("vf", ""), n.get("pf", ""),
                      _space(n.get("guid-space")))
            for n in block if str(n.tag).rpartition("}")[2] == "nic" and n.get("mac")]


def _space(text: Optional[str]) -> Optional[int]:
    t = (text or "").strip()
    return int(t) if t.isascii() and t.isdigit() and len(t) <= 10 else None


def guid_spaces(records: Iterable[NicRecord]) -> dict[str, Optional[int]]:
    """MAC -> the network its GUID was derived with (Host.program_guids)."""
    return {r.mac: r.space for r in records}


def hostdev_address(hostdev: ET.Element) -> Optional[str]:
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


# OpenNebula's kvm driver writes each of a VM's PCI devices (its PCI
# section) as <hostdev mode='subsystem' type='pci'><source><address
# domain='0x0000' bus='0x07' slot='0x00' function='0x0'/>: "0x" and the hex
# digits of the host's PCI monitoring (LibVirtDriverKVM.cc, "PCI Passthrough").
_STOCK_PCI = {"domain": 4, "bus": 2, "slot": 2, "function": 1}


def _stock_field(text: Optional[str], digits: int) -> Optional[int]:
    t = text or ""
    if not (2 < len(t) <= 2 + digits and t[:2] == "0x"
            and all(c in "0123456789abcdefABCDEF" for c in t[2:])):
        return None
    return int(t[2:], 16)


def _vm_pci_hostdevs(root: ET.Element):
    """The VM's own PCI hostdevs (not the VFs kvm-sriov puts in, known by
    alias_for's alias), in document order."""
    for hostdev in root.iterfind("devices/hostdev"):
        if hostdev.get("type") != "pci" or hostdev.get("mode") != "subsystem":
            continue
        alias = hostdev.find("alias")
        if alias is None or not alias.get("name", "").startswith(alias_for("")):
            yield hostdev


def _stock_address(hostdev: ET.Element) -> Optional[str]:
    """'0000:87:00.0' when the hostdev's source is written as the stock driver
    writes it, else None."""
    addr = hostdev.find("source/address")
    if addr is None:
        return None
    dom, bus, slot, fn = (_stock_field(addr.get(k), n) for k, n in _STOCK_PCI.items())
    if None in (dom, bus, slot, fn) or slot >= 32 or fn >= 8:
        return None
    return f"{dom:04x}:{bus:02x}:{slot:02x}.{fn:x}"


def passed_through(root: ET.Element, limit: int) -> list[str]:
    """The host PCI addresses of the VM's own PCI devices in a deployment
    file, as OpenNebula's kvm driver writes them, in document order; the
    VFs kvm-sriov puts in (alias_for's) left out, and any <hostdev> not in
    the stock shape (an mdev, an address written another way). More than
    ``limit`` PCI hostdevs: InputError."""
    found = []
    for hostdev in _vm_pci_hostdevs(root):
        if len(found) == limit:
            raise InputError(f"the domain passes through more than {limit} PCI devices")
        address = _stock_address(hostdev)
        if address:
            found.append(address)
    return found


def passed_through_hostdev(root: ET.Element, address: str) -> Optional[ET.Element]:
    """The VM's own hostdev that passed_through read as ``address`` (the first)."""
    return next((h for h in _vm_pci_hostdevs(root) if _stock_address(h) == address), None)


def pci_hostdevs(root: ET.Element) -> dict[str, ET.Element]:
    """Every PCI hostdev of a domain, by host PCI address."""
    found = {}
    for hostdev in root.iterfind("devices/hostdev"):
        address = hostdev_address(hostdev)
        if address:
            found[address] = hostdev
    return found
