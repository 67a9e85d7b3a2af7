"""Rung 4 with real VFs: a VM with a VF NIC through a real OpenNebula 7.4
front-end, on two libvirt hosts inside the nested SR-IOV host (rung 3's L1:
QEMU's emulated NVMe PF 0000:03:00.0 with four VFs, real vfio-pci), which
the front-end reaches by ssh through L1's user-mode network
(simhost.nested_node). nested1 offers VFs .1/.2, nested2 .3/.4.

The VM is the one role of a OneFlow service (a VF VM placed by the
scheduler as a tenant's cluster member would be): service RUNNING with the
VF in the domain, suspend (VF unplugged, given back) -> resume (a VF
plugged again), live migration to the other host on the default local
datastore (the stock migrate's --copy-storage-all; VF there, source pool
clean), `oneflow delete` (the VM DONE, pools clean). Each step's seconds
are printed. Each inner host's datastore
is an ext4 in L1 (simhost.nested_node): the stock DISK CACHE=none needs
O_DIRECT, which L1's tmpfs refuses. The VF is an NVMe function, not InfiniBand: no GUID, no IPoIB."""

import os
import re
import shutil
import time
import warnings

import pytest

from simhost.frontend import FrontEnd
from simhost.guest_image import HOTPLUG_READY, PCI_PREFIX, UP_LINE
from tests.conftest import REPO
from tests.opennebula.test_oneflow import create_service_template, role_vms, services, wait_all_running
from tests.opennebula.test_vf_nic import sched_line
from tests.sched.sched_frontend import running

LOG_DIR = REPO / "build" / "test-logs" / "opennebula-nested"
PF = "0000:03:00.0"
OFFERS = {"nested1": ["0000:03:00.1", "0000:03:00.2"], "nested2": ["0000:03:00.3", "0000:03:00.4"]}
# its own suite (rake test:opennebula-nested, after driver-vfio): ~24 min of
# nested TCG; inside test:opennebula it is reported skipped, naming that suite
pytestmark = pytest.mark.skipif(os.environ.get("KVM_SRIOV_NESTED_RUNG4") != "1",
                                reason="runs in rake test:opennebula-nested (KVM_SRIOV_NESTED_RUNG4=1)")


def host_config(name: str) -> dict:
    others = [vf for host, vfs in OFFERS.items() if host != name for vf in vfs]
    # hot-unplug in a nested TCG guest takes seconds: rung 3 allows 60
    return {"pool": {"pfs": [PF], "exclude_vfs": others}, "timeouts": {"hotplug_seconds": 60}}


@pytest.fixture(scope="module")
def nested_fe(request):
    work = REPO / "build" / "rung4-nested"
    shutil.rmtree(work, ignore_errors=True)
    fe = FrontEnd(work / "fe", [], nested_hosts=list(OFFERS),
                  host_config={name: host_config(name) for name in OFFERS})
    failed = lambda: request.session.testsfailed  # noqa: E731
    # OneFlow without OneGate: no restart of oned, no second monitoring of the nested hosts
    with running(fe, LOG_DIR, failed) as started, services(started, LOG_DIR, failed, gate=False) as flow:
        yield flow


# a kernel fault report on the guest's serial console (printed whatever `quiet`
# says); not a soft lockup, which a starved guest reports and lives through
KERNEL_FAULT = re.compile(r"^.*(BUG:(?! soft lockup)|Oops|general protection|Kernel panic|Fixing recursive fault).*$",
                          re.M)


class GuestKernelFault(TimeoutError):
    """The guest stopped answering and its kernel had reported a fault."""


def guest_timeout(what: str, text: str) -> TimeoutError:
    """The error for a guest that did not get there: with its console from
    the first kernel fault report on, or its last 500 characters."""
    fault = KERNEL_FAULT.search(text)
    if fault:
        return GuestKernelFault(f"{what}; the guest kernel faulted, console:\n{text[fault.start():fault.start() + 6000]}")
    return TimeoutError(f"{what}; console:\n{text[-500:]}")


def console_counter(fe, host: str, name: str, above: int, timeout: float) -> int:
    """The guest's serial counter on host once past `above` (read over ssh)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = fe.host(host).console(name)
        counters = [int(n) for n in re.findall(r"simhost-counter (\d+)", text)]
        if counters and counters[-1] > above:
            return counters[-1]
        time.sleep(5)
    raise guest_timeout(f"guest {name} on {host}: no counter above {above} in {timeout} s", text)


def pci_functions(console: str):
    """The number of PCI functions the guest last reported (None before)."""
    seen = re.findall(rf"{PCI_PREFIX}(\d+)", console)
    return int(seen[-1]) if seen else None


def pci_settled(fe, host: str, name: str, functions: int, mark: int, timeout: float) -> None:
    """Wait until the guest has its `functions` PCI functions again, seen by
    its loop twice since console offset `mark` (taken once the action that
    plugged a VF had ended): an unplug asked for while the guest still
    hot-plugs is ignored (seen under nested TCG: a migration 16 s after
    resume, "did not release VF within 60s")."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = fe.host(host).console(name)
        if pci_functions(text) == functions and len(re.findall(r"simhost-counter \d+", text[mark:])) >= 2:
            return
        time.sleep(5)
    raise guest_timeout(f"guest {name} on {host}: not back to {functions} PCI functions in {timeout} s", text)


def vf_of(fe, host: str, vm: int, timeout: float = 300) -> str:
    """The one VF the running VM has on host: in the domain and held by the
    pool as attached, with no operation left open. oned may say RUNNING
    before the action has ended (monitoring sees the new domain while the
    deploy still finishes under nested TCG), so wait for the action's end."""
    deadline = time.monotonic() + timeout
    while True:
        devs = fe.host(host).domain_hostdevs(f"one-{vm}")
        held = fe.host(host).pool_held()
        if devs is not None and len(devs) == 1 and held == [(devs[0], vm, "attached")]:
            assert devs[0] in OFFERS[host], (host, devs)
            return devs[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"{host}: VM {vm} domain hostdevs {devs}, pool {held} after {timeout} s")
        time.sleep(5)


class Steps:
    """Seconds of each step, printed as one line at the end."""

    def __init__(self):
        self.times, self.mark = [], time.monotonic()

    def done(self, what: str) -> None:
        now = time.monotonic()
        self.times.append((what, now - self.mark))
        self.mark = now

    def line(self) -> str:
        return ", ".join(f"{what} {secs:.0f} s" for what, secs in self.times)


def one_role_service(flow, template: int, name: str) -> int:
    """A OneFlow service of one VM of `template`; returns the service's ID."""
    made = create_service_template(flow, {"name": name, "deployment": "straight", "roles": [
        {"name": "node", "type": "vm", "template_id": template, "cardinality": 1}]})
    return int(flow.flow("oneflow-template", "instantiate", made).stdout.split("ID:")[1].split()[0])


def test_vf_service_vm_deploy_suspend_resume_live_migrate_delete(nested_fe):
    flow = nested_fe
    fe = flow.fe
    for name in OFFERS:
        attrs = fe.info("host", fe.host(name).id).find("TEMPLATE")
        assert attrs.findtext("KVM_SRIOV_FREE_VFS") == "2", name

    net = fe.create("vnet", str(REPO / "templates" / "network" / "ib-partition.tmpl"))
    image = fe.tiny_image("tiny-vf", "default")
    # The L2 guest runs under TCG inside L1's TCG. Once in a CI run its
    # kernel faulted right after a live migration that the driver had
    # completed (VM RUNNING on nested2 with its VF, nested1's pool clean).
    # Such a fault gets one more service, reported as a warning with the
    # report; any other failure, or a second fault, fails the test.
    for attempt in (1, 2):
        name = f"vf-nested-{attempt}"
        tmpl = fe.create("template", (
            f'NAME = "{name}"\nCPU = "0.1"\nVCPU = "1"\nMEMORY = "160"\n' + fe.guest_os()
            + f'DISK = [ IMAGE_ID = "{image}" ]\nNIC = [ NETWORK_ID = "{net}" ]\n'
            + sched_line("SCHED_REQUIREMENTS") + "\n" + sched_line("SCHED_RANK") + "\n"
            + fe.console_raw(name) + "\n"))
        steps = Steps()
        service = one_role_service(flow, tmpl, name)
        vm = role_vms(wait_all_running(flow, service, 1, timeout=900))["node"][0]
        steps.done("service RUNNING")
        fault = None
        try:
            vf_vm_steps(fe, vm, name, steps)
        except GuestKernelFault as e:
            if attempt == 2:
                raise
            fault = e
        delete_with_pools_clean(flow, service, vm)
        steps.done("oneflow delete")
        print(f"\nopennebula-nested: service {service}, VM {vm}: {steps.line()}")
        if fault is None:
            return
        warnings.warn(f"first service: {fault}\n-> deleted (pools checked clean), one more service")


def delete_with_pools_clean(flow, service: int, vm: int) -> None:
    fe = flow.fe
    flow.flow("oneflow", "delete", service)
    fe.wait_vm(vm, "DONE", timeout=600)
    for host in OFFERS:
        assert fe.host(host).pool_held() == [], host
        assert fe.host(host).domain_hostdevs(f"one-{vm}") is None, host


def vf_vm_steps(fe, vm: int, name: str, steps: Steps) -> None:
    """Suspend/resume a running VF VM where the scheduler put it and
    live-migrate it to the other nested host, checking domain, pool and
    guest after each step."""
    first = fe.vm_host(vm)
    assert first in OFFERS, first
    second = next(h for h in OFFERS if h != first)
    # deploy: RUNNING with a real VF (vfio-pci) from that host's share
    vf_of(fe, first, vm)
    up = console_counter(fe, first, name, HOTPLUG_READY, timeout=1200)
    functions = pci_functions(fe.host(first).console(name))
    assert functions is not None, "the guest reported no PCI functions"
    steps.done(f"guest up on {first}")

    # suspend: the VF unplugged (confirmed by the guest) and given back
    fe.cli("onevm", "suspend", vm)
    fe.wait_vm(vm, "SUSPENDED", timeout=600)
    assert fe.host(first).domain_hostdevs(f"one-{vm}") is None
    assert fe.host(first).pool_held() == []
    steps.done("suspend")
    # resume: a VF again, the guest goes on counting (not rebooted)
    fe.cli("onevm", "resume", vm)
    fe.wait_vm(vm, "RUNNING", timeout=600)
    vf_of(fe, first, vm)
    steps.done("resume")
    pci_settled(fe, first, name, functions, len(fe.host(first).console(name)), timeout=300)
    resumed = console_counter(fe, first, name, up, timeout=300)
    assert fe.host(first).console(name).count(UP_LINE) == 1
    steps.done("guest settled")

    # live migration on the default (local) system datastore: the VF moves
    fe.cli("onevm", "migrate", "--live", vm, fe.host(second).one_name)
    fe.wait_vm(vm, "RUNNING", timeout=900, host=second)
    vf_of(fe, second, vm)
    assert fe.host(first).domain_hostdevs(f"one-{vm}") is None
    assert fe.host(first).pool_held() == []
    steps.done(f"live migration to {second}")
    console_counter(fe, second, name, resumed, timeout=300)
    steps.done("guest counting there")
