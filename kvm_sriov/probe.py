"""The host monitoring probe: VF totals and free counts, NUMA, IB link state.

Output is OpenNebula's monitoring template format (``KEY = "value"`` and
``KEY = [ A = "x", B = "y" ]``). It runs as a *system* host probe
(``im/kvm-probes.d/host/system/``): OpenNebula copies those attributes into
the host template, so the scheduler sees them, e.g.
``SCHED_REQUIREMENTS = "KVM_SRIOV_FREE_VFS > 0"``.

Rules: never fail the monitoring run (always exit 0; a bad device becomes
an ``ERROR`` field on its own PF), never write anything, never touch libvirt,
be fast (no lxml, no libvirt imports; one read-only SQLite query).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections import Counter
from typing import Optional, TextIO

from . import __version__
from . import config as config_mod
from . import discovery
from .sysfs import Sysfs


def _q(value) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _vector(name: str, fields: list[tuple[str, object]]) -> str:
    inner = ",\n".join(f"  {k} = {_q(v)}" for k, v in fields)
    return f"{name} = [\n{inner} ]"


def held_vfs(db_path) -> Optional[set[str]]:
    """VFs the pool gives to VMs; None when the pool cannot be read (no VM ever ran: empty)."""
    if not db_path.exists():
        return set()
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2)
        try:
            return {row[0] for row in db.execute("SELECT vf FROM assignment")}
        finally:
            db.close()
    except sqlite3.Error:
        return None


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


class HostIndex:
    """Who is in which IOMMU group and bound to which driver, read once per
    host (one listdir per group and per driver) instead of per VF: on a host
    with hundreds of VFs, syscalls are the probe's whole cost."""

    def __init__(self, root: str):
        self.sys = os.path.join(root, "sys")
        self.groups: dict[str, tuple[str, int]] = {}   # address -> (group, group size)
        base = os.path.join(self.sys, "kernel", "iommu_groups")
        for group in _listdir(base):
            members = _listdir(f"{base}/{group}/devices")
            for m in members:
                self.groups[m] = (group, len(members))
        self.drivers: dict[str, str] = {}
        base = os.path.join(self.sys, "bus", "pci", "drivers")
        for driver in _listdir(base):
            for entry in _listdir(f"{base}/{driver}"):
                if ":" in entry:
                    self.drivers[entry] = driver


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


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


def fast_vfs(root: str, pf: discovery.PhysicalFunction, skip_in_host_use: bool,
             index: Optional[HostIndex] = None) -> list[tuple[str, int, bool]]:
    """(address, NUMA node or -1, eligible) per enabled VF of ``pf``.

    The same rules as :func:`kvm_sriov.discovery.read_vf` (tests keep them
    equal) with far fewer syscalls. A VF's NUMA node is its PF's (the kernel
    puts VFs on their PF's node).
    """
    index = index or HostIndex(root)
    pf_dir = os.path.join(index.sys, "bus", "pci", "devices", pf.address)
    pf_node = pf.numa_node if pf.numa_node is not None else -1
    found = []
    for address in _vf_addresses(pf_dir, pf.address):
        group = index.groups.get(address)
        ok = group is not None and group[1] == 1
        driver = index.drivers.get(address)
        if ok and skip_in_host_use and driver not in (None, "vfio-pci"):
            dev = os.path.join(index.sys, "bus", "pci", "devices", address)
            for nd in _listdir(dev + "/net"):
                try:
                    if int(_read(f"{dev}/net/{nd}/flags") or "0", 16) & discovery.IFF_UP:
                        ok = False
                except ValueError:
                    pass
        found.append((address, pf_node, ok))
    return found


def _ib_port(sysfs: Sysfs, port: discovery.IbPort) -> list[tuple[str, object]]:
    base = sysfs.ib_class(port.device, "ports", str(port.port))
    state = (sysfs.read(base / "state") or "").partition(": ")[2] or "UNKNOWN"
    phys = (sysfs.read(base / "phys_state") or "").partition(": ")[2] or "UNKNOWN"
    return [("IB_DEVICE", port.device), ("IB_PORT", port.port), ("IB_STATE", state),
            ("IB_PHYS_STATE", phys), ("IB_RATE", sysfs.read(base / "rate") or ""),
            ("LINK_LAYER", sysfs.read(base / "link_layer") or "")]


def _sriov_pfs(root: str, sysfs: Sysfs) -> list[discovery.PhysicalFunction]:
    """discovery.sriov_pfs on plain strings (a host has hundreds of VFs to skip)."""
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [discovery.read_pf(sysfs, a) for a in names
            if os.path.exists(f"{base}/{a}/sriov_totalvfs") and not os.path.exists(f"{base}/{a}/physfn")]


def report(cfg: config_mod.Config, out: TextIO) -> None:
    sysfs = Sysfs(cfg.sysfs_root)
    root = str(cfg.sysfs_root)
    lines = [f"KVM_SRIOV_VERSION = {_q(__version__)}"]
    held = held_vfs(cfg.pool_db)
    if held is None:
        lines.append(f"KVM_SRIOV_WARNING = {_q(f'cannot read the VF pool {cfg.pool_db}: free counts assume nothing is held')}")
        held = set()
    try:
        pfs = discovery.select_pfs(_sriov_pfs(root, sysfs), cfg.pfs)
    except Exception as exc:  # a bad selector or an unreadable bus: report, do not fail
        pfs = []
        lines.append(f"KVM_SRIOV_ERROR = {_q(exc)}")
    index = HostIndex(root)
    total = free = 0
    numa_total, numa_free = Counter(), Counter()
    vectors = []
    for pf in pfs:
        fields: list[tuple[str, object]] = [("ADDRESS", pf.address), ("NETDEV", ",".join(pf.netdevs)),
                                            ("NUMA_NODE", pf.numa_node if pf.numa_node is not None else -1)]
        try:
            vfs = fast_vfs(root, pf, cfg.skip_vfs_in_host_use, index)
            eligible = [(a, n) for a, n, ok in vfs if ok]
            pf_free = sum(1 for a, _ in eligible if a not in held)
            fields += [("TOTAL_VFS", len(eligible)), ("FREE_VFS", pf_free), ("ENABLED_VFS", len(vfs)),
                       ("MAX_VFS", pf.total_vfs)]
            for port in pf.ib_ports[:1]:
                fields += _ib_port(sysfs, port)
            total += len(eligible)
            free += pf_free
            for address, node in eligible:
                numa_total[node] += 1
                numa_free[node] += address not in held
        except Exception as exc:
            fields.append(("ERROR", f"{type(exc).__name__}: {exc}"))
        vectors.append(_vector("KVM_SRIOV_PF", fields))
    lines += [f"KVM_SRIOV_PFS = {len(pfs)}", f"KVM_SRIOV_TOTAL_VFS = {total}", f"KVM_SRIOV_FREE_VFS = {free}"]
    for node in sorted(numa_total):
        label = node if node >= 0 else "UNKNOWN"
        lines.append(f"KVM_SRIOV_FREE_VFS_NUMA{label} = {numa_free[node]}")
        vectors.append(_vector("KVM_SRIOV_NUMA", [("NODE", node), ("TOTAL_VFS", numa_total[node]),
                                                  ("FREE_VFS", numa_free[node])]))
    out.write("\n".join(lines + vectors) + "\n")


def main(remotes_dir=None, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    try:
        cfg = config_mod.load(remotes_dir)
    except Exception as exc:
        out.write(f"KVM_SRIOV_ERROR = {_q(f'configuration: {exc}')}\n")
        return 0
    try:
        report(cfg, out)
    except Exception as exc:  # never fail the whole monitoring run
        out.write(f"KVM_SRIOV_ERROR = {_q(f'{type(exc).__name__}: {exc}')}\n")
    return 0
