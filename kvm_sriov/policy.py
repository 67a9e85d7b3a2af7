"""Which free VFs a VM gets. Pure functions: no I/O, no state.

Rules, in order: a NIC that names a PF gets a VF of that PF; with a NUMA
wish (issue 4) a VF on the VM's NUMA node(s) is required (``require``) or
comes first (``prefer``); the NICs of one VM go to different PFs when they
can (more rails, no shared HCA); then the PF with the most free VFs (spread
load over HCAs); then the lowest VF index, so the choice is deterministic.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, NamedTuple, Optional, Sequence, Union

from .discovery import PhysicalFunction, VirtualFunction, pf_matches
from .errors import InputError, PoolExhausted


class VfRequest(NamedTuple):
    """One NIC that needs a VF."""
    mac: str
    pf_selector: Optional[str] = None  # from "ib-sriov:<pf>"

    def describe(self) -> str:
        return f"NIC {self.mac}" + (f" (PF {self.pf_selector})" if self.pf_selector else "")


# numa_nodes=AUTO: the VM is not pinned but wants one node (HPC profile):
# the node with the most free VFs is the wish.
AUTO = "auto"
NUMA_POLICIES = ("prefer", "require", "ignore")


def auto_node(free: Sequence[VirtualFunction]) -> Optional[int]:
    per_node = Counter(vf.numa_node for vf in free if vf.numa_node is not None)
    if not per_node:
        return None
    return min(per_node, key=lambda n: (-per_node[n], n))


def numa_misses(chosen: Sequence[VirtualFunction], nodes: Optional[frozenset]) -> list[VirtualFunction]:
    """The chosen VFs that are not on the wished nodes (what to report)."""
    if not nodes:
        return []
    return [vf for vf in chosen if vf.numa_node not in nodes]


def choose(requests: Sequence[VfRequest], free: Sequence[VirtualFunction],
           pfs: Mapping[str, PhysicalFunction],
           numa_nodes: Union[None, str, frozenset] = None,
           numa_policy: str = "ignore") -> list[VirtualFunction]:
    """One VF per request, in request order; raises before choosing anything.

    numa_nodes: the NUMA nodes of the VM's pinned CPUs/memory (None: unpinned,
    AUTO: pick the node with the most free VFs); numa_policy: prefer|require|ignore.
    """
    if numa_policy not in NUMA_POLICIES:
        raise InputError(f"NUMA policy must be one of {', '.join(NUMA_POLICIES)}, got {numa_policy!r}")
    if numa_nodes == AUTO:
        node = auto_node(free)
        numa_nodes = frozenset([node]) if node is not None else None
    wish = numa_nodes if numa_policy != "ignore" and numa_nodes else None
    for req in requests:
        if req.pf_selector and not any(pf_matches(pf, req.pf_selector) for pf in pfs.values()):
            raise InputError(
                f"{req.describe()} asks for a PF that is not in this host's VF pool "
                f"(pool PFs: {', '.join(sorted(pfs)) or 'none'})")
    remaining = list(free)
    free_per_pf = Counter(vf.pf for vf in remaining)
    used_pfs: set[str] = set()
    chosen: dict[int, VirtualFunction] = {}
    # Most constrained first: NICs that name a PF pick before the others.
    order = sorted(range(len(requests)), key=lambda i: requests[i].pf_selector is None)
    for i in order:
        req = requests[i]
        fits = [vf for vf in remaining
                if req.pf_selector is None or pf_matches(pfs[vf.pf], req.pf_selector)]
        if fits and wish and numa_policy == "require":
            fits = [vf for vf in fits if vf.numa_node in wish] or _numa_refusal(req, fits, wish)
        if not fits:
            raise PoolExhausted(_exhausted_message(requests, free))
        best = min(fits, key=lambda vf: (bool(wish) and vf.numa_node not in wish,
                                         vf.pf in used_pfs, -free_per_pf[vf.pf], vf.pf, vf.index))
        chosen[i] = best
        remaining.remove(best)
        free_per_pf[best.pf] -= 1
        used_pfs.add(best.pf)
    return [chosen[i] for i in range(len(requests))]


def _numa_refusal(req: VfRequest, fits, wish) -> list:
    elsewhere = Counter(vf.numa_node for vf in fits)
    have = ", ".join(f"{n} on node {node}" for node, n in sorted(elsewhere.items(), key=str))
    raise PoolExhausted(
        f"NUMA policy 'require': no free VF for {req.describe()} on NUMA node(s) "
        f"{', '.join(map(str, sorted(wish)))} of the VM's CPUs/memory (free elsewhere: {have}); "
        f"use numa_policy 'prefer' or pin the VM to another node")


def _exhausted_message(requests: Sequence[VfRequest], free: Sequence[VirtualFunction]) -> str:
    wanted = Counter(r.pf_selector or "any PF" for r in requests)
    asks = ", ".join(f"{n} on {where}" for where, n in wanted.items())
    have = Counter(vf.pf for vf in free)
    free_txt = ", ".join(f"{n} on {pf}" for pf, n in sorted(have.items())) or "none"
    return (f"not enough free SR-IOV VFs on this host: the VM needs {len(requests)} "
            f"({asks}); free: {free_txt}")
