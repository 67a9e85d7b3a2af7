"""Hot-unplug and hot-plug of VFs in a running domain, confirmed.

libvirt's detach returns success after waiting ~5 s for the guest even when
the guest has not let the device go (no OS yet, no PCIe hotplug); the
hostdev then stays in the live XML and a following save or migrate is
refused. So every change is confirmed by polling the live XML. The same
engine (unplug, plug) moves the shared-memory device (ivshmem/host.py).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Optional, Sequence
from xml.etree import ElementTree as ET

from ..errors import HypervisorError
from ..opennebula import log
from ..vf.discovery import VirtualFunction
from . import domain_xml, pcie_switch
from .hypervisor import libvirt_module

# live(dom): name -> device XML of the devices of one kind the running
# domain has now (a VF by its PCI address, a shared-memory region by its
# name): what the engine below polls to confirm a change, and the XML it
# hands libvirt to unplug one.
Live = Callable[[object], Mapping[str, str]]


def _live_hostdevs(dom) -> dict[str, ET.Element]:
    return domain_xml.pci_hostdevs(domain_xml.parse(dom.XMLDesc(0), f"live XML of {dom.name()}"))


def _live_vfs(dom) -> dict[str, str]:
    return {vf: ET.tostring(hostdev, encoding="unicode") for vf, hostdev in _live_hostdevs(dom).items()}


def present(dom) -> set[str]:
    return set(_live_hostdevs(dom))


def _wait(dom, live: Live, done, timeout: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if done(set(live(dom))):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def _request_unplug(dom, what: str, name: str, xml: str, repeat: bool) -> None:
    libvirt = libvirt_module()
    try:
        dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError as exc:
        if not repeat:
            raise HypervisorError(f"libvirt refused to detach {what} {name} from {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
        # a repeated request may race the removal or find QEMU's unplug still pending
        log("DEBUG", f"repeated unplug request for {what} {name}: {exc.get_error_message()}")


def unplug(dom, what: str, names: Sequence[str], live: Live, timeout: float, retry_every: float) -> None:
    """Unplug these devices (what: "VF", say, for the messages) from the
    running domain and wait until they are gone.

    The request is repeated every retry_every seconds while the device is
    still there: a guest ignores the PCIe attention button while its slot
    is still being powered on (right after a hot-plug or a migration), and
    QEMU does not press it again by itself (Nova repeats ignored detaches
    too). Repeating sooner than the guest's 5 s blink would cancel an
    unplug in progress (config: timeouts.detach_retry_seconds >= 6)."""
    started = time.monotonic()
    deadline = started + timeout
    repeat = False
    while True:
        now = live(dom)
        left = [name for name in names if name in now]
        if not left:
            if repeat:  # the cost of the unplug, for the VM log and rung-3 reports
                log("INFO", f"{dom.name()}: {what} {', '.join(names)} unplugged in "
                            f"{time.monotonic() - started:.1f}s")
            return
        if time.monotonic() >= deadline:
            raise HypervisorError(
                f"the guest of {dom.name()} did not release {what} {', '.join(sorted(left))} within "
                f"{timeout:.0f}s (libvirt reported the detach, but the device is still in the live "
                f"domain; is the guest OS up and handling PCIe hot-unplug?)")
        if repeat:
            log("INFO", f"{dom.name()}: {what} {', '.join(left)} still present after "
                        f"{time.monotonic() - started:.0f}s, asking the guest again")
        for name in left:
            _request_unplug(dom, what, name, now[name], repeat)
        repeat = True
        _wait(dom, live, lambda gone: not set(left) & gone, min(retry_every, deadline - time.monotonic()))


def plug(dom, what: str, devices: Mapping[str, str], live: Live, timeout: float) -> None:
    """Plug these devices (name -> device XML) into the running domain, those
    it does not have yet, and wait until they are all there."""
    started = time.monotonic()
    have = live(dom)
    wanted = [name for name in devices if name not in have]
    libvirt = libvirt_module()
    for name in wanted:
        try:
            dom.attachDeviceFlags(devices[name], libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"libvirt refused to attach {what} {name} to {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
    if not _wait(dom, live, lambda now: set(wanted) <= now, timeout):
        raise HypervisorError(f"{what} {', '.join(wanted)} did not appear in {dom.name()} "
                              f"within {timeout:.0f}s")
    if wanted:
        log("INFO", f"{dom.name()}: {what} {', '.join(wanted)} plugged in {time.monotonic() - started:.1f}s")


def detach(dom, vfs: Sequence[str], timeout: float, retry_every: float) -> None:
    """Unplug these VFs (PCI addresses) from the running domain, confirmed."""
    unplug(dom, "VF", vfs, _live_vfs, timeout, retry_every)


def attach(dom, vfs: Iterable[tuple[VirtualFunction, str]], timeout: float,
           ports: Optional[Mapping[str, int]] = None) -> None:
    """Plug (VF, NIC MAC) pairs into the running domain and wait until present.
    ports: NIC MAC -> the guest bus of the switch port its VF goes back to
    (beside its GPU: node/vm.switch_ports); any other VF goes where libvirt
    puts it."""
    devices = {}
    for vf, mac in vfs:
        hostdev = domain_xml.hostdev_element(vf, mac)
        if ports and mac in ports:
            pcie_switch.set_guest_address(hostdev, ports[mac])
        devices[vf.address] = ET.tostring(hostdev, encoding="unicode")
    plug(dom, "VF", devices, _live_vfs, timeout)
