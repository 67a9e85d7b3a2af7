"""Rung 3, run INSIDE the nested host (rakelib/driver.rake, test:driver-vfio):
GPU affinity and the guest's PCIe switch (docs/gpu.md) with real parts.

L1 has two PCIe switches, each behind an expander bus on a NUMA node of its
own, each with an SR-IOV PF (QEMU's NVMe) and a stand-in GPU: QEMU's ati-vga,
vendor 1002 and class VGA, so a GPU by kvm-sriov's own rule
(topology.is_gpu), which vfio-pci takes and passes to a guest
(simhost.nested.GpuSwitch says why the switches' lower ports are root ports).
Here: the kernel's sysfs tree is read as kvm-sriov reads it, each VF is in an
IOMMU group of its own; a VM passing the second switch's GPU through in
OpenNebula's PCI form with KVM_SRIOV_GPU_AFFINITY = "switch" gets its VF
from that switch's PF through the installed deploy, its domain has the
switch deploy adds, the guest's own PCI tree shows the GPU and the VF on two
downstream ports of one upstream port, and the VF's hot-unplug and plug on
its port (detach_nic, attach_nic) work in the guest."""

import contextlib
import os
import time
import uuid as uuidlib
from pathlib import Path

import libvirt
import pytest

from kvm_sriov.domain import domain_xml
from kvm_sriov.vf import topology
from kvm_sriov.vf.discovery import read_pf
from kvm_sriov.vf.sysfs import Sysfs
from simhost.nested import GPU_STAND_IN, GPU_SWITCHES, PF_ADDRESS, VFS_PER_SWITCH_PF
from tests.support.driver_env import DriverOnHost, destroy_all, pool_rows, wait_for, write_config
from tests.support.runnable import runnable_deployment

pytestmark = pytest.mark.vfio

URI = "qemu:///system"
PCI = Path("/sys/bus/pci/devices")
NEAR, FAR = GPU_SWITCHES[1], GPU_SWITCHES[0]   # the VM's GPU is NEAR's; FAR's PF has the lowest address
MAC = "02:00:0a:64:00:2a"                      # the deployment file's IB NIC
ROOT_PORT, UPSTREAM, DOWNSTREAM = "1b36:000c", "104c:8232", "104c:8233"   # QEMU's ids
NVME = "1b36:0010"        # QEMU's NVMe: the PFs and their VFs alike
GPU_IDS = ":".join(GPU_STAND_IN)
VM_SECONDS = 900        # the guest's boot, nested, on a loaded machine


def attribute(address, name):
    return (PCI / address / name).read_text().strip()


def group_members(address):
    return sorted(os.listdir(PCI / address / "iommu_group" / "devices"))


@pytest.fixture(scope="module")
def switch_vfs():
    """The switches' PFs with their VFs on (left unbound, as the nested host
    leaves its first PF's), off again afterwards."""
    for s in GPU_SWITCHES:
        assert wait_for(lambda: (PCI / s.pf / "driver").exists(), 60), f"nvme did not bind {s.pf}"
        (PCI / s.pf / "sriov_drivers_autoprobe").write_text("0")
        (PCI / s.pf / "sriov_numvfs").write_text(str(VFS_PER_SWITCH_PF))
    yield
    destroy_all(URI)
    for s in GPU_SWITCHES:
        (PCI / s.pf / "sriov_numvfs").write_text("0")


@pytest.fixture
def driver(remotes, tmp_path, switch_vfs):
    """The installed driver with the two switches' PFs as its pool."""
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "kvm-sriov.toml", {
        "pool": {"pfs": [s.pf for s in GPU_SWITCHES], "state_dir": str(state)},
        "libvirt": {"uri": URI},
        "timeouts": {"hotplug_seconds": 60, "shutdown_seconds": 240},
    })
    d = DriverOnHost(remotes, cfg, "host1")
    d.state = state
    yield d
    destroy_all(URI)


def test_each_switch_holds_a_gpu_and_a_pf_as_kvm_sriov_reads_them(switch_vfs):
    """The tree the firmware numbered is the one simhost.nested names, on its
    NUMA nodes; the root complex's PF is where it always was; every VF and
    each GPU is alone in its IOMMU group; and topology reads each GPU as
    switch-close to its own switch's PF and far from the other."""
    sysfs = Sysfs("/")
    for s in GPU_SWITCHES:
        for address, ids in ((s.root_port, ROOT_PORT), (s.upstream_port, UPSTREAM), (s.gpu_port, ROOT_PORT),
                             (s.pf_port, ROOT_PORT), (s.gpu, GPU_IDS), (s.pf, NVME)):
            assert f"{attribute(address, 'vendor')[2:]}:{attribute(address, 'device')[2:]}" == ids, address
        assert attribute(s.gpu, "class") == "0x030000"
        chain = f"/sys/devices/pci0000:{s.bus_nr:02x}/{s.root_port}/{s.upstream_port}"
        assert os.path.realpath(PCI / s.gpu) == f"{chain}/{s.gpu_port}/{s.gpu}"
        assert os.path.realpath(PCI / s.pf) == f"{chain}/{s.pf_port}/{s.pf}"
        assert attribute(s.gpu, "numa_node") == attribute(s.pf, "numa_node") == str(s.node)
        for vf in s.vf_addresses(VFS_PER_SWITCH_PF):
            assert group_members(vf) == [vf]
        assert group_members(s.gpu) == [s.gpu]
    assert os.path.realpath(PCI / PF_ADDRESS) == f"/sys/devices/pci0000:00/0000:00:04.0/{PF_ADDRESS}"

    gpus, problems = topology.find_gpus(sysfs)
    assert (gpus, problems) == ([s.gpu for s in GPU_SWITCHES], [])
    found = topology.vm_gpus(sysfs, gpus, [read_pf(sysfs, s.pf) for s in GPU_SWITCHES])
    levels = {(c.gpu, c.pf): (c.level, c.shared, c.numa_node) for c in found.closeness}
    assert levels == {
        (FAR.gpu, FAR.pf): ("switch", FAR.upstream_port, FAR.node),
        (FAR.gpu, NEAR.pf): ("far", None, None),
        (NEAR.gpu, FAR.pf): ("far", None, None),
        (NEAR.gpu, NEAR.pf): ("switch", NEAR.upstream_port, NEAR.node),
    }


def gpu_hostdev(address):
    """The GPU as OpenNebula 7.4's kvm driver writes a VM's PCI section on q35
    (LibVirtDriverKVM.cc "PCI Passthrough"), the guest address that of the flat layout's
    first root port (HostSharePCI.cc: VM_BUS 0x01 for PCI_ID 0)."""
    return ("\t\t<hostdev mode='subsystem' type='pci' managed='yes'>\n\t\t\t<source>\n"
            f"\t\t\t\t<address  domain='0x0000' bus='0x{address[5:7]}' slot='0x00' function='0x0'/>\n"
            "\t\t\t</source>\n"
            "\t\t\t<address type='pci' domain='0x0000' bus='0x01' slot='0x0000' function='0'/>\n"
            "\t\t</hostdev>\n")


def vm_document(vmid, gpu):
    """oned's vm.xml, as much as deploy reads: the NIC's network, the PCI
    request, the wish."""
    return (f"<VM><ID>{vmid}</ID><UID>0</UID><TEMPLATE>"
            f"<NIC><BRIDGE>ib-sriov</BRIDGE><MAC>{MAC}</MAC><NETWORK_ID>5</NETWORK_ID></NIC>"
            f"<PCI><DOMAIN>0000</DOMAIN><BUS>{gpu[5:7]}</BUS><SLOT>00</SLOT><FUNCTION>0</FUNCTION>"
            f"<VENDOR>{GPU_STAND_IN[0]}</VENDOR><DEVICE>{GPU_STAND_IN[1]}</DEVICE><CLASS>0300</CLASS></PCI>"
            "</TEMPLATE><USER_TEMPLATE><KVM_SRIOV_GPU_AFFINITY>switch</KVM_SRIOV_GPU_AFFINITY>"
            "</USER_TEMPLATE></VM>")


def live_domain(uuid):
    conn = libvirt.open(URI)
    try:
        return domain_xml.parse(conn.lookupByUUIDString(uuid).XMLDesc(0))
    finally:
        conn.close()


def switch_in_domain(root):
    """alias -> (model, index, the bus it plugs into) of deploy's switch
    controllers (a switch port's model with its name, e.g. x3130-upstream),
    and host address -> the guest bus of each PCI hostdev."""
    controllers = {}
    for c in root.iterfind("devices/controller[@type='pci']"):
        alias = c.find("alias")
        if alias is not None and alias.get("name", "").startswith("ua-sriov-"):
            address = c.find("address")
            model = c.find("model")     # libvirt names a root port's model pcie-root-port
            named = model is not None and c.get("model").startswith("pcie-switch-")
            controllers[alias.get("name")] = (
                c.get("model") + (f"/{model.get('name')}" if named else ""),
                int(c.get("index")), int(address.get("bus"), 16) if address is not None else None)
    buses = {a: int(h.find("address").get("bus"), 16) for a, h in domain_xml.pci_hostdevs(root).items()}
    return controllers, buses


def on_ports(tree):
    """The stand-in GPU's and the NVMe VF's guest addresses in one PCI listing."""
    by_ids = {}
    for address, (ids, _parent) in tree.items():
        by_ids.setdefault(ids, []).append(address)
    return by_ids.get(GPU_IDS, []), by_ids.get(NVME, [])


@contextlib.contextmanager
def shown_on_failure(*files):
    """What to read when the VM test fails: its console's and QEMU's log tails."""
    try:
        yield
    except BaseException:
        for f in files:
            text = f.read_text(errors="replace") if f.exists() else "(none)"
            print(f"--- {f} (last 4000 characters)\n{text[-4000:]}")
        raise


def test_a_gpu_vm_gets_its_switchs_vf_and_sees_both_under_one_switch_also_after_a_replug(driver):
    serial = driver.config.parent / "serial-42.log"
    with shown_on_failure(serial, Path("/var/log/libvirt/qemu/one-42.log")):
        gpu_vm(driver, serial)


def gpu_vm(driver, serial):
    """Deploy, the domain, the guest's tree, detach_nic and attach_nic, cancel."""
    from simhost.guest_image import (DEFAULT_CMDLINE, HOTPLUG_READY, PCI_TREE_OPTION, ensure_guest_image,
                                     last_counter, pci_trees)
    uuid = str(uuidlib.uuid4())
    start = time.monotonic()

    def said(what):   # where the minutes go (pytest -s), never asserted
        print(f"{time.monotonic() - start:6.0f} s  {what}")

    # DEFAULT_CMDLINE keeps pcie_ports=compat: the switch is on pcie-root here (no guest
    # NUMA), where QEMU 7.2's q35 hot-plugs through ACPI on every cold-plugged bridge's
    # bus, a switch's downstream ports included (the re-plug below is that path)
    xml = runnable_deployment("one-42", uuid, serial, ensure_guest_image(), ib_nics=1,
                              cmdline=f"{DEFAULT_CMDLINE} {PCI_TREE_OPTION}")
    xml = xml.replace("<devices>", "<devices>\n" + gpu_hostdev(NEAR.gpu), 1)
    deployment = Path(driver.vm_file("deployment.0"))
    deployment.parent.mkdir(parents=True, exist_ok=True)
    (deployment.parent / "vm.xml").write_text(vm_document(42, NEAR.gpu))

    r = driver("deploy", [str(deployment), "host1"], stdin=xml)
    assert r.code == 0, r.stderr
    said("deployed")
    [(vf, vm, state)] = pool_rows(driver.state)
    # without the wish the VF would be FAR's: the lowest address among PFs as free
    assert vf in NEAR.vf_addresses(VFS_PER_SWITCH_PF) and (vm, state) == (42, "attached")
    assert f"VF {vf} (PF {NEAR.pf}, switch-close to GPU {NEAR.gpu})" in r.stderr, r.stderr
    assert f"GPU {NEAR.gpu} and VF {vf} under one PCIe switch in the guest (pcie-root)" in r.stderr, r.stderr

    # the domain libvirt runs: deploy's root port, x3130 upstream port, two xio3130 ports
    name = "gpu-" + NEAR.gpu.replace(":", "-").replace(".", "-")
    port = "ua-sriov-port-" + MAC.replace(":", "")
    controllers, buses = switch_in_domain(live_domain(uuid))
    root_model, root_index, _ = controllers[f"ua-sriov-root-{name}"]
    up_model, up_index, up_bus = controllers[f"ua-sriov-switch-{name}"]
    assert (root_model, up_model, up_bus) == ("pcie-root-port", "pcie-switch-upstream-port/x3130-upstream",
                                              root_index)
    gpu_port, vf_port = controllers[f"ua-sriov-down-{name}"], controllers[port]
    for model, _, bus in (gpu_port, vf_port):
        assert (model, bus) == ("pcie-switch-downstream-port/xio3130-downstream", up_index)
    assert buses == {NEAR.gpu: gpu_port[1], vf: vf_port[1]}

    # the guest's own PCI tree: each on a downstream port, both ports on one upstream port
    assert wait_for(lambda: (last_counter(serial) or 0) >= HOTPLUG_READY, VM_SECONDS), "the guest did not boot"
    said("guest up")
    tree = pci_trees(serial)[-1]
    [gpu], [guest_vf] = on_ports(tree)
    gpu_parent, vf_parent = tree[gpu][1], tree[guest_vf][1]
    assert gpu_parent != vf_parent and tree[gpu_parent][0] == tree[vf_parent][0] == DOWNSTREAM, tree
    upstream = tree[gpu_parent][1]
    assert tree[vf_parent][1] == upstream and tree[upstream][0] == UPSTREAM, tree

    # the VF's hot-unplug and plug on its xio3130 port, seen by the guest
    listings = len(pci_trees(serial))
    r = driver("detach_nic", [uuid, MAC])
    assert r.code == 0, r.stderr
    assert pool_rows(driver.state) == []
    assert wait_for(lambda: any(on_ports(t)[1] == [] for t in pci_trees(serial)[listings:]), 120), \
        "the guest still lists the VF"
    said("VF unplugged in the guest")
    assert controllers == switch_in_domain(live_domain(uuid))[0]     # its port stays, empty
    listings = len(pci_trees(serial))
    # oned sends the VM (its wish and PCI section) with attach_nic: the VF is chosen with the wish
    r = driver("attach_nic", [uuid, MAC, "ib-sriov", "-", "dummy", "one-42-1"],
               stdin=f"<VMM_DRIVER_ACTION_DATA>{vm_document(42, NEAR.gpu)}</VMM_DRIVER_ACTION_DATA>")
    assert r.code == 0, r.stderr
    [(again, _, _)] = pool_rows(driver.state)
    assert again in NEAR.vf_addresses(VFS_PER_SWITCH_PF), r.stderr
    assert f"(PF {NEAR.pf}, switch-close to GPU {NEAR.gpu})" in r.stderr, r.stderr
    assert switch_in_domain(live_domain(uuid))[1] == {NEAR.gpu: gpu_port[1], again: vf_port[1]}
    assert wait_for(lambda: any(on_ports(t)[1] for t in pci_trees(serial)[listings:]), 120), \
        "the guest did not list the VF again"
    said("VF plugged again in the guest")
    tree = [t for t in pci_trees(serial)[listings:] if on_ports(t)[1]][0]
    [back] = on_ports(tree)[1]
    assert tree[back][1] == vf_parent, tree      # the same downstream port in the guest

    r = driver("cancel", [uuid, "host1"])
    assert r.code == 0, r.stderr
    assert pool_rows(driver.state) == []
