"""The kvm-sriov place program for OpenNebula 7.4's scheduler driver.

one_sched (src/schedm_mad) runs ``<remotes>/scheduler/<placer>/place`` with
the scheduler input (a SCHEDULER_DRIVER_ACTION document: pending VMs, hosts,
datastores, networks, and per VM the host IDs that passed its
SCHED_REQUIREMENTS) base64-encoded on stdin. The program prints a PLAN
document (one ACTION per VM to deploy or migrate) on stdout; every stderr
line ``ERROR: <vm id> <text>`` becomes that VM's SCHED_MESSAGE.

This program keeps every decision of the stock ``rank`` policy and adds VF
accounting (placement.py):

1. a VM whose options deploy would refuse is left out (it stays PENDING)
   with deploy's reason; each VM that needs VFs or a shared-memory region
   keeps only the candidate hosts that can take it alone (free VFs from the
   host's probe minus the VFs booked for VMs placed there that the probe
   does not show yet; the same for the region budget); a VM that fits
   nowhere is left out with a message saying what it needs and what the
   hosts have;
2. ``rank`` places the rest on that narrowed input (capacity, affinity,
   ranking, datastores, networks: all its own);
3. its plan is walked in order and each VM's VFs are booked on the host
   rank chose; a VM the host can no longer take (rank put several VMs there
   in one window) is dropped from the plan: it stays PENDING and is placed
   again right after this plan (oned schedules again once a plan is done).

Bookings outlive the window while the VM sits on the chosen host and its
probe does not show it yet (placement.Ledger).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from typing import Optional
from xml.etree import ElementTree as ET

from .. import locks
from ..opennebula import bounded, shown
from ..ib import pkey
from .groups import Groups
from .placement import BRIDGE, HostVfs, Ledger, VfNeed, option_problem, pkey_wait, vm_need

RANK_TIMEOUT = 600


def _ids(el: Optional[ET.Element], path: str = "ID") -> list[int]:
    out = []
    for e in (el.iterfind(path) if el is not None else ()):
        try:
            out.append(int(e.text))
        except (TypeError, ValueError):
            pass
    return out


def _first_hosts(hosts: list[int], describe) -> str:
    """'host 3: <describe(3)>; host 5: ...' for the first five, and how many more."""
    listed = "; ".join(f"host {h}: {describe(h)}" for h in hosts[:5])
    return listed + (f" (and {len(hosts) - 5} more)" if len(hosts) > 5 else "")


class Window:
    """One scheduling window: the input document and what placement knows of it."""

    def __init__(self, xml: bytes, ledger: Ledger, marker: str = BRIDGE, now: Optional[float] = None):
        self.root = ET.fromstring(xml)
        self.marker = marker
        self.ledger = ledger
        self.hosts: dict[int, HostVfs] = {}
        host_vms: dict[int, frozenset] = {}
        for h in self.root.iterfind("HOST_POOL/HOST"):
            hid = int(h.findtext("ID"))
            self.hosts[hid] = HostVfs.from_host_xml(h.find("TEMPLATE"), h.find("HOST_SHARE/PCI_DEVICES"))
            host_vms[hid] = frozenset(_ids(h.find("VMS")))
        self.vm_pool = self.root.find("VM_POOL")
        self.vms = {int(vm.findtext("ID")): vm for vm in self.vm_pool.iterfind("VM")}
        self.requirements = self.root.find("REQUIREMENTS")
        self.left_out = False
        self.vnets = {int(n.findtext("ID")): n for n in self.root.iterfind("VNET_POOL/VNET")}
        self.bridges = {i: (n.findtext("BRIDGE") or "") for i, n in self.vnets.items()}
        self.now = now or time.time()
        # VM_POOL holds every VM of a pending VM's group, running ones too:
        # only those being scheduled (or PENDING again) lose their bookings
        pending = set(_ids(self.requirements, "VM/ID"))
        pending.update(i for i, vm in self.vms.items() if (vm.findtext("STATE") or "").strip() == "1")
        ledger.apply(self.hosts, host_vms, frozenset(pending))
        self.groups = Groups(self.root)
        self.messages: list[str] = []
        self.told: set[int] = set()

    def _leave_out(self, vm_id: int) -> None:
        for req in self.requirements.iterfind("VM"):
            if req.findtext("ID") == str(vm_id):
                self.requirements.remove(req)
                break
        self.vm_pool.remove(self.vms[vm_id])
        self.left_out = True

    def vms_in_input(self) -> list[int]:
        """The VMs rank gets (those that fit nowhere are left out)."""
        return [int(v.findtext("ID")) for v in self.vm_pool.iterfind("VM")]

    def _message(self, vm: int, text: str) -> None:
        # one line (oned takes the rest of it), bounded whatever a template held
        self.told.add(vm)
        self.messages.append(f"ERROR: {vm} {bounded(' '.join(text.split()))}")

    def scheduled(self) -> list[int]:
        """The VMs rank is asked to place (not those left out)."""
        return _ids(self.requirements, "VM/ID")

    def candidates(self, vm_id: int) -> list[int]:
        for req in self.requirements.iterfind("VM"):
            if req.findtext("ID") == str(vm_id):
                return _ids(req.find("HOSTS"))
        return []

    def narrow(self) -> bool:
        """Candidate hosts of each VF VM := those that can take it, as its VM
        group allows; False when nothing changed (the input can go to rank as
        it came)."""
        changed = self.left_out
        for req in list(self.requirements.iterfind("VM")):
            vm_id = int(req.findtext("ID"))
            vm = self.vms.get(vm_id)
            if vm is None:
                continue
            problem = option_problem(vm, self.marker)
            if problem:   # deploy would refuse it: it waits for the user to fix the template
                changed = True
                self._leave_out(vm_id)
                self._message(vm_id, f"Cannot dispatch VM: {problem} (kvm-sriov); deploy would refuse it. "
                                     "It stays PENDING until the template is fixed.")
                continue
            net = pkey_wait(vm, self.vnets, self.marker)
            if net is not None:
                changed = True
                self._leave_out(vm_id)
                self._message(vm_id, self.pkey_refusal(net))
        picks = self._together_picks()
        fits: dict[tuple[VfNeed, int], bool] = {}
        for req in list(self.requirements.iterfind("VM")):
            vm_id = int(req.findtext("ID"))
            vm = self.vms.get(vm_id)
            if vm is None:
                continue
            need = vm_need(vm, marker=self.marker)
            if not need.ib and need.region is None and vm_id not in picks:
                continue
            hosts_el = req.find("HOSTS")
            candidates = _ids(hosts_el)
            fit = []
            for hid in candidates:
                key = (need, hid)
                if key not in fits:
                    host = self.hosts.get(hid)
                    fits[key] = host is not None and host.fits(need)
                if fits[key] and self.groups.host_allowed(vm_id, hid):
                    fit.append(hid)
            keep = [h for h in fit if not self.groups.apart_problem(vm_id, h)]
            _, placed = self.groups.together_hosts(vm_id)
            if placed or vm_id in picks:
                keep = [h for h in keep if h in (placed or picks[vm_id])]
            if keep == candidates:
                continue
            changed = True
            if not keep:
                self._leave_out(vm_id)
                self._message(vm_id, self.group_refusal(vm_id, need, fit, picks.get(vm_id))
                              or self.refusal(need, candidates))
                continue
            for el in list(hosts_el):
                hosts_el.remove(el)
            for hid in keep:
                ET.SubElement(hosts_el, "ID").text = str(hid)
        return changed

    def _together_picks(self) -> dict[int, frozenset]:
        """For each affinity set none of whose VMs has a host yet: the hosts
        that can take the most of its pending VMs (in ID order) and, among
        those, the ones with the most VFs left after them, for all of them;
        rank then puts the set's first VM on one of these. The room left
        matters because a set's VMs do not all come at once: OneFlow creates a
        role's VMs after the roles before it run, and a scale-up adds more,
        all of which must join the set's host."""
        picks: dict[int, frozenset] = {}
        scheduled = self.scheduled()
        seen = set()
        for vm_id in scheduled:
            rule, placed = self.groups.together_hosts(vm_id)
            if rule is None or placed or rule.vms in seen:
                continue
            seen.add(rule.vms)
            members = [(v, vm_need(self.vms[v], marker=self.marker), set(self.candidates(v)))
                       for v in sorted(rule.vms) if v in scheduled]
            if not any(n.ib or n.region is not None for _, n, _ in members):
                continue
            counts: dict[int, tuple[int, int]] = {}   # host -> (members it takes, VFs left then)
            for hid in sorted(set().union(*(c for _, _, c in members))):
                if hid not in self.hosts:
                    continue
                twin, n = self.hosts[hid].copy(), 0
                for v, need, cands in members:
                    if hid in cands and self.groups.host_allowed(v, hid) and twin.fits(need):
                        twin.take(twin.choose(need) if need.ib else [])
                        twin.take_pci(need)
                        twin.take_region(need.region, need.region_mb)
                        n += 1
                counts[hid] = (n, twin.free)
            most = max(counts.values(), default=(0, 0))
            if most[0]:
                best = frozenset(h for h, n in counts.items() if n == most)
                picks.update((v, best) for v, _, _ in members)
        return picks

    @staticmethod
    def _need_phrase(need: VfNeed) -> str:
        n, w = len(need.pfs), len(need.whole)
        vfs = f"{n} free VF{'s' if n != 1 else ''}" if n else ""
        whole = f"{w} PF{'s' if w != 1 else ''} free whole" if w else ""
        region = "room for its region" if need.region is not None else ""
        return " and ".join(p for p in (vfs, whole, region) if p)

    def _host_has(self, hid: int, need: VfNeed) -> str:
        host = self.hosts.get(hid)
        if host is None:
            return f"host {hid} runs its VMs and has no kvm-sriov probe data"
        n = len(need.pfs)
        text = f"host {hid} runs its VMs and has {host.free_vfs(need)} of {n} VF{'s' if n != 1 else ''} free"
        if need.whole:
            text += f", {host.free_pfs} of {len(need.whole)} PF{'s' if len(need.whole) != 1 else ''} free whole"
        if need.region is not None and host.region_problem(need):
            text += f" ({host.shm_summary(need)})"
        return text

    def group_refusal(self, vm_id: int, need: VfNeed, fit: list[int],
                      picks: Optional[frozenset] = None) -> Optional[str]:
        """Why the VM's group keeps it off every host that has its VFs (None:
        the group is not why)."""
        rule, placed = self.groups.together_hosts(vm_id)
        if placed and not any(h in placed for h in fit):
            has = "; ".join(self._host_has(h, need) for h in sorted(placed)[:5])
            return (f"affinity {rule.label}: {has} (kvm-sriov). "
                    f"It stays PENDING until VFs are freed there.")
        if picks and fit and not any(h in picks for h in fit):
            return (f"affinity {rule.label}: none of its VMs has a host yet and the hosts "
                    f"that can take the most of them ({', '.join(map(str, sorted(picks)[:5]))}) cannot take it "
                    f"(kvm-sriov). It stays PENDING.")
        busy = [h for h in fit if self.groups.apart_problem(vm_id, h)]
        if fit and busy == fit:
            apart = self.groups.apart_problem(vm_id, busy[0])
            listed = ", ".join(map(str, busy[:10])) + (f" and {len(busy) - 10} more" if len(busy) > 10 else "")
            return (f"anti-affinity {apart.label}: every host with {self._need_phrase(need)} "
                    f"already runs one of its VMs (hosts {listed}) (kvm-sriov). It stays PENDING until "
                    f"one of them has none or another host has them free.")
        return None

    def pkey_refusal(self, net: int) -> str:
        return (f"network {net} waits for its partition key ({pkey.ATTRIBUTE} = "
                f"{pkey.AUTO}, no VLAN_ID yet): kvm-sriov network hook. It stays PENDING until the "
                f"network has its key.")

    def refusal(self, need: VfNeed, candidates: list[int]) -> str:
        if not candidates:
            return f"Cannot dispatch VM: it needs {need.describe()} and no host matches its requirements"
        with_vfs = [h for h in candidates if h in self.hosts and self.hosts[h].vfs_fit(need)]
        if with_vfs:   # what is missing is room for its region
            have = _first_hosts(with_vfs, lambda h: self.hosts[h].shm_summary(need))
            return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host has room for "
                    f"region {need.region} (kvm-sriov). Shared memory: {have}. It stays PENDING "
                    f"until a host has room (or already has its group's region).")
        if need.gpu_level:
            plain = need._replace(gpu_level=None)
            unpaired = [h for h in candidates if h in self.hosts and self.hosts[h].vfs_fit(plain)]
            if unpaired:   # VFs enough, but not close enough to its GPUs
                have = _first_hosts(unpaired, lambda h: self.hosts[h].gpu_summary(need))
                return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host can pair "
                        f"them with the GPUs it would get there (kvm-sriov). Close VFs: {have}. "
                        f"It stays PENDING until VFs close to its GPUs are freed.")
        if need.whole:
            vfs_only = need._replace(whole=())
            no_pf = [h for h in candidates if h in self.hosts and self.hosts[h].vfs_fit(vfs_only)]
            if no_pf or not need.pfs:   # what is missing is whole PFs
                by_pfs = sorted(no_pf or candidates, key=lambda h: -self.hosts[h].free_pfs if h in self.hosts else 0)
                have = _first_hosts(by_pfs, lambda h: self.hosts[h].whole_summary() if h in self.hosts else "unknown")
                return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host has "
                        f"{self._need_phrase(need._replace(pfs=(), region=None))} (kvm-sriov). PFs: {have}. "
                        f"It stays PENDING until a PF with none of its VFs in use is free "
                        f"(KVM_SRIOV_FREE_PFS).")
        by_free = sorted(candidates, key=lambda h: -self.hosts[h].free if h in self.hosts else 0)
        have = _first_hosts(by_free, lambda h: self.hosts[h].summary() if h in self.hosts else "unknown")
        missing = [s for s in need.pfs if s and not any(self.hosts[h].pf_exists(s)
                                                        for h in candidates if h in self.hosts)]
        why = f"; no candidate host has PF {shown(missing[0])}" if missing else ""
        return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host has them free "
                f"(kvm-sriov){why}. Free VFs: {have}. It stays PENDING until VFs are freed.")

    def _group_guard(self, vm_id: int, hid: int) -> Optional[str]:
        """Why the VM's group forbids host hid, now that this window placed
        others (None: it does not)."""
        if not self.groups.host_allowed(vm_id, hid):
            return (f"VM group rule: host {hid} is not allowed for its role (kvm-sriov). It stays PENDING.")
        apart = self.groups.apart_problem(vm_id, hid)
        if apart is not None:
            return (f"anti-affinity {apart.label}: host {hid} already runs one of its VMs (kvm-sriov). "
                    f"It stays PENDING.")
        rule, placed = self.groups.together_hosts(vm_id)
        if placed and hid not in placed:
            return (f"affinity {rule.label}: its VMs are on host {', '.join(map(str, sorted(placed)[:5]))}, "
                    f"not {hid} (kvm-sriov). It stays PENDING.")
        return None

    def check_plan(self, plan_xml: bytes) -> bytes:
        """Book the VFs of each planned VM in plan order; drop those that no
        longer fit or that their VM group no longer allows there."""
        plan = ET.fromstring(plan_xml)
        changed = False
        for action in list(plan.iterfind("ACTION")):
            vm_id = int(action.findtext("VM_ID"))
            hid = int(action.findtext("HOST_ID") or -1)
            vm = self.vms.get(vm_id)
            if vm is None:
                continue
            nets = {int(n.findtext("NIC_ID")): int(n.findtext("NETWORK_ID")) for n in action.iterfind("NIC")}
            why = self._group_guard(vm_id, hid) if self.groups.in_group(vm_id) else None
            net = pkey_wait(vm, self.vnets, self.marker, nets) if why is None else None
            if why or net is not None:
                plan.remove(action)
                changed = True
                self._message(vm_id, why or self.pkey_refusal(net))
                continue
            need = vm_need(vm, {nic: self.bridges.get(n, "") for nic, n in nets.items()}, self.marker)
            host = self.hosts.get(hid)
            if not need.ib and need.region is None:
                if host is not None:
                    host.take_pci(need)     # its GPUs are no later VM's
                self.groups.place(vm_id, hid)
                continue
            _, placed = self.groups.together_hosts(vm_id)
            try:
                if host is None:
                    raise LookupError
                pfs = host.choose(need) if need.ib else []
                if host.region_problem(need):
                    raise LookupError
            except Exception:
                plan.remove(action)
                changed = True
                if hid in placed:    # its set is there: it cannot go elsewhere
                    self._message(vm_id, self.group_refusal(vm_id, need, []))
                elif host is not None and host.vfs_fit(need) and host.region_problem(need):
                    self._message(vm_id, f"Cannot dispatch VM to host {hid} in this window: it needs "
                                         f"{need.describe()}, VMs placed there before it took the shared "
                                         f"memory (left: {host.shm_summary(need)}; kvm-sriov). It is placed again "
                                         f"in the next window.")
                elif host is not None and need.gpu_level and host.vfs_fit(need._replace(gpu_level=None)):
                    self._message(vm_id, f"Cannot dispatch VM to host {hid} in this window: it needs "
                                         f"{need.describe()}, VMs placed there before it took its GPUs or "
                                         f"the VFs close to them (left: {host.gpu_summary(need)}; kvm-sriov). "
                                         f"It is placed again in the next window.")
                else:
                    have = host.summary() if host is not None else "unknown"
                    if host is not None and need.whole:
                        have += f"; {host.whole_summary()}"
                    self._message(vm_id, f"Cannot dispatch VM to host {hid} in this window: it needs "
                                         f"{need.describe()}, VMs placed there before it took the VFs "
                                         f"(left: {have}; kvm-sriov). It is placed again in the next window.")
                continue
            host.take(pfs)
            host.take_pci(need)
            host.take_region(need.region, need.region_mb)
            self.ledger.book(vm_id, hid, pfs, self.now, need.region, need.region_mb)
            self.groups.place(vm_id, hid)
        self._explain_unplaced({int(a.findtext("VM_ID")) for a in plan.iterfind("ACTION")})
        if not changed:
            return plan_xml
        return ET.tostring(plan, encoding="UTF-8", xml_declaration=True) + b"\n"

    def _explain_unplaced(self, planned: set[int]) -> None:
        """A VM of a group that rank left out, or that was dropped, because of
        its group: say which rule (rank's own message says only 'Cannot
        dispatch VM to any Host')."""
        for vm_id in self.scheduled():
            if vm_id in planned or vm_id in self.told or not self.groups.in_group(vm_id):
                continue
            need = vm_need(self.vms[vm_id], marker=self.marker)
            if not need.ib and need.region is None:
                continue
            fit = [h for h in self.candidates(vm_id)
                   if h in self.hosts and self.hosts[h].fits(need) and self.groups.host_allowed(vm_id, h)]
            why = self.group_refusal(vm_id, need, fit)
            if why:
                self._message(vm_id, why)

    def document(self) -> bytes:
        return ET.tostring(self.root, encoding="unicode").encode()


def _default_rank(here: str) -> str:
    return os.path.join(os.path.dirname(here), "rank", "place")


def _ledger_path() -> str:
    base = os.environ.get("ONE_LOCATION")
    var = os.path.join(base, "var") if base else "/var/lib/one"
    return os.environ.get("KVM_SRIOV_PLACEMENT_LEDGER", os.path.join(var, "kvm-sriov-placement.json"))


def _trace(trace_dir: Optional[str], name: str, data: bytes) -> None:
    """KVM_SRIOV_PLACEMENT_TRACE=<dir>: keep each window's documents (test
    fixtures, bug reports). Never fails the placement."""
    if not trace_dir:
        return
    try:
        os.makedirs(trace_dir, exist_ok=True)
        with open(os.path.join(trace_dir, name), "wb") as fh:
            fh.write(data)
    except OSError:
        pass


def run(message: bytes, rank: list[str], ledger_path: Optional[str], marker: str = BRIDGE,
        stderr=sys.stderr, trace_dir: Optional[str] = None) -> tuple[int, bytes]:
    """One PLACE call: (exit code, stdout bytes). stderr gets rank's log lines and ours."""
    xml = base64.b64decode(message.strip())
    now = time.time()
    stamp = f"{now:.6f}"
    _trace(trace_dir, f"{stamp}-input.xml", xml)

    def warn(text: str) -> None:   # a log line of oned's (no VM ID: oned.log)
        stderr.write(f"WARN: kvm-sriov place: {bounded(' '.join(text.split()))}\n")
    lock = None
    if ledger_path:
        try:
            lock = open(f"{ledger_path}.lock", "a")
            locks.acquire(lock)   # one window decides at a time
        except OSError as exc:   # the ledger is a hint: this window goes without it
            warn(f"placement ledger {ledger_path} not used in this window: its lock "
                 f"{ledger_path}.lock: {exc.strerror or exc}")
            if lock is not None:
                lock.close()
            lock = ledger_path = None
    try:
        ledger = Ledger(ledger_path).load(warn)
        _trace(trace_dir, f"{stamp}-ledger.json", ledger.dumps().encode())
        window = Window(xml, ledger, marker, now)
        narrowed = window.narrow()
        if not window.scheduled():   # every VM was left out: nothing for rank
            _trace(trace_dir, f"{stamp}-messages.txt", "".join(m + "\n" for m in window.messages).encode())
            stderr.write("".join(m + "\n" for m in window.messages))
            ledger.save(warn)
            return 0, b'<?xml version="1.0" encoding="UTF-8"?>\n<PLAN>\n  <ID>-1</ID>\n</PLAN>\n'
        stdin = base64.b64encode(window.document()) if narrowed else message.strip()
        _trace(trace_dir, f"{stamp}-narrowed.xml", window.document() if narrowed else xml)
        done = subprocess.run(rank, input=stdin + b"\n", capture_output=True, timeout=RANK_TIMEOUT)
        stderr.write(done.stderr.decode(errors="replace"))
        _trace(trace_dir, f"{stamp}-rank-plan.xml", done.stdout)
        if done.returncode != 0:
            stderr.write("".join(m + "\n" for m in window.messages))
            return done.returncode, done.stdout
        plan = window.check_plan(done.stdout)
        _trace(trace_dir, f"{stamp}-plan.xml", plan)
        _trace(trace_dir, f"{stamp}-messages.txt", "".join(m + "\n" for m in window.messages).encode())
        stderr.write("".join(m + "\n" for m in window.messages))
        ledger.save(warn)
        return 0, plan
    finally:
        if lock is not None:
            lock.close()


def main(here: str, argv: Optional[list[str]] = None) -> int:
    """Entry of sched/kvm-sriov/place. Arguments: none (one_sched passes none).
    KVM_SRIOV_RANK_PLACE: the rank program (default ../rank/place);
    KVM_SRIOV_PLACEMENT_LEDGER: the ledger file; KVM_SRIOV_BRIDGE: the bridge marker;
    KVM_SRIOV_PLACEMENT_TRACE: a folder that keeps every window's documents."""
    rank = os.environ.get("KVM_SRIOV_RANK_PLACE") or _default_rank(here)
    try:
        code, out = run(sys.stdin.buffer.read(), [rank], _ledger_path(),
                        os.environ.get("KVM_SRIOV_BRIDGE") or BRIDGE,
                        trace_dir=os.environ.get("KVM_SRIOV_PLACEMENT_TRACE"))
    except Exception as exc:  # the driver turns non-log stderr into the failure reason
        sys.stderr.write(f"kvm-sriov place: {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.buffer.write(out)
    return code
