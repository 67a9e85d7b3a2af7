"""Hot-unplug and hot-plug of VFs in a running domain, confirmed.

libvirt's detach returns success after waiting ~5 s for the guest even when
the guest has not let the device go (no OS yet, no PCIe hotplug); the
hostdev then stays in the live XML and a following save or migrate is
refused. So every change is confirmed by polling the live XML.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import libvirt
from lxml import etree

from . import domain_xml
from .discovery import VirtualFunction
from .errors import HypervisorError

LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE


def _live_hostdevs(dom) -> dict[str, etree._Element]:
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


def detach(dom, vfs: Sequence[str], timeout: float) -> None:
    """Unplug these VFs from the running domain and wait until they are gone."""
    live = _live_hostdevs(dom)
    for vf in vfs:
        if vf not in live:
            continue
        try:
            dom.detachDeviceFlags(etree.tostring(live[vf], encoding="unicode"), LIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"libvirt refused to detach VF {vf} from {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
    if not _wait(dom, lambda now: not set(vfs) & now, timeout):
        stuck = ", ".join(sorted(set(vfs) & present(dom)))
        raise HypervisorError(
            f"the guest of {dom.name()} did not release VF {stuck} within {timeout:.0f}s "
            f"(libvirt reported the detach, but the device is still in the live domain; "
            f"is the guest OS up and handling PCIe hot-unplug?)")


def attach(dom, vfs: Iterable[tuple[VirtualFunction, str]], timeout: float) -> None:
    """Plug (VF, NIC MAC) pairs into the running domain and wait until present."""
    wanted = []
    for vf, mac in vfs:
        if vf.address in present(dom):
            continue
        xml = etree.tostring(domain_xml.hostdev_element(vf, mac), encoding="unicode")
        try:
            dom.attachDeviceFlags(xml, LIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"libvirt refused to attach VF {vf.address} to {dom.name()}: "
                                  f"{exc.get_error_message()}") from None
        wanted.append(vf.address)
    if not _wait(dom, lambda now: set(wanted) <= now, timeout):
        raise HypervisorError(f"VF {', '.join(wanted)} did not appear in {dom.name()} within {timeout:.0f}s")
