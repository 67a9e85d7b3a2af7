"""Rung 1: each GPU and its VFs under one emulated PCIe switch in the guest
(domain/pcie_switch.py), on deployment files laid out as OpenNebula 7.4's
kvm driver writes them (LibVirtDriverKVM.cc: q35's 16 root ports, or per
guest NUMA node a pcie-expander-bus with 8): the XML checked against
libvirt's schema (virt-xml-validate) and defined on libvirt's test driver."""

import shutil
import subprocess
from xml.etree import ElementTree as etree

import pytest

from kvm_sriov.domain import domain_xml, pcie_switch
from kvm_sriov.vf.discovery import VirtualFunction
from kvm_sriov.vf.gpu_affinity import GuestPair
from tests.support.actions_in_process import deployment

GPU87, GPU90, GPU07 = "0000:87:00.0", "0000:90:00.0", "0000:07:00.0"
MACS = ["02:00:0a:64:00:2a", "02:00:0a:64:01:01", "02:00:0a:64:01:02", "02:00:0a:64:01:03"]


def stock_hostdev(address, guest_bus=None):
    """A VM's PCI device as OpenNebula's kvm driver writes it ("PCI Passthrough")."""
    _dom, bus, rest = address.split(":")
    guest = (f"<address type='pci' domain='0x0000' slot='0x00' function='0x0'  bus='{guest_bus}'/>"
             if guest_bus is not None else "")
    return (f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address  domain='0x0000' "
            f"bus='0x{bus}' slot='0x00' function='0x0'/></source>{guest}</hostdev>")


def oned_numa(cells, bound):
    """oned's NUMA layout: <cpu><numa> cells, memnodes binding cell -> host
    node, and its PCIe topology (root port 1, pcie-to-pci-bridge 2, per cell
    i a pcie-expander-bus of index 3 + 9i, busNr 0x20 + 0x10i, with 8 root
    ports)."""
    numa = "".join(f"<cell id='{i}' memory='1048576' cpus='{i}-{i}'/>" for i in range(cells))
    tune = "".join(f"<memnode cellid='{c}' mode='strict' nodeset='{n}'/>" for c, n in bound.items())
    pci = ["<controller index='0' type='pci' model='pcie-root'/>",
           "<controller type='pci' index='1' model='pcie-root-port'/>",
           "<controller type='pci' index='2' model='pcie-to-pci-bridge'/>"]
    for i in range(cells):
        bus = 3 + i * 9
        pci.append(f"<controller type='pci' index='{bus}' model='pcie-expander-bus'><target "
                   f"busNr='0x{0x20 + 0x10 * i:04x}'><node>{i}</node></target></controller>")
        for j in range(8):
            multi = " multifunction='on'" if j == 0 else ""
            pci.append(f"<controller type='pci' index='{bus + 1 + j}' model='pcie-root-port'><address "
                       f"type='pci' bus='{bus}' slot='0' function='{j}'{multi}/></controller>")
    return numa, tune, "".join(pci)


def vm(gpus=(GPU87, GPU90), nics=2, cells=0, bound=None, edits=()):
    """(domain root, NIC i's VF hostdev) as deploy has them when it places
    the switches: the GPUs where oned puts them (a root port each), then
    edits (old, new) made to the deployment file's text."""
    root = domain_xml.parse(deployment(nics=nics))
    devices = root.find("devices")
    for n, gpu in enumerate(gpus):
        devices.insert(n, domain_xml.parse(stock_hostdev(gpu, 4 + 9 * n if cells else f"0x{n + 1:02x}")))
    if cells:
        numa, tune, pci = oned_numa(cells, bound or {})
        for c in [c for c in devices.findall("controller") if c.get("type") == "pci"]:
            devices.remove(c)
        devices.extend(domain_xml.parse(f"<x>{pci}</x>"))
        root.find("cpu").append(domain_xml.parse(f"<numa>{numa}</numa>"))
        root.append(domain_xml.parse(f"<numatune>{tune}</numatune>"))
    xml = etree.tostring(root, encoding="unicode")
    for old, new in edits:
        assert old in xml, old
        xml = xml.replace(old, new, 1)
    root = domain_xml.parse(xml)
    vfs = []
    for n, nic in enumerate(domain_xml.sriov_nics(root, "ib-sriov")):
        address = f"0000:{0x8d + n:02x}:00.1"
        vf = VirtualFunction(address, 0, address[:-1] + "0", 1, None, (), None, (), ())
        vfs.append(domain_xml.replace_with_hostdev(nic, vf))
    return root, vfs


def pci_controllers(root):
    return {int(c.get("index")): c for c in root.iter("controller") if c.get("type") == "pci"}


def guest_bus(hostdev):
    return int(hostdev.find("address").get("bus"), 16)


def bus_of(controller):
    addr = controller.find("address")
    return None if addr is None else int(addr.get("bus"), 0)


def gpu_hostdev(root, address):
    return domain_xml.passed_through_hostdev(root, address)


def validate(tmp_path, root):
    """libvirt's RelaxNG schema, after two things oned writes that libvirt's
    parser reads and its schema does not: a second <devices> block (merged
    into the first) and an expander's busNr in hex ('0x0020', made decimal)."""
    root = etree.fromstring(domain_xml.to_string(root))
    blocks = root.findall("devices")
    for extra in blocks[1:]:
        blocks[0].extend(list(extra))
        root.remove(extra)
    for target in root.iterfind("devices/controller/target[@busNr]"):
        target.set("busNr", str(int(target.get("busNr"), 0)))
    path = tmp_path / "domain.xml"
    path.write_text(etree.tostring(root, encoding="unicode"))
    done = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


needs_validator = pytest.mark.skipif(shutil.which("virt-xml-validate") is None,
                                     reason="virt-xml-validate (libvirt-clients) missing")


def assert_libvirt_rules(root):
    """Indexes without a gap; each controller's index above the bus it plugs into."""
    pci = pci_controllers(root)
    assert sorted(pci) == list(range(len(pci)))
    for index, c in pci.items():
        bus = bus_of(c)
        assert bus is None or bus < index, (index, bus)


def test_each_gpu_and_its_vf_hang_from_one_switch_of_their_own(tmp_path, conn):
    root, vfs = vm()
    lines = pcie_switch.place(root, [GuestPair(GPU87, 1, (0,)), GuestPair(GPU90, 1, (1,))], vfs)
    assert lines == [("INFO", "GPU 0000:87:00.0 and VF 0000:8d:00.1 under one PCIe switch in the guest (pcie-root)"),
                     ("INFO", "GPU 0000:90:00.0 and VF 0000:8e:00.1 under one PCIe switch in the guest (pcie-root)")]
    pci = pci_controllers(root)
    # oned's 0-17 stay as written; ours follow: per GPU a root port, an upstream port, 2 downstream
    assert [(i, pci[i].get("model")) for i in range(18, 26)] == [
        (18, "pcie-root-port"), (19, "pcie-switch-upstream-port"),
        (20, "pcie-switch-downstream-port"), (21, "pcie-switch-downstream-port"),
        (22, "pcie-root-port"), (23, "pcie-switch-upstream-port"),
        (24, "pcie-switch-downstream-port"), (25, "pcie-switch-downstream-port")]
    assert [bus_of(pci[i]) for i in range(18, 26)] == [None, 18, 19, 19, None, 22, 23, 23]
    assert pci[19].find("model").get("name") == "x3130-upstream"
    assert pci[20].find("model").get("name") == "xio3130-downstream"
    assert [pci[i].find("address").get("slot") for i in (20, 21)] == ["0x00", "0x01"]
    # the GPU on the first downstream port (oned's guest address replaced), its VF on the next
    assert guest_bus(gpu_hostdev(root, GPU87)) == 20 and guest_bus(vfs[0]) == 21
    assert guest_bus(gpu_hostdev(root, GPU90)) == 24 and guest_bus(vfs[1]) == 25
    assert len(gpu_hostdev(root, GPU87).findall("address")) == 1
    # the VF's port is named after its NIC and knows its switch's GPU: a later re-plug finds both
    assert pcie_switch.vf_ports(root) == {"ua-sriov-port-02000a64002a": pcie_switch.VfPort(21, GPU87),
                                          "ua-sriov-port-02000a640101": pcie_switch.VfPort(25, GPU90)}
    assert_libvirt_rules(root)
    if shutil.which("virt-xml-validate"):
        validate(tmp_path, root)
    dom = conn.defineXML(domain_xml.to_string(root).replace("type='kvm'", "type='test'", 1))
    try:
        back = domain_xml.parse_live(dom.XMLDesc(0))
        assert pcie_switch.vf_ports(back) == pcie_switch.vf_ports(root)
        assert guest_bus(gpu_hostdev(back, GPU87)) == 20
    finally:
        dom.undefine()


@needs_validator
def test_an_expander_on_the_guest_node_bound_to_the_pairs_host_node(tmp_path, conn):
    """Guest cell 0 is bound to host node 1 and cell 1 to host node 0: the
    switch of a pair on host node 1 hangs from an expander on guest node 0."""
    root, vfs = vm(cells=2, bound={0: 1, 1: 0})
    lines = pcie_switch.place(root, [GuestPair(GPU87, 1, (0,)), GuestPair(GPU90, 1, (1,))], vfs)
    assert [line for _, line in lines] == [
        "GPU 0000:87:00.0 and VF 0000:8d:00.1 under one PCIe switch in the guest (guest NUMA node 0)",
        "GPU 0000:90:00.0 and VF 0000:8e:00.1 under one PCIe switch in the guest (guest NUMA node 0)"]
    pci = pci_controllers(root)
    assert max(pci) == 29    # oned's 0-20, one expander, 2 x (root port, upstream, 2 downstream)
    pxb = pci[21]
    assert pxb.get("model") == "pcie-expander-bus" and pxb.find("target/node").text == "0"
    # the top of the bus numbers: its bus, and per switch a root port, an upstream and 2 downstream
    assert int(pxb.find("target").get("busNr")) == 256 - (1 + 4 + 4)
    assert [(bus_of(pci[i]), pci[i].find("address").get("slot")) for i in (22, 26)] == [(21, "0x00"),
                                                                                      (21, "0x01")]
    assert guest_bus(gpu_hostdev(root, GPU87)) == 24 and guest_bus(vfs[0]) == 25
    assert_libvirt_rules(root)
    validate(tmp_path, root)
    dom = conn.defineXML(domain_xml.to_string(root).replace("type='kvm'", "type='test'", 1))
    dom.undefine()


def test_pairs_on_two_host_nodes_get_an_expander_each_the_highest_node_on_top():
    root, vfs = vm(gpus=(GPU07, GPU87), cells=2, bound={0: 0, 1: 1})
    pcie_switch.place(root, [GuestPair(GPU07, 0, (0,)), GuestPair(GPU87, 1, (1,))], vfs)
    pxbs = [(c.find("alias") is not None, c.find("target/node").text, int(c.find("target").get("busNr"), 0))
            for c in pci_controllers(root).values() if c.get("model") == "pcie-expander-bus"]
    # oned's as written; ours at the top, node 1's highest, 5 bus numbers each
    assert pxbs == [(False, "0", 0x20), (False, "1", 0x30), (True, "0", 256 - 10), (True, "1", 256 - 5)]
    assert_libvirt_rules(root)


def test_guest_nodes_not_bound_to_the_host_node_put_the_switch_on_pcie_root():
    root, vfs = vm(cells=2)     # cells, but no memnode binds them to host nodes
    lines = pcie_switch.place(root, [GuestPair(GPU87, 1, (0,))], vfs)
    assert ("INFO", "GPU 0000:87:00.0: no guest NUMA node is bound to host node 1 alone, "
                    "its switch is on pcie-root") in lines
    assert not [c for c in pci_controllers(root).values()
                if c.get("model") == "pcie-expander-bus" and c.find("alias") is not None]
    assert bus_of(pci_controllers(root)[21]) is None     # its root port: libvirt puts it on pcie-root
    assert_libvirt_rules(root)


def test_more_vfs_than_gpus_share_the_switch_of_the_gpu_they_serve(tmp_path):
    root, vfs = vm(gpus=(GPU87,), nics=3)
    pcie_switch.place(root, [GuestPair(GPU87, 1, (0, 2))], vfs)
    pci = pci_controllers(root)
    assert [pci[i].get("model") for i in range(18, 23)] == [
        "pcie-root-port", "pcie-switch-upstream-port", *["pcie-switch-downstream-port"] * 3]
    assert [guest_bus(vfs[0]), guest_bus(vfs[2])] == [21, 22]
    assert vfs[1].find("address") is None       # not paired: where libvirt puts it, as today
    if shutil.which("virt-xml-validate"):
        validate(tmp_path, root)


def test_no_pair_changes_nothing():
    root, vfs = vm()
    before = domain_xml.to_string(root)
    assert pcie_switch.place(root, [], vfs) == []
    assert domain_xml.to_string(root) == before


def unchanged(root, vfs, pairs):
    before = domain_xml.to_string(root)
    lines = pcie_switch.place(root, pairs, vfs)
    assert domain_xml.to_string(root) == before
    assert len(lines) == 1 and lines[0][0] == "WARN"
    assert lines[0][1].startswith("GPUs and their VFs not put under one PCIe switch in the guest "
                                  "(they are as close on the host): ")
    return lines[0][1]


def test_a_machine_without_pcie_root_keeps_its_xml():
    root, vfs = vm()
    devices = root.find("devices")
    for c in [c for c in devices.findall("controller") if c.get("type") == "pci"]:
        devices.remove(c)
    root.find("os/type").set("machine", "pc")
    assert "no PCIe root" in unchanged(root, vfs, [GuestPair(GPU87, 1, (0,))])


ROOT_PORT_5 = "index='5' model='pcie-root-port' />"     # as ElementTree writes oned's
BRIDGE_17 = "index='17' model='pcie-to-pci-bridge' />"


@pytest.mark.parametrize("edits,why", [
    ([("index='5'", "index='1e3'")], "index '1e3' cannot be read"),
    ([("index='5'", "index='-5'")], "index '-5' cannot be read"),
    ([("index='5'", "index='05'")], "index '05' cannot be read"),      # octal to libvirt
    ([("index='5'", "index='0x1ff'")], "index '0x1ff' cannot be read"),
    ([("index='5'", "index='6'")], "two PCI controllers have index 6"),
    ([(ROOT_PORT_5, "index='5' model='pcie-root-port'><address type='pci' bus='0x07' slot='0'/></controller>")],
     "PCI controller 5 plugs into bus '0x07', not a bus below its index"),
    ([("index='4'", "index='30'"),
      (ROOT_PORT_5, "index='5' model='pcie-root-port'><address type='pci' bus='4' slot='0'/></controller>")],
     "PCI controller 5 plugs into bus 4, which no controller provides"),
    ([(BRIDGE_17, "index='17' model='pcie-expander-bus'><target><node>0</node></target></controller>")],
     "pcie-expander-bus 17 has no busNr that can be read"),
    ([(BRIDGE_17, "index='17' model='pcie-expander-bus'><target busNr='2'><node>0</node></target></controller>")],
     "pcie-root would need 25 guest bus numbers, it has 2"),
    ([(BRIDGE_17, "index='250' model='pcie-to-pci-bridge' />")],
     "the switches would need PCI controller indexes up to 258, libvirt's buses end at 255"),
], ids=["exponent", "negative", "leading-zero", "too-big", "twice", "bus-above", "bus-missing",
        "no-busnr", "busnr-low", "indexes-run-out"])
def test_controllers_that_cannot_be_read_or_leave_no_room_keep_the_xml(edits, why):
    """A deployment file's RAW section can hold any controller: what cannot
    be read, or leaves no room for the switches, changes nothing."""
    root, vfs = vm(edits=[(a.replace("'", '"'), b) for a, b in edits])
    assert unchanged(root, vfs, [GuestPair(GPU87, 1, (0,)), GuestPair(GPU90, 1, (1,))]).endswith(why)


def test_an_expander_already_near_the_top_leaves_no_room_for_ours():
    """Ours take the top of the bus numbers: an expander already there
    (RAW) leaves ours too few, and nothing changes."""
    root, vfs = vm(cells=2, bound={0: 0, 1: 1}, edits=[('busNr="0x0030"', 'busNr="250"')])
    # ours would start at 251: oned's expander of node 1 (8 root ports) would keep 1 bus number
    assert unchanged(root, vfs, [GuestPair(GPU87, 1, (0,))]).endswith(
        "pcie-expander-bus 12 would need 9 guest bus numbers, it has 1")


def test_an_iommu_bound_to_a_gpus_bus_keeps_the_xml():
    """oned's IOMMU per dedicated device (IOMMU_MODE device: <iommu><driver
    pciBus=.../>) covers the GPU's own bus: moving the GPU would leave it."""
    root, vfs = vm()
    root.find("devices").append(domain_xml.parse("<iommu model='smmuv3'><driver pciBus='1'/></iommu>"))
    assert "an IOMMU bound to a PCI bus (pciBus)" in unchanged(root, vfs, [GuestPair(GPU87, 1, (0,))])


def test_pcie_root_that_would_run_out_of_bus_numbers_keeps_the_xml():
    """oned's expanders start at bus 0x20: pcie-root numbers 31 buses below
    them; 8 switches there (no guest node bound) need 4 each."""
    gpus = [f"0000:{b:02x}:00.0" for b in (0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd)]
    root, vfs = vm(gpus=gpus, nics=8, cells=2)
    why = unchanged(root, vfs, [GuestPair(g, 1, (n,)) for n, g in enumerate(gpus)])
    assert why.endswith("pcie-root would need 35 guest bus numbers, it has 32")


def test_a_gpu_with_more_vfs_than_switch_ports_keeps_the_xml():
    root, vfs = vm(gpus=(GPU87,), nics=1)
    many = [vfs[0]] * 32
    assert "GPU 0000:87:00.0 would need 33 switch ports, a switch has 32" in unchanged(
        root, many, [GuestPair(GPU87, 1, tuple(range(32)))])


def test_vf_ports_reads_only_the_ports_made_for_vfs():
    root = domain_xml.parse(
        "<domain><devices>"
        "<controller type='pci' index='9' model='pcie-switch-downstream-port'><alias name='ua-sriov-port-02aa'/>"
        "</controller>"
        "<controller type='pci' index='x' model='pcie-switch-downstream-port'><alias name='ua-sriov-port-02bb'/>"
        "</controller>"
        "<controller type='pci' index='300' model='pcie-switch-downstream-port'>"
        "<alias name='ua-sriov-port-02cc'/></controller>"
        "<controller type='pci' index='7' model='pcie-root-port'><alias name='ua-sriov-port-02dd'/></controller>"
        "<controller type='pci' index='8' model='pcie-switch-downstream-port'><alias name='ua-other'/></controller>"
        "</devices></domain>")
    assert pcie_switch.vf_ports(root) == {"ua-sriov-port-02aa": pcie_switch.VfPort(9, None)}
    assert pcie_switch.vf_port_alias("02:AA:00:00:00:01") == "ua-sriov-port-02aa00000001"
