"""VF accounting for OpenNebula's scheduler: which hosts can take which VM.

Front-end side, standard library only. A host's free VFs are what its
latest kvm-sriov probe reported (availability.py's definition, the same as
deploy's), minus the VFs booked for VMs placed on it that the probe does not
count (this scheduling window's and earlier windows' placements, kept in
a :class:`Ledger` while oned has the VM there). A VM needs one VF per NIC whose BRIDGE is ``ib-sriov``
or ``ib-sriov:<pf>``; a NUMA wish (HPC profile, pinned CPUs) with the NUMA
policy ``require`` needs them on one node. Whether a host fits, and which of
its PFs/nodes a VM uses up, is decided by deploy's own VF choice
(policy.choose) on stand-in VFs built from the probe's counts.

A VM that asks for VFs close to its GPUs (KVM_SRIOV_GPU_AFFINITY) needs a
host whose probe's pairing (KVM_SRIOV_GPU) gives each of its IB NICs a VF
that close to one of the GPUs oned would give it there (its PCI requests
matched against the host's PCI_DEVICES as oned's HostSharePCI assigns them),
by the same choice (policy.choose with a gpu_affinity.GpuWish).

A NIC on a whole-PF network (``BRIDGE = "ib-pf"`` or ``"ib-pf:<pf>"``)
needs a PF of its own: one the probe reports as ``WHOLE_FREE`` (nothing of
it held; KVM_SRIOV_FREE_PFS counts them), counted apart from the VFs.
Booked (``whole:<pf>`` in the ledger), it offers no VF any more; a PF with
a VF booked in the window is no longer free whole.

A VM with a shared-memory region (KVM_SRIOV_IVSHMEM) needs a host whose
budget (the probe's KVM_SRIOV_IVSHMEM_*), and its owner's share of it, take
its SIZE, unless its group's region is already there; a host whose probe
does not report the budget is not filtered on it. The per-VM options are read by deploy's own readers
(vm_template, hpc_profile, ivshmem): what deploy would refuse stays PENDING.

The scheduler protocol around it is in sched/kvm-sriov/place.
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from itertools import islice
from typing import Iterable, NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..domain import hpc_profile
from ..domain.domain_xml import bridge_selector
from ..domain.hpc_profile import YES
from ..errors import DriverError, InputError
from ..files import atomic_write
from ..ib import pkey
from ..ivshmem import device as ivshmem, region as ivshmem_region
from ..oned.vm_template import VmTemplate
from ..opennebula import shown
from ..vf import policy, topology
from ..vf.discovery import IbPort, PhysicalFunction, VirtualFunction, pf_matches
from ..vf.gpu_affinity import GpuWish
from ..vf.sysfs import normalize_pci_address

BRIDGE = "ib-sriov"
WHOLE = "whole:"   # a booking of a whole PF ("whole:<pf>"), beside the PFs of VFs


# -- what a host has -------------------------------------------------------------
class PfCount(NamedTuple):
    address: str
    netdevs: tuple[str, ...]
    ib_devices: tuple[str, ...]
    ib_port: Optional[IbPort]
    vendor: str
    device: str
    numa_node: Optional[int]
    free: int
    whole_free: bool = False    # WHOLE_FREE: may be passed through whole (not reported: no)
    enabled: int = 0            # ENABLED_VFS (deploy takes the PF with the fewest first)

    def as_pf(self) -> PhysicalFunction:
        return PhysicalFunction(self.address, self.vendor, self.device, 0x020700, None, self.numa_node,
                                self.netdevs, (self.ib_port,) if self.ib_port else
                                tuple(IbPort(d, 1) for d in self.ib_devices), 0, self.enabled)


def _int(text, default=0) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


def _split(text) -> tuple[str, ...]:
    return tuple(p for p in str(text or "").split(",") if p)


def _vectors(attrs: dict, name: str) -> list[dict]:
    """The vectors named so (a plain value of that name, or anything else, gives none)."""
    found = attrs.get(name)
    return [v for v in found if isinstance(v, dict)] if isinstance(found, list) else []


def _owners_mb(text) -> dict[int, int]:
    """The probe's "<uid>:<MB> ..." (what each owner's regions take); a
    pair that is not two numbers is skipped."""
    out = {}
    for uid, _, used in (pair.partition(":") for pair in str(text or "").split()):
        if _int(uid, -1) >= 0:
            out[_int(uid)] = max(0, _int(used))
    return out


# -- a VM's GPUs on a host: OpenNebula's PCI assignment --------------------------------
MAX_PCI_DEVICES = 4096   # a host's PCI_DEVICES read (the stock pci probe lists what its filter keeps)
MAX_FIELD = 64           # characters of a PCI value, a GPU's or PF's address, read


class PciDevice(NamedTuple):
    """One of a host's PCI_DEVICES (HOST_SHARE), as oned's HostSharePCI keeps it."""
    address: str             # ADDRESS, "0000:07:00.0"
    short: str               # SHORT_ADDRESS, "07:00.0"
    ids: tuple[int, int, int]    # VENDOR, DEVICE, CLASS ("0302"); 0 where not hex
    vmid: int                # -1: free

    @property
    def is_gpu(self) -> bool:
        return topology.is_gpu(f"{self.ids[0]:04x}", self.ids[2] << 8)


def _pci_value(text: str) -> tuple[int, Optional[int]]:
    """HostSharePCI::get_pci_value: (0, None) empty, (1, value) a hex number,
    (-1, None) anything else, which here matches no device (oned refuses such
    a VM when it is created: "Wrong Hex value for PCI attribute")."""
    if not text:
        return 0, None
    digits = text[2:] if text[:2].lower() == "0x" else text
    if not digits or len(digits) > 8 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        return -1, None
    return 1, int(digits, 16)


def pci_devices(el: Optional[ET.Element]) -> tuple[PciDevice, ...]:
    """A host's HOST_SHARE/PCI_DEVICES in oned's order (a map by ADDRESS:
    address order; of two with one ADDRESS, the first), at most MAX_PCI_DEVICES."""
    out: dict[str, PciDevice] = {}
    for pci in islice(el.iterfind("PCI"), MAX_PCI_DEVICES) if el is not None else ():
        raw = (pci.findtext("ADDRESS") or "")[:MAX_FIELD]
        address = normalize_pci_address(raw) or raw
        if address not in out:
            ids = tuple(_pci_value((pci.findtext(k) or "")[:MAX_FIELD])[1] or 0 for k in ("VENDOR", "DEVICE", "CLASS"))
            out[address] = PciDevice(address, (pci.findtext("SHORT_ADDRESS") or "")[:MAX_FIELD], ids,
                                     _int(pci.findtext("VMID"), -1))
    return tuple(out[a] for a in sorted(out))


def assign_pci(requests, devices: Iterable[PciDevice], taken=frozenset()) -> Optional[list[str]]:
    """The host devices (ADDRESS) oned gives a VM's PCI requests, in request
    order, as HostSharePCI::add does when the VM is deployed: first each
    request by SHORT_ADDRESS alone (that device, if free), then each by
    VENDOR/DEVICE/CLASS (the first free device in address order matching every
    one given). None: not all can be given here (rank does not place it here).
    requests: (SHORT_ADDRESS, VENDOR, DEVICE, CLASS) texts; taken: devices
    this window's earlier plans gave away."""
    devices = list(devices)
    free = {d.address for d in devices if d.vmid == -1 and d.address not in taken}
    got: dict[int, str] = {}
    for i, (short, *ids) in enumerate(requests):
        if short and not any(_pci_value(v)[0] > 0 for v in ids):
            d = next((d for d in devices if d.short == short), None)
            if d is None or d.address not in free:
                return None
            got[i] = d.address
            free.discard(d.address)
    for i, (short, *ids) in enumerate(requests):
        if i in got:
            continue
        wanted = [_pci_value(v) for v in ids]
        if all(rc <= 0 for rc, _ in wanted):
            return None
        d = next((d for d in devices if d.address in free and all(
            rc == 0 or value == have for (rc, value), have in zip(wanted, d.ids))), None)
        if d is None:
            return None
        got[i] = d.address
        free.discard(d.address)
    return [got[i] for i in range(len(requests))]


_CLOSE = {level: i for i, level in enumerate(topology.LEVELS)}


class HostVfs:
    """One host's free VFs per PF (and so per NUMA node), as the probe saw them."""

    def __init__(self, pfs: Iterable[PfCount], vms: Iterable[int] = (), numa_policy: str = "prefer",
                 reported: bool = True, hpc_profile: bool = False,
                 shm_max_region_mb: Optional[int] = None, shm_free_mb: Optional[int] = None,
                 shm_regions: Iterable[str] = (), shm_max_owner_mb: Optional[int] = None,
                 shm_owner_mb: Optional[dict[int, int]] = None,
                 gpus: Optional[dict[str, dict[str, str]]] = None, pci: Iterable[PciDevice] = ()):
        self.pfs = list(pfs)
        self.vms = frozenset(vms)              # VMs whose VFs the probe counted as held
        self.numa_policy = numa_policy
        self.hpc_profile = hpc_profile         # the host's default for VMs that do not say
        self.reported = reported               # False: no kvm-sriov probe on this host
        self._pf_objects = {p.address: p.as_pf() for p in self.pfs}
        # the shared-memory budget (None: not reported, an older probe: no limit here)
        self.shm_max_region_mb = shm_max_region_mb
        self.shm_free_mb = shm_free_mb
        self.shm_regions = set(shm_regions)    # regions the host has: joining one costs nothing
        self.shm_max_owner_mb = shm_max_owner_mb   # what one owner's regions may take together
        self.shm_owner_mb = dict(shm_owner_mb or {})  # owner uid -> what its regions take
        # GPU -> {PF: switch|root|numa} from the probe (a PF not named is far)
        self.gpus = dict(gpus or {})
        self.pci = tuple(pci)                  # oned's PCI_DEVICES of the host
        self.pci_taken: set[str] = set()       # devices this window's earlier plans gave away

    @classmethod
    def from_monitoring(cls, attrs: dict) -> "HostVfs":
        """attrs: the probe's attributes, KEY -> value, vectors KEY -> [dict, ...]
        (as they sit in the host template)."""
        if "KVM_SRIOV_VERSION" not in attrs:
            return cls((), reported=False)
        pfs = []
        for v in _vectors(attrs, "KVM_SRIOV_PF"):
            if "FREE_VFS" not in v:     # a PF the probe could not read offers nothing
                continue
            node = _int(v.get("NUMA_NODE"), -1)
            port = IbPort(v["IB_DEVICE"], _int(v.get("IB_PORT"), 1)) if v.get("IB_DEVICE") else None
            pfs.append(PfCount(v.get("ADDRESS", ""), _split(v.get("NETDEV")), _split(v.get("IB_DEVICES")),
                               port, v.get("VENDOR", ""), v.get("DEVICE", ""),
                               node if node >= 0 else None, max(0, _int(v.get("FREE_VFS"))),
                               str(v.get("WHOLE_FREE", "")).strip().upper() == "YES",
                               max(0, _int(v.get("ENABLED_VFS")))))
        vms = [_int(x, -1) for x in str(attrs.get("KVM_SRIOV_VMS", "")).split()]
        known = {p.address for p in pfs}
        gpus: dict[str, dict[str, str]] = {}
        for v in _vectors(attrs, "KVM_SRIOV_GPU")[:topology.MAX_RAILS]:
            address = normalize_pci_address(str(v.get("ADDRESS", ""))[:MAX_FIELD])
            if address is None or "ERROR" in v or address in gpus:
                continue
            levels: dict[str, str] = {}
            for level in reversed(topology.LEVELS[:3]):    # a PF named at two levels: the closer
                for pf in _split(str(v.get(f"{level.upper()}_PFS", ""))[:(MAX_FIELD + 1) * len(known)]):
                    if pf in known:
                        levels[pf] = level
            gpus[address] = levels

        def mb(name: str) -> Optional[int]:
            return max(0, _int(attrs[name])) if name in attrs else None
        return cls(pfs, [v for v in vms if v >= 0], str(attrs.get("KVM_SRIOV_NUMA_POLICY") or "prefer"),
                   hpc_profile=str(attrs.get("KVM_SRIOV_HPC_PROFILE", "")).strip().lower() in YES,
                   shm_max_region_mb=mb("KVM_SRIOV_IVSHMEM_MAX_REGION_MB"),
                   shm_free_mb=mb("KVM_SRIOV_IVSHMEM_FREE_MB"),
                   shm_regions=str(attrs.get("KVM_SRIOV_IVSHMEM_REGIONS", "")).split(),
                   shm_max_owner_mb=mb("KVM_SRIOV_IVSHMEM_MAX_OWNER_MB"),
                   shm_owner_mb=_owners_mb(attrs.get("KVM_SRIOV_IVSHMEM_OWNERS_MB", "")),
                   gpus=gpus)

    @classmethod
    def from_host_xml(cls, template: Optional[ET.Element], pci: Optional[ET.Element] = None) -> "HostVfs":
        """template: the host's TEMPLATE; pci: its HOST_SHARE/PCI_DEVICES."""
        attrs: dict = {}
        for el in (template if template is not None else ()):
            if el.tag.startswith("KVM_SRIOV_"):
                if len(el):
                    if not isinstance(attrs.get(el.tag), list):   # a vector wins over a plain value
                        attrs[el.tag] = []
                    attrs[el.tag].append({c.tag: (c.text or "") for c in el})
                elif not isinstance(attrs.get(el.tag), list):
                    attrs[el.tag] = el.text or ""
        host = cls.from_monitoring(attrs)
        host.pci = pci_devices(pci)
        return host

    def copy(self) -> "HostVfs":
        twin = copy.copy(self)
        twin.pfs, twin.shm_regions = list(self.pfs), set(self.shm_regions)
        twin.shm_owner_mb = dict(self.shm_owner_mb)
        twin.pci_taken = set(self.pci_taken)
        return twin

    def free_vfs(self, need: "VfNeed") -> int:
        """Free VFs a VM with this need could use (on its PFs when it names them)."""
        if any(need.pfs):
            return sum(p.free for p in self.pfs if any(s and pf_matches(self._pf_objects[p.address], s)
                                                       for s in need.pfs))
        return self.free

    @property
    def free(self) -> int:
        return sum(p.free for p in self.pfs)

    @property
    def free_pfs(self) -> int:
        """PFs that may be passed through whole."""
        return sum(1 for p in self.pfs if p.whole_free)

    def free_per_node(self) -> dict[int, int]:
        out: Counter = Counter()
        for p in self.pfs:
            out[p.numa_node if p.numa_node is not None else -1] += p.free
        return {n: out[n] for n in sorted(out)}

    def _stand_ins(self) -> list[VirtualFunction]:
        return [VirtualFunction(f"{p.address}#{i}", i, p.address, p.numa_node, None, (), None, (), ())
                for p in self.pfs for i in range(p.free)]

    def choose(self, need: "VfNeed") -> list[str]:
        """What deploy would take for ``need``: the PF of each VF, and
        ``whole:<pf>`` for each whole PF; raises PoolExhausted/InputError
        (DriverError) when the host cannot take it."""
        numa_policy = need.numa_policy or self.numa_policy
        nodes = policy.AUTO if self.numa_wish(need) else None
        requests = [policy.VfRequest(f"nic{i}", sel) for i, sel in enumerate(need.pfs)]
        requests += [policy.VfRequest(f"pf{i}", sel, True) for i, sel in enumerate(need.whole)]
        why_not = {p.address: "not free whole" for p in self.pfs if not p.whole_free}
        chosen = policy.choose_all(requests, self._stand_ins(), self._pf_objects, why_not, nodes,
                                   numa_policy, self.gpu_wish(need))
        return [f"{WHOLE}{d.pf}" if r.whole_pf else d.pf for r, d in zip(requests, chosen)]

    # -- GPU pairing (KVM_SRIOV_GPU_AFFINITY) --------------------------------------------
    def vm_gpus(self, need: "VfNeed") -> Optional[tuple[str, ...]]:
        """The GPUs oned would give the VM here, in address order: of the
        devices its PCI requests get (assign_pci), those the probe reports as
        GPUs or that are GPUs by their ids. None: its requests cannot all be
        met here (rank leaves the host out for that: "Unavailable PCI device")."""
        got = assign_pci(need.pci, self.pci, self.pci_taken)
        if got is None:
            return None
        gpus = {d.address for d in self.pci if d.is_gpu} | set(self.gpus)
        return tuple(sorted(a for a in set(got) if a in gpus))

    def gpu_wish(self, need: "VfNeed") -> Optional[GpuWish]:
        """Deploy's GPU wish for the VM here, from the probe's pairing (a GPU
        the probe does not report, or a PF it does not name for it, is far);
        None: no wish, or no GPU of the VM here (deploy then chooses as without it)."""
        if need.gpu_level is None or not need.pfs:
            return None
        gpus = self.vm_gpus(need)
        if not gpus:
            return None
        table = tuple(topology.Closeness(g, p.address, self.gpus.get(g, {}).get(p.address, "far"), None, None)
                      for g in gpus for p in self.pfs)
        return GpuWish(need.gpu_level, gpus, table)

    def take_pci(self, need: "VfNeed") -> None:
        """The devices the VM gets here are no one else's in this window."""
        self.pci_taken.update(assign_pci(need.pci, self.pci, self.pci_taken) or ())

    def gpu_summary(self, need: "VfNeed") -> str:
        """The free VFs close enough to each GPU the VM would get here, e.g.
        'GPU 0000:07:00.0: 0 free VFs switch-close; 6 free in all'."""
        gpus = self.vm_gpus(need) or ()
        limit = _CLOSE.get(need.gpu_level or "far", len(topology.LEVELS))
        parts = []
        for g in gpus[:4]:
            if g not in self.gpus:
                parts.append(f"GPU {g}: no pairing reported")
                continue
            n = sum(p.free for p in self.pfs if _CLOSE[self.gpus[g].get(p.address, "far")] <= limit)
            parts.append(f"GPU {g}: {n} free VF{'s' if n != 1 else ''} {need.gpu_level}-close")
        if len(gpus) > 4:
            parts.append(f"{len(gpus) - 4} more GPUs")
        return ", ".join(parts or ["none of the VM's GPUs"]) + f"; {self.free} free in all"

    def fits(self, need: "VfNeed") -> bool:
        return self.region_problem(need) is None and self.vfs_fit(need)

    def vfs_fit(self, need: "VfNeed") -> bool:
        if not need.ib:
            return True
        if self.free < len(need.pfs) or self.free_pfs < len(need.whole):
            return False
        if need.simple(self.numa_policy, self.numa_wish(need)):  # the common case, without stand-ins
            return True
        try:
            self.choose(need)
            return True
        except DriverError:
            return False

    def numa_wish(self, need: "VfNeed") -> bool:
        return self.hpc_profile if need.numa_wish is None else need.numa_wish

    def take(self, pfs: Iterable[str]) -> None:
        """Book one VF on each of these PFs, and each ``whole:<pf>`` whole:
        it offers no VF then, and a PF with a VF booked is not free whole
        (absent PFs: ignored, a stale booking)."""
        taken = Counter(pfs)
        whole = {p[len(WHOLE):] for p in taken if p.startswith(WHOLE)}
        self.pfs = [p._replace(free=0, whole_free=False) if p.address in whole else
                    p._replace(free=max(0, p.free - taken[p.address]), whole_free=False) if taken[p.address] else p
                    for p in self.pfs]

    @property
    def shm_reported(self) -> bool:
        return any(x is not None for x in (self.shm_max_region_mb, self.shm_free_mb, self.shm_max_owner_mb))

    def region_problem(self, need: "VfNeed") -> Optional[str]:
        """Why this host cannot give the VM its shared-memory region (None: it can)."""
        if need.region is None:
            return None
        if self.shm_max_region_mb is not None and need.region_mb > self.shm_max_region_mb:
            return f"regions up to {self.shm_max_region_mb} MB"
        if need.region in self.shm_regions:
            return None
        if self.shm_free_mb is not None and need.region_mb > self.shm_free_mb:
            return f"{self.shm_free_mb} MB free for new regions"
        owner = ivshmem_region.owner_of(need.region)
        if self.shm_max_owner_mb is not None and self._owner_used(owner) + need.region_mb > self.shm_max_owner_mb:
            return self._owner_text(owner)
        return None

    def _owner_used(self, owner: Optional[int]) -> int:
        return self.shm_owner_mb.get(owner, 0) if owner is not None else 0

    def _owner_text(self, owner: Optional[int]) -> str:
        return f"{self._owner_used(owner)} of {self.shm_max_owner_mb} MB per owner in use by uid {owner}"

    def take_region(self, name: Optional[str], size_mb: int) -> None:
        """Book a region: its size once per group on this host, from the
        host's budget and its owner's share."""
        if name is None or name in self.shm_regions:
            return
        self.shm_regions.add(name)
        if self.shm_free_mb is not None:
            self.shm_free_mb = max(0, self.shm_free_mb - size_mb)
        owner = ivshmem_region.owner_of(name)
        if owner is not None:
            self.shm_owner_mb[owner] = self._owner_used(owner) + max(0, size_mb)

    def shm_summary(self, need: Optional[VfNeed] = None) -> str:
        """The host's shared-memory budget (need: with its region's owner's share)."""
        if not self.shm_reported:
            return "no shared-memory budget reported"
        parts = []
        if self.shm_max_region_mb is not None:
            parts.append(f"regions up to {self.shm_max_region_mb} MB")
        if self.shm_free_mb is not None:
            parts.append(f"{self.shm_free_mb} MB free for new regions")
        owner = ivshmem_region.owner_of(need.region) if need is not None and need.region else None
        if self.shm_max_owner_mb is not None and owner is not None:
            parts.append(self._owner_text(owner))
        return ", ".join(parts)

    def summary(self) -> str:
        if not self.reported:
            return "no kvm-sriov probe data"
        per_pf = ", ".join(f"{p.free} on {(p.netdevs or p.ib_devices or (p.address,))[0]}" for p in self.pfs)
        return f"{self.free} free ({per_pf})" if self.pfs else "no SR-IOV PF in its pool"

    def whole_summary(self) -> str:
        """'1 of 3 PFs free whole (ib1)': what a whole-PF NIC may get here."""
        if not self.reported:
            return "no kvm-sriov probe data"
        free = [(p.netdevs or p.ib_devices or (p.address,))[0] for p in self.pfs if p.whole_free]
        return (f"{len(free)} of {len(self.pfs)} PF{'s' if len(self.pfs) != 1 else ''} free whole"
                + (f" ({', '.join(free[:4])}{', ...' if free[4:] else ''})" if free else ""))

    def pf_exists(self, selector: str) -> bool:
        return any(pf_matches(pf, selector) for pf in self._pf_objects.values())


# -- what a VM needs ---------------------------------------------------------------
class VfNeed(NamedTuple):
    pfs: tuple[Optional[str], ...]      # one entry per VF NIC: its PF selector or None
    numa_wish: Optional[bool] = None    # all its VFs near one NUMA node (HPC profile, pinned; None: the host's)
    numa_policy: Optional[str] = None   # the VM's own NUMA policy (None: the host's)
    region: Optional[str] = None        # its group's shared-memory region (KVM_SRIOV_IVSHMEM)
    region_mb: int = 0                  # and the region's SIZE
    gpu_level: Optional[str] = None     # KVM_SRIOV_GPU_AFFINITY: switch|root|numa (None: none)
    pci: tuple[tuple[str, str, str, str], ...] = ()   # its PCI requests (assign_pci)
    whole: tuple[Optional[str], ...] = ()   # one entry per whole-PF NIC ("ib-pf"): its PF selector or None

    @property
    def ib(self) -> bool:
        """Does it need an InfiniBand device here (a VF or a whole PF)?"""
        return bool(self.pfs or self.whole)

    def simple(self, host_numa_policy: str, numa_wish: bool) -> bool:
        policy_ = self.numa_policy or host_numa_policy
        return (not any(self.pfs) and not self.whole and not (numa_wish and policy_ == "require")
                and self.gpu_level is None)

    def describe(self) -> str:
        pinned = Counter(s for s in self.pfs if s)
        text = f"{len(self.pfs)} InfiniBand VF{'s' if len(self.pfs) != 1 else ''}" if self.pfs else ""
        if pinned:
            text += " (" + ", ".join(f"{n} on PF {shown(s)}" for s, n in pinned.items()) + ")"
        if self.whole:
            named = Counter(s for s in self.whole if s)
            text += (" and " if text else "") + f"{len(self.whole)} whole InfiniBand PF{'s' if len(self.whole) != 1 else ''}"
            if named:
                text += " (" + ", ".join(f"{n} of PF {shown(s)}" for s, n in named.items()) + ")"
        if self.numa_wish and self.numa_policy == "require":
            text += " on one NUMA node"
        if self.gpu_level and self.pfs:
            text += f" {self.gpu_level}-close to its GPUs ({hpc_profile.GPU_AFFINITY_ATTRIBUTE} = \"{self.gpu_level}\")"
        if self.region is not None:
            text += (" and " if text else "") + f"a {self.region_mb} MB shared-memory region ({ivshmem.ATTRIBUTE})"
        return text


def vm_options(vm: ET.Element) -> tuple[hpc_profile.VmOptions, Optional[ivshmem.Request]]:
    """The VM's options and shared-memory request, read from its VM element
    by deploy's own readers; InputError: what deploy would refuse."""
    doc = VmTemplate(vm, "VM template")
    return hpc_profile.vm_options(doc), ivshmem.request_of(doc)


def _vm_pci(vm: ET.Element) -> list[tuple[str, str, str, str]]:
    """The VM's PCI requests (TEMPLATE/PCI, document order), at most
    topology.MAX_RAILS + 1 (deploy refuses more than MAX_RAILS with a GPU wish)."""
    return [tuple((pci.findtext(k) or "")[:MAX_FIELD] for k in ("SHORT_ADDRESS", "VENDOR", "DEVICE", "CLASS"))
            for pci in islice(vm.iterfind("TEMPLATE/PCI"), topology.MAX_RAILS + 1)]


def option_problem(vm: ET.Element, marker: str = BRIDGE) -> Optional[str]:
    """Why deploy would refuse the VM's options (the reason it would give), or None."""
    try:
        options, shared = vm_options(vm)
    except InputError as exc:
        return str(exc)
    ib_nics = any(policy.nic_request("", (n.findtext("BRIDGE") or "").strip(), marker) is not None
                  for n in vm.iterfind("TEMPLATE/NIC"))
    if not (ib_nics or options != hpc_profile.VmOptions() or shared is not None):
        return None    # deploy leaves such a VM to the stock script, which reads no affinity
    try:
        level = hpc_profile.gpu_affinity(VmTemplate(vm, "VM template"))
    except InputError as exc:
        return str(exc)
    if level != policy.NO_GPU_AFFINITY and ib_nics and len(_vm_pci(vm)) > topology.MAX_RAILS:
        return (f'{hpc_profile.GPU_AFFINITY_ATTRIBUTE} = "{level}": the domain passes through more than '
                f"{topology.MAX_RAILS} PCI devices")
    return None


def vm_need(vm: ET.Element, bridges: Optional[dict[int, str]] = None, marker: str = BRIDGE) -> VfNeed:
    """What a VM (a VM element of the scheduler's VM_POOL) needs.

    bridges: NIC_ID -> BRIDGE for NICs whose network the scheduler chose
    (NETWORK_MODE = auto; from the plan), overriding the NIC's own."""
    bridges = bridges or {}
    pfs, whole = [], []
    for nic in vm.iterfind("TEMPLATE/NIC"):
        nic_id = _int(nic.findtext("NIC_ID"), -1)
        req = policy.nic_request("", bridges.get(nic_id, nic.findtext("BRIDGE") or "").strip(), marker)
        if req is not None:
            (whole if req.whole_pf else pfs).append(req.pf_selector)
    try:
        options, shared = vm_options(vm)
        level = hpc_profile.gpu_affinity(VmTemplate(vm, "VM template"))
    except InputError:   # left out of the window (option_problem); nothing to book
        options, shared, level = hpc_profile.VmOptions(), None, policy.NO_GPU_AFFINITY
    pinned = (vm.findtext("TEMPLATE/TOPOLOGY/PIN_POLICY") or "NONE").strip().upper() not in ("", "NONE")
    wish = True if pinned or options.hpc else (False if options.hpc is False else None)
    return VfNeed(tuple(pfs), wish, options.numa,
                  shared.name if shared else None, shared.size_mb if shared else 0,
                  None if level == policy.NO_GPU_AFFINITY else level, tuple(_vm_pci(vm)[:topology.MAX_RAILS]),
                  tuple(whole))


def pkey_wait(vm: ET.Element, vnets: dict[int, ET.Element], marker: str = BRIDGE,
              chosen: Optional[dict[int, int]] = None) -> Optional[int]:
    """The network an IB NIC of the VM waits on for its partition key (None:
    none): KVM_SRIOV_PKEY = AUTO and no VLAN_ID yet, which the network hook
    writes. vnets: the input's VNET_POOL by ID (networks of NETWORK_MODE =
    auto NICs; for the others the NIC's inherited KVM_SRIOV_PKEY is read);
    chosen: NIC_ID -> network the plan gives an auto NIC (then the NIC takes
    that network's VLAN_ID at deploy)."""
    chosen = chosen or {}
    for nic in vm.iterfind("TEMPLATE/NIC"):
        nic_id = _int(nic.findtext("NIC_ID"), -1)
        net_id = chosen.get(nic_id, _int(nic.findtext("NETWORK_ID"), -1))
        net = vnets.get(net_id)
        bridge = (net.findtext("BRIDGE") if nic_id in chosen and net is not None else nic.findtext("BRIDGE")) or ""
        if net_id < 0 or not bridge_selector(bridge.strip(), marker)[0]:
            continue
        marks = [nic.findtext(pkey.ATTRIBUTE)] + ([net.findtext(f"TEMPLATE/{pkey.ATTRIBUTE}")] if net is not None else [])
        if not any((m or "").strip().upper() == pkey.AUTO for m in marks):
            continue
        if nic_id in chosen and net is not None:
            vlan = net.findtext("VLAN_ID") or net.findtext("TEMPLATE/VLAN_ID")
        else:
            vlan = nic.findtext("VLAN_ID")
        if not (vlan or "").strip():
            return net_id
    return None


# -- what earlier placements still hold -------------------------------------------------
def _say(warn, text: str) -> None:
    if warn is not None:
        warn(text)


def _booking(vm, e) -> tuple[int, dict]:
    """One ledger entry as Ledger.book writes it; ValueError for any other shape."""
    if not (isinstance(vm, str) and vm.isascii() and vm.isdigit() and len(vm) <= 10
            and int(vm) <= ivshmem.MAX_ID):
        raise ValueError(f"VM {shown(str(vm), 20)!r} is not an OpenNebula ID")
    host, pfs, when = (e.get(k) for k in ("host", "pfs", "time")) if isinstance(e, dict) else (None,) * 3
    ok = (type(host) is int and 0 <= host <= ivshmem.MAX_ID and type(when) in (int, float) and 0 <= when < 1e12
          and isinstance(pfs, list) and all(isinstance(p, str) for p in pfs))
    if ok and e.get("region") is not None:
        size = e.get("region_mb")
        ok = (isinstance(e["region"], str) and ivshmem_region.owner_of(e["region"]) is not None
              and type(size) is int and 1 <= size <= ivshmem.MAX_SIZE_MB)
    if not ok:
        raise ValueError(f"VM {vm}: not a booking of this placer's")
    return int(vm), e


class Ledger:
    """VFs booked for VMs this policy placed, kept while oned has the VM on
    the booked host and subtracted whenever that host's probe does not count
    the VM (not deployed yet, or its deploy failed and gave the VF back).

    Stored as JSON next to OpenNebula's state; one writer at a time (the
    place program holds a lock around read-decide-write). It is a hint:
    a ledger that cannot be read or is not one this program writes is
    ignored, and one that cannot be saved is lost, each with one line to
    ``warn``; never a failed window. What it loses is bookings of VMs the
    hosts' probes do not count yet, which they soon do."""

    MAX_BYTES = 64 << 20     # some 500,000 bookings; more is not a ledger of ours

    def __init__(self, path: Optional[str]):
        self.path = path
        # vm -> {"host": id, "pfs": [...], "time": placed at[, "region": name, "region_mb": size]}
        self.entries: dict[int, dict] = {}

    def load(self, warn=None) -> "Ledger":
        self.entries = {}
        if not self.path:
            return self
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(self.MAX_BYTES + 1)
            if len(data) > self.MAX_BYTES:
                raise ValueError(f"larger than {self.MAX_BYTES >> 20} MB")
            self.loads(data)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, RecursionError) as exc:   # RecursionError: JSON nested too deep
            self.entries = {}
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else (str(exc) or type(exc).__name__)
            _say(warn, f"placement ledger {self.path} ignored ({why}); the bookings it held come back as "
                       f"the hosts' probes count their VMs")
        return self

    def dumps(self) -> str:
        return json.dumps({str(k): v for k, v in sorted(self.entries.items())})

    def loads(self, text) -> "Ledger":
        """ValueError for anything but bookings as this program writes them."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object of bookings")
        self.entries = dict(_booking(vm, e) for vm, e in data.items())
        return self

    def save(self, warn=None) -> None:
        """A new file renamed over the old one. A failure (a full disk, a
        folder it may not write) is told to warn, never raised: the window's
        placement stands; the old file stays, without this window's bookings."""
        if not self.path:
            return
        try:
            atomic_write(self.path, self.dumps())
        except OSError as exc:
            _say(warn, f"placement ledger {self.path} not saved ({exc.strerror or exc}); this window's "
                       f"bookings hold until the hosts' probes count their VMs")

    def book(self, vm: int, host: int, pfs: list[str], now: Optional[float] = None,
             region: Optional[str] = None, region_mb: int = 0) -> None:
        if not pfs and region is None:
            return                  # nothing to hold
        self.entries[vm] = {"host": host, "pfs": pfs, "time": now or time.time()}
        if region is not None:
            self.entries[vm].update(region=region, region_mb=region_mb)

    def apply(self, hosts: dict[int, HostVfs], host_vms: dict[int, frozenset], pending: frozenset) -> None:
        """Subtract the bookings the probes do not count from ``hosts``, and
        forget those of VMs that left their host.

        A booking lives while oned has the VM on the booked host, whatever
        its state there: a VM in BOOT_FAILURE or POWEROFF gave its VF back (a
        failed deploy, a shutdown) but recover or resume deploys it on that
        host again, so the VF stays its own (also when a probe counted the VM
        in between). A VM that is PENDING again was not
        deployed: its plan was refused (oned drops a placement plan while
        another one is applying) or has not reached it yet (then oned refuses
        this window's plan as well), so its booking goes and it is placed anew.
        A region's booking counts while the host's probe does not list the region."""
        for vm, e in list(self.entries.items()):
            host = hosts.get(e["host"])
            if host is None or vm in pending or vm not in host_vms.get(e["host"], ()):
                del self.entries[vm]
                continue
            if e["pfs"] and vm not in host.vms:
                host.take(e["pfs"])
            region = e.get("region")
            if region is not None and host.shm_reported and region not in host.shm_regions:
                host.take_region(region, _int(e.get("region_mb")))
