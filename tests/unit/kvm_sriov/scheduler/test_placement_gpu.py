"""The placer and KVM_SRIOV_GPU_AFFINITY (docs/gpu.md, section 6): a VM is
placed only where each of its IB NICs can get a VF close enough to one of the
GPUs oned would give it there, else it stays PENDING with the reason.

The hosts' templates are what the real probe prints on the DGX A100 fixture
(tests/support/gpu_hosts.py), the PCI_DEVICES what OpenNebula's pci probe
lists for its GPUs; the VMs ask for GPUs as OpenNebula's PCI section does."""

import base64
import json
import re
import sys
import xml.etree.ElementTree as ET
from functools import lru_cache
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from kvm_sriov.errors import DriverError
from kvm_sriov.scheduler import placement, placement_program
from kvm_sriov.scheduler.placement import HostVfs, Ledger, PciDevice, assign_pci, vm_need
from kvm_sriov.scheduler.placement_program import Window
from kvm_sriov.vf import policy
from kvm_sriov.vf.discovery import discover
from kvm_sriov.vf.gpu_affinity import GpuWish
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.vf.sysfs import Sysfs
from kvm_sriov.vf.topology import vm_gpus
from tests.support.gpu_hosts import dgx_a100
from tests.support.placement import requirements
from tests.support.probe import run_probe
from tests.unit.kvm_sriov.scheduler.test_placement import FAKE_RANK, Err

A100_GPUS = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]


def addr(bus: str) -> str:
    return f"0000:{bus}:00.0"


@lru_cache(maxsize=None)
def _probe_template(tmp_root: str, held: tuple[str, ...]) -> str:
    """The DGX A100 probe's output with ``held`` VFs (their PF's .1 and .2)
    taken, as a host TEMPLATE's children."""
    root = Path(tmp_root) / ("-".join(held) or "free")
    dgx_a100(root / "root")
    pool = VfPool(root / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        for i, pf in enumerate(held):      # both VFs of each named HCA
            for fn in (1, 2):
                txn.add(f"0000:{pf}:00.{fn}", addr(pf), 100 + i, f"one-{100 + i}", "", "attached", "deploy")
    pool.close()
    data = run_probe(root, root / "root")
    out = ""
    for key, value in data.items():
        for v in (value if isinstance(value, list) else [value]):
            out += (f"<{key}>" + ("".join(f"<{k}>{escape(x)}</{k}>" for k, x in v.items()) if isinstance(v, dict)
                                  else escape(str(v))) + f"</{key}>")
    return out


@pytest.fixture(scope="module")
def probe_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gpu-probe"))


def pci_devices(used: dict[str, int] = None) -> str:
    """The host's GPUs as OpenNebula's pci probe lists them (VMID: who has it)."""
    used = used or {}
    return "<PCI_DEVICES>" + "".join(
        f"<PCI><ADDRESS>{addr(b)}</ADDRESS><SHORT_ADDRESS>{b}:00.0</SHORT_ADDRESS><VENDOR>10de</VENDOR>"
        f"<DEVICE>20b0</DEVICE><CLASS>0302</CLASS><VMID>{used.get(b, -1)}</VMID></PCI>"
        for b in reversed(A100_GPUS)) + "</PCI_DEVICES>"      # oned orders them itself


def host(hid: int, template: str, pci: str = None) -> str:
    return (f"<HOST><ID>{hid}</ID><NAME>dgx{hid}</NAME><VMS/><TEMPLATE>{template}</TEMPLATE>"
            f"<HOST_SHARE>{pci if pci is not None else pci_devices()}</HOST_SHARE></HOST>")


GPU_REQUEST = "<PCI><VENDOR>10de</VENDOR><DEVICE>20b0</DEVICE><CLASS>0302</CLASS></PCI>"


def vm(vid: int, affinity=None, gpus: int = 2, nics: int = 2, pci: str = None, user: str = "") -> str:
    nic = "".join(f"<NIC><NIC_ID>{i}</NIC_ID><BRIDGE>ib-sriov</BRIDGE><MAC>02:00:00:00:{vid:02x}:{i:02x}</MAC></NIC>"
                  for i in range(nics))
    if affinity is not None:
        user += f"<KVM_SRIOV_GPU_AFFINITY>{affinity}</KVM_SRIOV_GPU_AFFINITY>"
    return (f"<VM><ID>{vid}</ID><UID>5</UID><NAME>vm{vid}</NAME><STATE>1</STATE><TEMPLATE>{nic}"
            f"{pci if pci is not None else GPU_REQUEST * gpus}</TEMPLATE><USER_TEMPLATE>{user}</USER_TEMPLATE></VM>")


def window(hosts: list[str], vms: list[str]) -> Window:
    hids = "".join(f"<ID>{ET.fromstring(h).findtext('ID')}</ID>" for h in hosts)
    req = "".join(f"<VM><ID>{ET.fromstring(v).findtext('ID')}</ID><HOSTS>{hids}</HOSTS></VM>" for v in vms)
    doc = (f"<SCHEDULER_DRIVER_ACTION><VM_POOL>{''.join(vms)}</VM_POOL><HOST_POOL>{''.join(hosts)}"
           f"</HOST_POOL><VNET_POOL/><REQUIREMENTS>{req}</REQUIREMENTS></SCHEDULER_DRIVER_ACTION>")
    return Window(doc.encode(), Ledger(None), now=1000.0)


def said(w: Window, vid: int) -> str:
    """'' when the VM goes to rank, else its one-line message."""
    w.narrow()
    if vid in w.vms_in_input():
        return ""
    return next(m for m in w.messages if m.startswith(f"ERROR: {vid} "))


def plan(*placed) -> bytes:
    return ("<PLAN><ID>-1</ID>" + "".join(
        f"<ACTION><VM_ID>{v}</VM_ID><HOST_ID>{h}</HOST_ID><DS_ID>0</DS_ID><OPERATION>deploy</OPERATION>"
        "</ACTION>" for v, h in placed) + "</PLAN>").encode()


def planned(xml: bytes) -> dict[int, int]:
    return {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(xml).iterfind("ACTION")}


# -- what the host offers, read back -------------------------------------------------------------
def test_the_pairing_comes_from_the_probe(probe_root):
    h = Window(f"<SCHEDULER_DRIVER_ACTION><VM_POOL/><HOST_POOL>{host(0, _probe_template(probe_root, ()))}"
               "</HOST_POOL><REQUIREMENTS/></SCHEDULER_DRIVER_ACTION>".encode(), Ledger(None)).hosts[0]
    assert sorted(h.gpus) == [addr(b) for b in A100_GPUS]
    assert h.gpus[addr("07")] == {addr("0c"): "switch", addr("12"): "switch",
                                  addr("4b"): "numa", addr("54"): "numa"}
    assert [d.address for d in h.pci] == [addr(b) for b in A100_GPUS]     # address order, as oned's map


# -- which GPUs oned gives: HostSharePCI's rule --------------------------------------------------
def devices(*spec) -> list[PciDevice]:
    return [PciDevice(addr(b), f"{b}:00.0", (v, d, c), vmid) for b, v, d, c, vmid in spec]


def test_oned_gives_the_first_free_matching_device_in_address_order_short_addresses_first():
    devs = devices(("07", 0x10de, 0x20b0, 0x0302, -1), ("0f", 0x10de, 0x20b0, 0x0302, 3),
                   ("47", 0x10de, 0x20b0, 0x0302, -1), ("4e", 0x10de, 0x2330, 0x0302, -1))
    by_name = ("", "10de", "20b0", "0302")
    assert assign_pci([by_name, by_name], devs) == [addr("07"), addr("47")]      # 0f is VM 3's
    assert assign_pci([by_name, ("07:00.0", "", "", "")], devs) == [addr("47"), addr("07")]
    assert assign_pci([("", "", "", "0302")] * 3, devs) == [addr("07"), addr("47"), addr("4e")]
    assert assign_pci([by_name], devs, taken={addr("07")}) == [addr("47")]
    assert assign_pci([by_name] * 3, devs) is None                              # rank's "Unavailable PCI device"
    assert assign_pci([("0f:00.0", "", "", "")], devs) is None                  # taken
    assert assign_pci([("", "", "", "")], devs) is None                         # asks nothing: oned refuses
    assert assign_pci([("", "10de", "0x20b0", "0302")], devs) == [addr("07")]   # hex as istream reads it
    for bad in ("10dex", "-10de", "1_0de", "10de" * 5, " 10de"):
        assert assign_pci([("", bad, "", "")], devs) is None


# -- a host that can pair and one that cannot ------------------------------------------------------
def test_a_vm_goes_only_to_the_host_that_can_pair_its_gpus(probe_root):
    full = _probe_template(probe_root, ("0c", "12"))     # the switch of GPUs 07 and 0f has no free VF
    free = _probe_template(probe_root, ())
    w = window([host(0, full), host(1, free)], [vm(1, "switch")])
    assert said(w, 1) == "" and requirements(w.root) == {1: [1]}
    w = window([host(0, full)], [vm(1, "switch")])
    message = said(w, 1)
    assert message.startswith("ERROR: 1 Cannot dispatch VM: it needs 2 InfiniBand VFs switch-close to its GPUs "
                              '(KVM_SRIOV_GPU_AFFINITY = "switch"), no candidate host can pair them')
    assert ("host 0: GPU 0000:07:00.0: 0 free VFs switch-close, GPU 0000:0f:00.0: 0 free VFs switch-close; "
            "12 free in all") in message and "stays PENDING" in message and "\n" not in message
    # the same VFs are close enough on the NUMA node
    w = window([host(0, full)], [vm(1, "numa")])
    assert said(w, 1) == ""


def test_the_gpus_oned_would_give_decide(probe_root):
    """GPUs 07 and 0f are another VM's: oned gives this one 47 and 4e, whose
    switch has free VFs; asked by address, 07 and 0f it is, and it waits."""
    full = _probe_template(probe_root, ("0c", "12"))
    w = window([host(0, full, pci_devices({"07": 9, "0f": 9}))], [vm(1, "switch")])
    assert said(w, 1) == ""
    assert w.hosts[0].vm_gpus(vm_need(w.vms[1])) == (addr("47"), addr("4e"))
    assert w.hosts[0].choose(vm_need(w.vms[1])) == [addr("4b"), addr("54")]
    by_address = "".join(f"<PCI><SHORT_ADDRESS>{b}:00.0</SHORT_ADDRESS></PCI>" for b in ("07", "0f"))
    w = window([host(0, full)], [vm(1, "switch", pci=by_address)])
    assert "GPU 0000:07:00.0: 0 free VFs switch-close" in said(w, 1)


def test_each_nic_is_its_gpus_rail_as_deploy_chooses(probe_root):
    w = window([host(0, _probe_template(probe_root, ()))], [vm(1, "switch", gpus=8, nics=8)])
    assert said(w, 1) == ""
    assert w.hosts[0].choose(vm_need(w.vms[1])) == [addr(b) for b in ("0c", "12", "4b", "54", "8d", "94", "ba", "cc")]


def test_one_window_gives_each_vm_the_next_gpus_and_their_vfs(probe_root):
    """Only the switch of GPUs 07/0f has free VFs (4): two 2-GPU VMs each fit
    alone, but the second gets GPUs 47/4e from oned, whose switch is full."""
    only = _probe_template(probe_root, ("4b", "54", "8d", "94", "ba", "cc"))
    w = window([host(0, only)], [vm(1, "switch"), vm(2, "switch")])
    w.narrow()
    assert requirements(w.root) == {1: [0], 2: [0]}
    out = w.check_plan(plan((1, 0), (2, 0)))
    assert planned(out) == {1: 0}
    (message,) = w.messages
    assert message.startswith("ERROR: 2 Cannot dispatch VM to host 0 in this window") and "took its GPUs" in message
    assert "GPU 0000:47:00.0: 0 free VFs switch-close" in message


def test_a_planned_vm_without_vfs_still_takes_its_gpus(probe_root):
    only = _probe_template(probe_root, ("4b", "54", "8d", "94", "ba", "cc"))
    w = window([host(0, only)], [vm(1, nics=0), vm(2, "switch")])
    w.narrow()
    assert planned(w.check_plan(plan((1, 0), (2, 0)))) == {1: 0}     # VM 1 took 07/0f
    assert "GPU 0000:47:00.0" in w.messages[0]


# -- "none" and VMs without GPUs: as before ----------------------------------------------------------
@pytest.mark.parametrize("affinity", [None, "none", "NONE", ""])
def test_none_is_unchanged(probe_root, affinity):
    full = _probe_template(probe_root, ("0c", "12"))
    w = window([host(0, full)], [vm(1, affinity)])
    need = vm_need(w.vms[1])
    assert need.gpu_level is None and said(w, 1) == ""
    assert w.hosts[0].choose(need) == w.hosts[0].choose(need._replace(pci=()))


def test_a_vm_with_the_wish_and_no_gpu_here_is_placed_as_without_it(probe_root):
    full = _probe_template(probe_root, ("0c", "12"))
    nvme = "<PCI><VENDOR>144d</VENDOR><CLASS>0108</CLASS></PCI>"
    nvme_host = pci_devices().replace("</PCI_DEVICES>", "<PCI><ADDRESS>0000:e0:00.0</ADDRESS><SHORT_ADDRESS>"
                                      "e0:00.0</SHORT_ADDRESS><VENDOR>144d</VENDOR><DEVICE>a808</DEVICE>"
                                      "<CLASS>0108</CLASS><VMID>-1</VMID></PCI></PCI_DEVICES>")
    for pci in ("", nvme):
        w = window([host(0, full, nvme_host)], [vm(1, "switch", pci=pci)])
        assert said(w, 1) == ""


def test_a_host_whose_probe_reports_no_pairing_pairs_nothing(probe_root):
    """An older probe (no KVM_SRIOV_GPU): its GPUs are far from every PF, as
    the placer cannot know better; "none" still goes there."""
    older = re.sub(r"<KVM_SRIOV_GPU>.*?</KVM_SRIOV_GPU>", "", _probe_template(probe_root, ()))
    w = window([host(0, older)], [vm(1, "numa")])
    assert "GPU 0000:07:00.0: no pairing reported" in said(w, 1)
    w = window([host(0, older)], [vm(1, "none")])
    assert said(w, 1) == ""


# -- hostile values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, why", [
    ("nearest", "KVM_SRIOV_GPU_AFFINITY = 'nearest': use one of switch, root, numa, none"),
    ("x" * 5000, "use one of switch, root, numa, none"),
])
def test_a_value_deploy_refuses_keeps_the_vm_pending_with_its_reason(probe_root, value, why):
    w = window([host(0, _probe_template(probe_root, ()))], [vm(1, value)])
    message = said(w, 1)
    assert why in message and "deploy would refuse it" in message and len(message) < 2100


def test_a_bad_value_on_a_vm_deploy_leaves_to_the_stock_script_is_not_refused(probe_root):
    """No IB NIC and no other kvm-sriov option: deploy hands the VM to the
    stock script, which reads no affinity."""
    w = window([host(0, _probe_template(probe_root, ()))], [vm(1, "nearest", nics=0)])
    assert said(w, 1) == ""
    w = window([host(0, _probe_template(probe_root, ()))],
               [vm(1, "nearest", nics=0, user="<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC>")])
    assert "use one of switch, root, numa, none" in said(w, 1)


def test_a_vector_where_the_value_belongs_is_refused(probe_root):
    w = window([host(0, _probe_template(probe_root, ()))],
               [vm(1, user="<KVM_SRIOV_GPU_AFFINITY><A>switch</A></KVM_SRIOV_GPU_AFFINITY>")])
    assert "KVM_SRIOV_GPU_AFFINITY" in said(w, 1)


def test_more_pci_devices_than_deploy_pairs_is_refused_only_with_the_wish_and_ib_nics(probe_root):
    t = _probe_template(probe_root, ())
    w = window([host(0, t)], [vm(1, "switch", gpus=65)])
    assert 'KVM_SRIOV_GPU_AFFINITY = "switch": the domain passes through more than 64 PCI devices' in said(w, 1)
    for v in (vm(1, "none", gpus=65), vm(1, "switch", gpus=65, nics=0)):
        w = window([host(0, t)], [v])
        assert said(w, 1) == ""
    w = window([host(0, t)], [vm(1, "switch", gpus=5000)])     # read no further than that
    assert "more than 64" in said(w, 1)


def test_hostile_host_documents_are_bounded_and_never_crash_the_placer(probe_root):
    t = _probe_template(probe_root, ())
    junk = (
        # GPUs that are no address, PFs not in the pool, a list far too long, an ERROR vector
        "<KVM_SRIOV_GPU><ADDRESS>../../etc</ADDRESS><SWITCH_PFS>0000:0c:00.0</SWITCH_PFS></KVM_SRIOV_GPU>"
        f"<KVM_SRIOV_GPU><ADDRESS>0000:e1:00.0</ADDRESS><SWITCH_PFS>{'0000:ff:00.0,' * 20000}</SWITCH_PFS>"
        "</KVM_SRIOV_GPU><KVM_SRIOV_GPU><ADDRESS>0000:e2:00.0</ADDRESS><ERROR>x</ERROR></KVM_SRIOV_GPU>"
        "<KVM_SRIOV_GPU>plain text</KVM_SRIOV_GPU><KVM_SRIOV_PF>plain text</KVM_SRIOV_PF>"
        + "<KVM_SRIOV_GPU><ADDRESS>0000:e3:00.0</ADDRESS></KVM_SRIOV_GPU>" * 1000)
    pci = ("<PCI_DEVICES>" + "<PCI><ADDRESS>zz</ADDRESS><VENDOR>10de\n</VENDOR><VMID>many</VMID></PCI>" * 5000
           + pci_devices()[len("<PCI_DEVICES>"):])
    w = window([host(0, t + junk, pci)], [vm(1, "switch"), vm(2, "numa")])
    h = w.hosts[0]
    assert len(h.gpus) <= 64 and "0000:e1:00.0" in h.gpus and h.gpus["0000:e1:00.0"] == {}
    assert "0000:e2:00.0" not in h.gpus and len(h.pci) <= placement.MAX_PCI_DEVICES
    w.narrow()       # rank gets them, or each has its one-line reason
    assert all("\n" not in m for m in w.messages)
    # a plain value where the probe writes a vector, and the other way round
    odd = HostVfs.from_host_xml(ET.fromstring(
        "<TEMPLATE><KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION><KVM_SRIOV_GPU>x</KVM_SRIOV_GPU>"
        "<KVM_SRIOV_PF><ADDRESS>0000:0c:00.0</ADDRESS><FREE_VFS>2</FREE_VFS></KVM_SRIOV_PF>"
        "<KVM_SRIOV_PF>x</KVM_SRIOV_PF><KVM_SRIOV_VMS><A>1</A></KVM_SRIOV_VMS></TEMPLATE>"))
    assert odd.free == 2 and odd.gpus == {}


def test_hostile_pci_requests_are_bounded(probe_root):
    t = _probe_template(probe_root, ())
    weird = ("<PCI><VENDOR>" + "f" * 100000 + "</VENDOR></PCI>"
             "<PCI><SHORT_ADDRESS>" + "0" * 100000 + "</SHORT_ADDRESS></PCI>")
    w = window([host(0, t)], [vm(1, "switch", pci=weird)])
    need = vm_need(w.vms[1])
    assert all(len(x) <= placement.MAX_FIELD for r in need.pci for x in r)
    assert w.hosts[0].vm_gpus(need) is None and said(w, 1) == ""     # rank's to refuse: no such device


# -- the place program, end to end (a stand-in for rank: each VM on its first candidate) ---------
def test_the_place_program_sends_the_vm_where_it_pairs_and_books_its_rails(probe_root, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(FAKE_RANK)
    full, free = _probe_template(probe_root, ("0c", "12")), _probe_template(probe_root, ())
    doc = (f"<SCHEDULER_DRIVER_ACTION><VM_POOL>{vm(1, 'switch')}{vm(2, 'switch')}</VM_POOL><HOST_POOL>"
           f"{host(0, full)}{host(1, free)}</HOST_POOL><VNET_POOL/><REQUIREMENTS>"
           "<VM><ID>1</ID><HOSTS><ID>0</ID><ID>1</ID></HOSTS></VM><VM><ID>2</ID><HOSTS><ID>0</ID></HOSTS></VM>"
           "</REQUIREMENTS></SCHEDULER_DRIVER_ACTION>")
    err, ledger = Err(), tmp_path / "ledger.json"
    code, out = placement_program.run(base64.b64encode(doc.encode()), [sys.executable, str(script)],
                                      str(ledger), stderr=err)
    assert code == 0 and planned(out) == {1: 1}
    (line,) = err.lines
    assert line.startswith("ERROR: 2 Cannot dispatch VM: it needs 2 InfiniBand VFs switch-close to its GPUs")
    assert json.loads(ledger.read_text())["1"]["pfs"] == [addr("0c"), addr("12")]


# -- the placer's choice is deploy's, on the same host ----------------------------------------------
@pytest.mark.parametrize("held, gpus, nics, level", [
    ((), 8, 8, "switch"), ((), 2, 2, "switch"), ((), 2, 3, "switch"), ((), 1, 2, "root"),
    (("0c",), 2, 2, "switch"), (("0c", "12"), 2, 2, "switch"), (("0c", "12"), 2, 2, "numa"),
    (("0c", "12", "4b", "54"), 2, 2, "numa"), (("4b", "54", "8d", "94", "ba", "cc"), 4, 4, "switch"),
    (("12",), 4, 2, "root"),
])
def test_the_placer_chooses_what_deploy_chooses(probe_root, held, gpus, nics, level):
    """The placer's fit and booked PFs, from the probe's output, are deploy's
    (topology.vm_gpus on the tree + policy.choose on the real free VFs), or
    both refuse."""
    w = window([host(0, _probe_template(probe_root, held))], [vm(1, level, gpus=gpus, nics=nics)])
    try:
        placer_pfs = w.hosts[0].choose(vm_need(w.vms[1]))
    except DriverError:
        placer_pfs = None
    sysfs = Sysfs(Path(probe_root) / ("-".join(held) or "free") / "root")
    inventory = discover(sysfs)
    topo = vm_gpus(sysfs, [addr(b) for b in A100_GPUS[:gpus]], inventory.pfs)
    free = [vf for vf in inventory.eligible_vfs() if vf.pf[5:7] not in held]
    try:
        deploy_pfs = [vf.pf for vf in policy.choose(
            [policy.VfRequest(f"02:00:00:00:00:{n:02x}") for n in range(nics)], free,
            {pf.address: pf for pf in inventory.pfs}, None, "prefer", GpuWish(level, topo.gpus, topo.closeness))]
    except DriverError:
        deploy_pfs = None
    assert placer_pfs == deploy_pfs
