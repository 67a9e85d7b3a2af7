"""The host monitoring probe: VF totals and free counts, NUMA, IB link state.

Output is OpenNebula's monitoring template format (``KEY = "value"`` and
``KEY = [ A = "x", B = "y" ]``). It runs as a *system* host probe
(``im/kvm-probes.d/host/system/``): OpenNebula copies those attributes into
the host template, so the scheduler sees them, e.g.
``SCHED_REQUIREMENTS = "KVM_SRIOV_FREE_VFS > 0"``.

Rules: never fail the monitoring run (always exit 0; a bad device becomes
an ``ERROR`` field on its own PF), never write anything, never touch libvirt.
What counts as usable and free is availability.py's, as for deploy and
status; what is held, the pool database's (read-only, one committed state).
It is one of monitord's system probes (a 4-5 s run, every 600 s and after
each pool change): its bar is 150 ms (bench/probe_bench.py), which it meets
without keeping a copy of the pool or sparing imports.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

from .. import __version__, config as config_mod
from ..errors import DriverError
from ..ivshmem import region as ivshmem_region
from ..vf import availability, discovery
from ..vf.sysfs import Sysfs


def _q(value) -> str:
    """One quoted value on one line: a newline or other control character in
    a value (an error text, a path, a config string) must never start a
    monitoring attribute of its own."""
    text = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(value))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _vector(name: str, fields: list[tuple[str, object]]) -> str:
    inner = ",\n".join(f"  {k} = {_q(v)}" for k, v in fields)
    return f"{name} = [\n{inner} ]"


def _ib_port(sysfs: Sysfs, port: discovery.IbPort) -> list[tuple[str, object]]:
    base = sysfs.at("class", "infiniband", port.device, "ports", str(port.port))
    state = (sysfs.read(base + "/state") or "").partition(": ")[2] or "UNKNOWN"
    phys = (sysfs.read(base + "/phys_state") or "").partition(": ")[2] or "UNKNOWN"
    return [("IB_DEVICE", port.device), ("IB_PORT", port.port), ("IB_STATE", state),
            ("IB_PHYS_STATE", phys), ("IB_RATE", sysfs.read(base + "/rate") or ""),
            ("LINK_LAYER", sysfs.read(base + "/link_layer") or "")]


def report(cfg: config_mod.Config, out: TextIO) -> None:
    sysfs = Sysfs(cfg.sysfs_root)
    lines = [f"KVM_SRIOV_VERSION = {_q(__version__)}"]
    try:
        pool = availability.read_holdings(cfg.pool_db)
    except DriverError as exc:
        lines.append(f"KVM_SRIOV_WARNING = {_q(f'{exc}: free counts assume nothing is held')}")
        pool = availability.Holdings({}, {})
    held = pool.vfs
    host = availability.scan(cfg)
    if host.error:
        lines.append(f"KVM_SRIOV_ERROR = {_q(host.error)}")
    vectors = []
    for entry in host.pfs:
        pf = entry.pf
        fields: list[tuple[str, object]] = [("ADDRESS", pf.address), ("NETDEV", ",".join(pf.netdevs)),
                                            ("IB_DEVICES", ",".join(pf.ib_devices)),
                                            ("VENDOR", pf.vendor), ("DEVICE", pf.device),
                                            ("NUMA_NODE", pf.numa_node if pf.numa_node is not None else -1)]
        if entry.error:
            fields.append(("ERROR", entry.error))
        else:
            n = availability.counts(entry.vfs, held)
            fields += [("TOTAL_VFS", n.total), ("FREE_VFS", n.free), ("ENABLED_VFS", len(entry.vfs)),
                       ("MAX_VFS", pf.total_vfs)]
            try:
                for port in pf.ib_ports[:1]:
                    fields += _ib_port(sysfs, port)
            except Exception as exc:
                fields.append(("ERROR", f"{type(exc).__name__}: {exc}"))
        vectors.append(_vector("KVM_SRIOV_PF", fields))
    vfs = [v for entry in host.pfs for v in entry.vfs]
    n = availability.counts(vfs, held)
    usable = {v.address for v in vfs if v.usable}
    # Which VMs the free count already reflects: the placement policy books VFs
    # for VMs it placed on this host until they show up here.
    vms = sorted({vm for vf, vm in held.items() if vf in usable})
    lines += [f"KVM_SRIOV_PFS = {len(host.pfs)}", f"KVM_SRIOV_TOTAL_VFS = {n.total}",
              f"KVM_SRIOV_FREE_VFS = {n.free}", f"KVM_SRIOV_VMS = {_q(' '.join(map(str, vms)))}",
              f"KVM_SRIOV_NUMA_POLICY = {_q(cfg.numa_policy)}",
              # the HPC profile of VMs that do not choose (KVM_SRIOV_HPC): placement's NUMA wish
              f"KVM_SRIOV_HPC_PROFILE = {_q('YES' if cfg.hpc_profile else 'NO')}"]
    for node, c in availability.numa_counts(vfs, held).items():
        label = node if node >= 0 else "UNKNOWN"
        lines.append(f"KVM_SRIOV_FREE_VFS_NUMA{label} = {c.free}")
        vectors.append(_vector("KVM_SRIOV_NUMA", [("NODE", node), ("TOTAL_VFS", c.total),
                                                  ("FREE_VFS", c.free)]))
    lines += _ivshmem(cfg, pool.regions)
    out.write("\n".join(lines + vectors) + "\n")


def _ivshmem(cfg: config_mod.Config, regions: dict[str, int]) -> list[str]:
    """The shared-memory budget (docs/ivshmem.md), for the placer: the largest
    region this host gives, what new regions may still take, the regions
    it has (joining one of those costs nothing), one owner's share and what
    each owner's regions take (the owner uid is in the region's name)."""
    budget = ivshmem_region.host_budget_mb(cfg.ivshmem_max_host_mb)
    free = max(0, min(budget - sum(regions.values()), ivshmem_region.shm_mb()[1]))
    owners: dict[int, int] = {}
    for name, size in regions.items():
        uid = ivshmem_region.owner_of(name)
        if uid is not None:
            owners[uid] = owners.get(uid, 0) + size
    return [f"KVM_SRIOV_IVSHMEM_MAX_REGION_MB = {min(cfg.ivshmem_max_region_mb, budget)}",
            f"KVM_SRIOV_IVSHMEM_FREE_MB = {free}",
            f"KVM_SRIOV_IVSHMEM_REGIONS = {_q(' '.join(sorted(regions)))}",
            f"KVM_SRIOV_IVSHMEM_MAX_OWNER_MB = {ivshmem_region.owner_budget_mb(cfg.ivshmem_max_owner_mb, budget)}",
            f"KVM_SRIOV_IVSHMEM_OWNERS_MB = {_q(' '.join(f'{u}:{mb}' for u, mb in sorted(owners.items())))}"]


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
