"""How close each GPU is to each InfiniBand PF, read from the PCI tree in sysfs.

GPUDirect RDMA runs at full speed only between a GPU and an HCA behind the
same PCIe switch; the next best is the same root port, then the same NUMA
node. Nothing here is configured by hand: each device's place in the PCI tree
is the folder its /sys/bus/pci/devices/<address> link resolves to, e.g.

    /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:08.0/0000:05:00.0
                 host bridge  root port    switch up    switch down  the device

Pure reads (docs/gpu.md). deploy reads it only for a VM that asks for VFs
close to its GPUs (KVM_SRIOV_GPU_AFFINITY: vm_gpus); gpu_affinity.py makes
the choice from it.
"""

from __future__ import annotations

import os
import stat
from itertools import islice
from typing import Iterable, NamedTuple, Optional

from ..errors import InputError
from .discovery import PhysicalFunction, sriov_pfs
from .sysfs import Sysfs, normalize_pci_address, read_small

# What counts as a GPU, the one place it is said: an NVIDIA or AMD device of
# PCI class 03 (display) subclass 02 (3D controller) or 00 (VGA).
GPU_VENDORS = frozenset({"10de", "1002"})          # NVIDIA, AMD
GPU_CLASSES = frozenset({0x0302, 0x0300})          # 3D controller, VGA


def is_gpu(vendor: str, class_code: int) -> bool:
    """vendor "10de", class_code 0x030200 (base, sub, prog-if) -> True."""
    return vendor in GPU_VENDORS and class_code >> 8 in GPU_CLASSES


BRIDGE_CLASS = 0x0604                  # PCI-to-PCI bridge: root ports and switch ports
LEVELS = ("switch", "root", "numa", "far")     # closest first
MAX_DEPTH = 16      # bridges between a host bridge and a device; real trees have 1-6
MAX_DEVICES = 8192  # PCI functions looked at; 8 PFs with 127 VFs each are ~1000
MAX_RAILS = 64      # GPUs pair_rails pairs in one call (a VM has a handful)


class PciPlace(NamedTuple):
    """Where a device sits in the PCI tree."""
    address: str
    host_bridge: str                 # "pci0000:00"
    ancestors: tuple[str, ...]       # from the root port down, the device itself excluded
    bridges: frozenset               # those ancestors whose class is a PCI bridge
    numa_node: Optional[int]         # None: unknown


class Closeness(NamedTuple):
    """How close one GPU is to one PF."""
    gpu: str
    pf: str
    level: str                       # one of LEVELS
    shared: Optional[str]            # switch: the deepest bridge above both; root: the root port
    numa_node: Optional[int]         # the NUMA node both are on, when known and the same


class GpuTopology(NamedTuple):
    gpus: tuple[str, ...]
    pfs: tuple[str, ...]
    closeness: tuple[Closeness, ...]     # every (GPU, PF), in address order
    problems: tuple[str, ...]            # devices left out, and why

    def of(self, gpu: str) -> tuple[Closeness, ...]:
        return tuple(c for c in self.closeness if c.gpu == gpu)


def _attribute(folder: str, name: str) -> Optional[str]:
    return read_small(os.path.join(folder, name), limit=64)[0]


def _hex_attribute(folder: str, name: str) -> tuple[Optional[int], Optional[str]]:
    """(value, None), (None, None) when absent or not hex, (None, why) when not a file."""
    text, why = read_small(os.path.join(folder, name), limit=64)
    try:
        return (int(text, 16) if text else None), why
    except ValueError:
        return None, None


def _numa_node(folder: str) -> Optional[int]:
    text = _attribute(folder, "numa_node")
    try:
        node = int(text) if text else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _is_host_bridge(name: str) -> bool:
    """"pci0000:00": a PCI domain and root bus, as the kernel names the folder."""
    dom, _, bus = name[3:].partition(":")
    return (name.startswith("pci") and len(dom) == 4 and len(bus) == 2
            and all(c in "0123456789abcdef" for c in dom + bus))


def _real_folders(top: str, names: list[str]) -> bool:
    """Every folder from top down through names is a folder, not a link: a
    link on the way could loop or lead out of the PCI tree."""
    path = top
    for name in names:
        path = os.path.join(path, name)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def read_place(sysfs: Sysfs, address: str) -> tuple[Optional[PciPlace], Optional[str]]:
    """(the device's place, None) or (None, why it cannot be read)."""
    link = sysfs.at("bus", "pci", "devices", address)
    try:
        target = os.readlink(link)
    except OSError as exc:
        return None, f"{address}: /sys/bus/pci/devices/{address} is not a link ({exc.strerror})"
    devices = os.path.normpath(sysfs.at("devices"))
    path = os.path.normpath(os.path.join(os.path.dirname(link), target))
    parts = os.path.relpath(path, devices).split(os.sep)
    shown = repr(target[:200])     # one line, whatever the link holds
    if (parts[0] == ".." or len(parts) < 2 or not _is_host_bridge(parts[0])
            or parts[-1] != address):
        return None, f"{address}: its link leads outside /sys/devices/pci*/ ({shown})"
    if len(parts) > MAX_DEPTH + 2:
        return None, f"{address}: more than {MAX_DEPTH} bridges above it"
    if any(normalize_pci_address(p) != p for p in parts[1:]):
        return None, f"{address}: a folder on its path is not a PCI address ({shown})"
    if not _real_folders(devices, parts):
        return None, f"{address}: a folder on its path is missing or a link ({shown})"
    host, ancestors = parts[0], tuple(parts[1:-1])
    folder = os.path.join(devices, host)
    bridges = set()
    for name in ancestors:
        folder = os.path.join(folder, name)
        code, _why = _hex_attribute(folder, "class")   # unknown: not taken as a bridge
        if code is not None and code >> 8 == BRIDGE_CLASS:
            bridges.add(name)
    return PciPlace(address, host, ancestors, frozenset(bridges), _numa_node(path)), None


def _below_switch(place: PciPlace) -> bool:
    """Is the first bridge below the root port a switch's upstream port?
    The PCIe port type (upstream/downstream) is not in sysfs, so the path's
    shape decides: a bridge below the root port followed by another bridge
    (the downstream port the device, or a deeper switch, hangs from)."""
    path = place.ancestors
    return len(path) >= 3 and path[1] in place.bridges and path[2] in place.bridges


def closeness(gpu: PciPlace, pf: PciPlace) -> Closeness:
    """switch: a PCIe switch above both (their paths share a bridge below the
    root port, with the switch's shape); root: the same root port; numa: the
    same NUMA node; far: none of these (or not known)."""
    numa = gpu.numa_node if gpu.numa_node is not None and gpu.numa_node == pf.numa_node else None
    common = 0
    if gpu.host_bridge == pf.host_bridge:
        for a, b in zip(gpu.ancestors, pf.ancestors):
            if a != b:
                break
            common += 1
    if common >= 2 and _below_switch(gpu) and _below_switch(pf):
        return Closeness(gpu.address, pf.address, "switch", gpu.ancestors[common - 1], numa)
    if common >= 1 and gpu.ancestors[0] in gpu.bridges:
        return Closeness(gpu.address, pf.address, "root", gpu.ancestors[0], numa)
    return Closeness(gpu.address, pf.address, "numa" if numa is not None else "far", None, numa)


def find_gpus(sysfs: Sysfs) -> tuple[list[str], list[str]]:
    """(the GPUs' addresses, problems). A GPU's own VFs are left out: they sit
    where their GPU sits."""
    base = sysfs.at("bus", "pci", "devices")
    addresses = list(islice(sysfs.pci_addresses(), MAX_DEVICES + 1))
    problems = []
    if len(addresses) > MAX_DEVICES:
        addresses = addresses[:MAX_DEVICES]
        problems.append(f"more than {MAX_DEVICES} PCI devices: only the first {MAX_DEVICES} looked at")
    gpus = []
    for address in addresses:
        folder = os.path.join(base, address)
        vendor = (_attribute(folder, "vendor") or "")[2:]
        code, why = _hex_attribute(folder, "class")
        if why:
            problems.append(f"{address}: its class {why}")
        elif code is not None and is_gpu(vendor, code) and not os.path.lexists(os.path.join(folder, "physfn")):
            gpus.append(address)
    return gpus, problems


def vm_gpus(sysfs: Sysfs, addresses: Iterable[str], pfs: Iterable[PhysicalFunction]) -> GpuTopology:
    """How close each of a VM's passed-through devices that is a GPU of this
    host is to each of the pool's PFs.

    addresses: what the VM's deployment file names, so a tenant's choice:
    each must be a PCI address, and is only ever looked at through
    read_place (the link must lead to that device's folder in the PCI tree)
    and read_small. A device that is not a GPU (is_gpu) is left out: naming
    one gains nothing. A named device whose place cannot be read is an
    InputError: the VM asked for closeness that cannot be known. A PF whose
    place cannot be read is left out, with a line in problems."""
    named = list(islice(addresses, MAX_RAILS + 1))
    if len(named) > MAX_RAILS:
        raise InputError(f"more than {MAX_RAILS} PCI devices passed through: "
                         f"at most {MAX_RAILS} are placed next to VFs")
    gpus = []
    for address in sorted(set(named)):
        if normalize_pci_address(address) != address:
            raise InputError(f"passed-through device {address[:40]!r} is not a PCI address")
        place, why = read_place(sysfs, address)
        if place is None:
            raise InputError(f"passed-through device {why}")
        folder = sysfs.at("devices", place.host_bridge, *place.ancestors, address)
        vendor = (_attribute(folder, "vendor") or "")[2:]
        code, why = _hex_attribute(folder, "class")
        if why:
            raise InputError(f"passed-through device {address}: its class {why}")
        if code is not None and is_gpu(vendor, code):
            gpus.append(place)
    problems = []
    pf_places = []
    for address in sorted(pf.address for pf in pfs):
        place, why = read_place(sysfs, address)
        if place is None:
            problems.append(why)
        else:
            pf_places.append(place)
    table = tuple(closeness(g, p) for g in gpus for p in pf_places)
    return GpuTopology(tuple(g.address for g in gpus), tuple(p.address for p in pf_places),
                       table, tuple(problems))


def gpu_topology(sysfs: Sysfs, pfs: Optional[Iterable[PhysicalFunction]] = None) -> GpuTopology:
    """How close every GPU is to every PF. pfs: the pool's PFs (discovery's);
    None: every SR-IOV PF of class InfiniBand."""
    if pfs is None:
        pfs = [pf for pf in sriov_pfs(sysfs) if pf.is_infiniband]
    gpu_addresses, problems = find_gpus(sysfs)
    places = {}
    for address in [*gpu_addresses, *sorted(pf.address for pf in pfs)]:
        place, why = read_place(sysfs, address)
        if place is None:
            problems.append(why)
        else:
            places[address] = place
    gpus = tuple(a for a in gpu_addresses if a in places)
    pf_addresses = tuple(sorted(pf.address for pf in pfs if pf.address in places))
    table = tuple(closeness(places[g], places[p]) for g in gpus for p in pf_addresses)
    return GpuTopology(gpus, pf_addresses, table, tuple(problems))


def pair_rails(candidates: Iterable[Closeness]) -> list[Closeness]:
    """One PF per GPU, in GPU address order; candidates: the (GPU, PF)
    records of the VM's GPUs and the PFs that may be chosen.

    Each GPU gets one of its closest PFs, never a farther one to spread the
    rails. Within that, as many GPUs as possible get a PF no other GPU has: a
    maximum matching of the GPUs to their closest PFs (augmenting paths, GPUs
    and PFs taken in address order, so the same host gives the same answer).
    A GPU left without one of its own (its closest PFs all went to others)
    shares the closest PF serving the fewest GPUs."""
    rank = {level: i for i, level in enumerate(LEVELS)}
    by_gpu: dict[str, list[Closeness]] = {}
    for c in candidates:
        by_gpu.setdefault(c.gpu, []).append(c)
    if len(by_gpu) > MAX_RAILS:
        raise InputError(f"{len(by_gpu)} GPUs to pair: at most {MAX_RAILS}")
    closest = {}
    for gpu, options in sorted(by_gpu.items()):
        best = min(rank[c.level] for c in options)
        closest[gpu] = sorted((c for c in options if rank[c.level] == best), key=lambda c: c.pf)
    owner: dict[str, str] = {}     # PF -> the GPU it is the rail of

    def augment(gpu: str, seen: set) -> bool:
        """Give gpu a closest PF: a free one, else one whose GPU can move to another."""
        pfs = [c.pf for c in closest[gpu]]
        for pf in pfs:
            if pf not in owner:
                owner[pf] = gpu
                return True
        for pf in pfs:
            if pf not in seen:
                seen.add(pf)
                if augment(owner[pf], seen):
                    owner[pf] = gpu
                    return True
        return False

    for gpu in closest:
        augment(gpu, set())
    chosen = {gpu: pf for pf, gpu in owner.items()}
    users = {pf: 1 for pf in owner}
    for gpu in closest:
        if gpu not in chosen:
            pf = min(closest[gpu], key=lambda c: (users.get(c.pf, 0), c.pf)).pf
            chosen[gpu] = pf
            users[pf] = users.get(pf, 0) + 1
    return [next(c for c in closest[gpu] if c.pf == chosen[gpu]) for gpu in closest]
