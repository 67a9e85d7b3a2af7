"""Orchestration through OpenNebula (pyone): N VMs per host from a template
on chosen hosts, wait for RUNNING and the InfiniBand port up, MPI hostfile
from their IPoIB addresses, run, terminate.

IPoIB address: the IP of the VM's NIC whose BRIDGE is ``ib-sriov`` or
``ib-sriov:<pf>`` (the project's marker, docs/conventions.md).
"IB up": the guest reports ``IB_STATE = "ACTIVE"`` in its USER_TEMPLATE
(through OneGate); the attribute and value are configurable. After a VF
hot-unplug and plug (a live migration) the guest also reports the outage it
timed, ``IB_OUTAGE_SECONDS`` and ``IB_OUTAGE_ENDED`` (guest_outage).

ServiceTarget takes the VMs of a running OneFlow service instead
(kvm_sriov_bench/oneflow.py reads the service); they are the tenant's and are
left running.
"""
from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from .errors import OrchestrationError

# OpenNebula 7.4's VM states and LCM states (include/VirtualMachine.h)
VM_STATES = {0: "INIT", 1: "PENDING", 2: "HOLD", 3: "ACTIVE", 4: "STOPPED", 5: "SUSPENDED",
             6: "DONE", 8: "POWEROFF", 9: "UNDEPLOYED", 10: "CLONING", 11: "CLONING_FAILURE"}
VM_STATE_ACTIVE, VM_STATE_DONE = 3, 6
VM_STATE_CLONING_FAILURE = 11
# states a VM being deployed never leaves by itself towards RUNNING
VM_STATES_STOPPED = {4, 5, 6, 8, 9, 11}
LCM_RUNNING = 3
LCM_FAILURES = {36: "BOOT_FAILURE", 37: "BOOT_MIGRATE_FAILURE", 38: "PROLOG_MIGRATE_FAILURE",
                39: "PROLOG_FAILURE", 40: "EPILOG_FAILURE", 41: "EPILOG_STOP_FAILURE",
                42: "EPILOG_UNDEPLOY_FAILURE", 44: "PROLOG_MIGRATE_POWEROFF_FAILURE",
                46: "PROLOG_MIGRATE_SUSPEND_FAILURE", 47: "BOOT_UNDEPLOY_FAILURE",
                48: "BOOT_STOPPED_FAILURE", 49: "PROLOG_RESUME_FAILURE",
                50: "PROLOG_UNDEPLOY_FAILURE", 61: "PROLOG_MIGRATE_UNKNOWN_FAILURE"}
LCM_NAMES = {0: "LCM_INIT", 1: "PROLOG", 2: "BOOT", 3: "RUNNING", 11: "EPILOG", 12: "SHUTDOWN",
             16: "UNKNOWN", 23: "CLEANUP_DELETE", **LCM_FAILURES}
RECOVER_DELETE = 3        # one.vm.recover operation: delete (works in every state)
IB_MARKER = "ib-sriov"
# An address as IPv4 or IPv6 text and nothing else: ipaddress takes a scope id
# with any text after '%' (newlines too), which would put more hosts, or any
# line, into the MPI hostfile.
_ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")
# the guest's outage figures as its hot-plug handler writes them (hundredths; Unix seconds)
_OUTAGE_SECONDS = re.compile(r"\d{1,7}(\.\d{1,3})?")
_UNIX_TIME = re.compile(r"\d{1,11}")


def state_name(state, lcm):
    name = VM_STATES.get(state, str(state))
    return f"{name}/{LCM_NAMES.get(lcm, lcm)}" if state == VM_STATE_ACTIVE else name


def vm_failure(state, lcm):
    """True when a VM being deployed will not reach RUNNING by itself."""
    return state in VM_STATES_STOPPED or (state == VM_STATE_ACTIVE and lcm in LCM_FAILURES)


@dataclass
class BenchVM:
    id: int
    name: str
    host: str
    ipoib: str | None = None
    vcpu: int = 1
    role: str = ""
    ib_outage_seconds: float | None = None   # the guest's last IB outage (guest_outage)
    ib_outage_ended: int | None = None


def guest_outage(user_template):
    """The last InfiniBand outage the guest timed on its own clock and reported
    through OneGate, from the VF's removal until the new VF's ports were ACTIVE
    (docs/monitoring.md, section 6): (seconds, ended as Unix time or None), or
    None. The USER_TEMPLATE is the VM owner's to write: a value that is not a
    plain figure counts as not reported."""
    user = user_template or {}
    seconds, ended = user.get("IB_OUTAGE_SECONDS"), user.get("IB_OUTAGE_ENDED")
    if not isinstance(seconds, str) or not _OUTAGE_SECONDS.fullmatch(seconds):
        return None
    ended = int(ended) if isinstance(ended, str) and _UNIX_TIME.fullmatch(ended) else None
    return float(seconds), ended


def outage_text(vm):
    """One line's end for a BenchVM with a guest-reported outage."""
    text = f"IB outage {vm.ib_outage_seconds:.2f} s as its guest timed it (VF removed until ACTIVE again)"
    if vm.ib_outage_ended is not None:
        text += f", ended {datetime.fromtimestamp(vm.ib_outage_ended, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    return text


def _as_list(x):
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


def ipoib_address(vm_template, marker=IB_MARKER):
    """The address of the first NIC on the marker bridge; None when there is
    none or it is not a usable unicast address (a template is the tenant's)."""
    for nic in _as_list(vm_template.get("NIC")):
        if not hasattr(nic, "get"):
            continue
        bridge = str(nic.get("BRIDGE", ""))
        if bridge == marker or bridge.startswith(marker + ":"):
            return usable_address(nic.get("IP") or nic.get("IP6_GLOBAL") or nic.get("IP6"))
    return None


def usable_address(raw):
    """``raw`` as a unicast IP address in its normal form, or None."""
    if not isinstance(raw, str) or not _ADDRESS.fullmatch(raw):
        return None
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        return None
    if ip.is_multicast or ip.is_unspecified or ip.is_loopback or ip.is_link_local:
        return None
    return str(ip)


def hostfile(vms, slots=None):
    """OpenMPI hostfile text: one IPoIB address per VM, ``slots`` each (None:
    the VM's VCPU, as the guests' kvm-sriov-hostfile writes it). Each line is
    one host: a VM whose address or slots would be anything else is refused,
    wherever its BenchVM came from."""
    from .oneflow import MAX_SLOTS
    lines = []
    for vm in vms:
        n = slots or vm.vcpu
        if vm.ipoib is None or usable_address(vm.ipoib) != vm.ipoib or type(n) is not int or \
                not 1 <= n <= MAX_SLOTS:
            raise OrchestrationError(f"VM {vm.id}: address {str(vm.ipoib)[:60]!r} slots {str(n)[:12]!r} "
                                     "is not a hostfile line")
        lines.append(f"{vm.ipoib} slots={n}\n")
    return "".join(lines)


def ib_up(info, attr, value):
    """The guest reported its IB port up (attr None: not waited for)."""
    if attr is None:
        return True
    user = info.USER_TEMPLATE or {}
    return str(user.get(attr, "")).upper() == value.upper()


def _checked_ipoib(info, vmid):
    address = ipoib_address(info.TEMPLATE or {})
    if address is None:
        raise OrchestrationError(f"VM {vmid} has no NIC with a usable address on an {IB_MARKER} network")
    return address


class OneCluster:
    """VMs for one benchmark configuration. Use as a context manager so the
    VMs are terminated even when the run fails."""

    def __init__(self, one, template_id, hosts, vms_per_host, name_prefix="kvm-sriov-bench",
                 timeout=900, poll=None, ib_attr="IB_STATE", ib_value="ACTIVE", progress=False,
                 retry=30.0):
        self.one = one
        self.template_id = int(template_id)
        self.hosts = list(hosts)
        self.vms_per_host = int(vms_per_host)
        self.prefix = name_prefix
        self.timeout = timeout
        self.poll = poll if poll is not None else one.server_retry_interval()
        self.ib_attr, self.ib_value = ib_attr, ib_value
        self.progress = progress
        self.retry = retry      # seconds before a VM not yet DONE is asked again
        self.vms = []

    @classmethod
    def connect(cls, endpoint, session, **kw):
        try:
            import pyone
        except ImportError:
            raise OrchestrationError("pyone is missing: install it with pip install pyone "
                                     "(rake test:harness puts it in the project's .venv)") from None
        return pyone.OneServer(endpoint, session=session, **kw)

    def host_ids(self):
        pool = self.one.hostpool.info()
        by_name = {h.NAME: h.ID for h in pool.HOST}
        missing = [h for h in self.hosts if h not in by_name]
        if missing:
            raise OrchestrationError(f"hosts not in OpenNebula: {', '.join(missing)} "
                                     f"(known: {', '.join(sorted(by_name))})")
        return [by_name[h] for h in self.hosts]

    def deploy(self):
        """Instantiate (on hold) and deploy vms_per_host VMs on each host."""
        ids = self.host_ids()
        for host, hid in zip(self.hosts, ids):
            for k in range(self.vms_per_host):
                name = f"{self.prefix}-{host}-{k}"
                vmid = self.one.template.instantiate(self.template_id, name, True, "", False)
                self.vms.append(BenchVM(int(vmid), name, host))
                self.one.vm.deploy(int(vmid), int(hid), False, -1)
        return self.vms

    def wait_ready(self):
        """Wait until every VM is ACTIVE/RUNNING with its IB port reported up."""
        from .progress import bar
        deadline = time.monotonic() + self.timeout
        pending = {vm.id: vm for vm in self.vms}
        with bar(len(pending), "VMs ready", enabled=self.progress) as pb:
            while pending:
                for vmid in list(pending):
                    info = self.one.vm.info(vmid)
                    state, lcm = int(info.STATE), int(info.LCM_STATE)
                    if vm_failure(state, lcm):
                        raise OrchestrationError(f"VM {vmid} ({pending[vmid].name}) failed: "
                                                 f"{state_name(state, lcm)} (STATE={state} LCM_STATE={lcm})")
                    if state != VM_STATE_ACTIVE or lcm != LCM_RUNNING:
                        continue
                    vm = pending[vmid]
                    vm.ipoib = _checked_ipoib(info, vmid)
                    if ib_up(info, self.ib_attr, self.ib_value):
                        del pending[vmid]
                        pb.update(1)
                if pending:
                    if time.monotonic() > deadline:
                        raise OrchestrationError(
                            f"timed out after {self.timeout}s waiting for VMs "
                            f"{sorted(pending)} to be RUNNING with {self.ib_attr}={self.ib_value}")
                    time.sleep(self.poll)
        return self.vms

    def _delete(self, vmid, again=False):
        """Ask OpenNebula to get rid of one VM: terminate-hard where it allows it
        (RUNNING, UNKNOWN, SHUTDOWN, failures, not yet deployed, powered off...),
        else (PROLOG, BOOT, EPILOG, migrations, hot-plugs: "wrong state")
        recover --delete, which OpenNebula accepts in every state (it needs
        admin rights on the VM). ``again``: the VM ignored a first request (a
        driver that never answers), so recover --delete comes first."""
        asks = [("terminate-hard", lambda: self.one.vm.action("terminate-hard", vmid)),
                ("recover --delete", lambda: self.one.vm.recover(vmid, RECOVER_DELETE))]
        failed = []
        for name, ask in (asks[::-1] if again else asks):
            try:
                ask()
                return None
            except Exception as e:  # noqa: BLE001 - pyone raises its own classes per error
                failed.append(f"{name}: {e}")
        return f"VM {vmid}: " + "; ".join(failed)

    def terminate(self, wait=True):
        """Clean-up: every VM reaches DONE. A VM that is not DONE after
        ``retry`` seconds is asked again (recover --delete at once when
        terminate-hard is refused). Raises OrchestrationError naming each VM
        left and its state."""
        errors = {}
        for vm in self.vms:
            err = self._delete(vm.id)
            if err:
                errors[vm.id] = err
        if not wait:
            return self._raise(errors, {})
        deadline = time.monotonic() + self.timeout
        asked = time.monotonic()
        left = {vm.id: None for vm in self.vms}
        while left:
            for vmid in list(left):
                try:
                    info = self.one.vm.info(vmid)
                except Exception as e:  # noqa: BLE001
                    left[vmid] = f"info: {e}"
                    continue
                state, lcm = int(info.STATE), int(info.LCM_STATE)
                if state == VM_STATE_DONE:
                    del left[vmid]
                    errors.pop(vmid, None)
                else:
                    left[vmid] = state_name(state, lcm)
            if not left or time.monotonic() > deadline:
                break
            if time.monotonic() - asked >= self.retry:
                for vmid in left:
                    err = self._delete(vmid, again=True)
                    if err:
                        errors[vmid] = err
                asked = time.monotonic()
            time.sleep(self.poll)
        return self._raise(errors, left)

    def _raise(self, errors, left):
        parts = [errors[k] for k in sorted(errors)]
        if left:
            parts.append(f"not DONE after {self.timeout}s: " +
                         ", ".join(f"{k} ({v})" for k, v in sorted(left.items())))
        if parts:
            raise OrchestrationError("clean-up: " + "; ".join(parts))

    def __enter__(self):
        try:
            self.deploy()
            self.wait_ready()
        except BaseException as first:
            self._cleanup_after(first)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.terminate()
        else:
            self._cleanup_after(exc)
        return False

    def _cleanup_after(self, first):
        """Clean up after a failure; the failure stays the error raised, the
        clean-up's own trouble is added to it (never the other way round)."""
        try:
            self.terminate()
        except Exception as e:  # noqa: BLE001
            note = f"and then the clean-up failed: {e}"
            if hasattr(first, "add_note"):
                first.add_note(note)
            import sys
            print(f"kvm-sriov-bench: {note}", file=sys.stderr)


class ServiceTarget:
    """The VMs of a OneFlow service (every role, or ``roles``): waits until
    OneFlow says RUNNING and every VM is ACTIVE/RUNNING with its IB port up,
    then gives them with host, IPoIB address and VCPU, head role first. The
    service is not the harness's: nothing is created or terminated."""

    def __init__(self, one, flow, ref, roles=(), timeout=900, poll=None, ib_attr="IB_STATE",
                 ib_value="ACTIVE", progress=False):
        self.one, self.flow, self.ref = one, flow, ref
        self.roles = list(roles)
        self.timeout = timeout
        self.poll = poll if poll is not None else one.server_retry_interval()
        self.ib_attr, self.ib_value = ib_attr, ib_value
        self.progress = progress
        self.service = None
        self.vms = []

    @property
    def hosts(self):
        return list(dict.fromkeys(vm.host for vm in self.vms))

    def wait_ready(self):
        from . import oneflow
        deadline = time.monotonic() + self.timeout
        sid = self.flow.service_id(self.ref)
        last = None
        while True:
            svc = self.flow.service(sid)
            missing = [r for r in self.roles if r not in svc.roles]
            if missing:
                raise OrchestrationError(f"service {sid} has no role {', '.join(map(repr, missing))} "
                                         f"(roles: {', '.join(svc.roles)})")
            if svc.state in oneflow.STATES_STOPPED:
                raise OrchestrationError(f"service {sid} ({svc.name}) is {svc.state}")
            last = svc.state
            if svc.state == "RUNNING":
                vms = self._vms(svc)
                if vms is not None:
                    self.service, self.vms = svc, vms
                    return vms
                last = "RUNNING, its VMs not all RUNNING with " + \
                    (f"{self.ib_attr}={self.ib_value}" if self.ib_attr else "an address")
            if time.monotonic() > deadline:
                raise OrchestrationError(f"timed out after {self.timeout}s waiting for service {sid} "
                                         f"({svc.name}): {last}")
            time.sleep(self.poll)

    def _vms(self, svc):
        """The wanted roles' VMs, head role first; None while one is not ready."""
        names = self.roles or list(svc.roles)
        names = sorted(names, key=lambda r: r != "head")
        vms = []
        for role in names:
            for vmid in svc.roles[role]:
                vm = self._vm(svc, role, vmid)
                if vm is None:
                    return None
                vms.append(vm)
        if not vms:
            raise OrchestrationError(f"{svc.describe()}: no VM in " + ", ".join(names))
        seen = {}
        for vm in vms:
            if vm.ipoib in seen:
                raise OrchestrationError(f"VMs {seen[vm.ipoib]} and {vm.id} have the same IB address "
                                         f"{vm.ipoib}")
            seen[vm.ipoib] = vm.id
        return vms

    def _vm(self, svc, role, vmid):
        from .oneflow import HOSTNAME, MAX_SLOTS
        info = self.one.vm.info(vmid)
        owner = str((info.USER_TEMPLATE or {}).get("SERVICE_ID", "")).strip()
        if owner != str(svc.id):
            raise OrchestrationError(f"VM {vmid} (role {role!r}) is not a VM of service {svc.id} "
                                     f"(its SERVICE_ID is {owner[:20]!r})")
        state, lcm = int(info.STATE), int(info.LCM_STATE)
        if vm_failure(state, lcm):
            raise OrchestrationError(f"VM {vmid} (role {role!r}) failed: {state_name(state, lcm)} "
                                     f"(STATE={state} LCM_STATE={lcm})")
        if state != VM_STATE_ACTIVE or lcm != LCM_RUNNING:
            return None
        address = _checked_ipoib(info, vmid)
        history = _as_list(getattr(info.HISTORY_RECORDS, "HISTORY", None)) if info.HISTORY_RECORDS else []
        host = str(history[-1].HOSTNAME) if history else ""
        if not HOSTNAME.fullmatch(host):
            raise OrchestrationError(f"VM {vmid}: host {host[:40]!r} is not a host name")
        vcpu = str((info.TEMPLATE or {}).get("VCPU") or "1").strip()
        if not re.fullmatch(r"[1-9][0-9]{0,3}", vcpu) or int(vcpu) > MAX_SLOTS:
            raise OrchestrationError(f"VM {vmid}: VCPU {vcpu[:12]!r} is not a slot count (1-{MAX_SLOTS})")
        if not ib_up(info, self.ib_attr, self.ib_value):
            return None
        outage = guest_outage(info.USER_TEMPLATE) or (None, None)
        return BenchVM(int(vmid), str(info.NAME)[:128], host, address, int(vcpu), role, *outage)
