"""Rung 4, VM groups with VF accounting (docs/scheduling.md): the session's
front-end (kvm-sriov placer; host1 has 2 free VFs, host2 1) places the VMs of
a VM group's role as the role says and never where their VF is missing.

- ANTI_AFFINED role of 3 VF VMs, 2 hosts with a free VF: one VM per host,
  the third PENDING with the anti-affinity reason; placed once a host has
  none of the role's VMs.
- AFFINED role of 3 VF VMs: all on host1 (the host that takes the most of
  them), the one host1 has no VF for PENDING with the affinity reason (not
  sent to host2); placed on host1 once a VF is freed there.

A placed VM ends in BOOT_FAILURE here because a fake VF cannot be passed
through (libvirt's refusal, as in test_vf_nic.py), never for lack of a VF;
it holds its host and its VF's booking like a running VM."""

import time

import pytest

from tests.sched.sched_frontend import wait_free_vfs
from tests.opennebula.conftest import HOST_VFS
from tests.sim.helpers import wait_for

RETRY = 60 + 60     # SCHED_RETRY_TIME (stock 60 s) and the deploy's own time
# The deploy over: a VM deleted before it ends leaves oned's placement plan
# APPLYING until ACTION_TIMEOUT (300 s), and no other plan is taken meanwhile
PLACED = ("BOOT_FAILURE", "RUNNING")


def _hosts(fe, vm: int) -> list[str]:
    return [h.findtext("HOSTNAME") for h in fe.info("vm", vm).iterfind("HISTORY_RECORDS/HISTORY")]


def _message(fe, vm: int) -> str:
    """The placer's last word on the VM: SCHED_MESSAGE holds its first 100
    characters (oned's MAX_ERROR_MSG_LENGTH), the VM log the whole line."""
    short = fe.info("vm", vm).findtext("USER_TEMPLATE/SCHED_MESSAGE") or ""
    lines = [line.split("]: ", 1)[1] for line in fe.vm_log(vm).splitlines() if "[VMM][E]: " in line]
    if not lines or lines[-1][:60] not in short:
        return ""
    return lines[-1]


@pytest.fixture(scope="module")
def image(frontend):
    return frontend.tiny_image("tiny-vmgroup", "default")


@pytest.fixture
def role_vms(frontend, ib_network, image):
    """make(policy, n): a VM group with one role 'ranks' of that policy and n
    VMs with one IB NIC in it, released at once; all removed afterwards."""
    made = {"vms": [], "groups": []}

    def make(policy: str, n: int) -> tuple[int, list[int]]:
        for host, vfs in HOST_VFS.items():
            wait_free_vfs(frontend, host, vfs, timeout=300)
        group = frontend.create("vmgroup", f'NAME = "ranks-{policy.lower()}-{time.monotonic_ns()}"\n'
                                           f'ROLE = [ NAME = "ranks", POLICY = "{policy}" ]\n')
        made["groups"].append(group)
        tmpl = frontend.create("template", (
            f'NAME = "vmgroup-{group}"\nCPU = "0.1"\nVCPU = "1"\nMEMORY = "64"\n' + frontend.guest_os()
            + f'DISK = [ IMAGE_ID = "{image}" ]\nNIC = [ NETWORK_ID = "{ib_network}" ]\n'
            + f'VMGROUP = [ VMGROUP_ID = "{group}", ROLE = "ranks" ]\n'
            + 'SCHED_REQUIREMENTS = "KVM_SRIOV_FREE_VFS > 0"\nSCHED_DS_REQUIREMENTS = "ID = 0"\n'))
        vms = [int(frontend.cli("onetemplate", "instantiate", tmpl, "--hold", "--name", f"g{group}-{i}")
                   .stdout.split("ID:")[1].split()[0]) for i in range(n)]
        made["vms"] += vms
        frontend.cli("onevm", "release", ",".join(map(str, vms)))
        return group, vms

    yield make
    for vm in made["vms"]:    # never mid-deploy: that would hold oned's plan (PLACED)
        wait_for(lambda: frontend.vm_state(vm) in PLACED + ("PENDING", "HOLD", "DONE"), 300, f"VM {vm} deployed")
    if made["vms"]:
        frontend.cli("onevm", "recover", "--delete", ",".join(map(str, made["vms"])), check=False)
        for vm in made["vms"]:
            frontend.wait_vm(vm, "DONE", timeout=120, fail_fast=False)
    for group in made["groups"]:
        frontend.cli("onevmgroup", "delete", str(group), check=False)


def _settled(fe, vms: list[int], placed_n: int):
    """(placed VMs, waiting VMs) once placed_n of them have a host and the rest
    carry a kvm-sriov SCHED_MESSAGE."""
    def look():
        placed = [vm for vm in vms if _hosts(fe, vm)]
        waiting = [vm for vm in vms if vm not in placed]
        if len(placed) == placed_n and all(fe.vm_state(vm) in PLACED for vm in placed) \
                and all("kvm-sriov" in _message(fe, vm) for vm in waiting):
            return placed, waiting
        return None
    return wait_for(look, RETRY * 2, f"{placed_n} of VMs {vms} placed, the rest with a kvm-sriov SCHED_MESSAGE")


def _never_for_lack_of_a_vf(fe, vms):
    for vm in vms:
        assert fe.vm_state(vm) not in ("FAILED", "PROLOG_FAILURE"), fe.vm_error(vm)
        assert "not enough free SR-IOV VFs" not in fe.vm_log(vm), fe.vm_log(vm)


def test_anti_affined_role_one_vm_per_host_and_the_extra_one_waits(frontend, role_vms):
    group, vms = role_vms("ANTI_AFFINED", 3)
    placed, waiting = _settled(frontend, vms, 2)
    hosts = sorted(_hosts(frontend, vm)[-1] for vm in placed)
    assert hosts == sorted(frontend.host(h).one_name for h in HOST_VFS), hosts   # one per host
    (late,) = waiting
    assert frontend.vm_state(late) == "PENDING"
    # host2's only VF is taken: host1 is the one host with a VF for it, and runs one of the role
    assert (f"anti-affinity role ranks of VM group {group}: every host with 1 free VF already runs "
            f"one of its VMs (hosts {frontend.host('host1').id})") in _message(frontend, late), _message(frontend, late)
    _never_for_lack_of_a_vf(frontend, vms)

    gone = next(vm for vm in placed if _hosts(frontend, vm)[-1] == frontend.host("host2").one_name)
    frontend.cli("onevm", "recover", "--delete", str(gone))
    wait_for(lambda: _hosts(frontend, late), RETRY * 2, f"VM {late} placed once the host was free")
    assert _hosts(frontend, late) == [frontend.host("host2").one_name]
    _never_for_lack_of_a_vf(frontend, vms)


def test_affined_role_stays_on_its_host_and_the_one_without_a_vf_waits(frontend, role_vms):
    group, vms = role_vms("AFFINED", 3)
    placed, waiting = _settled(frontend, vms, 2)
    host1 = frontend.host("host1")
    assert {_hosts(frontend, vm)[-1] for vm in placed} == {host1.one_name}    # 2 free VFs there
    (late,) = waiting
    assert frontend.vm_state(late) == "PENDING"
    assert (f"affinity role ranks of VM group {group}: host {host1.id} runs its VMs and has 0 of 1 VF free"
            in _message(frontend, late)), _message(frontend, late)
    _never_for_lack_of_a_vf(frontend, vms)

    frontend.cli("onevm", "recover", "--delete", str(placed[0]))
    wait_for(lambda: _hosts(frontend, late), RETRY * 2, f"VM {late} placed once the host was free")
    assert _hosts(frontend, late) == [host1.one_name]
    _never_for_lack_of_a_vf(frontend, vms)
