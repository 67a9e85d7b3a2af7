"""VF discovery: which PFs feed the pool and which of their VFs may be offered.

Pure reads of sysfs (through :class:`Sysfs`). A PF is offered only whole,
to a NIC on a whole-PF network (whole_pf.py); a VF is offered only when
passing it to a VM cannot hurt anything else on the host.
"""

from __future__ import annotations

import os
from typing import Iterable, NamedTuple, Optional

from ..errors import ConfigError
from .sysfs import Sysfs, normalize_pci_address

INFINIBAND_CLASS = 0x0207  # PCI base class 02 (network), subclass 07
IFF_UP = 0x1
IN_HOST_USE = "in use on the host"  # how vf_problems says it (whole_pf.py looks for it)


class IbPort(NamedTuple):
    device: str
    port: int


class PhysicalFunction(NamedTuple):
    address: str                    # "0000:81:00.0"
    vendor: str                     # "15b3"
    device: str                     # "1017"
    class_code: int                 # 0x020700
    driver: Optional[str]           # None when unbound
    numa_node: Optional[int]        # None: unknown
    netdevs: tuple[str, ...]
    ib_ports: tuple[IbPort, ...]
    total_vfs: int
    num_vfs: int
    iommu_group: Optional[str] = None       # None: none (or not read)
    group_members: tuple[str, ...] = ()     # every device in the group, itself included
    up_netdevs: tuple[str, ...] = ()        # its netdevs that are up: the host uses it

    @property
    def is_infiniband(self) -> bool:
        return self.class_code >> 8 == INFINIBAND_CLASS

    @property
    def ib_devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.device for p in self.ib_ports))


class VirtualFunction(NamedTuple):
    address: str
    index: int                          # N in the PF's virtfnN
    pf: str                             # the PF's PCI address
    numa_node: Optional[int]            # None: unknown
    iommu_group: Optional[str]          # None: none
    group_members: tuple[str, ...]      # every device in the group, itself included
    driver: Optional[str]               # None when unbound
    netdevs: tuple[str, ...]
    ib_ports: tuple[IbPort, ...]        # the VF's own IB device, when a host driver has it
    problems: tuple[str, ...] = ()      # why it must not be offered

    @property
    def eligible(self) -> bool:
        return not self.problems

    @property
    def pci_parts(self) -> tuple[int, int, int, int]:
        dom, bus, rest = self.address.split(":")
        slot, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(slot, 16), int(fn, 16)


class HostInventory(NamedTuple):
    pfs: tuple[PhysicalFunction, ...]
    vfs: tuple[VirtualFunction, ...]

    def eligible_vfs(self) -> tuple[VirtualFunction, ...]:
        return tuple(v for v in self.vfs if v.eligible)

    def vf(self, address: str) -> Optional[VirtualFunction]:
        return next((v for v in self.vfs if v.address == address), None)

    def pf(self, address: str) -> Optional[PhysicalFunction]:
        return next((p for p in self.pfs if p.address == address), None)


def _numa(sysfs: Sysfs, dev: str) -> Optional[int]:
    node = sysfs.read_int(dev + "/numa_node")
    return node if node is not None and node >= 0 else None


def _ib_ports(sysfs: Sysfs, dev: str) -> tuple[IbPort, ...]:
    ports = []
    for ibdev in sysfs.listdir(dev + "/infiniband"):
        for port in sysfs.listdir(sysfs.at("class", "infiniband", ibdev, "ports")) or ["1"]:
            if port.isdigit():
                ports.append(IbPort(ibdev, int(port)))
    return tuple(ports)


def read_pf(sysfs: Sysfs, address: str) -> PhysicalFunction:
    dev = sysfs.at("bus", "pci", "devices", address)
    group = sysfs.link_name(dev + "/iommu_group")
    netdevs = tuple(sysfs.listdir(dev + "/net"))
    return PhysicalFunction(
        address=address,
        vendor=(sysfs.read(dev + "/vendor") or "0x0000")[2:],
        device=(sysfs.read(dev + "/device") or "0x0000")[2:],
        class_code=sysfs.read_int(dev + "/class", 16) or 0,
        driver=sysfs.link_name(dev + "/driver"),
        numa_node=_numa(sysfs, dev),
        netdevs=netdevs,
        ib_ports=_ib_ports(sysfs, dev),
        total_vfs=sysfs.read_int(dev + "/sriov_totalvfs") or 0,
        num_vfs=sysfs.read_int(dev + "/sriov_numvfs") or 0,
        iommu_group=group,
        group_members=sysfs.iommu_group_members(group) if group else (),
        up_netdevs=tuple(n for n in netdevs if _netdev_up(sysfs, dev, n)),
    )


def _netdev_up(sysfs: Sysfs, dev: str, netdev: str) -> bool:
    flags = sysfs.read_int(f"{dev}/net/{netdev}/flags", 16)
    return bool(flags is not None and flags & IFF_UP)


def vf_may_be_in_host_use(driver: Optional[str]) -> bool:
    """Only a VF bound to a host driver can carry a host netdev that is up."""
    return driver not in (None, "vfio-pci")


def vf_problems(address: str, group: Optional[str], members, driver: Optional[str],
                up_netdevs, skip_in_host_use: bool, excluded: bool = False) -> tuple[str, ...]:
    """Why a VF must not be offered (empty: usable). The one rule set behind
    deploy, the probe, `kvm-sriov status` and placement (availability.py)."""
    problems = []
    if group is None:
        problems.append("no IOMMU group (is the IOMMU enabled on the kernel command line?)")
    elif set(members) - {address}:
        others = ", ".join(m for m in members if m != address)
        problems.append(f"IOMMU group {group} also holds {others}")
    if skip_in_host_use and vf_may_be_in_host_use(driver) and up_netdevs:
        problems.append(f"{IN_HOST_USE} by {driver} ({', '.join(up_netdevs)} is up)")
    if excluded:
        problems.append("excluded by pool.exclude_vfs")
    return tuple(problems)


def read_vf(sysfs: Sysfs, pf: PhysicalFunction, index: int, address: str,
            skip_in_host_use: bool, excluded: bool = False) -> VirtualFunction:
    dev = sysfs.at("bus", "pci", "devices", address)
    group = sysfs.link_name(dev + "/iommu_group")
    members = sysfs.iommu_group_members(group) if group else ()
    driver = sysfs.link_name(dev + "/driver")
    netdevs = tuple(sysfs.listdir(dev + "/net"))
    up = [n for n in netdevs if _netdev_up(sysfs, dev, n)] if vf_may_be_in_host_use(driver) else []
    problems = vf_problems(address, group, members, driver, up, skip_in_host_use, excluded)
    numa = _numa(sysfs, dev)
    return VirtualFunction(
        address=address, index=index, pf=pf.address,
        numa_node=numa if numa is not None else pf.numa_node,
        iommu_group=group, group_members=members, driver=driver, netdevs=netdevs,
        ib_ports=_ib_ports(sysfs, dev), problems=problems)


def list_vfs(sysfs: Sysfs, pf: PhysicalFunction, skip_in_host_use: bool,
             exclude: frozenset = frozenset()) -> list[VirtualFunction]:
    dev = sysfs.at("bus", "pci", "devices", pf.address)
    vfs = []
    for name in sysfs.listdir(dev):
        if name.startswith("virtfn") and name[6:].isdigit():
            address = sysfs.link_name(f"{dev}/{name}")
            if address:
                vfs.append(read_vf(sysfs, pf, int(name[6:]), address, skip_in_host_use, address in exclude))
    return sorted(vfs, key=lambda v: v.index)


def sriov_pfs(sysfs: Sysfs) -> list[PhysicalFunction]:
    """Every SR-IOV capable PF on the host (a VF has physfn; a PF has totalvfs)."""
    base = sysfs.at("bus", "pci", "devices")
    return [read_pf(sysfs, a) for a in sysfs.pci_addresses()
            if os.path.exists(f"{base}/{a}/sriov_totalvfs") and not os.path.exists(f"{base}/{a}/physfn")]


def pf_matches(pf: PhysicalFunction, selector: str) -> bool:
    """Does a PF selector (see kvm-sriov.toml, pool.pfs) name this PF?"""
    sel = selector.strip()
    address = normalize_pci_address(sel)
    if address:
        return pf.address == address
    if ":" in sel and all(len(p) == 4 for p in sel.split(":")):
        vendor, device = sel.lower().split(":")
        return (pf.vendor, pf.device) == (vendor, device)
    if ":" in sel:
        ibdev, _, port = sel.partition(":")
        return port.isdigit() and IbPort(ibdev, int(port)) in pf.ib_ports
    return sel in pf.netdevs or sel in pf.ib_devices


def select_pfs(all_pfs: Iterable[PhysicalFunction], selectors: Iterable[str]) -> list[PhysicalFunction]:
    all_pfs = list(all_pfs)
    selectors = list(selectors)
    if not selectors:
        return [pf for pf in all_pfs if pf.is_infiniband]
    chosen = []
    for sel in selectors:
        hits = [pf for pf in all_pfs if pf_matches(pf, sel)]
        if not hits:
            raise ConfigError(f"pool.pfs entry {sel!r} matches no SR-IOV PF on this host")
        chosen.extend(pf for pf in hits if pf not in chosen)
    return chosen


def discover(sysfs: Sysfs, selectors: Iterable[str] = (), skip_in_host_use: bool = True,
             exclude: Iterable[str] = ()) -> HostInventory:
    pfs = select_pfs(sriov_pfs(sysfs), selectors)
    excluded = frozenset(exclude)
    vfs = [vf for pf in pfs for vf in list_vfs(sysfs, pf, skip_in_host_use, excluded)]
    return HostInventory(pfs=tuple(pfs), vfs=tuple(vfs))
