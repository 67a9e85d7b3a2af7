"""OpenNebula's real deployment file, made runnable under QEMU TCG here.

Only what cannot exist on a test host changes (disk images, the KVM
emulator wrapper, host-passthrough CPU, fixed VNC port, 8 GiB of memory,
the br0 bridge); the IB NIC and the rest keep OpenNebula's shape, so the
driver sees what it sees in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from lxml import etree

from simhost.guest_image import DEFAULT_CMDLINE
from tests.conftest import FIXTURES

DEPLOYMENT = FIXTURES / "opennebula" / "deployment.0"


def runnable_deployment(name: str, uuid: str, serial_log: Path, image=None, ib_nics: int = 1,
                        bridge: str = "ib-sriov", memory_mib: int = 160,
                        cmdline: str = DEFAULT_CMDLINE) -> str:
    """image=None gives a guest with no OS: the firmware idles and ignores ACPI.
    The image boots with the kernel options every simulated guest uses: they skip
    boot work the guest has no use for, which costs most under nested emulation."""
    root = etree.fromstring(DEPLOYMENT.read_bytes())
    root.set("type", "qemu")
    root.find("name").text = name
    root.find("uuid").text = uuid
    root.find("vcpu").text = "1"
    root.find("memory").text = str(memory_mib * 1024)
    for tag in ("cputune", "cpu"):
        root.remove(root.find(tag))
    os_el = root.find("os")
    if image is not None:
        for tag, text in (("kernel", image.kernel), ("initrd", image.initrd), ("cmdline", cmdline)):
            etree.SubElement(os_el, tag).text = str(text)
    devices = root.find("devices")
    devices.find("emulator").text = "/usr/bin/qemu-system-x86_64"
    for el in devices.findall("disk") + devices.findall("graphics"):
        devices.remove(el)
    ifaces = devices.findall("interface")
    plain, ib = ifaces[0], ifaces[1]
    # br0 does not exist here: a user-mode NIC stands for "a NIC on another network"
    plain.set("type", "user")
    for tag in ("source", "target", "driver"):
        plain.remove(plain.find(tag))
    ib.find("source").set("bridge", bridge)
    for n in range(1, ib_nics):
        extra = etree.fromstring(etree.tostring(ib))
        extra.find("mac").set("address", f"02:00:0a:64:01:{n:02x}")
        extra.find("target").set("dev", f"{name}-{n + 1}")
        ib.addnext(extra)
    if ib_nics == 0:
        devices.remove(ib)
    serial = etree.SubElement(devices, "serial", type="file")
    etree.SubElement(serial, "source", path=str(serial_log), append="on")
    etree.SubElement(serial, "target", port="0")
    etree.SubElement(devices, "memballoon", model="none")
    return etree.tostring(root, encoding="unicode")


def interface_macs(xml: str, kind: Optional[str] = None) -> list[str]:
    root = etree.fromstring(xml.encode())
    return [i.find("mac").get("address") for i in root.iter("interface")
            if kind is None or i.get("type") == kind]
