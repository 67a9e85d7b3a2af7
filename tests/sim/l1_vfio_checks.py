"""Checks that run INSIDE L1 (rung 3), first in driver-vfio's nested host
(rakelib/driver.rake): every VF is still unbound there. Named so that
pytest does not collect them on the host."""
import os
from pathlib import Path

import libvirt
import pytest

from simhost.guest_image import domain_xml
from simhost.nested import PF_ADDRESS, vf_addresses

pytestmark = pytest.mark.vfio

PCI = Path('/sys/bus/pci/devices')


def driver(addr):
    link = PCI / addr / 'driver'
    return link.resolve().name if link.exists() else None


def iommu_group(addr):
    return (PCI / addr / 'iommu_group').resolve().name


def hostdev_xml(addr):
    domain, bus, slot_fn = addr.split(':')
    slot, function = slot_fn.split('.')
    return f"""
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/></source>
    </hostdev>"""


def test_vfs_exist_unbound_each_in_its_own_iommu_group():
    vfs = vf_addresses()
    for vf in vfs:
        assert (PCI / vf / 'physfn').resolve().name == PF_ADDRESS
        assert driver(vf) is None
        assert os.listdir(f'/sys/kernel/iommu_groups/{iommu_group(vf)}/devices') == [vf]
    assert len({iommu_group(vf) for vf in vfs} | {iommu_group(PF_ADDRESS)}) == len(vfs) + 1


@pytest.fixture
def l2_with_vf(guest_image, tmp_path):
    """A running L2 guest holding the first VF as a managed hostdev."""
    conn = libvirt.open('qemu:///system')
    vf = vf_addresses()[0]
    dom = conn.defineXML(domain_xml('l2', guest_image, tmp_path / 'l2.log',
                                    devices=hostdev_xml(vf)))
    dom.create()
    yield dom, vf
    if dom.isActive():
        dom.destroy()
    dom.undefine()
    conn.close()


def test_managed_hostdev_binds_the_vf_to_vfio_and_releases_it(l2_with_vf):
    dom, vf = l2_with_vf
    assert driver(vf) == 'vfio-pci'
    dom.destroy()
    assert driver(vf) != 'vfio-pci'


def test_save_is_refused_while_the_vf_is_attached(l2_with_vf, tmp_path):
    dom, _ = l2_with_vf
    with pytest.raises(libvirt.libvirtError, match="VFIO device doesn't support migration"):
        dom.save(str(tmp_path / 'l2.save'))
    assert dom.isActive()
