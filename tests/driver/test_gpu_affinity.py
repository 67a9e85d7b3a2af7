"""Rung 1: deploy of a VM with passed-through GPUs that asks for VFs close to
them (KVM_SRIOV_GPU_AFFINITY), through the real action code in-process
against libvirt's test driver, on a DGX A100-style fake sysfs host
(tests/support/gpu_hosts.py: 8 GPUs, 8 ConnectX HCAs with 2 VFs each, 4
PCIe switches: GPUs 87 and 90 share one with HCAs 8d and 94, on NUMA node 1).
The GPUs reach the deployment file as OpenNebula 7.4's kvm driver writes a
VM's PCI section (LibVirtDriverKVM.cc, "PCI Passthrough")."""

import io
import re
from xml.etree import ElementTree as etree

import pytest

from kvm_sriov.actions import main
from kvm_sriov.domain import domain_xml, hotplug, pcie_switch
from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.node.host import Host
from kvm_sriov.vf import topology
from tests.conftest import FIXTURES
from tests.support.actions_in_process import deployment
from tests.support.gpu_hosts import dgx_a100
from tests.support.stock_standin import StockOnTestDriver


def stock_hostdev(bus, guest_bus=None):
    """A PCI device as the stock driver writes it: DOMAIN, BUS, SLOT, FUNCTION
    of the host's PCI monitoring after "0x"; VM_BUS_INDEX as the guest bus."""
    guest = (f"\t\t\t<address type='pci' domain='0x0000' slot='0x00' function='0x0'  bus='{guest_bus}'/>\n"
             if guest_bus is not None else "")
    return ("\t\t<hostdev mode='subsystem' type='pci' managed='yes'>\n\t\t\t<source>\n"
            f"\t\t\t\t<address  domain='0x0000' bus='0x{bus}' slot='0x00' function='0x0'/>\n"
            f"\t\t\t</source>\n{guest}\t\t</hostdev>\n")


def uuid(vmid):
    return f"00000000-0000-0000-0000-{vmid:012d}"


@pytest.fixture
def dgx(tmp_path, make_config, conn, capsys, monkeypatch):
    """dgx.deploy(vmid, gpus=("87",), nics=1, affinity="switch"); dgx.pool()."""
    root = tmp_path / "root"
    dgx_a100(root)
    cfg = make_config(root)
    stock = StockOnTestDriver(conn).install(monkeypatch)

    def host():
        return Host(cfg, Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")

    class Dgx:
        def deploy(self, vmid, gpus=(), nics=1, affinity="switch", hostdevs=None, guest_buses=False):
            dep = tmp_path / "datastores" / "0" / str(vmid) / "deployment.0"
            dep.parent.mkdir(parents=True, exist_ok=True)
            macs = [f"02:00:0a:64:00:{vmid:02x}", *(f"02:00:0a:{vmid:02x}:01:{n:02x}" for n in range(1, nics))]
            xml = deployment(nics=nics, name=f"one-{vmid}", uuid=uuid(vmid)).replace(
                "02:00:0a:64:00:2a", macs[0]).replace("02:00:0a:64:01:", f"02:00:0a:{vmid:02x}:01:")
            # oned's vm.xml: the NICs with their network (the GUID rule needs it), the wish
            template = "".join(f"<NIC><BRIDGE>ib-sriov</BRIDGE><MAC>{m}</MAC><NETWORK_ID>5</NETWORK_ID></NIC>"
                               for m in macs)
            user = f"<KVM_SRIOV_GPU_AFFINITY>{affinity}</KVM_SRIOV_GPU_AFFINITY>" if affinity else ""
            (dep.parent / "vm.xml").write_text(f"<VM><ID>{vmid}</ID><UID>0</UID><TEMPLATE>{template}"
                                               f"</TEMPLATE><USER_TEMPLATE>{user}</USER_TEMPLATE></VM>")
            if hostdevs is None:
                hostdevs = "".join(stock_hostdev(b, 1 + n if guest_buses else None) for n, b in enumerate(gpus))
            xml = xml.replace("<devices>", "<devices>\n" + hostdevs, 1)
            code = main("deploy", [str(dep), "h", str(vmid), "h"], stdin=io.StringIO(xml), host=host())
            out, err = capsys.readouterr()
            return code, out, err

        @staticmethod
        def cancel(vmid):
            code = main("cancel", [uuid(vmid), "h", str(vmid), "h"], stdin=io.StringIO(""), host=host())
            out, err = capsys.readouterr()
            return code, out, err

        @staticmethod
        def pool():
            return [(a.vf, a.vm_id, a.state) for a in host().pool.assignments()]

        guids = staticmethod(lambda: host().guid_records())

        @staticmethod
        def saved(vmid):
            """VM vmid as our save leaves it: its VFs unplugged and given back
            to the pool, the domain (its switches and their empty ports kept)
            in a checkpoint."""
            dom = conn.lookupByName(f"one-{vmid}")
            root = domain_xml.parse_live(dom.XMLDesc(0))
            vfs = {a.vf for a in host().assignments(vmid)}
            devices = root.find("devices")
            for h in [h for h in devices.iterfind("hostdev") if domain_xml.hostdev_address(h) in vfs]:
                devices.remove(h)
            dom.destroy()
            host().release_vm(vmid)
            ckpt = tmp_path / "datastores" / "0" / str(vmid) / "checkpoint"
            conn.createXML(domain_xml.to_string(root), 0).save(str(ckpt))
            return ckpt

        @staticmethod
        def action(name, affinity):
            """oned's action XML for VM 42 (one IB NIC, 02:00:0a:64:00:2a), with the wish."""
            text = (FIXTURES / "opennebula" / f"action-{name}.xml").read_text()
            text = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{tmp_path / 'datastores' / '0'}</BASE_PATH>", text)
            return text.replace("<USER_TEMPLATE>", "<USER_TEMPLATE><KVM_SRIOV_GPU_AFFINITY>"
                                f"{affinity}</KVM_SRIOV_GPU_AFFINITY>", 1)

        @staticmethod
        def plugs():
            """Each hot-plug asked (libvirt's test driver cannot): ([(VF, MAC)], MAC -> guest bus)."""
            plugged = []
            monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.append(
                ([(vf.address, mac) for vf, mac in vfs], dict(ports or {}))))
            return plugged

        @staticmethod
        def run(action, argv, stdin):
            code = main(action, argv, stdin=io.StringIO(stdin), host=host())
            out, err = capsys.readouterr()
            return code, out, err

    Dgx.stock = stock
    return Dgx()


def hostdevs_of(conn, vmid):
    xml = etree.fromstring(conn.lookupByName(f"one-{vmid}").XMLDesc(0).encode())
    return [h.find("source/address").get("bus") for h in xml.iterfind("devices/hostdev")]


def test_each_vf_comes_from_the_pf_under_its_gpus_switch(dgx, conn):
    code, out, err = dgx.deploy(42, gpus=("87", "90"), nics=2, guest_buses=True)
    assert code == 0, err
    # one rail per GPU: GPU 87 -> HCA 8d, GPU 90 -> HCA 94, both behind their switch
    assert dgx.pool() == [("0000:8d:00.1", 42, "attached"), ("0000:94:00.1", 42, "attached")]
    assert ("NIC 02:00:0a:64:00:2a -> VF 0000:8d:00.1 (PF 0000:8d:00.0, "
            "switch-close to GPU 0000:87:00.0)") in err
    assert "(PF 0000:94:00.0, switch-close to GPU 0000:90:00.0)" in err
    # the GPUs are still there, as the stock driver wrote them, beside the VFs
    assert sorted(hostdevs_of(conn, 42)) == ["0x87", "0x8d", "0x90", "0x94"]


def test_none_and_no_attribute_are_todays_deploy_and_read_no_topology(dgx, conn, monkeypatch):
    def looked(*args):
        raise AssertionError("the GPU topology was read for a VM that did not ask")
    monkeypatch.setattr(topology, "vm_gpus", looked)
    sent = []
    for affinity in ("none", None, "NONE"):
        code, _, err = dgx.deploy(42, gpus=("87", "90"), nics=2, affinity=affinity)
        assert code == 0, err
        assert "GPU" not in err
        # today's rule: the PFs with the most free VFs, lowest address first
        assert dgx.pool() == [("0000:0c:00.1", 42, "attached"), ("0000:12:00.1", 42, "attached")]
        sent.append(dgx.stock.calls[-1][2])
        assert dgx.cancel(42)[0] == 0 and dgx.pool() == []
    assert sent[0] == sent[1] == sent[2]


def test_a_level_that_cannot_be_met_fails_and_reserves_nothing(dgx, conn):
    # VM 7 (GPU 90, four NICs) takes every VF behind that switch
    code, _, err = dgx.deploy(7, gpus=("90",), nics=4)
    assert code == 0, err
    assert sorted(vf[5:7] for vf, _, _ in dgx.pool()) == ["8d", "8d", "94", "94"]
    before, guids, calls = dgx.pool(), dgx.guids(), len(dgx.stock.calls)
    for level in ("switch", "root"):
        code, out, err = dgx.deploy(8, gpus=("87",), nics=1, affinity=level)
        assert code == 1 and out == ""
        lines = [line for line in err.splitlines() if "KVM_SRIOV_GPU_AFFINITY" in line]
        assert len(lines) == 1 and "GPU 0000:87:00.0" in lines[0], err
        assert f'KVM_SRIOV_GPU_AFFINITY = "{level}": no free VF ' in lines[0]
        assert dgx.pool() == before and dgx.guids() == guids
        assert len(dgx.stock.calls) == calls
        assert "one-8" not in [d.name() for d in conn.listAllDomains()]
    # "numa": the HCAs of the socket's other switch
    code, _, err = dgx.deploy(8, gpus=("87",), nics=1, affinity="numa")
    assert code == 0, err
    assert [vf for vf, vm, _ in dgx.pool() if vm == 8] == ["0000:ba:00.1"]
    assert "numa-close to GPU 0000:87:00.0" in err


@pytest.mark.parametrize("value", ["nearest", "switch\nnuma", "x" * 5000], ids=["word", "newline", "long"])
def test_a_bad_value_is_one_line_and_changes_nothing(dgx, value):
    code, out, err = dgx.deploy(42, gpus=("87",), affinity=value)
    assert code == 1 and out == ""
    assert "KVM_SRIOV_GPU_AFFINITY = " in err and "use one of switch, root, numa, none" in err
    assert len(err.strip().splitlines()) == 1 and len(err) < 1000
    assert dgx.pool() == [] and dgx.stock.calls == []


def test_naming_a_device_that_is_no_gpu_claims_nothing(dgx, conn):
    """A PF, a pool VF or a switch port as a 'GPU' is no GPU: the VF is
    chosen as without the wish (and no sysfs path comes from the XML)."""
    for vmid, bus in ((42, "8d"), (43, "01")):
        code, _, err = dgx.deploy(vmid, gpus=(bus,), nics=1)
        assert code == 0, err
        assert "passes through no GPU of this host; VFs chosen without it" in err
    assert [vf[5:7] for vf, _, _ in dgx.pool()] == ["0c", "12"]


@pytest.mark.parametrize("hostdevs,why", [
    (stock_hostdev("33"), "passed-through device 0000:33:00.0: /sys/bus/pci/devices/0000:33:00.0 is not a link"),
    (stock_hostdev("87") * (topology.MAX_RAILS + 1), f"more than {topology.MAX_RAILS} PCI devices"),
], ids=["absent", "too-many"])
def test_devices_that_cannot_be_placed_fail_clearly(dgx, hostdevs, why):
    code, out, err = dgx.deploy(42, hostdevs=hostdevs)
    assert code == 1 and out == ""
    assert 'KVM_SRIOV_GPU_AFFINITY = "switch": ' in err and why in err
    assert dgx.pool() == [] and dgx.stock.calls == []


def test_only_the_stock_shape_is_read_as_the_vms_pci_devices(dgx):
    """What OpenNebula's driver writes ("0x" and hex digits) is read; a path,
    a decimal number, an mdev (no PCI address) or a VF kvm-sriov put in
    (its alias) is no device of the VM's PCI section and is not looked at."""
    odd = "".join([
        stock_hostdev("87").replace("bus='0x87'", "bus='0x87/../../..'"),
        stock_hostdev("87").replace("bus='0x87'", "bus='135'"),
        stock_hostdev("87").replace("function='0x0'", "function='0x8'"),
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        "<address uuid='c2177883-f1bb-47f0-914d-32a22e3a8804'/></source></hostdev>",
        stock_hostdev("90").replace("</source>", "</source><alias name='ua-sriov-02000a640099'/>"),
    ])
    xml = deployment().replace("<devices>", "<devices>\n" + odd + stock_hostdev("b7", 3), 1)
    assert domain_xml.passed_through(domain_xml.parse(xml), topology.MAX_RAILS) == ["0000:b7:00.0"]
    code, _, err = dgx.deploy(42, hostdevs=odd)   # (libvirt refuses the path, the deploy fails)
    assert "passes through no GPU of this host; VFs chosen without it" in err
    assert dgx.pool() == []


def test_each_gpu_and_its_rail_hang_from_one_pcie_switch_in_the_guest(dgx, conn):
    code, _, err = dgx.deploy(42, gpus=("87", "90"), nics=2, guest_buses=True)
    assert code == 0, err
    assert "INFO: GPU 0000:87:00.0 and VF 0000:8d:00.1 under one PCIe switch in the guest (pcie-root)" in err
    assert "INFO: GPU 0000:90:00.0 and VF 0000:94:00.1 under one PCIe switch in the guest (pcie-root)" in err
    live = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    parent = {int(c.get("index")): int(c.find("address").get("bus"), 0) for c in live.iterfind("devices/controller")
              if c.get("type") == "pci" and c.find("address") is not None}
    model = {int(c.get("index")): c.get("model") for c in live.iterfind("devices/controller")}
    switch_of = {}   # host address -> the upstream port above its guest slot
    for h in live.iterfind("devices/hostdev"):
        port = int(h.find("address").get("bus"), 16)
        assert model[port] == "pcie-switch-downstream-port"
        assert model[parent[port]] == "pcie-switch-upstream-port"
        assert model[parent[parent[port]]] == "pcie-root-port"
        switch_of[domain_xml.hostdev_address(h)] = parent[port]
    assert switch_of["0000:87:00.0"] == switch_of["0000:8d:00.1"] != switch_of["0000:90:00.0"]
    assert switch_of["0000:90:00.0"] == switch_of["0000:94:00.1"]


@pytest.mark.parametrize("gpus,nics,affinity,take", [
    (("87", "90"), 2, "none", ()),          # no wish
    (("87", "90"), 2, None, ()),
    (("87", "90"), 1, "switch", ()),        # fewer VFs than GPUs
    (("8d",), 1, "switch", ()),             # no GPU (an HCA named)
    (("87",), 1, "numa", ("8d", "94")),     # a VF only numa-close: peer traffic crosses the CPU
], ids=["none", "no-attribute", "fewer-vfs", "no-gpu", "numa-close"])
def test_what_gets_no_switch_is_deployed_with_todays_xml(dgx, monkeypatch, gpus, nics, affinity, take):
    """The deployment file the stock deploy gets is byte for byte the one it
    got before the switch placement existed (place() stubbed out)."""
    if take:   # another VM holds every VF behind GPU 87's switch
        assert dgx.deploy(7, gpus=("90",), nics=4)[0] == 0
    sent = []
    for stub in (False, True):
        if stub:
            monkeypatch.setattr(pcie_switch, "place", lambda *args: [])
        code, _, err = dgx.deploy(42, gpus=gpus, nics=nics, affinity=affinity, guest_buses=True)
        assert code == 0, err
        assert "under one PCIe switch" not in err
        sent.append(dgx.stock.calls[-1][2])
        assert dgx.cancel(42)[0] == 0
    assert sent[0] == sent[1]
    assert b"pcie-switch" not in sent[0]


def _port_of(conn, vmid, mac):
    return pcie_switch.vf_ports(domain_xml.parse_live(conn.lookupByName(f"one-{vmid}").XMLDesc(0)))[
        pcie_switch.vf_port_alias(mac)]


def test_a_restore_takes_a_vf_near_the_gpu_again_and_puts_it_back_beside_it(dgx, conn):
    """Every path that takes VFs asks the GPU wish: restore takes new ones as
    deploy did (not the PF with the most free VFs), and the VF goes back to
    the NIC's port on the GPU's switch in the guest. (libvirt saves no domain
    holding a physical GPU today; its test driver does, and the path is the
    one any VM whose saved XML names GPUs would take.)"""
    mac = "02:00:0a:64:00:2a"
    assert dgx.deploy(42, gpus=("87",), nics=1, guest_buses=True)[0] == 0
    ckpt = dgx.saved(42)
    assert dgx.pool() == []
    plugged = dgx.plugs()
    code, _, err = dgx.run("restore", [str(ckpt), "h", uuid(42), "42", "h"], dgx.action("restore", "switch"))
    assert code == 0, err
    assert dgx.pool() == [("0000:8d:00.1", 42, "attached")]   # GPU 87's rail, behind its switch
    port = _port_of(conn, 42, mac)
    assert port.gpu == "0000:87:00.0"
    assert plugged == [([("0000:8d:00.1", mac)], {mac: port.bus})]


def test_a_far_vf_plugged_again_is_never_shown_beside_the_gpu(dgx, conn, monkeypatch):
    """As seen on rung 3: the NIC detached, the VFs behind GPU 87's switch
    taken meanwhile, the NIC attached again with the wish "numa": its VF
    (the socket's other switch) must not go to the NIC's port on GPU 87's
    switch in the guest (NCCL would take GPUDirect RDMA across the CPU):
    libvirt places it, and the VM log says why."""
    mac = "02:00:0a:64:00:2a"
    assert dgx.deploy(42, gpus=("87",), nics=1, guest_buses=True)[0] == 0
    monkeypatch.setattr(hotplug, "detach", lambda dom, vfs, *a: None)  # the test driver cannot unplug
    code, _, err = dgx.run("detach_nic", [uuid(42), mac, "42", "h"], "")
    assert code == 0, err
    assert dgx.deploy(7, gpus=("90",), nics=3)[0] == 0      # the switch's VFs (8d.1 still in one-42's XML)
    plugged = dgx.plugs()
    code, _, err = dgx.run("attach_nic", [uuid(42), mac, "ib-sriov", "-", "dummy", "one-42-1", "42", "h"],
                           dgx.action("attach_nic", "numa"))
    assert code == 0, err
    [([(vf, plugged_mac)], ports)] = plugged
    assert vf[5:7] in ("ba", "cc") and plugged_mac == mac    # numa-close: the other switch of node 1
    assert ports == {}
    assert f"NIC {mac}: VF {vf} is not close to GPU 0000:87:00.0 on this host" in err
    assert _port_of(conn, 42, mac).gpu == "0000:87:00.0"     # the port stays for a later, closer VF


def test_a_hot_plugged_nic_takes_its_vf_near_the_vms_gpu(dgx, conn):
    """attach_nic asks the VM's GPU wish too: the rail behind GPU 87's switch,
    not the PF with the most free VFs. A NIC deploy made no port for goes
    where libvirt puts it."""
    mac = "02:00:0a:64:00:2a"
    assert dgx.deploy(42, gpus=("87",), nics=0)[0] == 0
    plugged = dgx.plugs()
    code, _, err = dgx.run("attach_nic", [uuid(42), mac, "ib-sriov", "-", "dummy", "one-42-1", "42", "h"],
                           dgx.action("attach_nic", "switch"))
    assert code == 0, err
    assert dgx.pool() == [("0000:8d:00.1", 42, "attached")]
    assert f"NIC {mac} -> VF 0000:8d:00.1 (PF 0000:8d:00.0, switch-close to GPU 0000:87:00.0)" in err
    assert plugged == [([("0000:8d:00.1", mac)], {})]
