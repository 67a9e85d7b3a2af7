"""The placer and a tenant's template: per-VM options read by deploy's own
readers (what deploy would refuse stays PENDING with deploy's reason),
messages bounded whatever a template holds, and the hosts' shared-memory
budget (KVM_SRIOV_IVSHMEM_*) taken into account, a region once per group
per host."""

import io
import json
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov import opennebula
from kvm_sriov.scheduler.placement import HostVfs, Ledger
from kvm_sriov.scheduler.placement_program import Window
from tests.sched.test_placement import WINDOWS, requirements, window

OPTIONS = "xmlns:sriov='urn:kvm-sriov:metadata:1'"


def _one_nic_vm(w: Window) -> tuple[int, ET.Element]:
    return next((i, v) for i, v in w.vms.items() if v.findtext("NAME").startswith("one-nic"))


def _with(vm: ET.Element, user: str = "", template: str = "", raw: str = "") -> ET.Element:
    for text, where in ((user, "USER_TEMPLATE"), (template, "TEMPLATE")):
        for el in ET.fromstring(f"<x>{text}</x>"):
            vm.find(where).append(el)
    if raw:
        r = ET.SubElement(vm.find("TEMPLATE"), "RAW")
        ET.SubElement(r, "TYPE").text = "kvm"
        ET.SubElement(r, "DATA").text = raw
    return vm


def _placer(w: Window, vm_id: int) -> str:
    """The placer's word on the VM: '' when it goes to rank, else its message."""
    w.narrow()
    if vm_id in w.vms_in_input():
        assert vm_id in requirements(w.root)
        return ""
    return next(m for m in w.messages if m.startswith(f"ERROR: {vm_id} "))


# -- the placer and deploy read a VM's options alike -------------------------------------------
VARIANTS = {
    # name: (USER_TEMPLATE, TEMPLATE, RAW DATA, refused)
    "hpc-vector": ('<KVM_SRIOV_HPC><A>yes</A></KVM_SRIOV_HPC>', "", "", True),
    "numa-vector": ('<KVM_SRIOV_NUMA><X>require</X></KVM_SRIOV_NUMA>', "", "", True),
    "empty-user-hides-template": ("<KVM_SRIOV_HPC> </KVM_SRIOV_HPC>", "<KVM_SRIOV_HPC>maybe</KVM_SRIOV_HPC>",
                                  "", False),
    "empty-user-numa": ("<KVM_SRIOV_NUMA></KVM_SRIOV_NUMA>", "<KVM_SRIOV_NUMA>sideways</KVM_SRIOV_NUMA>",
                        "", False),
    "hpc-no": ("<KVM_SRIOV_HPC>No</KVM_SRIOV_HPC>", "", "", False),
    "raw-bad-hpc": ("", "", f"<metadata><sriov:options {OPTIONS} hpc='maybe'/></metadata>", True),
    "raw-twice": ("", "", f"<metadata><sriov:options {OPTIONS} numa='prefer'/>"
                          f"<sriov:options {OPTIONS} numa='ignore'/></metadata>", True),
    "raw-fine": ("", "", f"<metadata><sriov:options {OPTIONS} numa='ignore'/></metadata>", False),
    "ivshmem-no-group": ("<KVM_SRIOV_IVSHMEM><SIZE>64</SIZE></KVM_SRIOV_IVSHMEM>", "", "", True),
    "ivshmem-bad-size": ("<KVM_SRIOV_IVSHMEM><SIZE>100</SIZE></KVM_SRIOV_IVSHMEM>",
                         "<VMGROUP><VMGROUP_ID>7</VMGROUP_ID><ROLE>r</ROLE></VMGROUP>", "", True),
    "ivshmem-scalar": ("<KVM_SRIOV_IVSHMEM>64</KVM_SRIOV_IVSHMEM>",
                       "<VMGROUP><VMGROUP_ID>7</VMGROUP_ID><ROLE>r</ROLE></VMGROUP>", "", True),
    "vmgroup-above-int32": ("<KVM_SRIOV_IVSHMEM><SIZE>64</SIZE></KVM_SRIOV_IVSHMEM>",
                            "<VMGROUP><VMGROUP_ID>4294967296</VMGROUP_ID><ROLE>r</ROLE></VMGROUP>", "", True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_placer_refuses_what_deploy_refuses_with_its_reason(variant, fake_host, make_config, conn,
                                                               capsys, monkeypatch, tmp_path):
    from kvm_sriov.actions import main
    from kvm_sriov.node.host import Host
    from kvm_sriov.domain.hypervisor import Hypervisor
    from tests.support.stock_standin import StockOnTestDriver
    from tests.support.actions_in_process import deployment
    user, template, raw, refused = VARIANTS[variant]
    w = window(WINDOWS[0])
    vm_id, vm = _one_nic_vm(w)
    _with(vm, user, template, raw)
    said = _placer(w, vm_id)

    # deploy, with the same VM document as vm.xml and RAW where oned puts it
    dep = tmp_path / "datastores" / "0" / "42" / "deployment.0"
    dep.parent.mkdir(parents=True)
    ib = next(n for n in vm.iterfind("TEMPLATE/NIC") if n.findtext("BRIDGE") == "ib-sriov")
    ib.find("MAC").text = "02:00:0a:64:00:2a"   # the deployment file's NIC, as oned writes both
    (dep.parent / "vm.xml").write_text(ET.tostring(vm, encoding="unicode"))
    StockOnTestDriver(conn).install(monkeypatch)
    host = Host(make_config(fake_host["root"]), Hypervisor("test:///default"), remotes_dir=tmp_path / "r")
    code = main("deploy", [str(dep), "host1", "42", "host1"], host=host,
                stdin=io.StringIO(deployment().replace("</domain>", raw + "</domain>")))
    err = capsys.readouterr().err
    reason = opennebula.reason_from_stderr(err)
    assert (code == 1) is refused, err
    assert bool(said) is refused, said
    if refused:
        assert "internal error" not in reason
        assert reason.replace(str(dep.parent / "vm.xml"), "VM template") in said
        assert "stays PENDING" in said


def test_an_empty_user_template_value_is_no_value_in_both():
    """USER_TEMPLATE's element is the user's word, empty or not: TEMPLATE's
    is not read behind it (as deploy reads vm.xml)."""
    from kvm_sriov.scheduler.placement import vm_need
    w = window(WINDOWS[0])
    _, vm = _one_nic_vm(w)
    _with(vm, "<KVM_SRIOV_HPC></KVM_SRIOV_HPC>", "<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC>")
    assert vm_need(vm).numa_wish is None           # the host's default, as deploy


# -- messages are bounded ------------------------------------------------------------------------
def test_a_huge_pf_selector_is_not_echoed_into_sched_message():
    w = window(WINDOWS[0])
    vm_id, vm = _one_nic_vm(w)
    selector = "mlx5_" + "q" * 10000
    next(n for n in vm.iterfind("TEMPLATE/NIC") if n.findtext("BRIDGE") == "ib-sriov").find(
        "BRIDGE").text = f"ib-sriov:{selector}"
    said = _placer(w, vm_id)
    assert "no candidate host has PF mlx5_qqq" in said
    assert "q" * 100 not in said and len(said) < 800, len(said)


def test_a_huge_option_value_is_not_echoed_into_sched_message():
    w = window(WINDOWS[0])
    vm_id, vm = _one_nic_vm(w)
    _with(vm, f"<KVM_SRIOV_NUMA>{'z' * 100000}</KVM_SRIOV_NUMA>")
    said = _placer(w, vm_id)
    assert "KVM_SRIOV_NUMA" in said and "z" * 100 not in said and len(said) < 800


def test_every_placer_message_is_one_bounded_line():
    w = Window(b"<X><VM_POOL/><HOST_POOL/><VNET_POOL/><REQUIREMENTS/></X>", Ledger(None))
    w._message(3, "a\nb " + "c " * 5000)
    (line,) = w.messages
    assert "\n" not in line and line.startswith("ERROR: 3 a b c") and len(line) <= opennebula.MAX_MESSAGE + 10


# -- the shared-memory budget --------------------------------------------------------------------
REGION_7 = "kvm-sriov-ivshmem-u5-g7"


def _host(hid: int, shm=None, vms=(), free_vfs=None) -> str:
    t = "<KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION>"
    if free_vfs is not None:
        t += ("<KVM_SRIOV_PF><ADDRESS>0000:03:00.0</ADDRESS><NETDEV>ib0</NETDEV><VENDOR>15b3</VENDOR>"
              f"<DEVICE>101c</DEVICE><NUMA_NODE>0</NUMA_NODE><FREE_VFS>{free_vfs}</FREE_VFS></KVM_SRIOV_PF>")
    if shm is not None:
        largest, free, regions = shm
        t += (f"<KVM_SRIOV_IVSHMEM_MAX_REGION_MB>{largest}</KVM_SRIOV_IVSHMEM_MAX_REGION_MB>"
              f"<KVM_SRIOV_IVSHMEM_FREE_MB>{free}</KVM_SRIOV_IVSHMEM_FREE_MB>"
              f"<KVM_SRIOV_IVSHMEM_REGIONS>{' '.join(regions)}</KVM_SRIOV_IVSHMEM_REGIONS>")
    ids = "".join(f"<ID>{v}</ID>" for v in vms)
    return f"<HOST><ID>{hid}</ID><NAME>h{hid}</NAME><VMS>{ids}</VMS><TEMPLATE>{t}</TEMPLATE></HOST>"


def _vm(vid: int, group: int = 7, size: int = 64, vf: bool = False) -> str:
    nic = "<NIC><NIC_ID>0</NIC_ID><BRIDGE>ib-sriov</BRIDGE><MAC>02:00:00:00:00:01</MAC></NIC>" if vf else ""
    return (f"<VM><ID>{vid}</ID><UID>5</UID><NAME>vm{vid}</NAME><TEMPLATE><VMGROUP><VMGROUP_ID>{group}"
            f"</VMGROUP_ID><ROLE>ranks</ROLE></VMGROUP>{nic}</TEMPLATE><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>"
            f"<SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>")


def _window(hosts: list[str], vms: list[str], ledger: Ledger = None) -> Window:
    hids = "".join(f"<ID>{ET.fromstring(h).findtext('ID')}</ID>" for h in hosts)
    req = "".join(f"<VM><ID>{ET.fromstring(v).findtext('ID')}</ID><HOSTS>{hids}</HOSTS></VM>" for v in vms)
    doc = (f"<SCHEDULER_DRIVER_ACTION><VM_POOL>{''.join(vms)}</VM_POOL><HOST_POOL>{''.join(hosts)}"
           f"</HOST_POOL><VNET_POOL/><REQUIREMENTS>{req}</REQUIREMENTS></SCHEDULER_DRIVER_ACTION>")
    return Window(doc.encode(), ledger or Ledger(None), now=1000.0)


def _plan(*placed: tuple[int, int]) -> bytes:
    return ("<PLAN><ID>-1</ID>" + "".join(
        f"<ACTION><VM_ID>{v}</VM_ID><HOST_ID>{h}</HOST_ID><DS_ID>0</DS_ID><OPERATION>deploy</OPERATION>"
        "</ACTION>" for v, h in placed) + "</PLAN>").encode()


def _planned(plan: bytes) -> dict[int, int]:
    return {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(plan).iterfind("ACTION")}


def test_the_host_budget_comes_from_its_probe():
    attrs = {"KVM_SRIOV_VERSION": "1", "KVM_SRIOV_IVSHMEM_MAX_REGION_MB": "512",
             "KVM_SRIOV_IVSHMEM_FREE_MB": "300", "KVM_SRIOV_IVSHMEM_REGIONS": f"{REGION_7} kvm-sriov-ivshmem-u1-g2"}
    host = HostVfs.from_monitoring(attrs)
    assert (host.shm_max_region_mb, host.shm_free_mb, host.shm_regions) == (
        512, 300, {REGION_7, "kvm-sriov-ivshmem-u1-g2"})
    old = HostVfs.from_monitoring({"KVM_SRIOV_VERSION": "1"})
    assert not old.shm_reported


def test_a_host_without_room_keeps_the_vm_off_it_and_none_keeps_it_pending_with_the_reason():
    w = _window([_host(0, (128, 1000, [])), _host(1, (512, 100, []))], [_vm(1, size=256)])
    said = _placer(w, 1)
    assert "256 MB shared-memory region" in said and REGION_7 in said and "stays PENDING" in said
    assert "host 0: regions up to 128 MB" in said and "host 1: regions up to 512 MB, 100 MB free" in said
    w = _window([_host(0, (128, 1000, [])), _host(1, (512, 300, []))], [_vm(1, size=256)])
    assert _placer(w, 1) == "" and requirements(w.root) == {1: [1]}


def test_a_host_that_does_not_report_a_budget_is_not_filtered_on_it():
    w = _window([_host(0, (128, 0, [])), _host(1)], [_vm(1, size=256)])
    assert _placer(w, 1) == "" and requirements(w.root) == {1: [1]}


def test_the_groups_region_on_a_host_costs_nothing_more_there():
    w = _window([_host(0, (1024, 0, [REGION_7]))], [_vm(1, group=7, size=256), _vm(2, group=8, size=256)])
    w.narrow()
    assert w.vms_in_input() == [1]
    assert "0 MB free for new regions" in next(m for m in w.messages if m.startswith("ERROR: 2 "))
    w = _window([_host(0, (128, 1000, [REGION_7]))], [_vm(1, group=7, size=256)])
    assert "regions up to 128 MB" in _placer(w, 1)    # the largest region holds whatever is there


def test_one_window_books_a_region_once_per_group_per_host():
    ledger = Ledger(None)
    w = _window([_host(0, (1024, 100, []))], [_vm(1, group=7), _vm(2, group=7), _vm(3, group=8)], ledger)
    w.narrow()
    assert sorted(w.vms_in_input()) == [1, 2, 3]          # each fits alone
    plan = w.check_plan(_plan((1, 0), (2, 0), (3, 0)))
    assert _planned(plan) == {1: 0, 2: 0}                  # 64 MB once for group 7; 36 MB left
    (message,) = w.messages
    assert message.startswith("ERROR: 3 ") and "36 MB free for new regions" in message
    assert ledger.entries[1]["region"] == REGION_7 and ledger.entries[1]["region_mb"] == 64


def test_vfs_and_region_both_count_in_one_window():
    w = _window([_host(0, (1024, 100, []), free_vfs=1)], [_vm(1, group=7, vf=True), _vm(2, group=7, vf=True)])
    w.narrow()
    plan = w.check_plan(_plan((1, 0), (2, 0)))
    assert _planned(plan) == {1: 0} and "took the VFs" in w.messages[0]


def test_a_booked_region_holds_until_the_probe_lists_it():
    ledger = Ledger(None)
    w = _window([_host(0, (1024, 100, []))], [_vm(1, group=7)], ledger)
    w.narrow()
    w.check_plan(_plan((1, 0)))
    saved = json.loads(ledger.dumps())
    # the next window: VM 1 is on host 0, whose probe has not run since
    ledger = Ledger(None).loads(json.dumps(saved))
    w = _window([_host(0, (1024, 100, []), vms=[1])], [_vm(2, group=8)], ledger)
    assert "36 MB free for new regions" in _placer(w, 2)
    assert 1 in ledger.entries
    # the probe lists the region (and counts it in what is free): not subtracted twice
    ledger = Ledger(None).loads(json.dumps(saved))
    w = _window([_host(0, (1024, 36, [REGION_7]), vms=[1])], [_vm(2, group=7)], ledger)
    assert _placer(w, 2) == ""
    ledger = Ledger(None).loads(json.dumps(saved))
    w = _window([_host(0, (1024, 36, [REGION_7]), vms=[1])], [_vm(2, group=8)], ledger)
    assert "36 MB free for new regions" in _placer(w, 2)
