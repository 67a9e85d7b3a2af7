"""Rung 4: a VM group of two VMs asking for shared memory, through the real
oned: both deploy on one host and share one region, one is suspended and
resumed (leaves and rejoins), both terminate and the region is gone."""

import libvirt

from kvm_sriov.domain import domain_xml
from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region
from tests.opennebula.conftest import guest_counter, instantiate, terminate, vm_template


def regions_of(frontend, host, vm):
    conn = libvirt.open(frontend.host(host).libvirt.uri)
    try:
        dom = conn.lookupByName(f"one-{vm}")
        return ivshmem.live_regions(domain_xml.parse(dom.XMLDesc(0)))
    finally:
        conn.close()


def header(name):
    return ivshmem_region.read_header((ivshmem_region.SHM_DIR / name).read_bytes()[:4096])


def test_vm_group_shares_a_region_suspend_resume_terminate(frontend):
    group = frontend.create("vmgroup", 'NAME = "ivshmem-ranks"\nROLE = [ NAME = "ranks" ]\n')
    template = vm_template(frontend, "ivshmem-rank", extra=(
        f'VMGROUP = [ VMGROUP_ID = "{group}", ROLE = "ranks" ]\n'
        'KVM_SRIOV_IVSHMEM = [ SIZE = "4" ]\n'))
    uid = int(frontend.xml("onetemplate", "show", template).findtext("UID"))
    name = f"kvm-sriov-ivshmem-u{uid}-g{group}"
    vms = [instantiate(frontend, template, f"ivshmem-rank-{i}", host="host1") for i in (0, 1)]
    try:
        for vm in vms:
            frontend.wait_vm(vm, "RUNNING")
            assert regions_of(frontend, "host1", vm) == [name]
        assert header(name)["vms"] == sorted(vms)

        guest_counter(frontend, "host1", "ivshmem-rank-0")  # up: it answers the unplug
        frontend.cli("onevm", "suspend", vms[0])
        frontend.wait_vm(vms[0], "SUSPENDED", timeout=240)
        assert header(name)["vms"] == [vms[1]]
        frontend.cli("onevm", "resume", vms[0])
        frontend.wait_vm(vms[0], "RUNNING", timeout=240)
        assert regions_of(frontend, "host1", vms[0]) == [name]
        assert header(name)["vms"] == sorted(vms)
    finally:
        for vm in vms:
            terminate(frontend, vm, hard=True)
    assert not (ivshmem_region.SHM_DIR / name).exists()
