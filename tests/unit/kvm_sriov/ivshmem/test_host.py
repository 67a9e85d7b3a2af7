"""Rung 1: the shared-memory device in a running domain, plugged and unplugged
through the VFs' hot-plug engine (domain/hotplug.py)."""

import libvirt
import pytest

from kvm_sriov.ivshmem import device as ivshmem, host as ivshmem_host
from kvm_sriov.errors import HypervisorError


# -- the device in a running domain: the VFs' hot-plug engine (domain/hotplug.py)
class SlowGuestWithRegion:
    """A running domain whose guest ignores the first `ignored` unplug
    requests for its shared-memory device, as libvirt reports such a guest:
    the detach succeeds and the device stays in the live XML."""

    def __init__(self, record, ignored, plugged=True):
        self.record, self.ignored, self.plugged = record, ignored, plugged
        self.requests = []

    def name(self):
        return 'one-42'

    def XMLDesc(self, flags=0):
        shmem = ivshmem_host.device_xml(self.record) if self.plugged else ''
        return f"<domain type='kvm'><name>one-42</name><devices>{shmem}</devices></domain>"

    def detachDeviceFlags(self, xml, flags):
        assert xml == ivshmem_host.device_xml(self.record)
        self.requests.append(xml)
        if len(self.requests) > self.ignored:
            self.plugged = False
        return 0

    def attachDeviceFlags(self, xml, flags):
        self.plugged = True
        return 0


RECORD = ivshmem.Record(ivshmem.Request(3, 7, 64), ivshmem.Placement(1, 0, 8))


def test_a_guest_that_ignored_the_region_unplug_is_asked_again(capsys):
    dom = SlowGuestWithRegion(RECORD, ignored=1)
    ivshmem_host.unplug(dom, RECORD, timeout=10, retry_every=0.3)
    assert not dom.plugged and len(dom.requests) == 2
    assert 'shared-memory region kvm-sriov-ivshmem-u3-g7 still present' in capsys.readouterr().err


def test_a_guest_that_never_lets_the_region_go_times_out_with_the_reason():
    dom = SlowGuestWithRegion(RECORD, ignored=10**6)
    with pytest.raises(HypervisorError, match='did not release shared-memory region kvm-sriov-ivshmem-u3-g7 '
                                              'within 1s .*is the guest OS up and handling PCIe hot-unplug'):
        ivshmem_host.unplug(dom, RECORD, timeout=1, retry_every=0.4)
    assert len(dom.requests) >= 2


def test_the_region_device_is_plugged_and_confirmed_or_the_refusal_said():
    dom = SlowGuestWithRegion(RECORD, ignored=0, plugged=False)
    ivshmem_host.plug(dom, RECORD, timeout=1)
    assert dom.plugged

    def refuse(xml, flags):
        raise libvirt.libvirtError('unsupported configuration: no hotplug')
    dom = SlowGuestWithRegion(RECORD, ignored=0, plugged=False)
    dom.attachDeviceFlags = refuse
    with pytest.raises(HypervisorError, match='libvirt refused to attach shared-memory region '
                                              'kvm-sriov-ivshmem-u3-g7 to one-42'):
        ivshmem_host.plug(dom, RECORD, timeout=1)
