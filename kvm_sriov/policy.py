"""Which free VFs a VM gets. Pure functions: no I/O, no state.

Rules, in order: a NIC that names a PF gets a VF of that PF; with a NUMA
wish (issue 4) a VF on the VM's NUMA node(s) is required (``require``) or
comes first (``prefer``); the NICs of one VM go to different PFs when they
can (more rails, no shared HCA); then the PF with the most free VFs (spread
load over HCAs); then the lowest VF index, so the choice is deterministic.
"""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from operator import attrgetter
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
    # The pool lock is held while this runs, and every parallel action on
    # the host waits for it: so no per-VF key over all ~500 free VFs per
    # NIC. The rule's order (wish, other PF, most free, PF, index) depends
    # on the PF but for the NUMA node and the index: each PF's free VFs are
    # ranked once (in C: sorted, groupby), each PF offers its first and the
    # PFs, a handful, are compared with the whole rule.
    if wish:
        ranked = sorted(free, key=lambda vf: (vf.pf, vf.numa_node not in wish, vf.index))
    else:
        ranked = sorted(free, key=_PF_INDEX)
    per_pf = {pf: list(vfs) for pf, vfs in groupby(ranked, _PF)}
    used_pfs: set[str] = set()
    chosen: dict[int, VirtualFunction] = {}
    # Most constrained first: NICs that name a PF pick before the others.
    order = sorted(range(len(requests)), key=lambda i: requests[i].pf_selector is None)
    for i in order:
        req = requests[i]
        offers = [vfs for pf, vfs in per_pf.items() if vfs and (
            req.pf_selector is None or pf_matches(pfs[pf], req.pf_selector))]
        if offers and wish and numa_policy == "require":
            # a PF's first VF is off the wished nodes only if all of its are
            offers = [vfs for vfs in offers if vfs[0].numa_node in wish] or _numa_refusal(
                req, [vf for vfs in offers for vf in vfs], wish)
        if not offers:
            raise PoolExhausted(_exhausted_message(requests, free))
        best = min((vfs[0] for vfs in offers),
                   key=lambda vf: (bool(wish) and vf.numa_node not in wish, vf.pf in used_pfs,
                                   -len(per_pf[vf.pf]), vf.pf, vf.index))
        chosen[i] = per_pf[best.pf].pop(0)
        used_pfs.add(best.pf)
    return [chosen[i] for i in range(len(requests))]


_PF = attrgetter("pf")
_PF_INDEX = attrgetter("pf", "index")


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
