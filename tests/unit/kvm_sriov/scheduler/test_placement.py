"""The kvm-sriov placement policy on scheduler documents written by OpenNebula
7.4 itself (tests/sched/fixtures/, made by tests/sched/make_fixtures.py on a
real front-end: several VMs per window, multi-NIC VMs, a pinned PF, NUMA
wishes, hosts whose counts are stale because VMs were placed since their
last probe)."""

import base64
import errno
import io
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Optional
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov import opennebula
from kvm_sriov.domain import hpc_profile
from kvm_sriov.scheduler import placement, placement_program
from kvm_sriov.scheduler.placement import HostVfs, Ledger, VfNeed, vm_need
from kvm_sriov.scheduler.placement_program import Window
from tests.support.placement import FIXTURES, PLACE, WINDOWS, plan_actions, rank_place, requirements, window

def vm_names(w: Window) -> dict[int, str]:
    return {vid: vm.findtext("NAME") for vid, vm in w.vms.items()}


def test_there_are_fixtures():
    assert len(WINDOWS) >= 3, "tests/sched/fixtures is missing: run tests/sched/make_fixtures.py"


# -- replaying each window --------------------------------------------------------
@pytest.mark.parametrize("name", WINDOWS)
def test_narrowing_is_what_rank_got(name):
    w = window(name)
    w.narrow()
    if not (FIXTURES / name / "narrowed.xml").is_file():    # every VM left out: rank not run
        assert w.vms_in_input() == []
        return
    got = ET.fromstring((FIXTURES / name / "narrowed.xml").read_bytes())
    assert requirements(w.root) == requirements(got)
    assert sorted(w.vms_in_input()) == sorted(int(v.findtext("ID")) for v in got.iterfind("VM_POOL/VM"))


@pytest.mark.parametrize("name", [n for n in WINDOWS if (FIXTURES / n / "rank-plan.xml").is_file()])
def test_plan_check_is_what_oned_got(name):
    d = FIXTURES / name
    w = window(name)
    w.narrow()
    plan = w.check_plan((d / "rank-plan.xml").read_bytes())
    assert plan_actions(plan) == plan_actions((d / "plan.xml").read_bytes())
    assert "".join(m + "\n" for m in w.messages) == (d / "messages.txt").read_text()


@pytest.mark.parametrize("name", [n for n in WINDOWS if (FIXTURES / n / "plan.xml").is_file()])
def test_no_host_gets_more_vfs_than_it_has_free(name):
    """Whatever rank proposed: per host, per PF and per NUMA node (for the
    VMs that require one), what the final plan places fits what was free."""
    d = FIXTURES / name
    w = window(name)      # hosts after the ledger: the free VFs of this window
    free = {hid: HostVfs(h.pfs, h.vms, h.numa_policy) for hid, h in w.hosts.items()}
    for vm, hid in plan_actions((d / "plan.xml").read_bytes()).items():
        need = vm_need(w.vms[vm])
        if need.pfs:
            free[hid].take(free[hid].choose(need))   # raises if it does not fit
    assert all(p.free >= 0 for h in free.values() for p in h.pfs)


# -- what the scenarios show ---------------------------------------------------------
def _final(prefix: str) -> tuple[dict[int, str], dict[int, int], str]:
    names, placed, messages = {}, {}, ""
    for name in (n for n in WINDOWS if n.startswith(prefix)):
        w = window(name)
        names.update(vm_names(w))
        if (FIXTURES / name / "plan.xml").is_file():
            placed.update(plan_actions((FIXTURES / name / "plan.xml").read_bytes()))
        messages += (FIXTURES / name / "messages.txt").read_text()
    return names, placed, messages


def _host_ids(prefix: str) -> dict[str, int]:
    w = window(next(n for n in WINDOWS if n.startswith(prefix)))
    return {h.findtext("NAME").rsplit("-", 1)[-1]: int(h.findtext("ID")) for h in w.root.iterfind("HOST_POOL/HOST")}


def test_burst_places_no_more_vfs_than_free_and_leaves_the_rest_pending():
    names, placed, messages = _final("burst-")
    hosts = _host_ids("burst-")
    need = {vm: 2 if names[vm].startswith("two-nic") else 1 for vm in names}
    per_host = Counter()
    for vm, hid in placed.items():
        per_host[hid] += need[vm]
    capacity = {hosts["h1"]: 5, hosts["h2"]: 2, hosts["h3"]: 1}
    assert all(per_host[h] <= capacity[h] for h in per_host), (per_host, capacity)
    assert sum(need.values()) > sum(capacity.values())          # more asked than there is
    assert set(names) - set(placed)                              # some wait
    for name in (n for n in WINDOWS if n.startswith("burst-") and (FIXTURES / n / "rank-plan.xml").is_file()):
        dropped = set(plan_actions((FIXTURES / name / "rank-plan.xml").read_bytes())) - set(
            plan_actions((FIXTURES / name / "plan.xml").read_bytes()))
        for vm in dropped:                                       # each with the reason
            assert re.search(rf"^ERROR: {vm} Cannot dispatch VM to host \d+ in this window: .*kvm-sriov",
                             (FIXTURES / name / "messages.txt").read_text(), re.M)


def test_pinned_pf_and_numa_require_go_where_they_can():
    names, placed, messages = _final("shapes-")
    h1 = _host_ids("shapes-")["h1"]
    pinned = [vm for vm, n in names.items() if n.startswith("pinned")]
    # only h1 has ib1, with 2 VFs: two of the three pinned VMs get them, the third waits
    assert sorted(placed.get(vm) for vm in pinned if vm in placed) == [h1, h1]
    late = [vm for vm in pinned if vm not in placed]
    assert len(late) == 1 and re.search(rf"^ERROR: {late[0]} .*1 on PF ib1", messages, re.M)
    numa = next(vm for vm, n in names.items() if n.startswith("numa-require"))
    assert placed.get(numa, h1) == h1        # 3 VFs on one node: only h1's node 0 has them
    too_big = next(vm for vm, n in names.items() if n.startswith("too-big"))
    assert too_big not in placed
    assert re.search(rf"^ERROR: {too_big} Cannot dispatch VM: it needs 6 InfiniBand VFs", messages, re.M)


# -- the pieces, on the fixtures' own VM and host elements --------------------------------
def _some_window_with(prefix: str) -> Window:
    for name in WINDOWS:
        w = window(name)
        if any(n.startswith(prefix) for n in vm_names(w).values()):
            return w
    pytest.fail(f"no fixture window has a {prefix} VM")


@pytest.mark.parametrize("prefix,expected", [
    ("one-nic", VfNeed((None,), None, None)),          # HPC: the host's default
    ("two-nic", VfNeed((None, None), None, None)),
    ("pinned", VfNeed(("ib1",), None, None)),
    ("numa-require", VfNeed((None, None, None), True, "require")),
    ("hpc-prefer", VfNeed((None,), True, None)),
])
def test_what_a_vm_needs(prefix, expected):
    w = _some_window_with(prefix)
    vm = next(v for v in w.vms.values() if v.findtext("NAME").startswith(prefix))
    assert vm_need(vm) == expected


def test_host_counts_come_from_the_probe_in_the_host_template():
    w = window(WINDOWS[0])
    hosts = _host_ids(WINDOWS[0].rsplit("-", 1)[0] + "-")
    h1 = HostVfs.from_host_xml(next(h for h in w.root.iterfind("HOST_POOL/HOST")
                                    if int(h.findtext("ID")) == hosts["h1"]).find("TEMPLATE"))
    assert {(p.netdevs, p.numa_node) for p in h1.pfs} == {(("ib0",), 0), (("ib1",), 1)}
    assert h1.reported and h1.numa_policy == "prefer"


def test_a_host_without_the_probe_takes_no_vf_vm():
    host = HostVfs.from_host_xml(ET.fromstring("<TEMPLATE><CPUSPEED>1</CPUSPEED></TEMPLATE>"))
    assert not host.reported and not host.fits(VfNeed((None,)))
    assert host.fits(VfNeed(()))


def _one_pf_host(free: int, vms=()) -> HostVfs:
    return HostVfs([placement.PfCount("0000:03:00.0", ("ib0",), ("mlx5_0",), None, "15b3", "1017", 0, free)], vms)


def test_ledger_subtracts_bookings_the_probe_does_not_count():
    host = _one_pf_host(3)
    ledger = Ledger(None)
    ledger.book(7, 0, ["0000:03:00.0", "0000:03:00.0"], now=100.0)
    ledger.apply({0: host}, {0: frozenset({7})}, frozenset())      # on the host, not probed yet
    assert host.free == 1 and 7 in ledger.entries
    shown = _one_pf_host(1, vms=[7])
    ledger.apply({0: shown}, {0: frozenset({7})}, frozenset())
    assert shown.free == 1                                         # the probe counts it now


def test_a_failed_deploy_keeps_its_vfs_after_a_probe_counted_them():
    """A probe ran while deploy held the VF; the deploy then failed (BOOT_FAILURE)
    and gave it back. The VM is still oned's on that host, and recover or resume
    deploys it there again: the VF stays booked, so no other VM is placed on it."""
    ledger = Ledger(None)
    ledger.book(7, 0, ["0000:03:00.0"], now=100.0)
    ledger.apply({0: _one_pf_host(0, vms=[7])}, {0: frozenset({7})}, frozenset())
    after = _one_pf_host(1)                                        # VF given back, VM not counted
    ledger.apply({0: after}, {0: frozenset({7})}, frozenset())
    assert after.free == 0 and 7 in ledger.entries
    ledger.apply({0: _one_pf_host(1)}, {0: frozenset()}, frozenset())   # recover --delete
    assert not ledger.entries


def test_a_vm_without_vfs_or_region_is_not_booked():
    ledger = Ledger(None)
    ledger.book(9, 0, [], now=100.0)
    assert not ledger.entries


def test_ledger_forgets_vms_that_left_the_host():
    host = _one_pf_host(2)
    ledger = Ledger(None)
    ledger.book(7, 0, ["0000:03:00.0"], now=100.0)
    ledger.apply({0: host}, {0: frozenset()}, frozenset())         # deleted, or failed and gone
    assert host.free == 2 and not ledger.entries


def test_a_vm_pending_again_loses_its_booking():
    """oned refused its plan (another was applying) or has not deployed it
    yet (then it refuses this window's plan too): it is placed anew."""
    host = _one_pf_host(2)
    ledger = Ledger(None)
    ledger.book(8, 0, ["0000:03:00.0"], now=1000.0)
    ledger.apply({0: host}, {0: frozenset()}, frozenset({8}))
    assert host.free == 2 and not ledger.entries


# -- the whole program, with the real rank placer ----------------------------------------
@pytest.mark.parametrize("name", [n for n in WINDOWS if (FIXTURES / n / "plan.xml").is_file()])
def test_place_program_with_real_rank(name, tmp_path):
    """one_sched's call: base64 document on stdin, plan on stdout, VM messages on stderr."""
    prefix = rank_place()
    d = FIXTURES / name
    loc = tmp_path / "one"
    (loc / "etc" / "schedulers").mkdir(parents=True)
    (loc / "var").mkdir()
    rank_conf = (prefix / "etc" / "schedulers" / "rank.conf").read_text()
    (loc / "etc" / "schedulers" / "rank.conf").write_text(re.sub(r"(?m)^MAX_HOST\s*=.*$", "MAX_HOST = 4", rank_conf))
    ledger = loc / "var" / "kvm-sriov-placement.json"
    # the program runs now, the window ran then: bookings keep their age
    shift = time.time() - float((d / "time.txt").read_text())
    entries = json.loads((d / "ledger.json").read_text())
    ledger.write_text(json.dumps({vm: dict(e, time=e["time"] + shift) for vm, e in entries.items()}))
    env = dict(os.environ, ONE_LOCATION=str(loc),
               KVM_SRIOV_RANK_PLACE=str(prefix / "var" / "remotes" / "scheduler" / "rank" / "place"))
    done = subprocess.run([str(PLACE)], input=base64.b64encode((d / "input.xml").read_bytes()) + b"\n",
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert plan_actions(done.stdout) == plan_actions((d / "plan.xml").read_bytes())
    ours = [line for line in done.stderr.decode().splitlines() if "kvm-sriov" in line]
    assert ours == [m for m in (d / "messages.txt").read_text().splitlines()]
    assert json.loads(ledger.read_text()) is not None


# -- per-VM options as template attributes (USER_TEMPLATE, where oned keeps them) ----------
def _fixture_vm(prefix: str) -> ET.Element:
    """A copy of a VM element of a real scheduler document."""
    w = _some_window_with(prefix)
    vm = next(v for v in w.vms.values() if v.findtext("NAME").startswith(prefix))
    return ET.fromstring(ET.tostring(vm))


def _set_user_attribute(vm: ET.Element, name: str, value: str) -> ET.Element:
    # the real document carries KVM_SRIOV_HPC of the hpc-prefer template here (fixtures)
    ET.SubElement(vm.find("USER_TEMPLATE"), name).text = value
    return vm


def test_the_hpc_attribute_is_read_where_oned_puts_it():
    vm = _fixture_vm("hpc-prefer")
    assert vm.findtext("USER_TEMPLATE/KVM_SRIOV_HPC") == "YES" and vm.find("TEMPLATE/KVM_SRIOV_HPC") is None
    assert vm_need(vm).numa_wish is True


@pytest.mark.parametrize("value,expected", [("require", "require"), ("Prefer", "prefer"),
                                            ("ignore", "ignore"), ("", None)])  # "sideways": refused, below
def test_the_numa_attribute_is_the_vms_numa_policy(value, expected):
    vm = _set_user_attribute(_fixture_vm("hpc-prefer"), hpc_profile.NUMA_ATTRIBUTE, value)
    assert vm_need(vm) == VfNeed((None,), True, expected)


def test_numa_attribute_require_keeps_a_vm_off_hosts_without_its_vfs_on_one_node():
    vm = _set_user_attribute(_fixture_vm("hpc-prefer"), hpc_profile.NUMA_ATTRIBUTE, "require")
    two_nodes = HostVfs([placement.PfCount("0000:03:00.0", ("ib0",), ("mlx5_0",), None, "15b3", "101c", 0, 1),
                         placement.PfCount("0000:81:00.0", ("ib1",), ("mlx5_1",), None, "15b3", "101c", 1, 1)])
    need = vm_need(vm)._replace(pfs=(None, None))       # two VF NICs: one free on each node
    assert not two_nodes.fits(need)
    assert two_nodes.fits(need._replace(numa_policy="prefer"))


def test_attributes_win_over_raw_options():
    vm = _fixture_vm("numa-require")              # RAW <sriov:options hpc='yes' numa='require'/>
    assert vm_need(vm).numa_policy == "require"
    _set_user_attribute(vm, hpc_profile.NUMA_ATTRIBUTE, "prefer")
    _set_user_attribute(vm, hpc_profile.HPC_ATTRIBUTE, "NO")
    assert vm_need(vm) == VfNeed((None, None, None), False, "prefer")


def test_a_vm_that_does_not_choose_gets_the_hosts_hpc_profile():
    vm = _fixture_vm("two-nic")
    need = vm_need(vm)
    assert need.numa_wish is None
    pfs = [placement.PfCount("0000:03:00.0", ("ib0",), ("mlx5_0",), None, "15b3", "101c", 0, 1),
           placement.PfCount("0000:81:00.0", ("ib1",), ("mlx5_1",), None, "15b3", "101c", 1, 1)]
    assert HostVfs(pfs, numa_policy="require").fits(need)                       # no HPC: any node
    assert not HostVfs(pfs, numa_policy="require", hpc_profile=True).fits(need)  # HPC: one node
    _set_user_attribute(vm, hpc_profile.HPC_ATTRIBUTE, "no")
    assert HostVfs(pfs, numa_policy="require", hpc_profile=True).fits(vm_need(vm))


def test_the_hosts_hpc_profile_comes_from_its_probe():
    attrs = {"KVM_SRIOV_VERSION": "1", "KVM_SRIOV_HPC_PROFILE": "YES"}
    assert HostVfs.from_monitoring(attrs).hpc_profile is True
    assert HostVfs.from_monitoring({"KVM_SRIOV_VERSION": "1"}).hpc_profile is False   # an older probe


@pytest.mark.parametrize("profile,shown", [(False, "NO"), (True, "YES")])
def test_the_probe_reports_the_hosts_hpc_profile(fake_host, make_config, profile, shown):
    import io
    from kvm_sriov.node import probe
    out = io.StringIO()
    probe.report(make_config(fake_host["root"], hpc={"profile": profile}), out)
    assert f'KVM_SRIOV_HPC_PROFILE = "{shown}"' in out.getvalue().splitlines()


@pytest.mark.parametrize("name,value", [(hpc_profile.NUMA_ATTRIBUTE, "sideways"), (hpc_profile.HPC_ATTRIBUTE, "maybe")])
def test_a_vm_with_an_option_deploy_would_refuse_stays_pending_with_the_reason(name, value):
    w = _some_window_with("one-nic")
    vm_id, vm = next((i, v) for i, v in w.vms.items() if v.findtext("NAME").startswith("one-nic"))
    ET.SubElement(vm.find("USER_TEMPLATE"), name).text = value
    assert placement.option_problem(vm)
    w.narrow()
    assert vm_id not in w.vms_in_input() and vm_id not in requirements(w.root)
    message = next(m for m in w.messages if m.startswith(f"ERROR: {vm_id} "))
    assert f'{name} = "{value}"' in message and "kvm-sriov" in message and "stays PENDING" in message
    others = [i for i, v in w.vms.items() if i != vm_id]
    assert all(placement.option_problem(w.vms[i]) is None for i in others)


# ======================================================================================
# The placer and a tenant's template: per-VM options read by deploy's own readers (what
# deploy would refuse stays PENDING with deploy's reason), messages bounded whatever a
# template holds, and the hosts' shared-memory budget (KVM_SRIOV_IVSHMEM_*) taken into
# account, a region once per group per host.

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


# ======================================================================================
# The placer's ledger (placement.Ledger: bookings kept between scheduling windows) is a
# hint: a ledger file of the wrong shape is ignored with one logged line, a save that
# fails (a full disk, a folder it may not write) is logged, and in both cases the
# window's placement is still answered.

# rank's stand-in: every VM it is asked about goes to its first candidate host
FAKE_RANK = r'''
import base64, sys
from xml.etree import ElementTree as ET
doc = ET.fromstring(base64.b64decode(sys.stdin.buffer.read().strip()))
out = ["<PLAN><ID>-1</ID>"]
for vm in doc.iterfind("REQUIREMENTS/VM"):
    out.append(f"<ACTION><VM_ID>{vm.findtext('ID')}</VM_ID><HOST_ID>{vm.findtext('HOSTS/ID')}</HOST_ID>"
               "<DS_ID>0</DS_ID><OPERATION>deploy</OPERATION></ACTION>")
print("".join(out) + "</PLAN>")
'''

HOST = ("<HOST><ID>0</ID><NAME>h0</NAME><VMS/><TEMPLATE><KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION>"
        "<KVM_SRIOV_PF><ADDRESS>0000:03:00.0</ADDRESS><NETDEV>ib0</NETDEV><VENDOR>15b3</VENDOR><DEVICE>101c"
        "</DEVICE><NUMA_NODE>0</NUMA_NODE><FREE_VFS>2</FREE_VFS></KVM_SRIOV_PF></TEMPLATE></HOST>")
VM = ("<VM><ID>7</ID><UID>5</UID><NAME>vm7</NAME><STATE>1</STATE><TEMPLATE><NIC><NIC_ID>0</NIC_ID>"
      "<BRIDGE>ib-sriov</BRIDGE><MAC>02:00:00:00:00:01</MAC></NIC></TEMPLATE><USER_TEMPLATE/></VM>")
DOC = (f"<SCHEDULER_DRIVER_ACTION><VM_POOL>{VM}</VM_POOL><HOST_POOL>{HOST}</HOST_POOL><VNET_POOL/>"
       "<REQUIREMENTS><VM><ID>7</ID><HOSTS><ID>0</ID></HOSTS></VM></REQUIREMENTS></SCHEDULER_DRIVER_ACTION>")
GOOD = {"7": {"host": 0, "pfs": ["0000:03:00.0"], "time": 1000.0}}

BOOKING = {"host": 0, "pfs": ["0000:03:00.0"], "time": 1000.0}
BAD_LEDGERS = {
    # wrong shapes
    "list": "[]",
    "list-of-bookings": json.dumps([BOOKING]),
    "null": "null",
    "string": '"ledger"',
    "number": "1",
    # an object of wrong types
    "booking-a-string": '{"3": "host 0"}',
    "booking-a-list": '{"3": [0, ["0000:03:00.0"]]}',
    "vm-not-a-number": json.dumps({"three": BOOKING}),
    "vm-negative": json.dumps({"-3": BOOKING}),
    "vm-unicode-digits": json.dumps({"\u0663": BOOKING}),
    "host-a-string": json.dumps({"3": dict(BOOKING, host="0")}),
    "host-a-bool": json.dumps({"3": dict(BOOKING, host=True)}),
    "host-missing": json.dumps({"3": {"pfs": [], "time": 1000.0}}),
    "pfs-a-number": json.dumps({"3": dict(BOOKING, pfs=5)}),
    "pfs-a-string": json.dumps({"3": dict(BOOKING, pfs="0000:03:00.0")}),
    "pfs-of-lists": json.dumps({"3": dict(BOOKING, pfs=[["0000:03:00.0"]])}),
    "time-a-string": json.dumps({"3": dict(BOOKING, time="now")}),
    "region-a-list": json.dumps({"3": dict(BOOKING, region=["kvm-sriov-ivshmem-u5-g7"], region_mb=4)}),
    "region-not-a-region": json.dumps({"3": dict(BOOKING, region="../../etc", region_mb=4)}),
    "region-mb-a-string": json.dumps({"3": dict(BOOKING, region="kvm-sriov-ivshmem-u5-g7", region_mb="4")}),
    # huge numbers
    "vm-huge": json.dumps({"9" * 30: BOOKING}),
    "vm-4301-digits": json.dumps({"9" * 4301: BOOKING}),
    "host-huge": json.dumps({"3": dict(BOOKING, host=10 ** 30)}),
    "host-4301-digits": '{"3": {"host": ' + "9" * 4301 + ', "pfs": [], "time": 1000.0}}',
    "host-infinite": '{"3": {"host": 1e999, "pfs": [], "time": 1000.0}}',
    "time-infinite": '{"3": {"host": 0, "pfs": [], "time": 1e999}}',
    "time-nan": '{"3": {"host": 0, "pfs": [], "time": NaN}}',
    "time-huge": json.dumps({"3": dict(BOOKING, time=10 ** 30)}),
    "region-mb-huge": json.dumps({"3": dict(BOOKING, region="kvm-sriov-ivshmem-u5-g7", region_mb=10 ** 30)}),
    # not JSON
    "empty": "",
    "truncated": json.dumps(GOOD)[:-3],
    "text": "kvm-sriov ledger v1\n7 0 0000:03:00.0\n",
    "binary": b"\xff\xfe\x00\x01\x80garbage",
    "nested-too-deep": "[" * 100000 + "]" * 100000,
}


@pytest.fixture
def rank(tmp_path) -> list[str]:
    script = tmp_path / "rank.py"
    script.write_text(FAKE_RANK)
    return [sys.executable, str(script)]


class Err:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += text.splitlines()

    def warnings(self) -> list[str]:
        return [line for line in self.lines if line.startswith("WARN:")]


def place(rank, ledger_path) -> tuple[int, dict[int, int], Err]:
    err = Err()
    code, out = placement_program.run(base64.b64encode(DOC.encode()), rank,
                                      str(ledger_path) if ledger_path else None, stderr=err)
    plan = {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(out).iterfind("ACTION")}
    return code, plan, err


@pytest.mark.parametrize("name", BAD_LEDGERS)
def test_a_ledger_of_the_wrong_shape_is_ignored_with_one_line_and_the_window_is_answered(name, rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    content = BAD_LEDGERS[name]
    ledger.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}, err.lines
    (line,) = err.warnings()
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} ignored (") and len(line) < 2100
    assert err.lines == [line]                   # one line, and no VM message
    saved = json.loads(ledger.read_text())       # rewritten with this window's booking
    assert set(saved) == {"7"} and (saved["7"]["host"], saved["7"]["pfs"]) == (0, ["0000:03:00.0"])


def test_a_good_ledger_says_nothing_and_a_missing_one_neither(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and err.lines == []
    assert set(json.loads(ledger.read_text())) == {"7"}
    code, plan, err = place(rank, ledger)    # 7 is pending again: its booking goes, it is placed anew
    assert code == 0 and plan == {7: 0} and err.lines == []


def test_a_ledger_larger_than_any_of_ours_is_ignored(rank, tmp_path, monkeypatch):
    monkeypatch.setattr(Ledger, "MAX_BYTES", 64)
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text(json.dumps({str(i): BOOKING for i in range(10)}))
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and "larger than" in err.warnings()[0] and len(err.lines) == 1


def test_a_ledger_that_cannot_be_read_is_ignored_with_one_line(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.mkdir()                                # EISDIR: read fails (root reads any mode)
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    assert err.lines == err.warnings() and len(err.lines) == 2   # not read, not saved
    assert "ignored (Is a directory)" in err.lines[0] and "not saved" in err.lines[1]


def test_a_save_to_a_full_disk_is_logged_and_the_window_answered(rank, tmp_path, monkeypatch):
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text(json.dumps({"3": BOOKING}))
    fdopen = os.fdopen

    def onto_a_full_disk(fd, *args, **kwargs):   # the new file's writes: ENOSPC, as on a full disk
        os.close(fd)
        return fdopen(os.open("/dev/full", os.O_WRONLY), *args, **kwargs)
    monkeypatch.setattr(os, "fdopen", onto_a_full_disk)
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    (line,) = err.lines
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} not saved (No space left on device)")
    assert json.loads(ledger.read_text()) == {"3": BOOKING}          # the old ledger, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ledger.name, f"{ledger.name}.lock", "rank.py"])


def test_a_link_planted_beside_the_ledger_is_neither_written_through_nor_removed(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    os.symlink(victim, f"{ledger}.tmp")     # the name the save used before it made its own
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and err.lines == []
    assert victim.read_text() == "victim's\n" and os.readlink(f"{ledger}.tmp") == str(victim)
    assert set(json.loads(ledger.read_text())) == {"7"}


def test_a_save_whose_write_raises_enospc_is_logged(rank, tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "replace", full)
    ledger = tmp_path / "kvm-sriov-placement.json"
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and "not saved (No space left on device)" in err.lines[0]
    assert not ledger.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{ledger.name}.lock", "rank.py"])


def test_a_folder_the_ledger_cannot_be_in_costs_the_window_nothing(rank, tmp_path):
    ledger = tmp_path / "gone" / "kvm-sriov-placement.json"    # no lock, no ledger, no save there
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    (line,) = err.lines
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} not used in this window")
    assert not ledger.parent.exists()


def test_the_place_program_answers_whatever_its_ledger_holds(tmp_path):
    """one_sched's call: exit 0 and the plan on stdout; the line reaches oned as a log line
    without a VM (DriverExecHelper: WARN: <text>)."""
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text("[1, 2, 3]")
    fake = tmp_path / "rank-place"
    fake.write_text(f"#!{sys.executable}\n{FAKE_RANK}")
    fake.chmod(0o755)
    env = dict(os.environ, KVM_SRIOV_PLACEMENT_LEDGER=str(ledger), KVM_SRIOV_RANK_PLACE=str(fake))
    done = subprocess.run([str(PLACE)], input=base64.b64encode(DOC.encode()) + b"\n", capture_output=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"<VM_ID>7</VM_ID>" in done.stdout
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("WARN: kvm-sriov place: placement ledger") and "JSON list" in line


# ======================================================================================
# The placer and a host's per-owner shared-memory share (the probe's
# KVM_SRIOV_IVSHMEM_MAX_OWNER_MB and KVM_SRIOV_IVSHMEM_OWNERS_MB, docs/ivshmem.md): a VM
# whose owner's regions already take its share of a host is not placed there, with the
# reason, while another tenant's VM is; bookings of this window and earlier ones count
# for the owner too.

A, B = 3, 5     # two tenants' uids


def region(uid: int, group: int) -> str:
    return f"kvm-sriov-ivshmem-u{uid}-g{group}"


def host(hid: int, free_mb: int, regions: list[str], owners: Optional[dict[int, int]], vms=()) -> str:
    t = ("<KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION><KVM_SRIOV_IVSHMEM_MAX_REGION_MB>1024"
         f"</KVM_SRIOV_IVSHMEM_MAX_REGION_MB><KVM_SRIOV_IVSHMEM_FREE_MB>{free_mb}</KVM_SRIOV_IVSHMEM_FREE_MB>"
         f"<KVM_SRIOV_IVSHMEM_REGIONS>{' '.join(regions)}</KVM_SRIOV_IVSHMEM_REGIONS>")
    if owners is not None:
        t += ("<KVM_SRIOV_IVSHMEM_MAX_OWNER_MB>32</KVM_SRIOV_IVSHMEM_MAX_OWNER_MB><KVM_SRIOV_IVSHMEM_OWNERS_MB>"
              + " ".join(f"{u}:{mb}" for u, mb in owners.items()) + "</KVM_SRIOV_IVSHMEM_OWNERS_MB>")
    ids = "".join(f"<ID>{v}</ID>" for v in vms)
    return f"<HOST><ID>{hid}</ID><NAME>h{hid}</NAME><VMS>{ids}</VMS><TEMPLATE>{t}</TEMPLATE></HOST>"


def vm(vid: int, uid: int, group: int, size: int = 1) -> str:
    return (f"<VM><ID>{vid}</ID><UID>{uid}</UID><NAME>vm{vid}</NAME><TEMPLATE><VMGROUP><VMGROUP_ID>{group}"
            f"</VMGROUP_ID><ROLE>ranks</ROLE></VMGROUP></TEMPLATE><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>"
            f"<SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>")


# host 0: 64 MB budget, tenant A's two groups take its whole 32 MB share
FULL_FOR_A = dict(free_mb=32, regions=[region(A, 1), region(A, 2)], owners={A: 32})


def test_the_owners_share_comes_from_the_probe():
    h = HostVfs.from_monitoring({"KVM_SRIOV_VERSION": "1", "KVM_SRIOV_IVSHMEM_MAX_OWNER_MB": "32",
                                 "KVM_SRIOV_IVSHMEM_OWNERS_MB": "3:32 5:1 x:4 6: :7 7:-3 8:9:9 " + "9" * 5000 + ":1"})
    assert h.shm_reported and h.shm_max_owner_mb == 32
    assert h.shm_owner_mb == {3: 32, 5: 1, 6: 0, 7: 0, 8: 0}


def test_a_tenant_whose_share_is_full_stays_off_the_host_and_another_tenants_vm_goes_there():
    w = _window([host(0, **FULL_FOR_A)], [vm(1, A, 3), vm(2, B, 1)])
    said = _placer(w, 1)
    assert said.startswith("ERROR: 1 Cannot dispatch VM: it needs a 1 MB shared-memory region")
    assert f"no candidate host has room for region {region(A, 3)}" in said
    assert "host 0: regions up to 1024 MB, 32 MB free for new regions, 32 of 32 MB per owner in use by uid 3" in said
    assert "stays PENDING" in said
    assert w.vms_in_input() == [2] and requirements(w.root) == {2: [0]}
    assert _planned(w.check_plan(_plan((2, 0)))) == {2: 0}


def test_the_placer_sends_a_tenant_to_the_host_where_its_share_has_room():
    w = _window([host(0, **FULL_FOR_A), host(1, free_mb=64, regions=[], owners={})], [vm(1, A, 3), vm(2, B, 1)])
    w.narrow()
    assert requirements(w.root) == {1: [1], 2: [0, 1]}
    # joining A's group region on host 0 costs nothing, its share full or not
    w = _window([host(0, **FULL_FOR_A)], [vm(1, A, 1, size=16)])
    assert _placer(w, 1) == ""


def test_one_window_counts_the_owners_share_in_plan_order():
    ledger = Ledger(None)
    w = _window([host(0, free_mb=64, regions=[region(A, 1)], owners={A: 16})],
                [vm(1, A, 2, size=16), vm(2, A, 3, size=16), vm(3, B, 1, size=16)], ledger)
    w.narrow()
    assert sorted(w.vms_in_input()) == [1, 2, 3]        # each fits alone
    assert _planned(w.check_plan(_plan((1, 0), (2, 0), (3, 0)))) == {1: 0, 3: 0}
    (message,) = w.messages
    assert message.startswith("ERROR: 2 ") and "took the shared memory" in message
    assert "32 of 32 MB per owner in use by uid 3" in message


def test_a_booked_region_counts_for_its_owner_until_the_probe_lists_it():
    ledger = Ledger(None)
    w = _window([host(0, free_mb=64, regions=[], owners={})], [vm(1, A, 1, size=32)], ledger)
    w.narrow()
    w.check_plan(_plan((1, 0)))
    saved = ledger.dumps()
    # next window: VM 1 is on host 0, whose probe has not run since
    w = _window([host(0, free_mb=64, regions=[], owners={}, vms=[1])], [vm(2, A, 2), vm(3, B, 2)],
                Ledger(None).loads(saved))
    assert "32 of 32 MB per owner in use by uid 3" in _placer(w, 2) and _placer(w, 3) == ""
    # the probe lists the region and counts it for A: not counted twice
    w = _window([host(0, free_mb=32, regions=[region(A, 1)], owners={A: 32}, vms=[1])], [vm(2, A, 1)],
                Ledger(None).loads(saved))
    assert _placer(w, 2) == ""
    assert json.loads(saved)["1"]["region"] == region(A, 1)


def test_a_host_whose_probe_reports_no_owner_share_is_not_filtered_on_it():
    w = _window([host(0, free_mb=64, regions=[region(A, 1), region(A, 2)], owners=None)], [vm(1, A, 3)])
    assert _placer(w, 1) == ""


# -- whole PFs (BRIDGE = "ib-pf"): counted apart from the VFs -----------------------------------
def _pf_host(hid: int, pfs, vms=()) -> str:
    """pfs: (address, netdev, NUMA node, free VFs, enabled VFs, WHOLE_FREE or None: an older probe)."""
    t = "<KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION>"
    for address, netdev, node, free, enabled, whole in pfs:
        t += (f"<KVM_SRIOV_PF><ADDRESS>{address}</ADDRESS><NETDEV>{netdev}</NETDEV><VENDOR>15b3</VENDOR>"
              f"<DEVICE>101b</DEVICE><NUMA_NODE>{node}</NUMA_NODE><FREE_VFS>{free}</FREE_VFS>"
              f"<ENABLED_VFS>{enabled}</ENABLED_VFS>"
              + (f"<WHOLE_FREE>{whole}</WHOLE_FREE>" if whole is not None else "") + "</KVM_SRIOV_PF>")
    ids = "".join(f"<ID>{v}</ID>" for v in vms)
    return f"<HOST><ID>{hid}</ID><NAME>h{hid}</NAME><VMS>{ids}</VMS><TEMPLATE>{t}</TEMPLATE></HOST>"


def _pf_vm(vid: int, *bridges: str) -> str:
    nics = "".join(f"<NIC><NIC_ID>{i}</NIC_ID><BRIDGE>{b}</BRIDGE><MAC>02:00:00:00:{vid:02x}:{i:02x}</MAC></NIC>"
                   for i, b in enumerate(bridges))
    return f"<VM><ID>{vid}</ID><UID>5</UID><NAME>vm{vid}</NAME><TEMPLATE>{nics}</TEMPLATE></VM>"


def test_a_whole_pf_nic_is_counted_apart_from_the_vf_nics():
    vm = ET.fromstring(_pf_vm(1, "ib-sriov", "ib-pf", "ib-pf:ib1", "br0"))
    need = vm_need(vm)
    assert (need.pfs, need.whole, need.ib) == ((None,), (None, "ib1"), True)
    assert need.describe() == "1 InfiniBand VF and 2 whole InfiniBand PFs (1 of PF ib1)"
    assert vm_need(ET.fromstring(_pf_vm(2, "ib-pf"))).describe() == "1 whole InfiniBand PF"
    assert not vm_need(ET.fromstring(_pf_vm(3, "br0"))).ib


def test_a_vm_asking_for_whole_pfs_goes_only_where_that_many_are_free():
    hosts = [_pf_host(0, [("0000:03:00.0", "ib0", 0, 4, 4, "NO"), ("0000:04:00.0", "ib1", 0, 4, 4, "YES")]),
             _pf_host(1, [("0000:03:00.0", "ib0", 0, 4, 4, "YES"), ("0000:04:00.0", "ib1", 0, 2, 2, "YES")])]
    w = _window(hosts, [_pf_vm(1, "ib-pf", "ib-pf")])
    assert _placer(w, 1) == "" and requirements(w.root) == {1: [1]}
    w = _window(hosts, [_pf_vm(1, "ib-pf", "ib-pf", "ib-pf")])
    said = _placer(w, 1)
    assert said.startswith("ERROR: 1 Cannot dispatch VM: it needs 3 whole InfiniBand PFs, no candidate host "
                           "has 3 PFs free whole (kvm-sriov). PFs: host 1: 2 of 2 PFs free whole (ib0, ib1); "
                           "host 0: 1 of 2 PFs free whole (ib1).")
    assert "stays PENDING" in said and "KVM_SRIOV_FREE_PFS" in said
    w = _window(hosts, [_pf_vm(1, "ib-pf:ib0")])           # a named PF: only where that one is free
    assert _placer(w, 1) == "" and requirements(w.root) == {1: [1]}


def test_an_older_probe_offers_no_whole_pf():
    w = _window([_pf_host(0, [("0000:03:00.0", "ib0", 0, 4, 4, None)])], [_pf_vm(1, "ib-pf")])
    assert "0 of 1 PF free whole" in _placer(w, 1)


def test_a_whole_pf_takes_its_vfs_and_a_booked_vf_takes_the_whole_pf_in_one_window():
    ledger = Ledger(None)
    hosts = [_pf_host(0, [("0000:03:00.0", "ib0", 0, 1, 1, "YES"), ("0000:04:00.0", "ib1", 0, 0, 0, "NO")])]
    w = _window(hosts, [_pf_vm(1, "ib-pf"), _pf_vm(2, "ib-sriov")], ledger)
    w.narrow()
    assert sorted(w.vms_in_input()) == [1, 2]               # each fits alone
    plan = w.check_plan(_plan((1, 0), (2, 0)))
    assert _planned(plan) == {1: 0} and "took the VFs (left: 0 free (0 on ib0, 0 on ib1)" in w.messages[0]
    assert ledger.entries[1]["pfs"] == ["whole:0000:03:00.0"]
    w = _window(hosts, [_pf_vm(2, "ib-sriov"), _pf_vm(1, "ib-pf")], Ledger(None))
    w.narrow()
    assert _planned(w.check_plan(_plan((2, 0), (1, 0)))) == {2: 0}
    # the next window: VM 1 on host 0, which its probe does not show yet: the PF stays booked
    w = _window([_pf_host(0, [("0000:03:00.0", "ib0", 0, 1, 1, "YES")], vms=[1])], [_pf_vm(3, "ib-pf")], ledger)
    assert "0 of 1 PF free whole" in _placer(w, 3)
    assert w.hosts[0].free == 0


def test_the_placer_books_the_whole_pf_deploy_takes():
    """The fewest VFs enabled first, as deploy (policy.choose_whole_pfs), on the wished node."""
    host = HostVfs.from_host_xml(ET.fromstring(_pf_host(0, [
        ("0000:03:00.0", "ib0", 0, 4, 4, "YES"), ("0000:04:00.0", "ib1", 0, 2, 2, "YES"),
        ("0000:81:00.0", "ib2", 1, 8, 8, "YES")])).find("TEMPLATE"))
    # the VF: the PF with the most free VFs (deploy's rule); the whole PF: the fewest enabled
    assert host.choose(VfNeed((None,), whole=(None,))) == ["0000:81:00.0", "whole:0000:04:00.0"]
    assert host.choose(VfNeed((), True, "require", whole=(None,))) == ["whole:0000:04:00.0"]   # node 0: 2 free
    assert host.choose(VfNeed((), True, "prefer", whole=("ib2",))) == ["whole:0000:81:00.0"]
    host.take(["whole:0000:04:00.0", "0000:03:00.0"])
    assert [(p.free, p.whole_free) for p in host.pfs] == [(3, False), (0, False), (8, True)]
