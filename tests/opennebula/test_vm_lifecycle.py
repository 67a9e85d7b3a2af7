"""A VM without VF NICs through the real oned and the kvm-sriov driver:
deploy, suspend/resume, poweroff/resume, live migration (default local
datastore and a shared one), terminate."""

import time

from simhost.guest_image import UP_LINE
from tests.opennebula.conftest import guest_counter, instantiate, running_domains, terminate


def domain(vm):
    return f"one-{vm}"


def test_plain_vm_deploy_suspend_resume_poweroff_terminate(frontend, plain_template):
    name = "plain-lifecycle"
    vm = instantiate(frontend, plain_template, name, host="host1")
    frontend.wait_vm(vm, "RUNNING")
    assert domain(vm) in running_domains(frontend, "host1")
    assert domain(vm) not in running_domains(frontend, "host2")
    before = guest_counter(frontend, "host1", name)

    frontend.cli("onevm", "suspend", vm)
    frontend.wait_vm(vm, "SUSPENDED")
    assert domain(vm) not in running_domains(frontend, "host1")
    frontend.cli("onevm", "resume", vm)
    frontend.wait_vm(vm, "RUNNING")
    assert domain(vm) in running_domains(frontend, "host1")
    guest_counter(frontend, "host1", name, above=before)  # the same guest goes on

    # ACPI (the guest's acpid powers it off): fast only once the guest is up;
    # the stock script asks again after half its timeout, destroys after all of it
    # (conftest KVMRC: SHUTDOWN_TIMEOUT, FORCE_DESTROY)
    frontend.cli("onevm", "poweroff", vm)
    frontend.wait_vm(vm, "POWEROFF", timeout=240)
    assert domain(vm) not in running_domains(frontend, "host1")
    console_before_boot = len(frontend.host("host1").console(name))
    frontend.cli("onevm", "resume", vm)
    frontend.wait_vm(vm, "RUNNING")
    assert domain(vm) in running_domains(frontend, "host1")
    deadline = time.monotonic() + 120  # a fresh boot: "up" again after the power-off
    while UP_LINE not in frontend.host("host1").console(name)[console_before_boot:]:
        assert time.monotonic() < deadline, "the guest did not boot again after poweroff/resume"
        time.sleep(0.5)

    terminate(frontend, vm)
    assert domain(vm) not in running_domains(frontend, "host1")


def live_migrate_there_and_back(frontend, vm, name):
    count = guest_counter(frontend, "host1", name)
    for src, dst in (("host1", "host2"), ("host2", "host1")):
        frontend.cli("onevm", "migrate", "--live", vm, frontend.host(dst).one_name)
        frontend.wait_vm(vm, "RUNNING", timeout=300, host=dst)
        assert domain(vm) in running_domains(frontend, dst)
        assert domain(vm) not in running_domains(frontend, src)
        count = guest_counter(frontend, dst, name, above=count)  # live: the counter goes on


def test_live_migration_on_a_shared_datastore(frontend, shared_template, shared_datastores):
    system, _images = shared_datastores
    vm = instantiate(frontend, shared_template, "plain-shared", host="host1", datastore=system)
    frontend.wait_vm(vm, "RUNNING")
    try:
        live_migrate_there_and_back(frontend, vm, "plain-shared")
    finally:
        terminate(frontend, vm, hard=True)


def test_live_migration_on_the_default_local_datastore(frontend, plain_template):
    vm = instantiate(frontend, plain_template, "plain-local-migrate", host="host1")
    frontend.wait_vm(vm, "RUNNING")
    try:
        live_migrate_there_and_back(frontend, vm, "plain-local-migrate")
    finally:
        terminate(frontend, vm, hard=True)
