"""Rung 1: the shared-memory request of a VM, its region name and the device
XML."""

from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.ivshmem import device as ivshmem
from kvm_sriov.errors import InputError
from kvm_sriov.oned.vm_template import VmTemplate


def vm_xml(size='256', group='7', uid='3', where='USER_TEMPLATE'):
    attr = '' if size is None else f'<KVM_SRIOV_IVSHMEM><SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM>'
    grp = '' if group is None else f'<VMGROUP><ROLE>ranks</ROLE><VMGROUP_ID>{group}</VMGROUP_ID></VMGROUP>'
    tmpl, user = (attr, '') if where == 'TEMPLATE' else ('', attr)
    return VmTemplate.from_text(f'<VM><ID>5</ID><UID>{uid}</UID><TEMPLATE>{grp}{tmpl}</TEMPLATE>'
                                f'<USER_TEMPLATE>{user}</USER_TEMPLATE></VM>')


def test_request_name_comes_from_owner_and_group_only():
    r = ivshmem.request_of(vm_xml())
    assert r == ivshmem.Request(3, 7, 256) and r.name == 'kvm-sriov-ivshmem-u3-g7'
    assert ivshmem.request_of(vm_xml(where='TEMPLATE'), uid=9).name == 'kvm-sriov-ivshmem-u9-g7'
    assert ivshmem.request_of(vm_xml(size=None)) is None
    assert ivshmem.request_of(None) is None


@pytest.mark.parametrize('size, why', [('0', 'power of two'), ('3', 'power of two'),
                                       ('131072', 'power of two'), ('abc', 'whole number'),
                                       ('', 'whole number'), ('-4', 'whole number'),
                                       ('99999999', 'whole number')])
def test_bad_sizes_are_refused(size, why):
    with pytest.raises(InputError, match=why):
        ivshmem.request_of(vm_xml(size=size))


def test_no_group_no_size_or_a_single_value_is_refused():
    with pytest.raises(InputError, match='no VM group'):
        ivshmem.request_of(vm_xml(group=None))
    with pytest.raises(InputError, match='whole number'):
        ivshmem.request_of(VmTemplate.from_text('<VM><UID>1</UID><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>'
                                                '<OTHER>1</OTHER></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>'))
    with pytest.raises(InputError, match='must be a vector'):
        ivshmem.request_of(VmTemplate.from_text('<VM><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>256'
                                                '</KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>'))


def test_q35_device_gets_a_root_port_of_its_own():
    root = ET.fromstring("<domain><os><type machine='q35'>hvm</type></os><devices>"
                         "<controller type='pci' index='0' model='pcie-root'/>"
                         "<controller type='pci' index='6' model='pcie-root-port'/></devices></domain>")
    where = ivshmem.add_device(root, ivshmem.Request(3, 7, 64))
    assert where == ivshmem.Placement(7, 0, 7)
    shmem = root.find('devices/shmem')
    assert shmem.get('name') == 'kvm-sriov-ivshmem-u3-g7' and shmem.find('model').get('type') == 'ivshmem-plain'
    assert shmem.find('address').get('bus') == '0x07'
    assert root.find("devices/controller[@index='7']").get('model') == 'pcie-root-port'
    rec = ivshmem.recorded(ET.fromstring(ET.tostring(root)))
    assert rec.request == ivshmem.Request(3, 7, 64) and rec.where.bus == 7


def test_pc_device_takes_a_free_slot_of_bus_0():
    root = ET.fromstring("<domain><os><type machine='pc'>hvm</type></os><devices><disk>"
                         "<address type='pci' domain='0' bus='0x00' slot='0x1f' function='0'/></disk>"
                         "</devices></domain>")
    assert ivshmem.add_device(root, ivshmem.Request(1, 2, 4)) == ivshmem.Placement(0, 0x1e, None)
