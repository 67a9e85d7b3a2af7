"""Which free VFs a VM gets. Pure functions: no I/O, no state.

Rules, in order: a NIC that names a PF gets a VF of that PF; a VM that
asks for VFs close to its GPUs gets them only from PFs close enough, the
closest (its GPU's rail) first (gpu_affinity.py); with a NUMA
wish a VF on the VM's NUMA node(s) is required (``require``) or
comes first (``prefer``); the NICs of one VM go to different PFs when they
can (more rails, no shared HCA); then the PF with the most free VFs (spread
load over HCAs); then the lowest VF index, so the choice is deterministic.

A NIC on a whole-PF network (``BRIDGE = "ib-pf"``) gets a PF itself
(choose_whole_pfs): one that may be passed through whole now
(whole_pf.why_not_free), of the PF it names, on the wished NUMA node first,
then the one with the fewest VFs enabled (its VFs leave the pool while the
VM has it), then the lowest address.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain, groupby
from operator import attrgetter
from typing import Iterable, Mapping, NamedTuple, Optional, Sequence, Union

from ..errors import InputError, PoolExhausted
from . import gpu_affinity, whole_pf
from .discovery import PhysicalFunction, VirtualFunction, pf_matches
from .gpu_affinity import GpuWish


class VfRequest(NamedTuple):
    """One NIC that needs a VF (or, whole_pf, a PF of its own)."""
    mac: str
    pf_selector: Optional[str] = None  # from "ib-sriov:<pf>" / "ib-pf:<pf>"
    whole_pf: bool = False             # on a whole-PF network: the PF itself

    def describe(self) -> str:
        return f"NIC {self.mac}" + (f" (PF {self.pf_selector})" if self.pf_selector else "")


# A NIC on a network with this BRIDGE ("ib-pf", or "ib-pf:<pf>" for a PF as
# in pool.pfs) gets a whole PF. BRIDGE because oned copies it into every
# copy of the NIC kvm-sriov reads (the deployment file, vm.xml, the action
# XML, attach_nic's arguments, the scheduler's document) and lets only
# oneadmin's group set it (VNET_RESTRICTED_ATTR in the stock oned.conf).
WHOLE_PF_BRIDGE = "ib-pf"


def nic_request(mac: str, bridge: str, marker: str) -> Optional[VfRequest]:
    """The request of a NIC on ``bridge`` (marker: network.bridge, the VF
    networks'), None when the NIC is not on a network of the driver's."""
    for whole, name in ((False, marker), (True, WHOLE_PF_BRIDGE)):
        ours, selector = bridge_selector(bridge, name)
        if ours:
            return VfRequest(mac, selector, whole)
    return None


def is_whole_pf_bridge(bridge: str) -> bool:
    """Is ``bridge`` a whole-PF network's ("ib-pf" or "ib-pf:<pf>")?"""
    return bridge_selector(bridge, WHOLE_PF_BRIDGE)[0]


def bridge_selector(bridge: str, name: str) -> tuple[bool, Optional[str]]:
    """'name' -> (True, None); 'name:<pf>' -> (True, '<pf>'); else (False, None)."""
    if bridge == name:
        return True, None
    if bridge.startswith(name + ":") and bridge[len(name) + 1:].strip():
        return True, bridge[len(name) + 1:].strip()
    return False, None


# numa_nodes=AUTO: the VM is not pinned but wants one node (HPC profile):
# the node with the most free VFs is the wish.
AUTO = "auto"
NUMA_POLICIES = ("prefer", "require", "ignore")
# KVM_SRIOV_GPU_AFFINITY: how close to one of the VM's GPUs each VF's PF must
# be (topology.LEVELS); "none": VFs chosen as for a VM without GPUs
GPU_AFFINITIES = ("switch", "root", "numa", "none")
NO_GPU_AFFINITY = "none"


class FreeVfs:
    """The free VFs per PF, each PF's in index order, found without a pass
    over every VF: choose() runs under the pool lock, which every parallel
    action on the host waits for, and a pool has hundreds of VFs of which a
    VM takes one or two. ``by_pf``: every VF the pool may offer, per PF in
    index order (built once per inventory); ``taken``: the addresses that
    are not free. Counting per PF costs a pass over ``taken``, finding a
    PF's first free VF a pass over its taken ones at the front."""

    def __init__(self, by_pf: Mapping[str, Sequence[VirtualFunction]],
                 taken: Iterable[str] = (), pf_of: Optional[Mapping[str, str]] = None):
        self._by_pf = by_pf
        self._taken = set(taken)
        self._count = {pf: len(vfs) for pf, vfs in by_pf.items()}
        if self._taken:
            if pf_of is None:
                pf_of = {vf.address: pf for pf, vfs in by_pf.items() for vf in vfs}
            for address in self._taken:
                pf = pf_of.get(address)
                if pf is not None:
                    self._count[pf] -= 1

    @classmethod
    def of(cls, free: Iterable[VirtualFunction]) -> "FreeVfs":
        return cls({pf: tuple(vfs) for pf, vfs in groupby(sorted(free, key=_PF_INDEX), _PF)})

    def count(self, pf: str) -> int:
        return self._count[pf]

    def pfs(self) -> list[str]:
        """The PFs with a free VF, in address order."""
        return [pf for pf in sorted(self._by_pf) if self._count[pf]]

    def first(self, pf: str, wish: Optional[frozenset] = None) -> VirtualFunction:
        """The PF's free VF that ranks first: lowest index, on a wished NUMA
        node when there is one."""
        fallback = None
        for vf in self._by_pf[pf]:
            if vf.address in self._taken:
                continue
            if not wish or vf.numa_node in wish:
                return vf
            if fallback is None:
                fallback = vf
        if fallback is None:
            raise LookupError(pf)
        return fallback

    def take(self, vf: VirtualFunction) -> None:
        self._taken.add(vf.address)
        self._count[vf.pf] -= 1

    def take_pf(self, pf: str) -> None:
        """None of this PF's VFs is free any more (it goes whole to a VM)."""
        self._taken.update(vf.address for vf in self._by_pf.get(pf, ()))
        if pf in self._count:
            self._count[pf] = 0

    def __iter__(self):
        for pf in sorted(self._by_pf):
            for vf in self._by_pf[pf]:
                if vf.address not in self._taken:
                    yield vf


def auto_node(free: Iterable[VirtualFunction]) -> Optional[int]:
    per_node = Counter(vf.numa_node for vf in free if vf.numa_node is not None)
    if not per_node:
        return None
    return min(per_node, key=lambda n: (-per_node[n], n))


def numa_misses(chosen: Sequence[VirtualFunction], nodes: Optional[frozenset]) -> list[VirtualFunction]:
    """The chosen VFs that are not on the wished nodes (what to report)."""
    if not nodes:
        return []
    return [vf for vf in chosen if vf.numa_node not in nodes]


def choose(requests: Sequence[VfRequest], free: Union[Iterable[VirtualFunction], FreeVfs],
           pfs: Mapping[str, PhysicalFunction],
           numa_nodes: Union[None, str, frozenset] = None,
           numa_policy: str = "ignore", gpus: Optional[GpuWish] = None) -> list[VirtualFunction]:
    """One VF per request, in request order; raises before choosing anything.

    free: the free VFs, or a FreeVfs (what the pool lock's holder passes);
    numa_nodes: the NUMA nodes of the VM's pinned CPUs/memory (None: unpinned,
    AUTO: pick the node with the most free VFs); numa_policy: prefer|require|ignore;
    gpus: the VM's GPUs and how close each PF is to them (None: not asked).
    """
    if numa_policy not in NUMA_POLICIES:
        raise InputError(f"NUMA policy must be one of {', '.join(NUMA_POLICIES)}, got {numa_policy!r}")
    if not isinstance(free, FreeVfs):
        free = FreeVfs.of(free)
    offered = free.pfs()
    near = None  # per request: the PFs close enough to its GPU(s) -> rank
    if gpus is not None and gpus.gpus:
        near = gpu_affinity.pf_ranks(gpus, len(requests), offered)
    if numa_nodes == AUTO:  # with GPUs: the node with the most free VFs close to them
        close = None if near is None else set().union(*near)
        node = auto_node(free if close is None else (vf for vf in free if vf.pf in close))
        numa_nodes = frozenset([node]) if node is not None else None
    wish = numa_nodes if numa_policy != "ignore" and numa_nodes else None
    for req in requests:
        if req.pf_selector and not any(pf_matches(pf, req.pf_selector) for pf in pfs.values()):
            raise InputError(
                f"{req.describe()} asks for a PF that is not in this host's VF pool "
                f"(pool PFs: {', '.join(sorted(pfs)) or 'none'})")
    # The rule's order (GPU, wish, other PF, most free, PF, index) depends on the
    # PF but for the NUMA node and the index: so each PF offers its first
    # free VF in (wish, index) order, and the PFs, a handful, are compared
    # with the whole rule.
    want: list[VirtualFunction] = []
    used_pfs: set[str] = set()
    chosen: dict[int, VirtualFunction] = {}
    # Most constrained first: NICs that name a PF pick before the others.
    order = sorted(range(len(requests)), key=lambda i: requests[i].pf_selector is None)
    for i in order:
        req = requests[i]
        firsts = [free.first(pf, wish) for pf in offered if free.count(pf) and (
            req.pf_selector is None or pf_matches(pfs[pf], req.pf_selector))]
        if firsts and near is not None:
            firsts = [vf for vf in firsts if vf.pf in near[i]]
            if not firsts:
                raise PoolExhausted(gpu_affinity.refusal(gpus, len(requests), i, req.describe(),
                                                         [pf for pf in offered if free.count(pf)]))
        if firsts and wish and numa_policy == "require":
            # a PF's first VF is off the wished nodes only if all of its are
            firsts = [vf for vf in firsts if vf.numa_node in wish] or _numa_refusal(
                req, [vf for vf in free if vf.pf in {f.pf for f in firsts}], wish)
        if not firsts:  # (what was free when the call began)
            raise PoolExhausted(_exhausted_message(requests, chain(free, want)))
        best = min(firsts, key=lambda vf: (near[i][vf.pf] if near else 0,
                                           bool(wish) and vf.numa_node not in wish, vf.pf in used_pfs,
                                           -free.count(vf.pf), vf.pf, vf.index))
        chosen[i] = best
        free.take(best)
        want.append(best)
        used_pfs.add(best.pf)
    return [chosen[i] for i in range(len(requests))]


def choose_all(requests: Sequence[VfRequest], free: Union[Iterable[VirtualFunction], FreeVfs],
               pfs: Mapping[str, PhysicalFunction], why_not: Mapping[str, str],
               numa_nodes: Union[None, str, frozenset] = None, numa_policy: str = "ignore",
               gpus: Optional[GpuWish] = None) -> list[VirtualFunction]:
    """A VM's NICs, VF NICs and whole-PF NICs alike, in request order: each
    gets a VF (choose) or its whole PF (choose_whole_pfs, as
    whole_pf.as_device); the whole PFs first, and none of their VFs then.
    An unpinned VM with a NUMA wish (AUTO) has its VFs wished on its whole
    PFs' node. why_not: as for choose_whole_pfs (asked only with whole-PF NICs)."""
    whole = [i for i, r in enumerate(requests) if r.whole_pf]
    if not whole:
        return choose(requests, free, pfs, numa_nodes, numa_policy, gpus)
    if not isinstance(free, FreeVfs):
        free = FreeVfs.of(free)
    got = choose_whole_pfs([requests[i] for i in whole], list(pfs.values()), why_not, numa_nodes, numa_policy)
    for pf in got:
        free.take_pf(pf.address)
    if numa_nodes == AUTO:
        nodes = frozenset(pf.numa_node for pf in got if pf.numa_node is not None)
        numa_nodes = nodes or AUTO
    rest = [i for i in range(len(requests)) if i not in whole]
    vfs = choose([requests[i] for i in rest], free, pfs, numa_nodes, numa_policy, gpus) if rest else []
    out: dict[int, VirtualFunction] = dict(zip(rest, vfs))
    out.update((i, whole_pf.as_device(pf)) for i, pf in zip(whole, got))
    return [out[i] for i in range(len(requests))]


_PF = attrgetter("pf")
_PF_INDEX = attrgetter("pf", "index")

MAX_SAID = 6  # PFs named in a refusal


def choose_whole_pfs(requests: Sequence[VfRequest], pfs: Sequence[PhysicalFunction],
                     why_not: Mapping[str, str], numa_nodes: Union[None, str, frozenset] = None,
                     numa_policy: str = "ignore") -> list[PhysicalFunction]:
    """One PF per request, in request order; raises before choosing anything.

    pfs: the pool's PFs; why_not: PF address -> why it cannot be passed
    through whole now (whole_pf.why_not_free); a PF not in it may be.
    numa_nodes, numa_policy: as for choose()."""
    if numa_policy not in NUMA_POLICIES:
        raise InputError(f"NUMA policy must be one of {', '.join(NUMA_POLICIES)}, got {numa_policy!r}")
    free = [pf for pf in pfs if pf.address not in why_not]
    if numa_nodes == AUTO:
        per_node = Counter(pf.numa_node for pf in free if pf.numa_node is not None)
        numa_nodes = frozenset([min(per_node, key=lambda n: (-per_node[n], n))]) if per_node else None
    wish = numa_nodes if numa_policy != "ignore" and numa_nodes else None
    for req in requests:
        if req.pf_selector and not any(pf_matches(pf, req.pf_selector) for pf in pfs):
            raise InputError(f"{req.describe()} asks for a PF that is not in this host's pool "
                             f"(pool PFs: {', '.join(sorted(pf.address for pf in pfs)) or 'none'})")
    chosen: dict[int, PhysicalFunction] = {}
    order = sorted(range(len(requests)), key=lambda i: requests[i].pf_selector is None)
    for i in order:
        req = requests[i]
        fits = [pf for pf in free if pf not in chosen.values()
                and (req.pf_selector is None or pf_matches(pf, req.pf_selector))]
        if fits and wish and numa_policy == "require":
            near = [pf for pf in fits if pf.numa_node in wish]
            if not near:
                raise PoolExhausted(
                    f"NUMA policy 'require': no PF to pass through whole for {req.describe()} on NUMA "
                    f"node(s) {', '.join(map(str, sorted(wish)))} of the VM's CPUs/memory (free elsewhere: "
                    f"{', '.join(f'{pf.address} on node {pf.numa_node}' for pf in fits[:MAX_SAID])}); "
                    f"use numa_policy 'prefer' or pin the VM to another node")
            fits = near
        if not fits:
            raise PoolExhausted(_no_whole_pf(requests, req, pfs, why_not, list(chosen.values())))
        chosen[i] = min(fits, key=lambda pf: (bool(wish) and pf.numa_node not in wish, pf.num_vfs, pf.address))
    return [chosen[i] for i in range(len(requests))]


def _no_whole_pf(requests: Sequence[VfRequest], req: VfRequest, pfs: Sequence[PhysicalFunction],
                 why_not: Mapping[str, str], chosen: list[PhysicalFunction]) -> str:
    said = []
    for pf in pfs:
        if req.pf_selector and not pf_matches(pf, req.pf_selector):
            continue
        if pf in chosen:
            said.append(f"{pf.address}: taken by another NIC of the VM")
        elif pf.address in why_not:
            said.append(f"{pf.address}: {why_not[pf.address]}")
    more = f" and {len(said) - MAX_SAID} more" if len(said) > MAX_SAID else ""
    needs = f"{len(requests)} whole PF{'s' if len(requests) != 1 else ''}"
    return (f"no PF of this host can be passed through whole for {req.describe()} (the VM needs "
            f"{needs}): {'; '.join(said[:MAX_SAID]) or 'no pool PF'}{more}")


def _numa_refusal(req: VfRequest, fits, wish) -> list:
    elsewhere = Counter(vf.numa_node for vf in fits)
    have = ", ".join(f"{n} on node {node}" for node, n in sorted(elsewhere.items(), key=str))
    raise PoolExhausted(
        f"NUMA policy 'require': no free VF for {req.describe()} on NUMA node(s) "
        f"{', '.join(map(str, sorted(wish)))} of the VM's CPUs/memory (free elsewhere: {have}); "
        f"use numa_policy 'prefer' or pin the VM to another node")


def _exhausted_message(requests: Sequence[VfRequest], free: Iterable[VirtualFunction]) -> str:
    wanted = Counter(r.pf_selector or "any PF" for r in requests)
    asks = ", ".join(f"{n} on {where}" for where, n in wanted.items())
    have = Counter(vf.pf for vf in free)
    free_txt = ", ".join(f"{n} on {pf}" for pf, n in sorted(have.items())) or "none"
    return (f"not enough free SR-IOV VFs on this host: the VM needs {len(requests)} "
            f"({asks}); free: {free_txt}")
