"""The host monitoring probe: VF totals and free counts, NUMA, IB link state,
the PFs that may be passed through whole (KVM_SRIOV_FREE_PFS, WHOLE_FREE),
and, on a host with GPUs, how close each GPU's free VFs are (KVM_SRIOV_GPU).

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

import os
import sys
from typing import Optional, TextIO

from .. import __version__, config as config_mod
from ..errors import DriverError
from ..ivshmem import region as ivshmem_region
from ..vf import availability, discovery, topology
from ..vf.sysfs import Sysfs, normalize_pci_address, read_small


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
    gid = (sysfs.read(base + "/gids/0") or "").replace(":", "")
    return [("IB_DEVICE", port.device), ("IB_PORT", port.port), ("IB_STATE", state),
            ("IB_PHYS_STATE", phys), ("IB_RATE", sysfs.read(base + "/rate") or ""),
            ("LINK_LAYER", sysfs.read(base + "/link_layer") or ""),
            # its own (burned-in) port GUID: what a whole-PF network's partition lists
            ("PORT_GUID", f"0x{gid[16:]}" if len(gid) == 32 else "")]


def report(cfg: config_mod.Config, out: TextIO) -> None:
    sysfs = Sysfs(cfg.sysfs_root)
    lines = [f"KVM_SRIOV_VERSION = {_q(__version__)}"]
    try:
        pool = availability.read_holdings(cfg.pool_db)
    except DriverError as exc:
        lines.append(f"KVM_SRIOV_WARNING = {_q(f'{exc}: free counts assume nothing is held')}")
        pool = availability.Holdings({}, {}, {})
    held = pool.vfs
    host = availability.scan(cfg)
    if host.error:
        lines.append(f"KVM_SRIOV_ERROR = {_q(host.error)}")
    whole = availability.whole_pfs(host, pool, cfg.skip_vfs_in_host_use, cfg.whole_pfs)
    held = dict(held)  # a PF held whole offers none of its VFs (switched off, or about to be)
    for entry in host.pfs:
        if entry.pf.address in pool.pfs:
            held.update((v.address, pool.pfs[entry.pf.address]) for v in entry.vfs)
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
            # may it be passed through whole now (whole_pf.why_not_free), and if not, why;
            # nothing where whole PFs are off (the placer reads no WHOLE_FREE as no)
            if cfg.whole_pfs or pf.address in pool.pfs:
                fields.append(("WHOLE_FREE", "NO" if whole[pf.address] else "YES"))
                if whole[pf.address]:
                    fields.append(("WHOLE_NOT_FREE", whole[pf.address]))
        vectors.append(_vector("KVM_SRIOV_PF", fields))
    vfs = [v for entry in host.pfs for v in entry.vfs]
    n = availability.counts(vfs, held)
    usable = {v.address for v in vfs if v.usable}
    # Which VMs the free count already reflects: the placement policy books VFs
    # for VMs it placed on this host until they show up here.
    # (and the VMs holding a PF of the pool whole)
    pool_pfs = {e.pf.address for e in host.pfs}
    vms = sorted({vm for vf, vm in held.items() if vf in usable}
                 | {vm for pf, vm in pool.pfs.items() if pf in pool_pfs})
    lines += [f"KVM_SRIOV_PFS = {len(host.pfs)}", f"KVM_SRIOV_TOTAL_VFS = {n.total}",
              f"KVM_SRIOV_FREE_VFS = {n.free}", f"KVM_SRIOV_VMS = {_q(' '.join(map(str, vms)))}",
              f"KVM_SRIOV_NUMA_POLICY = {_q(cfg.numa_policy)}",
              # the HPC profile of VMs that do not choose (KVM_SRIOV_HPC): placement's NUMA wish
              f"KVM_SRIOV_HPC_PROFILE = {_q('YES' if cfg.hpc_profile else 'NO')}",
              # PFs that may be passed through whole now (a whole-PF network's NICs)
              f"KVM_SRIOV_FREE_PFS = {sum(1 for why in whole.values() if why is None)}"]
    for node, c in availability.numa_counts(vfs, held).items():
        label = node if node >= 0 else "UNKNOWN"
        lines.append(f"KVM_SRIOV_FREE_VFS_NUMA{label} = {c.free}")
        vectors.append(_vector("KVM_SRIOV_NUMA", [("NODE", node), ("TOTAL_VFS", c.total),
                                                  ("FREE_VFS", c.free)]))
    lines += _ivshmem(cfg, pool.regions)
    try:
        vectors += _gpu_pairing(sysfs, host.pfs, held)
    except Exception as exc:  # the VF counts go out all the same
        vectors.append(_vector("KVM_SRIOV_GPU", [("ERROR", f"{type(exc).__name__}: {exc}")]))
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


# Drivers a GPU OpenNebula can pass through is bound to: vfio-pci (the
# passthrough set-up binds it; libvirt does at a VM's start) or its vendor's
# own (libvirt's managed='yes' gives it back when the VM ends). Only their
# devices are looked at, so a host without GPUs reads no device's class.
GPU_DRIVERS = ("vfio-pci", "nvidia", "nouveau", "amdgpu", "radeon")


def _gpu_candidates(sysfs: Sysfs, known: set[str]) -> list[str]:
    """The GPUs bound to one of GPU_DRIVERS, in address order (at most
    topology.MAX_RAILS); known: the pool's PFs and VFs, never GPUs."""
    found: set[str] = set()
    for driver in GPU_DRIVERS:
        try:
            names = os.listdir(sysfs.at("bus", "pci", "drivers", driver))
        except OSError:
            continue
        found.update(n for n in names[:topology.MAX_DEVICES] if ":" in n and n not in known
                     and normalize_pci_address(n) == n)
    gpus = []
    for address in sorted(found)[:topology.MAX_DEVICES]:
        folder = sysfs.at("bus", "pci", "devices", address)
        try:
            code = int(read_small(os.path.join(folder, "class"), limit=64)[0] or "", 16)
        except ValueError:
            continue
        if code >> 8 not in topology.GPU_CLASSES:
            continue
        vendor = (read_small(os.path.join(folder, "vendor"), limit=64)[0] or "")[2:]
        if topology.is_gpu(vendor, code) and not os.path.lexists(os.path.join(folder, "physfn")):
            gpus.append(address)    # a GPU's own VFs (physfn) sit where it sits
    return gpus[:topology.MAX_RAILS]


def _gpu_pairing(sysfs: Sysfs, entries, held) -> list[str]:
    """Per GPU (KVM_SRIOV_GPU): the pool PFs at each closeness level
    (docs/gpu.md: SWITCH_PFS, ROOT_PFS, NUMA_PFS; the others are far) and the
    free VFs at least that close, for the placer (KVM_SRIOV_GPU_AFFINITY).
    Nothing without GPUs; a PF whose place cannot be read counts as far."""
    pfs = [e for e in entries if not e.error]
    gpus = _gpu_candidates(sysfs, {v.address for e in entries for v in e.vfs} | {e.pf.address for e in entries})
    if not gpus:
        return []
    free = {e.pf.address: availability.counts(e.vfs, held).free for e in pfs}
    places = [p for p in (topology.read_place(sysfs, e.pf.address)[0] for e in pfs) if p is not None]
    vectors = []
    for gpu in gpus:
        place, why = topology.read_place(sysfs, gpu)
        if place is None:
            vectors.append(_vector("KVM_SRIOV_GPU", [("ADDRESS", gpu), ("ERROR", why)]))
            continue
        at = {level: [] for level in topology.LEVELS}
        for pf in places:
            at[topology.closeness(place, pf).level].append(pf.address)
        fields: list[tuple[str, object]] = [
            ("ADDRESS", gpu), ("NUMA_NODE", place.numa_node if place.numa_node is not None else -1)]
        fields += [(f"{level.upper()}_PFS", ",".join(at[level])) for level in topology.LEVELS[:3]]
        within = 0
        for level in topology.LEVELS[:3]:      # at least that close: what that wish may take
            within += sum(free[a] for a in at[level])
            fields.append((f"{level.upper()}_FREE_VFS", within))
        vectors.append(_vector("KVM_SRIOV_GPU", fields))
    return vectors


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
