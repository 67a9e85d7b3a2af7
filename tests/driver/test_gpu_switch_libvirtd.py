"""Rung 2: the PCIe switch deploy puts a GPU and its VF under
(domain/pcie_switch.py, docs/gpu.md section 7), started by a real libvirtd
and QEMU (TCG) and enumerated by the guest's kernel.

There is no GPU and no VF here. The layout is made as deploy makes it, on
OpenNebula's deployment file with a GPU written as the stock driver writes
the PCI section and the IB NIC made a VF hostdev; then each of the two
hostdevs is swapped for an emulated PCIe NIC (e1000e, 8086:10d3) at the
same guest address. So libvirt's qemu driver checks the controllers, the
indexes and the addresses, QEMU builds the tree, the firmware numbers the
buses inside the ranges the expanders' busNr leave, and the guest kernel
(its log at loglevel 8 on the serial console) shows where each device is."""

import re
import uuid as uuidlib
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.domain import domain_xml, pcie_switch
from kvm_sriov.vf.discovery import VirtualFunction
from kvm_sriov.vf.gpu_affinity import GuestPair
from tests.support.driver_env import wait_for
from tests.support.runnable import runnable_deployment

pytestmark = pytest.mark.libvirt

simhost = pytest.importorskip("simhost.libvirt_host")
from simhost.guest_image import DEFAULT_CMDLINE, UP_LINE, ensure_guest_image  # noqa: E402

STAND_IN = "8086:10d3"          # e1000e: a PCIe endpoint QEMU emulates
UPSTREAM, DOWNSTREAM = "104c:8232", "104c:8233"   # QEMU's x3130 / xio3130 ports
GPU = "0000:87:00.0"


@pytest.fixture(scope="module")
def lvhost(tmp_path_factory):
    with simhost.LibvirtHost("h1", tmp_path_factory.mktemp("hosts")) as h:
        yield h


def stand_in(hostdev, mac):
    """An emulated NIC where the hostdev was, at its guest address."""
    nic = ET.Element("interface", type="user")
    ET.SubElement(nic, "mac", address=mac)
    ET.SubElement(nic, "model", type="e1000e")
    nic.append(hostdev.find("address"))
    return nic


def deployment_with_switch(serial):
    """The runnable deployment file with two guest NUMA cells, cell 1 bound
    to host node 0 alone (as oned binds a pinned topology), GPU 87 and the
    IB NIC's VF under one switch by pcie_switch.place, then the stand-ins."""
    uuid = str(uuidlib.uuid4())
    xml = runnable_deployment("one-42", uuid, serial, ensure_guest_image(), ib_nics=1, memory_mib=256,
                              cmdline=DEFAULT_CMDLINE.replace("quiet ", "") + " loglevel=8")
    root = domain_xml.parse(xml)
    root.find("vcpu").text = "2"
    cpu = ET.Element("cpu")
    numa = ET.SubElement(cpu, "numa")
    for cell in (0, 1):
        ET.SubElement(numa, "cell", id=str(cell), cpus=str(cell), memory=str(128 * 1024), unit="KiB")
    root.insert(list(root).index(root.find("os")) + 1, cpu)
    tune = ET.SubElement(root, "numatune")
    ET.SubElement(tune, "memnode", cellid="1", mode="strict", nodeset="0")
    devices = root.find("devices")
    devices.insert(0, domain_xml.parse(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source><address  domain='0x0000' bus='0x87' "
        "slot='0x00' function='0x0'/></source><address type='pci' domain='0x0000' bus='0x01' "
        "slot='0x0000' function='0'/></hostdev>"))
    nic = domain_xml.sriov_nics(root, "ib-sriov")[0]
    vf = domain_xml.replace_with_hostdev(nic, VirtualFunction("0000:8d:00.1", 0, "0000:8d:00.0", 0, None,
                                                              (), None, (), ()))
    lines = pcie_switch.place(root, [GuestPair(GPU, 0, (0,))], [vf])
    assert lines == [("INFO", f"GPU {GPU} and VF 0000:8d:00.1 under one PCIe switch in the guest "
                              f"(guest NUMA node 1)")]
    gpu = domain_xml.passed_through_hostdev(root, GPU)
    for hostdev, mac in ((gpu, "02:00:00:00:87:00"), (vf, nic.request.mac)):
        devices[list(devices).index(hostdev)] = stand_in(hostdev, mac)
    pxb = next(c for c in devices.iter("controller") if c.get("model") == "pcie-expander-bus")
    return uuid, domain_xml.to_string(root), int(pxb.find("target").get("busNr"))


def kernel_tree(log):
    """From the guest kernel's log: PCI address -> vendor:device, and bus -> the bridge above it."""
    devices = dict(re.findall(r"pci (0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): \[([0-9a-f]{4}:[0-9a-f]{4})\]", log))
    above = {}
    for bridge, first in re.findall(r"pci (0000:[0-9a-f:.]+): PCI bridge to \[bus ([0-9a-f]{2})", log):
        above.setdefault(int(first, 16), bridge)
    return devices, above


def test_the_guest_sees_the_gpu_and_its_vf_below_one_switch_on_their_numa_node(lvhost, tmp_path):
    serial = tmp_path / "serial.log"
    uuid, xml, bus_nr = deployment_with_switch(serial)
    conn = lvhost.open()
    dom = conn.createXML(xml, 0)        # libvirt's qemu driver: indexes, addresses, busNr accepted
    try:
        assert wait_for(lambda: serial.exists() and UP_LINE in serial.read_text(errors="replace"), 240), \
            "guest never booted"
        log = serial.read_text(errors="replace")
        devices, above = kernel_tree(log)
        stand_ins = sorted(a for a, ids in devices.items() if ids == STAND_IN and int(a[5:7], 16) >= bus_nr)
        assert len(stand_ins) == 2, log[-3000:]
        ports = [above[int(a[5:7], 16)] for a in stand_ins]
        assert [devices[p] for p in ports] == [DOWNSTREAM, DOWNSTREAM]
        switches = {above[int(p[5:7], 16)] for p in ports}
        assert len(switches) == 1 and devices[switches.pop()] == UPSTREAM   # one switch above both
        # the expander's root bus, numbered from its busNr, on guest NUMA node 1
        assert re.search(rf"pci_bus 0000:{bus_nr:02x}: on NUMA node 1\b", log), log[-3000:]
        assert all(bus_nr < int(a[5:7], 16) for a in stand_ins)
    finally:
        dom.destroy()
        conn.close()
