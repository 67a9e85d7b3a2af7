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


class PlugRecorder:
    """A running domain of libvirt's test driver (which cannot hot-plug) as
    hotplug.attach sees it: its live XML, plus the devices plugged so far;
    each attach request recorded."""

    def __init__(self, dom):
        self.dom = dom
        self.plugged = []

    def name(self):
        return self.dom.name()

    def XMLDesc(self, flags=0):
        return self.dom.XMLDesc(flags).replace("</devices>", "".join(self.plugged) + "</devices>", 1)

    def attachDeviceFlags(self, xml, flags):
        assert flags == libvirt.VIR_DOMAIN_AFFECT_LIVE
        self.plugged.append(xml)
        return 0


def test_a_vf_plugged_again_after_save_and_restore_goes_back_to_its_switch_port(conn, tmp_path):
    """Deploy put GPU 87 and NIC 02:00:0a:64:00:2a's VF under one switch in
    the guest. Save unplugs the VF; libvirt saves the domain with the switch
    and the VF's empty port; after restore the port is found again with the
    GPU on its switch, and the VF given that port (node/vm.switch_ports
    decides whether the new VF is close enough) is plugged there. A NIC with
    no port given goes where libvirt puts it, as before."""
    from kvm_sriov.domain import domain_xml, pcie_switch
    from kvm_sriov.vf.discovery import VirtualFunction
    from kvm_sriov.vf.gpu_affinity import GuestPair
    from tests.support.actions_in_process import deployment

    gpu = ("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' "
           "bus='0x87' slot='0x00' function='0x0'/></source></hostdev>")
    root = domain_xml.parse(deployment(nics=2).replace("<devices>", "<devices>" + gpu, 1))
    vfs = [VirtualFunction(f"0000:8d:00.{n}", n - 1, "0000:8d:00.0", 1, None, (), None, (), ())
           for n in (1, 2)]
    nics = domain_xml.sriov_nics(root, "ib-sriov")
    hostdevs = [domain_xml.replace_with_hostdev(nic, vf) for nic, vf in zip(nics, vfs)]
    assert pcie_switch.place(root, [GuestPair("0000:87:00.0", 1, (0,))], hostdevs)[0][0] == "INFO"
    port = int(hostdevs[0].find("address").get("bus"), 16)
    devices = root.find("devices")
    for hostdev in hostdevs:                     # as save leaves the domain: its VFs unplugged
        devices.remove(hostdev)
    checkpoint = tmp_path / "checkpoint"
    conn.createXML(domain_xml.to_string(root), 0).save(str(checkpoint))
    conn.restore(str(checkpoint))
    dom = PlugRecorder(conn.lookupByName("one-42"))
    try:
        ports = pcie_switch.vf_ports(domain_xml.parse_live(dom.XMLDesc(0)))
        assert ports == {pcie_switch.vf_port_alias(nics[0].request.mac): pcie_switch.VfPort(port, "0000:87:00.0")}
        hotplug.attach(dom, [(vfs[0], nics[0].request.mac), (vfs[1], nics[1].request.mac)], timeout=5,
                       ports={nics[0].request.mac: port})
        plugged = [domain_xml.parse(xml) for xml in dom.plugged]
        assert [domain_xml.hostdev_address(h) for h in plugged] == ["0000:8d:00.1", "0000:8d:00.2"]
        assert plugged[0].find("address").attrib == {"type": "pci", "domain": "0x0000", "bus": f"0x{port:02x}",
                                                    "slot": "0x00", "function": "0x0"}
        assert plugged[1].find("address") is None
    finally:
        conn.lookupByName("one-42").destroy()
