"""Which free VFs a VM gets. Pure functions: no I/O, no state.

Rules, in order: a NIC that names a PF gets a VF of that PF; the NICs of one
VM go to different PFs when they can (more rails, no shared HCA); then the PF
with the most free VFs (spread load over HCAs); then the lowest VF index, so
the choice is deterministic.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .discovery import PhysicalFunction, VirtualFunction, pf_matches
from .errors import InputError, PoolExhausted


@dataclass(frozen=True)
class VfRequest:
    """One NIC that needs a VF."""
    mac: str
    pf_selector: Optional[str] = None  # from "ib-sriov:<pf>"

    def describe(self) -> str:
        return f"NIC {self.mac}" + (f" (PF {self.pf_selector})" if self.pf_selector else "")


def choose(requests: Sequence[VfRequest], free: Sequence[VirtualFunction],
           pfs: Mapping[str, PhysicalFunction]) -> list[VirtualFunction]:
    """One VF per request, in request order; raises before choosing anything."""
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
        if not fits:
            raise PoolExhausted(_exhausted_message(requests, free))
        best = min(fits, key=lambda vf: (vf.pf in used_pfs, -free_per_pf[vf.pf], vf.pf, vf.index))
        chosen[i] = best
        remaining.remove(best)
        free_per_pf[best.pf] -= 1
        used_pfs.add(best.pf)
    return [chosen[i] for i in range(len(requests))]


def _exhausted_message(requests: Sequence[VfRequest], free: Sequence[VirtualFunction]) -> str:
    wanted = Counter(r.pf_selector or "any PF" for r in requests)
    asks = ", ".join(f"{n} on {where}" for where, n in wanted.items())
    have = Counter(vf.pf for vf in free)
    free_txt = ", ".join(f"{n} on {pf}" for pf, n in sorted(have.items())) or "none"
    return (f"not enough free SR-IOV VFs on this host: the VM needs {len(requests)} "
            f"({asks}); free: {free_txt}")
