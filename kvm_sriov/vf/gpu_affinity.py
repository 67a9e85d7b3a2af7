"""Which PFs a VM's InfiniBand NICs may take their VFs from when it asks
for VFs close to its passed-through GPUs (KVM_SRIOV_GPU_AFFINITY), and in
what order. Pure: the closeness is read by topology.vm_gpus, the VF itself
is chosen by policy.choose, the pool is the pool's (docs/gpu.md).

A VM with as many IB NICs as GPUs gets one rail per GPU: NIC i (document
order) is the rail of GPU i (address order), and its PF is the one
topology.pair_rails gives that GPU, else the closest other PF still close
enough to it. Any other VM: each NIC takes a VF of the PF closest to any
of its GPUs. A PF farther than the asked level is never taken.

guest_pairs says which of those VFs the guest should see beside their GPU
(under one emulated PCIe switch: domain/pcie_switch.py).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Optional, Sequence

from .topology import LEVELS, Closeness, pair_rails

_RANK = {level: i for i, level in enumerate(LEVELS)}
_WITHIN = {"switch": "behind the PCIe switch", "root": "under the root port",
           "numa": "on the NUMA node"}
SHOWN_PFS = 4   # PFs a refusal names (one line)


class GpuWish(NamedTuple):
    """What a VM asks: its VFs at most ``level`` away from its GPUs."""
    level: str                          # switch | root | numa (policy.GPU_AFFINITIES)
    gpus: tuple[str, ...]               # the VM's GPUs, in address order
    closeness: tuple[Closeness, ...]    # each of them to each PF of the pool


def pf_ranks(wish: GpuWish, nics: int, offered: Iterable[str]) -> list[dict[str, int]]:
    """Per NIC (request order): the offered PFs it may take a VF from ->
    rank, lower first. offered: the PFs with a free VF."""
    offered = set(offered)
    limit = _RANK[wish.level]
    close = [c for c in wish.closeness if c.pf in offered and _RANK[c.level] <= limit]
    if nics == len(wish.gpus):
        rails = {c.gpu: c.pf for c in pair_rails(close)}
        out = []
        for gpu in wish.gpus:
            ranks = {c.pf: 1 + _RANK[c.level] for c in close if c.gpu == gpu}
            if gpu in rails:
                ranks[rails[gpu]] = 0
            out.append(ranks)
        return out
    nearest: dict[str, int] = {}
    for c in close:
        nearest[c.pf] = min(nearest.get(c.pf, len(LEVELS)), _RANK[c.level])
    return [nearest] * nics


def refusal(wish: GpuWish, nics: int, i: int, nic: str, free_pfs: Iterable[str]) -> str:
    """One line: which GPU had no free VF close enough for NIC i, and the
    nearest PFs with a free VF there are instead."""
    paired = nics == len(wish.gpus)
    gpus = [wish.gpus[i]] if paired else list(wish.gpus)
    free = set(free_pfs)
    nearest: dict[str, str] = {}
    for c in wish.closeness:
        if c.gpu in gpus and c.pf in free and (c.pf not in nearest or _RANK[c.level] < _RANK[nearest[c.pf]]):
            nearest[c.pf] = c.level
    shown = sorted(nearest.items(), key=lambda kv: (_RANK[kv[1]], kv[0]))
    have = ", ".join(f"{pf} ({level})" for pf, level in shown[:SHOWN_PFS]) or "none"
    if len(shown) > SHOWN_PFS:
        have += f" and {len(shown) - SHOWN_PFS} more"
    whose = f"GPU {gpus[0]}" if len(gpus) == 1 else (
        f"any of the VM's GPUs {', '.join(gpus[:SHOWN_PFS])}" + (" ..." if len(gpus) > SHOWN_PFS else ""))
    return (f'KVM_SRIOV_GPU_AFFINITY = "{wish.level}": no free VF {_WITHIN[wish.level]} of {whose} '
            f"for {nic}; PFs with a free VF, nearest first: {have}")


def served(wish: GpuWish, nics: int, i: int, pf: str) -> Optional[Closeness]:
    """The GPU NIC i's VF (of pf) serves and how close it is: its rail's GPU
    (as many NICs as GPUs), else the GPU closest to pf."""
    gpus = {wish.gpus[i]} if nics == len(wish.gpus) else set(wish.gpus)
    return min((c for c in wish.closeness if c.pf == pf and c.gpu in gpus),
               key=lambda c: (_RANK[c.level], c.gpu), default=None)


# Host levels at which a GPU's peer traffic with its VF stays below the CPU's
# root complex: only those pairs are shown in the guest as behind one switch.
# A numa-close pair shown so would make NCCL take GPUDirect RDMA across the
# host's root complex where on bare metal it would not.
GUEST_SWITCH_LEVELS = ("switch", "root")


class GuestPair(NamedTuple):
    """A GPU and the NICs whose VFs the guest sees beside it."""
    gpu: str
    numa_node: Optional[int]     # the host NUMA node of the GPU and all its VFs; None: unknown
    nics: tuple[int, ...]        # NIC indexes (request order)


def guest_pairs(wish: Optional[GpuWish], pfs: Sequence[str]) -> list[GuestPair]:
    """Per GPU (address order), the NICs whose VF (of pfs[i]) serves it at
    a GUEST_SWITCH_LEVELS level. Nothing without a wish or with fewer NICs
    than GPUs (a GPU without a VF of its own gains nothing from a switch
    of its own)."""
    if wish is None or len(pfs) < len(wish.gpus):
        return []
    nics: dict[str, list[int]] = {}
    nodes: dict[str, set] = {}
    for i, pf in enumerate(pfs):
        c = served(wish, len(pfs), i, pf)
        if c is not None and c.level in GUEST_SWITCH_LEVELS:
            nics.setdefault(c.gpu, []).append(i)
            nodes.setdefault(c.gpu, set()).add(c.numa_node)
    return [GuestPair(gpu, next(iter(nodes[gpu])) if len(nodes[gpu]) == 1 else None, tuple(nics[gpu]))
            for gpu in wish.gpus if gpu in nics]
