"""VF accounting for OpenNebula's scheduler: which hosts can take which VM.

Front-end side, standard library only. A host's free VFs are what its
latest kvm-sriov probe reported (availability.py's definition, the same as
deploy's), minus the VFs booked for VMs placed on it that the probe does not
show yet (this scheduling window's and earlier windows' placements, kept in
a :class:`Ledger`). A VM needs one VF per NIC whose BRIDGE is ``ib-sriov``
or ``ib-sriov:<pf>``; a NUMA wish (HPC profile, pinned CPUs) with the NUMA
policy ``require`` needs them on one node. Whether a host fits, and which of
its PFs/nodes a VM uses up, is decided by deploy's own VF choice
(policy.choose) on stand-in VFs built from the probe's counts.

The scheduler protocol around it is in sched/kvm-sriov/place.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Iterable, NamedTuple, Optional
from xml.etree import ElementTree as ET

from . import policy
from .discovery import IbPort, PhysicalFunction, VirtualFunction, pf_matches
from .domain_xml import bridge_selector
from .errors import DriverError
from .hpc_profile import HPC_ATTRIBUTE, NO, NUMA_ATTRIBUTE, YES

BRIDGE = "ib-sriov"
OPTIONS_NS = "urn:kvm-sriov:metadata:1"
# Per-VM options are deploy's (hpc_profile): plain template attributes (oned
# keeps unknown attributes in the VM's USER_TEMPLATE), winning over RAW.


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

    def as_pf(self) -> PhysicalFunction:
        return PhysicalFunction(self.address, self.vendor, self.device, 0x020700, None, self.numa_node,
                                self.netdevs, (self.ib_port,) if self.ib_port else
                                tuple(IbPort(d, 1) for d in self.ib_devices), 0, 0)


def _int(text, default=0) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


def _split(text) -> tuple[str, ...]:
    return tuple(p for p in str(text or "").split(",") if p)


class HostVfs:
    """One host's free VFs per PF (and so per NUMA node), as the probe saw them."""

    def __init__(self, pfs: Iterable[PfCount], vms: Iterable[int] = (), numa_policy: str = "prefer",
                 reported: bool = True, hpc_profile: bool = False):
        self.pfs = list(pfs)
        self.vms = frozenset(vms)              # VMs whose VFs the probe counted as held
        self.numa_policy = numa_policy
        self.hpc_profile = hpc_profile         # the host's default for VMs that do not say
        self.reported = reported               # False: no kvm-sriov probe on this host
        self._pf_objects = {p.address: p.as_pf() for p in self.pfs}

    @classmethod
    def from_monitoring(cls, attrs: dict) -> "HostVfs":
        """attrs: the probe's attributes, KEY -> value, vectors KEY -> [dict, ...]
        (as they sit in the host template)."""
        if "KVM_SRIOV_VERSION" not in attrs:
            return cls((), reported=False)
        pfs = []
        for v in attrs.get("KVM_SRIOV_PF", []):
            if "FREE_VFS" not in v:     # a PF the probe could not read offers nothing
                continue
            node = _int(v.get("NUMA_NODE"), -1)
            port = IbPort(v["IB_DEVICE"], _int(v.get("IB_PORT"), 1)) if v.get("IB_DEVICE") else None
            pfs.append(PfCount(v.get("ADDRESS", ""), _split(v.get("NETDEV")), _split(v.get("IB_DEVICES")),
                               port, v.get("VENDOR", ""), v.get("DEVICE", ""),
                               node if node >= 0 else None, max(0, _int(v.get("FREE_VFS")))))
        vms = [_int(x, -1) for x in str(attrs.get("KVM_SRIOV_VMS", "")).split()]
        return cls(pfs, [v for v in vms if v >= 0], str(attrs.get("KVM_SRIOV_NUMA_POLICY") or "prefer"),
                   hpc_profile=str(attrs.get("KVM_SRIOV_HPC_PROFILE", "")).strip().lower() in YES)

    @classmethod
    def from_host_xml(cls, template: Optional[ET.Element]) -> "HostVfs":
        attrs: dict = {}
        for el in (template if template is not None else ()):
            if el.tag.startswith("KVM_SRIOV_"):
                if len(el):
                    attrs.setdefault(el.tag, []).append({c.tag: (c.text or "") for c in el})
                else:
                    attrs[el.tag] = el.text or ""
        return cls.from_monitoring(attrs)

    @property
    def free(self) -> int:
        return sum(p.free for p in self.pfs)

    def free_per_node(self) -> dict[int, int]:
        out: Counter = Counter()
        for p in self.pfs:
            out[p.numa_node if p.numa_node is not None else -1] += p.free
        return {n: out[n] for n in sorted(out)}

    def _stand_ins(self) -> list[VirtualFunction]:
        return [VirtualFunction(f"{p.address}#{i}", i, p.address, p.numa_node, None, (), None, (), ())
                for p in self.pfs for i in range(p.free)]

    def choose(self, need: "VfNeed") -> list[str]:
        """The PF of each VF deploy would take for ``need``; raises
        PoolExhausted/InputError (DriverError) when the host cannot take it."""
        numa_policy = need.numa_policy or self.numa_policy
        nodes = policy.AUTO if self.numa_wish(need) else None
        chosen = policy.choose([policy.VfRequest(f"nic{i}", sel) for i, sel in enumerate(need.pfs)],
                               self._stand_ins(), self._pf_objects, nodes, numa_policy)
        return [vf.pf for vf in chosen]

    def fits(self, need: "VfNeed") -> bool:
        if not need.pfs:
            return True
        if self.free < len(need.pfs):
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
        """Book one VF on each of these PFs (absent PFs: ignored, a stale booking)."""
        taken = Counter(pfs)
        self.pfs = [p._replace(free=max(0, p.free - taken[p.address])) for p in self.pfs]

    def summary(self) -> str:
        if not self.reported:
            return "no kvm-sriov probe data"
        per_pf = ", ".join(f"{p.free} on {(p.netdevs or p.ib_devices or (p.address,))[0]}" for p in self.pfs)
        return f"{self.free} free ({per_pf})" if self.pfs else "no SR-IOV PF in its pool"

    def pf_exists(self, selector: str) -> bool:
        return any(pf_matches(pf, selector) for pf in self._pf_objects.values())


# -- what a VM needs ---------------------------------------------------------------
class VfNeed(NamedTuple):
    pfs: tuple[Optional[str], ...]      # one entry per VF NIC: its PF selector or None
    numa_wish: Optional[bool] = None    # all its VFs near one NUMA node (HPC profile, pinned; None: the host's)
    numa_policy: Optional[str] = None   # the VM's own NUMA policy (None: the host's)

    def simple(self, host_numa_policy: str, numa_wish: bool) -> bool:
        policy_ = self.numa_policy or host_numa_policy
        return not any(self.pfs) and not (numa_wish and policy_ == "require")

    def describe(self) -> str:
        pinned = Counter(s for s in self.pfs if s)
        text = f"{len(self.pfs)} InfiniBand VF{'s' if len(self.pfs) != 1 else ''}"
        if pinned:
            text += " (" + ", ".join(f"{n} on PF {s}" for s, n in pinned.items()) + ")"
        if self.numa_wish and self.numa_policy == "require":
            text += " on one NUMA node"
        return text


def _options(vm: ET.Element) -> tuple[Optional[str], Optional[str]]:
    """(hpc, numa) from a <sriov:options> element in the VM's RAW data."""
    for data in vm.iterfind("TEMPLATE/RAW/DATA"):
        text = data.text or ""
        if "options" not in text:
            continue
        try:
            root = ET.fromstring(f"<r xmlns:sriov='{OPTIONS_NS}'>{text}</r>")
        except ET.ParseError:
            continue
        for el in root.iter(f"{{{OPTIONS_NS}}}options"):
            return (el.get("hpc") or "").strip().lower() or None, (el.get("numa") or "").strip().lower() or None
    return None, None


def _attribute(vm: ET.Element, name: str) -> Optional[str]:
    """A plain template attribute, lower case; None when absent or empty."""
    for where in ("USER_TEMPLATE", "TEMPLATE"):
        text = (vm.findtext(f"{where}/{name}") or "").strip().lower()
        if text:
            return text
    return None


def option_problem(vm: ET.Element) -> Optional[str]:
    """Why deploy would refuse the VM's option attributes (hpc_profile.py
    checks the same), or None."""
    for name, allowed in ((HPC_ATTRIBUTE, YES + NO), (NUMA_ATTRIBUTE, policy.NUMA_POLICIES)):
        value = _attribute(vm, name)
        if value is not None and value not in allowed:
            return f'{name} = "{value[:40]}" is not one of {", ".join(allowed)}'
    return None


def vm_need(vm: ET.Element, bridges: Optional[dict[int, str]] = None, marker: str = BRIDGE) -> VfNeed:
    """What a VM (a VM element of the scheduler's VM_POOL) needs.

    bridges: NIC_ID -> BRIDGE for NICs whose network the scheduler chose
    (NETWORK_MODE = auto; from the plan), overriding the NIC's own."""
    bridges = bridges or {}
    pfs = []
    for nic in vm.iterfind("TEMPLATE/NIC"):
        nic_id = _int(nic.findtext("NIC_ID"), -1)
        bridge = bridges.get(nic_id, nic.findtext("BRIDGE") or "")
        ok, selector = bridge_selector(bridge.strip(), marker)
        if ok:
            pfs.append(selector)
    raw_hpc, raw_numa = _options(vm)
    hpc = _attribute(vm, HPC_ATTRIBUTE) or raw_hpc
    numa = _attribute(vm, NUMA_ATTRIBUTE) or raw_numa
    pinned = (vm.findtext("TEMPLATE/TOPOLOGY/PIN_POLICY") or "NONE").strip().upper() not in ("", "NONE")
    wish = True if pinned or hpc in YES else (False if hpc in NO else None)
    return VfNeed(tuple(pfs), wish, numa if numa in policy.NUMA_POLICIES else None)


# -- what earlier placements still hold -------------------------------------------------
class Ledger:
    """VFs booked for VMs this policy placed, kept until the host's probe shows
    the VM (its VFs are then in the free count) or the VM left the host.

    Stored as JSON next to OpenNebula's state; one writer at a time (the
    place program holds a lock around read-decide-write)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.entries: dict[int, dict] = {}   # vm -> {"host": id, "pfs": [...], "time": placed at}

    def load(self) -> "Ledger":
        if self.path and os.path.exists(self.path):
            try:
                with open(self.path) as fh:
                    self.loads(fh.read())
            except (OSError, ValueError):
                self.entries = {}   # a broken ledger only loses bookings the next probe restores
        return self

    def dumps(self) -> str:
        return json.dumps({str(k): v for k, v in sorted(self.entries.items())})

    def loads(self, text: str) -> "Ledger":
        self.entries = {int(k): v for k, v in json.loads(text).items()}
        return self

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(self.dumps())
        os.replace(tmp, self.path)

    def book(self, vm: int, host: int, pfs: list[str], now: Optional[float] = None) -> None:
        self.entries[vm] = {"host": host, "pfs": pfs, "time": now or time.time()}

    def apply(self, hosts: dict[int, HostVfs], host_vms: dict[int, frozenset], pending: frozenset) -> None:
        """Subtract the live bookings from ``hosts`` and forget the settled ones.

        A booking lives while oned has the VM on the booked host and that
        host's probe does not show it yet. A VM that is PENDING again was not
        deployed: its plan was refused (oned drops a placement plan while
        another one is applying) or has not reached it yet (then oned refuses
        this window's plan as well), so its booking goes and it is placed anew."""
        for vm, e in list(self.entries.items()):
            host = hosts.get(e["host"])
            if host is None or vm in pending or vm in host.vms or vm not in host_vms.get(e["host"], ()):
                del self.entries[vm]
                continue
            host.take(e["pfs"])
