"""pyone and the benchmark harness's orchestration (kvm_sriov_bench.opennebula)
against the real oned."""

import time

import pytest

pyone = pytest.importorskip("pyone", reason="pyone (PyPI) is installed into .venv by `rake test:opennebula`")


def wait_running(one, vm, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = one.vm.info(vm)
        if int(info.STATE) == 3 and int(info.LCM_STATE) == 3:
            return info
        assert int(info.LCM_STATE) not in (36, 37), f"VM {vm} failed: {info.USER_TEMPLATE}"
        time.sleep(1)
    raise TimeoutError(f"VM {vm} not RUNNING")


def test_pyone_sees_the_hosts_and_runs_a_vm(frontend, plain_template):
    one = frontend.pyone()
    hosts = {h.NAME: h for h in one.hostpool.info().HOST}
    for name, host in frontend.hosts.items():
        assert hosts[host.one_name].VM_MAD == "kvm-sriov"
    vm = one.template.instantiate(plain_template, "pyone-vm", True, "", False)
    one.vm.deploy(vm, frontend.host("host2").id, False, -1)
    info = wait_running(one, vm)
    assert info.HISTORY_RECORDS.HISTORY[-1].HOSTNAME == frontend.host("host2").one_name
    one.vm.action("terminate-hard", vm)
    frontend.wait_vm(vm, "DONE", timeout=120)


def test_harness_orchestration_deploys_and_terminates(frontend, plain_template):
    from kvm_sriov_bench.opennebula import OneCluster
    one = OneCluster.connect(frontend.endpoint, frontend.session)
    cluster = OneCluster(one, plain_template, [frontend.host("host1").one_name, frontend.host("host2").one_name],
                         vms_per_host=1, name_prefix="bench", timeout=300, poll=1)
    vms = cluster.deploy()
    try:
        assert [vm.host for vm in vms] == cluster.hosts
        for vm in vms:
            wait_running(one, vm.id)
    finally:
        cluster.terminate()
    assert all(frontend.vm_state(vm.id) == "DONE" for vm in vms)
