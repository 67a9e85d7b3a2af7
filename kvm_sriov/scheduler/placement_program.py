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
import fcntl
import os
import subprocess
import sys
import time
from typing import Optional
from xml.etree import ElementTree as ET

from ..opennebula import bounded, shown
from .placement import BRIDGE, HostVfs, Ledger, VfNeed, option_problem, vm_need

RANK_TIMEOUT = 600


def _ids(el: Optional[ET.Element], path: str = "ID") -> list[int]:
    out = []
    for e in (el.iterfind(path) if el is not None else ()):
        try:
            out.append(int(e.text))
        except (TypeError, ValueError):
            pass
    return out


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
            self.hosts[hid] = HostVfs.from_host_xml(h.find("TEMPLATE"))
            host_vms[hid] = frozenset(_ids(h.find("VMS")))
        self.vm_pool = self.root.find("VM_POOL")
        self.vms = {int(vm.findtext("ID")): vm for vm in self.vm_pool.iterfind("VM")}
        self.requirements = self.root.find("REQUIREMENTS")
        self.left_out = False
        self.bridges = {int(n.findtext("ID")): (n.findtext("BRIDGE") or "")
                        for n in self.root.iterfind("VNET_POOL/VNET")}
        self.now = now or time.time()
        ledger.apply(self.hosts, host_vms, frozenset(self.vms))
        self.messages: list[str] = []

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
        self.messages.append(f"ERROR: {vm} {bounded(' '.join(text.split()))}")

    def narrow(self) -> bool:
        """Candidate hosts of each VF VM := those that can take it; False when
        nothing changed (the input can go to rank as it came)."""
        changed = self.left_out
        fits: dict[tuple[VfNeed, int], bool] = {}
        for req in list(self.requirements.iterfind("VM")):
            vm_id = int(req.findtext("ID"))
            vm = self.vms.get(vm_id)
            if vm is None:
                continue
            problem = option_problem(vm)
            if problem:   # deploy would refuse it: it waits for the user to fix the template
                changed = True
                self._leave_out(vm_id)
                self._message(vm_id, f"Cannot dispatch VM: {problem} (kvm-sriov); deploy would refuse it. "
                                     "It stays PENDING until the template is fixed.")
                continue
            need = vm_need(vm, marker=self.marker)
            if not need.pfs and need.region is None:
                continue
            hosts_el = req.find("HOSTS")
            candidates = _ids(hosts_el)
            keep = []
            for hid in candidates:
                key = (need, hid)
                if key not in fits:
                    host = self.hosts.get(hid)
                    fits[key] = host is not None and host.fits(need)
                if fits[key]:
                    keep.append(hid)
            if len(keep) == len(candidates):
                continue
            changed = True
            if not keep:
                self._leave_out(vm_id)
                self._message(vm_id, self.refusal(need, candidates))
                continue
            for el in list(hosts_el):
                hosts_el.remove(el)
            for hid in keep:
                ET.SubElement(hosts_el, "ID").text = str(hid)
        return changed

    def refusal(self, need: VfNeed, candidates: list[int]) -> str:
        if not candidates:
            return f"Cannot dispatch VM: it needs {need.describe()} and no host matches its requirements"
        with_vfs = [h for h in candidates if h in self.hosts and self.hosts[h].vfs_fit(need)]
        if with_vfs:   # what is missing is room for its region
            listed = with_vfs[:5]
            have = "; ".join(f"host {h}: {self.hosts[h].shm_summary()}" for h in listed)
            more = f" (and {len(with_vfs) - len(listed)} more)" if len(with_vfs) > len(listed) else ""
            return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host has room for "
                    f"region {need.region} (kvm-sriov). Shared memory: {have}{more}. It stays PENDING "
                    f"until a host has room (or already has its group's region).")
        listed = sorted(candidates, key=lambda h: -self.hosts[h].free if h in self.hosts else 0)[:5]
        have = "; ".join(f"host {h}: {self.hosts[h].summary() if h in self.hosts else 'unknown'}"
                         for h in listed)
        more = f" (and {len(candidates) - len(listed)} more)" if len(candidates) > len(listed) else ""
        missing = [s for s in need.pfs if s and not any(self.hosts[h].pf_exists(s)
                                                        for h in candidates if h in self.hosts)]
        why = f"; no candidate host has PF {shown(missing[0])}" if missing else ""
        return (f"Cannot dispatch VM: it needs {need.describe()}, no candidate host has them free "
                f"(kvm-sriov){why}. Free VFs: {have}{more}. It stays PENDING until VFs are freed.")

    def check_plan(self, plan_xml: bytes) -> bytes:
        """Book the VFs of each planned VM in plan order; drop those that no longer fit."""
        plan = ET.fromstring(plan_xml)
        changed = False
        for action in list(plan.iterfind("ACTION")):
            vm_id = int(action.findtext("VM_ID"))
            hid = int(action.findtext("HOST_ID") or -1)
            vm = self.vms.get(vm_id)
            if vm is None:
                continue
            chosen_nets = {int(n.findtext("NIC_ID")): self.bridges.get(int(n.findtext("NETWORK_ID")), "")
                           for n in action.iterfind("NIC")}
            need = vm_need(vm, chosen_nets, self.marker)
            if not need.pfs and need.region is None:
                continue
            host = self.hosts.get(hid)
            try:
                if host is None:
                    raise LookupError
                pfs = host.choose(need) if need.pfs else []
            except Exception:
                plan.remove(action)
                changed = True
                have = host.summary() if host is not None else "unknown"
                self._message(vm_id, f"Cannot dispatch VM to host {hid} in this window: it needs "
                                     f"{need.describe()}, VMs placed there before it took the VFs "
                                     f"(left: {have}; kvm-sriov). It is placed again in the next window.")
                continue
            if host.region_problem(need):
                plan.remove(action)
                changed = True
                self._message(vm_id, f"Cannot dispatch VM to host {hid} in this window: it needs "
                                     f"{need.describe()}, VMs placed there before it took the shared "
                                     f"memory (left: {host.shm_summary()}; kvm-sriov). It is placed again "
                                     f"in the next window.")
                continue
            host.take(pfs)
            host.take_region(need.region, need.region_mb)
            self.ledger.book(vm_id, hid, pfs, self.now, need.region, need.region_mb)
        if not changed:
            return plan_xml
        return ET.tostring(plan, encoding="UTF-8", xml_declaration=True) + b"\n"

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
    lock = None
    if ledger_path:
        lock = open(f"{ledger_path}.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)   # one window decides at a time
    try:
        ledger = Ledger(ledger_path).load()
        _trace(trace_dir, f"{stamp}-ledger.json", ledger.dumps().encode())
        window = Window(xml, ledger, marker, now)
        narrowed = window.narrow()
        if len(window.vm_pool) == 0:   # every VM was left out: nothing for rank
            _trace(trace_dir, f"{stamp}-messages.txt", "".join(m + "\n" for m in window.messages).encode())
            stderr.write("".join(m + "\n" for m in window.messages))
            ledger.save()
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
        ledger.save()
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
