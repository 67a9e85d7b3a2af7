"""Which VFs of this host are usable and which are free: one definition.

usable = a VF of a pool PF (``pool.pfs``, default every InfiniBand SR-IOV
PF) that passes :func:`kvm_sriov.vf.discovery.vf_problems` (own IOMMU group,
not in use on the host when ``pool.skip_vfs_in_host_use``, not in
``pool.exclude_vfs``); free = usable and not held in the VF pool.

Deploy (host.py, through discovery.discover) applies the same rules to full
device records; the probe, ``kvm-sriov status`` and the placement policy
(which reads the probe's output) use :func:`scan`, the same rules on far
fewer syscalls (hundreds of VFs per host). tests/sched/test_availability.py
keeps all of them equal for every option that narrows the set.
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from pathlib import Path
from typing import NamedTuple, Optional

from ..errors import DriverError
from . import discovery, pool, whole_pf
from .sysfs import Sysfs


class Vf(NamedTuple):
    address: str
    pf: str
    numa_node: int                  # -1: unknown
    problems: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not self.problems


class PfVfs(NamedTuple):
    pf: discovery.PhysicalFunction
    vfs: tuple[Vf, ...]
    error: Optional[str] = None     # this PF could not be read; its VFs count as none

    @property
    def usable(self) -> list[Vf]:
        return [v for v in self.vfs if v.usable]


class HostVfs(NamedTuple):
    pfs: tuple[PfVfs, ...]
    error: Optional[str] = None     # bad pool.pfs selector, unreadable bus

    def usable(self) -> list[Vf]:
        return [v for p in self.pfs for v in p.usable]


class Counts(NamedTuple):
    total: int
    free: int


def free(usable, held) -> list:
    """The usable VFs nobody holds (held: addresses from the pool, and for
    deploy also the hostdevs of running domains)."""
    return [v for v in usable if v.address not in held]


class Holdings(NamedTuple):
    vfs: dict[str, int]             # VF -> VM id
    regions: dict[str, int]         # shared-memory region name -> size in MB
    pfs: dict[str, int]             # PF passed through whole -> VM id


def read_holdings(db_path: Path | str) -> Holdings:
    """What the pool holds, read straight from its database (read-only, no
    pool lock: one committed state); nothing when there is no pool yet.
    DriverError (with the reason) when it cannot be read."""
    try:
        db = pool.read_only(db_path, timeout=2)
    except DriverError as exc:
        raise DriverError(f"cannot read the VF pool {db_path}: {exc}") from None
    if db is None:
        if not os.path.lexists(db_path):
            return Holdings({}, {}, {})
        raise DriverError(f"cannot read the VF pool {db_path}: not a pool database (yet)")
    try:
        db.execute("BEGIN")  # the VFs, the regions and the whole PFs of one committed state
        vfs = dict(db.execute("SELECT vf, vm_id FROM assignment"))
        regions, pfs = {}, {}
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ivshmem_region'").fetchone():
            regions = dict(db.execute("SELECT name, size_mb FROM ivshmem_region"))
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'pf_assignment'").fetchone():
            pfs = dict(db.execute("SELECT pf, vm_id FROM pf_assignment"))
        return Holdings(vfs, regions, pfs)
    except sqlite3.Error as exc:
        raise DriverError(f"cannot read the VF pool {db_path}: {exc}") from None
    finally:
        db.close()


# -- the fast scan -------------------------------------------------------------
def _read(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _link(path: str) -> Optional[str]:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class HostIndex:
    """Who is in which IOMMU group and bound to which driver, read once per
    host (one listdir per group and per driver) instead of per VF: on a host
    with hundreds of VFs, syscalls are the scan's whole cost."""

    def __init__(self, root: str):
        self.sys = os.path.join(root, "sys")
        self.groups: dict[str, tuple[str, tuple[str, ...]]] = {}   # address -> (group, members)
        base = os.path.join(self.sys, "kernel", "iommu_groups")
        for group in _listdir(base):
            members = tuple(_listdir(f"{base}/{group}/devices"))
            for m in members:
                self.groups[m] = (group, members)
        self.drivers: dict[str, str] = {}
        base = os.path.join(self.sys, "bus", "pci", "drivers")
        for driver in _listdir(base):
            for entry in _listdir(f"{base}/{driver}"):
                if ":" in entry:
                    self.drivers[entry] = driver


def _vf_addresses(pf_dir: str, address: str) -> list[str]:
    """VF addresses as the kernel computes them (PCIe SR-IOV: routing ID =
    PF's + First VF Offset + n * VF Stride); the virtfn links when that fails."""
    try:
        numvfs = int(_read(pf_dir + "/sriov_numvfs") or "0")
        offset, stride = int(_read(pf_dir + "/sriov_offset") or ""), int(_read(pf_dir + "/sriov_stride") or "")
        dom, bus, rest = address.split(":")
        slot, fn = rest.split(".")
        rid = int(bus, 16) << 8 | int(slot, 16) << 3 | int(fn, 16)
        out = []
        for n in range(numvfs):
            r = rid + offset + n * stride
            out.append(f"{dom}:{r >> 8:02x}:{(r >> 3) & 0x1f:02x}.{r & 7}")
        return out
    except ValueError:
        names = [n for n in _listdir(pf_dir) if n.startswith("virtfn") and n[6:].isdigit()]
        return [a for a in (_link(f"{pf_dir}/{n}") for n in sorted(names, key=lambda n: int(n[6:]))) if a]


def pf_vfs(pf: discovery.PhysicalFunction, index: HostIndex, skip_in_host_use: bool,
           exclude: frozenset = frozenset(), addresses: Optional[list[str]] = None) -> tuple[Vf, ...]:
    """Every enabled VF of ``pf`` with its problems (discovery.vf_problems).
    A VF's NUMA node is its PF's (the kernel puts VFs on their PF's node).
    ``addresses``: the PF's VF addresses when already read (sriov_pfs)."""
    pf_dir = os.path.join(index.sys, "bus", "pci", "devices", pf.address)
    node = pf.numa_node if pf.numa_node is not None else -1
    found = []
    if addresses is None:
        addresses = _vf_addresses(pf_dir, pf.address)
    for address in addresses:
        group, members = index.groups.get(address, (None, ()))
        driver = index.drivers.get(address)
        up = []
        if skip_in_host_use and discovery.vf_may_be_in_host_use(driver):
            dev = os.path.join(index.sys, "bus", "pci", "devices", address)
            for nd in _listdir(dev + "/net"):
                try:
                    if int(_read(f"{dev}/net/{nd}/flags") or "0", 16) & discovery.IFF_UP:
                        up.append(nd)
                except ValueError:
                    pass
        found.append(Vf(address, pf.address, node, discovery.vf_problems(
            address, group, members, driver, up, skip_in_host_use, address in exclude)))
    return tuple(found)


def sriov_pfs(root: str, sysfs: Sysfs, vf_addresses: Optional[dict[str, list[str]]] = None
              ) -> list[discovery.PhysicalFunction]:
    """discovery.sriov_pfs on plain strings (a host has hundreds of VFs to skip).
    The VFs of a PF found earlier are skipped without a look: a VF is never
    an SR-IOV PF, and a PF's VFs sort after it (routing ID = PF's + offset).
    ``vf_addresses``, when given, receives each PF's VF addresses."""
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    found, known_vfs = [], set()
    for a in sorted(_listdir(base)):
        if a in known_vfs or not os.path.exists(f"{base}/{a}/sriov_totalvfs") \
                or os.path.exists(f"{base}/{a}/physfn"):
            continue
        found.append(discovery.read_pf(sysfs, a))
        try:
            vfs = _vf_addresses(f"{base}/{a}", a)
        except Exception:  # pf_vfs reads it again and reports the error on its PF
            continue
        known_vfs.update(vfs)
        if vf_addresses is not None:
            vf_addresses[a] = vfs
    return found


def scan(cfg) -> HostVfs:
    """This host's pool PFs and their VFs under every narrowing option of ``cfg``.
    Never raises for a bad device: the error is kept on the PF (or the host)."""
    root = os.fspath(cfg.sysfs_root)
    sysfs = Sysfs(root)
    vf_addresses: dict[str, list[str]] = {}
    try:
        pfs = discovery.select_pfs(sriov_pfs(root, sysfs, vf_addresses), cfg.pfs)
    except Exception as exc:  # a bad selector or an unreadable bus
        return HostVfs((), str(exc))
    index = HostIndex(root)
    exclude = frozenset(cfg.exclude_vfs)
    out = []
    for pf in pfs:
        try:
            out.append(PfVfs(pf, pf_vfs(pf, index, cfg.skip_vfs_in_host_use, exclude,
                                        vf_addresses.get(pf.address))))
        except Exception as exc:
            out.append(PfVfs(pf, (), f"{type(exc).__name__}: {exc}"))
    return HostVfs(tuple(out))


def whole_pfs(host: HostVfs, holdings: Holdings, skip_in_host_use: bool,
              enabled: bool = True) -> dict[str, Optional[str]]:
    """Each pool PF -> None when it may be passed through whole now, else
    why not (whole_pf.why_not_free, on what the pool holds)."""
    out: dict[str, Optional[str]] = {}
    for entry in host.pfs:
        if entry.error:
            out[entry.pf.address] = entry.error
        else:
            out[entry.pf.address] = whole_pf.why_not_free(entry.pf, entry.vfs, skip_in_host_use,
                                                          holdings.vfs, holdings.pfs, enabled)
    return out


def counts(vfs, held) -> Counts:
    usable = [v for v in vfs if v.usable]
    return Counts(len(usable), len(free(usable, held)))


def numa_counts(vfs, held) -> dict[int, Counts]:
    usable = [v for v in vfs if v.usable]
    total = Counter(v.numa_node for v in usable)
    free_n = Counter(v.numa_node for v in free(usable, held))
    return {n: Counts(total[n], free_n[n]) for n in sorted(total)}
