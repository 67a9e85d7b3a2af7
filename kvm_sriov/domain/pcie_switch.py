"""Each passed-through GPU and the VFs paired with it under one emulated
PCIe switch in the guest, so NCCL and UCX there see them together as they
sit on the host (docs/gpu.md, section 7).

OpenNebula's kvm driver gives every PCI device a root port of its own
(LibVirtDriverKVM.cc: 16 pcie-root-ports on q35, or per guest NUMA node a
pcie-expander-bus with 8 of them), so a guest sees no switch. Per GPU this
adds, with explicit indexes above every controller already written:

    pcie-expander-bus (pxb-pcie) on the guest NUMA node bound to the pair's
    host node; only when the VM has such a node; one per node, shared
      pcie-root-port                         (else this one on pcie-root)
        pcie-switch-upstream-port            (x3130-upstream)
          pcie-switch-downstream-port        (xio3130-downstream): the GPU
          pcie-switch-downstream-port        one per VF

and gives the GPU's <hostdev> (oned's) and each VF's a guest address on
its downstream port. A VF's port carries an alias naming its NIC
(vf_port_alias): a VF plugged again after save/restore or migration goes
back to that port, but only a VF as close on the host to that switch's GPU
(node/vm.switch_ports): the guest is never shown a pairing the host lacks.

libvirt's rules (formatdomain, "Controllers"): the PCI controller of index
N is bus N, and the bus a device names is its controller's index; a
controller's index is greater than the bus it plugs into; a gap in the
indexes is filled by libvirt with controllers of its choosing, so ours
follow the highest index without a gap, parents first. Guest bus numbers:
each host bridge (pcie-root: 0, a pcie-expander-bus: its busNr) numbers its
own bus and every bridge below it from there up to the next host bridge's
busNr. Ours take the top of the range (busNr just low enough below 256),
and the layout is given up if any host bridge, oned's too, would run out.

Anything that cannot be done (no PCIe root, an index or bus that cannot be
read, no room) leaves the XML exactly as it was, with one line saying why:
the VFs are as close on the host, only the guest does not see it.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional, Sequence
from xml.etree import ElementTree as ET

from ..vf.gpu_affinity import GuestPair
from . import domain_xml

VF_PORT_ALIAS = "ua-sriov-port-"   # + the NIC's MAC without colons
MAX_BUS = 255          # a controller's index is the bus number devices name
MAX_PORTS = 32         # downstream ports on one upstream port: the slots of its bus
EXPANDERS = ("pcie-expander-bus", "pci-expander-bus")   # host bridges besides the root
UPSTREAM_MODEL = "x3130-upstream"
DOWNSTREAM_MODEL = "xio3130-downstream"
# libvirt reads these numbers as C's strtoul: hex with 0x, else decimal (no
# leading zero: that would be octal to libvirt); anything else is not read
_NUMBER = re.compile(r"0x[0-9a-fA-F]{1,4}|0|[1-9][0-9]{0,4}")


class NotPlaced(Exception):
    """Why the guest gets no switch: the XML is left as it was."""


def vf_port_alias(mac: str) -> str:
    """The alias of the downstream port a NIC's VF sits on."""
    return VF_PORT_ALIAS + mac.lower().replace(":", "")


def _number(text: Optional[str]) -> Optional[int]:
    t = (text or "").strip()
    if not _NUMBER.fullmatch(t):
        return None
    return int(t, 16) if t.startswith("0x") else int(t)


def guest_address(bus: int) -> ET.Element:
    return ET.Element("address", type="pci", domain="0x0000", bus=f"0x{bus:02x}", slot="0x00",
                      function="0x0")


def set_guest_address(hostdev: ET.Element, bus: int) -> None:
    """Put a hostdev on slot 0 of bus ``bus`` (replacing any guest address it had)."""
    new = guest_address(bus)
    old = hostdev.find("address")
    if old is None:
        hostdev.append(new)
        return
    new.tail = old.tail
    hostdev[list(hostdev).index(old)] = new
    for extra in hostdev.findall("address")[1:]:
        hostdev.remove(extra)


class VfPort(NamedTuple):
    """A switch port deploy made for a NIC's VF."""
    bus: int                  # its index: the guest bus a VF on it names
    gpu: Optional[str]        # the host address of the GPU on the same switch; None: none there


def vf_ports(root: ET.Element) -> dict[str, VfPort]:
    """Port alias (vf_port_alias) -> the port, for the ports deploy made for
    VFs, each with the GPU its switch holds (the device on the switch's
    first port, slot 0, where place puts it)."""
    parent: dict[int, int] = {}          # downstream port -> its upstream port
    named: dict[str, int] = {}
    first_ports = set()
    for c in root.iterfind("devices/controller"):
        alias = c.find("alias")
        name = alias.get("name", "") if alias is not None else ""
        index = _number(c.get("index"))
        addr = c.find("address")
        bus = _number(addr.get("bus")) if addr is not None else None
        if (c.get("type") != "pci" or c.get("model") != "pcie-switch-downstream-port"
                or index is None or index > MAX_BUS):
            continue
        if bus is not None:
            parent[index] = bus
        if name.startswith(VF_PORT_ALIAS):
            named[name] = index
        elif bus is not None and _number(addr.get("slot")) == 0:
            first_ports.add(index)
    gpus: dict[int, str] = {}            # upstream port -> the GPU on its first port
    for hostdev in root.iterfind("devices/hostdev"):
        addr = hostdev.find("address")
        bus = _number(addr.get("bus")) if addr is not None and addr.get("type") == "pci" else None
        source = domain_xml.hostdev_address(hostdev)
        if bus in first_ports and source is not None:
            gpus[parent[bus]] = source
    return {name: VfPort(index, gpus.get(parent.get(index))) for name, index in named.items()}


class _Controller(NamedTuple):
    index: int
    model: str
    bus: Optional[int]        # the bus it plugs into; None: libvirt places it (on pcie-root)
    bus_nr: Optional[int]     # an expander's busNr


def _controllers(root: ET.Element) -> list[_Controller]:
    found, seen = [], set()
    for c in root.iterfind("devices/controller"):
        if c.get("type") != "pci":
            continue
        index = _number(c.get("index"))
        if index is None or index > MAX_BUS:
            raise NotPlaced(f"a PCI controller's index {c.get('index', '')[:20]!r} cannot be read")
        if index in seen:
            raise NotPlaced(f"two PCI controllers have index {index}")
        seen.add(index)
        model = c.get("model", "")
        addr = c.find("address")
        bus = None
        if addr is not None and addr.get("bus") is not None:
            bus = _number(addr.get("bus"))
            if bus is None or bus >= index:
                raise NotPlaced(f"PCI controller {index} plugs into bus {addr.get('bus', '')[:20]!r}, "
                                f"not a bus below its index")
        bus_nr = None
        if model in EXPANDERS:
            target = c.find("target")
            bus_nr = _number(target.get("busNr")) if target is not None else None
            if bus_nr is None or not 0 < bus_nr <= MAX_BUS:
                raise NotPlaced(f"{model} {index} has no busNr that can be read")
        found.append(_Controller(index, model, bus, bus_nr))
    if not any(c.index == 0 and c.model == "pcie-root" for c in found):
        raise NotPlaced("the VM's machine has no PCIe root (pcie-root: q35), so no PCIe switch")
    if root.find("devices/iommu/driver[@pciBus]") is not None:   # oned's IOMMU per dedicated device
        raise NotPlaced("the VM has an IOMMU bound to a PCI bus (pciBus), which a GPU moved off "
                        "that bus would leave")
    return sorted(found)


def _bus_needs(controllers: list[_Controller]) -> tuple[dict[int, int], dict[int, int]]:
    """(host bridge index -> bus numbers it needs, host bridge index -> its first bus number)."""
    host_of: dict[int, int] = {}
    needs: dict[int, int] = {}
    first: dict[int, int] = {}
    for c in controllers:          # by index: a parent comes before its children
        if c.model == "pcie-root" or c.model in EXPANDERS:
            host_of[c.index] = c.index
            needs[c.index] = 1     # its own bus
            first[c.index] = c.bus_nr or 0
            continue
        host = host_of.get(0 if c.bus is None else c.bus)
        if host is None:
            raise NotPlaced(f"PCI controller {c.index} plugs into bus {c.bus}, which no controller provides")
        host_of[c.index] = host
        needs[host] += 1
    return needs, first


def _check_room(needs: dict[int, int], first: dict[int, int]) -> None:
    """Every host bridge's bridges get a bus number before the next host bridge's busNr."""
    order = sorted(first, key=first.get)
    for here, above in zip(order, [*order[1:], None]):
        room = (first[above] if above is not None else MAX_BUS + 1) - first[here]
        if room <= 0:
            raise NotPlaced(f"two PCI host bridges have busNr {first[here]}")
        if needs[here] > room:
            what = "pcie-root" if here == 0 else f"pcie-expander-bus {here}"
            raise NotPlaced(f"{what} would need {needs[here]} guest bus numbers, it has {room}")


def _guest_cells(root: ET.Element) -> tuple[bool, dict[int, int]]:
    """(the VM has guest NUMA nodes, host node -> the guest node bound to it alone)."""
    cells = {_number(c.get("id")) for c in root.iterfind("cpu/numa/cell")} - {None}
    bound: dict[int, int] = {}
    for m in root.iterfind("numatune/memnode"):
        cell, node = _number(m.get("cellid")), _number(m.get("nodeset"))   # one host node, no list
        if cell in cells and node is not None:
            bound[node] = min(cell, bound.get(node, cell))
    return bool(cells), bound


class _Switch(NamedTuple):
    gpu: str
    hostdevs: tuple[ET.Element, ...]   # the GPU's, then each VF's
    cell: Optional[int]                # the guest NUMA node of its expander; None: on pcie-root


def _controller(index: int, model: str, alias: str, bus: Optional[int] = None, slot: int = 0,
                model_name: str = "", cell: Optional[int] = None, bus_nr: int = 0) -> ET.Element:
    c = ET.Element("controller", type="pci", index=str(index), model=model)
    if model_name:
        ET.SubElement(c, "model", name=model_name)
    if cell is not None:
        target = ET.SubElement(c, "target", busNr=str(bus_nr))
        ET.SubElement(target, "node").text = str(cell)
    ET.SubElement(c, "alias", name=alias)
    if bus is not None:
        ET.SubElement(c, "address", type="pci", domain="0x0000", bus=f"0x{bus:02x}",
                      slot=f"0x{slot:02x}", function="0x0")
    return c


def _alias(hostdev: ET.Element, fallback: str) -> str:
    """A VF's port is named after its NIC (its hostdev's alias_for alias)."""
    alias = hostdev.find("alias")
    name = alias.get("name", "") if alias is not None else ""
    prefix = domain_xml.alias_for("")
    return VF_PORT_ALIAS + name[len(prefix):] if name.startswith(prefix) else fallback


def _layout(root: ET.Element, switches: list[_Switch]) -> list[ET.Element]:
    """The new controllers, in index order, and the hostdevs' new guest buses
    (set on the elements only by place, once everything is known to fit)."""
    controllers = _controllers(root)
    needs, first = _bus_needs(controllers)
    index = controllers[-1].index + 1
    expanders: dict[int, int] = {}            # guest node -> its expander's index
    new: list[ET.Element] = []
    slots: dict[int, int] = {}                # expander index -> root ports on it
    for s in switches:
        if len(s.hostdevs) > MAX_PORTS:
            raise NotPlaced(f"GPU {s.gpu} would need {len(s.hostdevs)} switch ports, "
                            f"a switch has {MAX_PORTS}")
        if s.cell is not None and s.cell not in expanders:
            expanders[s.cell] = index
            needs[index] = 1
            new.append(_controller(index, "pcie-expander-bus", f"ua-sriov-pxb-node{s.cell}",
                                   cell=s.cell))
            index += 1
        name = "gpu-" + re.sub("[:.]", "-", s.gpu)
        parent = expanders.get(s.cell) if s.cell is not None else None
        host = parent if parent is not None else 0
        needs[host] += 2 + len(s.hostdevs)     # root port, upstream port, a downstream port each
        slot = slots.get(host, 0)
        slots[host] = slot + 1
        new.append(_controller(index, "pcie-root-port", f"ua-sriov-root-{name}", bus=parent, slot=slot))
        new.append(_controller(index + 1, "pcie-switch-upstream-port", f"ua-sriov-switch-{name}",
                               bus=index, model_name=UPSTREAM_MODEL))
        for n, hostdev in enumerate(s.hostdevs):
            alias = f"ua-sriov-down-{name}" if n == 0 else _alias(hostdev, f"ua-sriov-down-{name}-{n}")
            new.append(_controller(index + 2 + n, "pcie-switch-downstream-port", alias, bus=index + 1,
                                   slot=n, model_name=DOWNSTREAM_MODEL))
        index += 2 + len(s.hostdevs)
    if index - 1 > MAX_BUS:
        raise NotPlaced(f"the switches would need PCI controller indexes up to {index - 1}, "
                        f"libvirt's buses end at {MAX_BUS}")
    top = MAX_BUS + 1
    for cell in sorted(expanders, reverse=True):   # the highest node's expander at the top
        i = expanders[cell]
        top -= needs[i]
        first[i] = top
    for c in new:
        target = c.find("target")
        if target is not None:
            target.set("busNr", str(first[int(c.get("index"))]))
    _check_room(needs, first)
    return new


def _insert_after(parent: ET.Element, anchor: ET.Element, elements: list[ET.Element]) -> None:
    """Insert elements after anchor, indented as anchor is."""
    children = list(parent)
    at = children.index(anchor)
    before = children[at - 1].tail if at > 0 else parent.text
    between = before if before is not None and not before.strip() else anchor.tail
    for n, element in enumerate(elements):
        element.tail = between
        parent.insert(at + 1 + n, element)
    elements[-1].tail, anchor.tail = anchor.tail, between


def place(root: ET.Element, pairs: Sequence[GuestPair],
          vf_hostdevs: Sequence[ET.Element]) -> list[tuple[str, str]]:
    """Put each pair's GPU and VFs (vf_hostdevs[i]: NIC i's) under a switch
    of its own in the domain XML. Returns the (level, line)s for the VM log;
    nothing changed (and nothing said) without pairs."""
    if not pairs:
        return []
    has_cells, bound = _guest_cells(root)
    switches, notes = [], []
    for p in pairs:
        gpu = domain_xml.passed_through_hostdev(root, p.gpu)
        if gpu is None:
            continue
        cell = bound.get(p.numa_node) if p.numa_node is not None else None
        if has_cells and cell is None:
            notes.append(f"GPU {p.gpu}: no guest NUMA node is bound to host node "
                         f"{'(unknown)' if p.numa_node is None else p.numa_node} alone, its switch is on pcie-root")
        switches.append(_Switch(p.gpu, (gpu, *(vf_hostdevs[i] for i in p.nics)), cell))
    if not switches:
        return []
    try:
        new = _layout(root, switches)
    except NotPlaced as exc:
        return [("WARN", f"GPUs and their VFs not put under one PCIe switch in the guest "
                         f"(they are as close on the host): {exc}")]
    anchor = [c for c in root.iterfind("devices/controller") if c.get("type") == "pci"][-1]
    parent = next(d for d in root.iterfind("devices") if anchor in list(d))
    _insert_after(parent, anchor, new)
    downstream = iter(c for c in new if c.get("model") == "pcie-switch-downstream-port")
    lines = []
    for s in switches:
        for hostdev in s.hostdevs:
            set_guest_address(hostdev, int(next(downstream).get("index")))
        vfs = ", ".join(filter(None, (domain_xml.hostdev_address(h) for h in s.hostdevs[1:])))
        where = f"guest NUMA node {s.cell}" if s.cell is not None else "pcie-root"
        lines.append(("INFO", f"GPU {s.gpu} and VF {vfs} under one PCIe switch in the guest ({where})"))
    return lines + [("INFO", note) for note in notes]
