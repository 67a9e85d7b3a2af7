"""Hot-unplug and hot-plug of VFs in a running domain, confirmed.

libvirt's detach returns success after waiting ~5 s for the guest even when
the guest has not let the device go (no OS yet, no PCIe hotplug); the
hostdev then stays in the live XML and a following save or migrate is
refused. So every change is confirmed by polling the live XML.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence
from xml.etree import ElementTree as ET

import libvirt

from ..errors import HypervisorError
from ..opennebula import log
from ..vf.discovery import VirtualFunction
from . import domain_xml

LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE


def _live_hostdevs(dom) -> dict[str, ET.Element]:
    return domain_xml.pci_hostdevs(domain_xml.parse(dom.XMLDesc(0), f"live XML of {dom.name()}"))


def present(dom) -> set[str]:
    return set(_live_hostdevs(dom))


def _wait(dom, done, timeout: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if done(present(dom)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def _request_unplug(dom, hostdev: ET.Element, vf: str, repeat: bool) -> None:
    try:
        dom.detachDeviceFlags(ET.tostring(hostdev, encoding="unicode"), LIVE)
    except libvirt.libvirtError as exc:
        if not repeat:
            raise HypervisorError(f"libvirt refused to detach VF {vf} from {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
        # a repeated request may race the removal or find QEMU's unplug still pending
        log("DEBUG", f"repeated unplug request for VF {vf}: {exc.get_error_message()}")


def detach(dom, vfs: Sequence[str], timeout: float, retry_every: float) -> None:
    """Unplug these VFs from the running domain and wait until they are gone.

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
        live = _live_hostdevs(dom)
        left = [vf for vf in vfs if vf in live]
        if not left:
            if repeat:  # the cost of the unplug, for the VM log and rung-3 reports
                log("INFO", f"{dom.name()}: VF {', '.join(vfs)} unplugged in {time.monotonic() - started:.1f}s")
            return
        if time.monotonic() >= deadline:
            raise HypervisorError(
                f"the guest of {dom.name()} did not release VF {', '.join(sorted(left))} within "
                f"{timeout:.0f}s (libvirt reported the detach, but the device is still in the live "
                f"domain; is the guest OS up and handling PCIe hot-unplug?)")
        if repeat:
            log("INFO", f"{dom.name()}: VF {', '.join(left)} still present after "
                        f"{time.monotonic() - started:.0f}s, asking the guest again")
        for vf in left:
            _request_unplug(dom, live[vf], vf, repeat)
        repeat = True
        _wait(dom, lambda now: not set(left) & now, min(retry_every, deadline - time.monotonic()))


def attach(dom, vfs: Iterable[tuple[VirtualFunction, str]], timeout: float) -> None:
    """Plug (VF, NIC MAC) pairs into the running domain and wait until present."""
    started = time.monotonic()
    wanted = []
    for vf, mac in vfs:
        if vf.address in present(dom):
            continue
        xml = ET.tostring(domain_xml.hostdev_element(vf, mac), encoding="unicode")
        try:
            dom.attachDeviceFlags(xml, LIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"libvirt refused to attach VF {vf.address} to {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
        wanted.append(vf.address)
    if not _wait(dom, lambda now: set(wanted) <= now, timeout):
        raise HypervisorError(f"VF {', '.join(wanted)} did not appear in {dom.name()} within {timeout:.0f}s")
    if wanted:
        log("INFO", f"{dom.name()}: VF {', '.join(wanted)} plugged in {time.monotonic() - started:.1f}s")
