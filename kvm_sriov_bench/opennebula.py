"""Orchestration through OpenNebula (pyone): N VMs per host from a template
on chosen hosts, wait for RUNNING and the InfiniBand port up, MPI hostfile
from their IPoIB addresses, run, terminate.

IPoIB address: the IP of the VM's NIC whose BRIDGE is ``ib-sriov`` or
``ib-sriov:<pf>`` (the project's marker, docs/conventions.md).
"IB up": the guest reports ``IB_STATE = "ACTIVE"`` in its USER_TEMPLATE
(through OneGate); the attribute and value are configurable.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .errors import OrchestrationError

VM_STATE_ACTIVE, VM_STATE_DONE, VM_STATE_FAILED, VM_STATE_POWEROFF = 3, 6, 7, 8
LCM_RUNNING = 3
LCM_FAILURES = {14, 36, 37, 38, 39, 40, 41, 42, 46, 48, 49, 50, 51}  # *_FAILURE states
IB_MARKER = "ib-sriov"


@dataclass
class BenchVM:
    id: int
    name: str
    host: str
    ipoib: str | None = None


def _as_list(x):
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


def ipoib_address(vm_template, marker=IB_MARKER):
    for nic in _as_list(vm_template.get("NIC")):
        bridge = str(nic.get("BRIDGE", ""))
        if bridge == marker or bridge.startswith(marker + ":"):
            ip = nic.get("IP")
            if ip:
                return str(ip)
    return None


def hostfile(vms, slots=1):
    """OpenMPI hostfile text: one IPoIB address per VM."""
    return "".join(f"{vm.ipoib} slots={slots}\n" for vm in vms)


class OneCluster:
    """VMs for one benchmark configuration. Use as a context manager so the
    VMs are terminated even when the run fails."""

    def __init__(self, one, template_id, hosts, vms_per_host, name_prefix="kvm-sriov-bench",
                 timeout=900, poll=None, ib_attr="IB_STATE", ib_value="ACTIVE", progress=False):
        self.one = one
        self.template_id = int(template_id)
        self.hosts = list(hosts)
        self.vms_per_host = int(vms_per_host)
        self.prefix = name_prefix
        self.timeout = timeout
        self.poll = poll if poll is not None else one.server_retry_interval()
        self.ib_attr, self.ib_value = ib_attr, ib_value
        self.progress = progress
        self.vms = []

    @classmethod
    def connect(cls, endpoint, session, **kw):
        import pyone
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
                    if state in (VM_STATE_DONE, VM_STATE_FAILED, VM_STATE_POWEROFF) or lcm in LCM_FAILURES:
                        raise OrchestrationError(f"VM {vmid} ({pending[vmid].name}) failed: "
                                                 f"STATE={state} LCM_STATE={lcm}")
                    if state != VM_STATE_ACTIVE or lcm != LCM_RUNNING:
                        continue
                    vm = pending[vmid]
                    vm.ipoib = ipoib_address(info.TEMPLATE)
                    if vm.ipoib is None:
                        raise OrchestrationError(f"VM {vmid} has no NIC on an {IB_MARKER} network")
                    user = info.USER_TEMPLATE or {}
                    if str(user.get(self.ib_attr, "")).upper() == self.ib_value.upper():
                        del pending[vmid]
                        pb.update(1)
                if pending:
                    if time.monotonic() > deadline:
                        raise OrchestrationError(
                            f"timed out after {self.timeout}s waiting for VMs "
                            f"{sorted(pending)} to be RUNNING with {self.ib_attr}={self.ib_value}")
                    time.sleep(self.poll)
        return self.vms

    def terminate(self, wait=True):
        errors = []
        for vm in self.vms:
            try:
                self.one.vm.action("terminate-hard", vm.id)
            except Exception as e:  # keep terminating the others
                errors.append(f"{vm.id}: {e}")
        if wait:
            deadline = time.monotonic() + self.timeout
            left = {vm.id for vm in self.vms}
            while left and time.monotonic() < deadline:
                for vmid in list(left):
                    if int(self.one.vm.info(vmid).STATE) == VM_STATE_DONE:
                        left.discard(vmid)
                if left:
                    time.sleep(self.poll)
            if left:
                errors.append(f"not DONE after {self.timeout}s: {sorted(left)}")
        if errors:
            raise OrchestrationError("terminate: " + "; ".join(errors))

    def __enter__(self):
        try:
            self.deploy()
            self.wait_ready()
        except BaseException:
            self.terminate(wait=False)
            raise
        return self

    def __exit__(self, *exc):
        self.terminate()
