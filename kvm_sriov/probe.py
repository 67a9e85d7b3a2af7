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


def fast_vfs(root: str, pf: discovery.PhysicalFunction, skip_in_host_use: bool) -> list[tuple[str, int, bool]]:
    """(address, NUMA node or -1, eligible) per enabled VF of ``pf``.

    The same rules as :func:`kvm_sriov.discovery.read_vf` (tests keep them
    equal), on plain strings: pathlib costs more than the probe's budget.
    """
    sys_dir = os.path.join(root, "sys")
    pf_dir = os.path.join(sys_dir, "bus", "pci", "devices", pf.address)
    groups = os.path.join(sys_dir, "kernel", "iommu_groups")
    pf_node = pf.numa_node if pf.numa_node is not None else -1
    found = []
    try:
        names = os.listdir(pf_dir)
    except OSError:
        return found
    for name in names:
        if not (name.startswith("virtfn") and name[6:].isdigit()):
            continue
        address = _link(os.path.join(pf_dir, name))
        if not address:
            continue
        dev = os.path.join(sys_dir, "bus", "pci", "devices", address)
        group = _link(dev + "/iommu_group")
        ok = group is not None
        if ok:
            try:
                ok = os.listdir(os.path.join(groups, group, "devices")) == [address]
            except OSError:
                ok = False
        driver = _link(dev + "/driver")
        if ok and skip_in_host_use and driver not in (None, "vfio-pci"):
            try:
                netdevs = os.listdir(dev + "/net")
            except OSError:
                netdevs = []
            for nd in netdevs:
                try:
                    if int(_read(f"{dev}/net/{nd}/flags") or "0", 16) & discovery.IFF_UP:
                        ok = False
                except ValueError:
                    pass
        try:
            node = int(_read(dev + "/numa_node") or "-1")
        except ValueError:
            node = -1
        found.append((address, node if node >= 0 else pf_node, ok))
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
    total = free = 0
    numa_total, numa_free = Counter(), Counter()
    vectors = []
    for pf in pfs:
        fields: list[tuple[str, object]] = [("ADDRESS", pf.address), ("NETDEV", ",".join(pf.netdevs)),
                                            ("NUMA_NODE", pf.numa_node if pf.numa_node is not None else -1)]
        try:
            vfs = fast_vfs(root, pf, cfg.skip_vfs_in_host_use)
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
