"""Confirmed hot-unplug: a guest that ignores the first unplug request.

No libvirt driver that runs here can make a guest ignore the PCIe attention
button on cue (the nested rung 3 hits it only by chance, right after a
migration), so a stand-in domain plays the guest. It behaves as libvirt does
with such a guest: detachDeviceFlags returns success and the hostdev stays
in the live XML; it refuses a request for a device it does not have.
"""

import time

import libvirt
import pytest

from kvm_sriov import config
from kvm_sriov.domain import hotplug
from kvm_sriov.errors import ConfigError, HypervisorError

VF = "0000:03:00.1"
HOSTDEV = ("<hostdev mode='subsystem' type='pci' managed='yes'><source>"
           "<address domain='0x0000' bus='0x03' slot='0x00' function='0x1'/></source></hostdev>")


class SlowGuestDomain:
    """A running domain whose guest ignores the first `ignored` unplug requests
    (its slot is still powering on) and then releases the device."""

    def __init__(self, ignored: int, refuse_repeats: bool = False):
        self.ignored = ignored
        self.refuse_repeats = refuse_repeats
        self.requests = []
        self.attached = True

    def name(self):
        return "one-42"

    def XMLDesc(self, flags=0):
        devices = HOSTDEV if self.attached else ""
        return f"<domain type='kvm'><name>one-42</name><devices>{devices}</devices></domain>"

    def detachDeviceFlags(self, xml, flags):
        assert flags == libvirt.VIR_DOMAIN_AFFECT_LIVE
        if not self.attached:
            raise libvirt.libvirtError("operation failed: device not found")
        self.requests.append(time.monotonic())
        if self.refuse_repeats and len(self.requests) > 1:
            raise libvirt.libvirtError("internal error: unable to execute QEMU command "
                                       "'device_del': Device is already in the process of unplug")
        if len(self.requests) > self.ignored:
            self.attached = False
        return 0


def test_a_guest_that_ignored_the_request_is_asked_again(capsys):
    dom = SlowGuestDomain(ignored=1)
    hotplug.detach(dom, [VF], timeout=10, retry_every=0.3)
    assert not dom.attached and len(dom.requests) == 2
    gap = dom.requests[1] - dom.requests[0]
    assert gap >= 0.3, "asked again sooner than retry_every"
    assert "asking the guest again" in capsys.readouterr().err


def test_errors_on_a_repeated_request_do_not_end_the_wait():
    dom = SlowGuestDomain(ignored=1, refuse_repeats=True)
    with pytest.raises(HypervisorError, match="did not release VF 0000:03:00.1 within 1s"):
        hotplug.detach(dom, [VF], timeout=1, retry_every=0.3)
    assert len(dom.requests) >= 3


def test_the_first_refusal_is_an_error_at_once(monkeypatch):
    class Refusing(SlowGuestDomain):
        def detachDeviceFlags(self, xml, flags):
            self.requests.append(time.monotonic())
            raise libvirt.libvirtError("unsupported configuration: no hotplug")
    waits = []
    monkeypatch.setattr(hotplug, "_wait", lambda *args, **kw: waits.append(args) or False)
    dom = Refusing(ignored=0)
    with pytest.raises(HypervisorError, match="libvirt refused to detach VF 0000:03:00.1 from one-42"):
        hotplug.detach(dom, [VF], timeout=30, retry_every=10)
    assert len(dom.requests) == 1 and waits == []   # asked once, never waited for the guest


def test_a_guest_that_never_lets_go_times_out_with_the_reason():
    dom = SlowGuestDomain(ignored=10**6)
    with pytest.raises(HypervisorError, match="is the guest OS up and handling PCIe hot-unplug"):
        hotplug.detach(dom, [VF], timeout=1, retry_every=0.4)
    assert 2 <= len(dom.requests) <= 4


def test_a_device_already_gone_needs_no_request():
    dom = SlowGuestDomain(ignored=0)
    dom.attached = False
    hotplug.detach(dom, [VF], timeout=1, retry_every=0.3)
    assert dom.requests == []


def test_retry_interval_below_the_guest_blink_is_refused():
    with pytest.raises(ConfigError, match="detach_retry_seconds must be >= 6"):
        config.load(files=[], overrides={"timeouts": {"detach_retry_seconds": 3}})
    assert config.load(files=[]).detach_retry_seconds == 15
