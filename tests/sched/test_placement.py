"""The kvm-sriov placement policy on scheduler documents written by OpenNebula
7.4 itself (tests/sched/fixtures/, made by tests/sched/make_fixtures.py on a
real front-end: several VMs per window, multi-NIC VMs, a pinned PF, NUMA
wishes, hosts whose counts are stale because VMs were placed since their
last probe)."""

import base64
import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.domain import hpc_profile
from kvm_sriov.scheduler import placement
from kvm_sriov.scheduler.placement import HostVfs, Ledger, VfNeed, vm_need
from kvm_sriov.scheduler.placement_program import Window

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WINDOWS = sorted(d.name for d in FIXTURES.iterdir() if (d / "input.xml").is_file()) if FIXTURES.is_dir() else []
PLACE = Path(__file__).resolve().parents[2] / "sched" / "kvm-sriov" / "place"


def window(name: str) -> Window:
    d = FIXTURES / name
    ledger = Ledger(None)
    if (d / "ledger.json").is_file():
        ledger.loads((d / "ledger.json").read_text())
    return Window((d / "input.xml").read_bytes(), ledger, now=float((d / "time.txt").read_text()))


def requirements(doc: ET.Element) -> dict[int, list[int]]:
    return {int(r.findtext("ID")): sorted(int(h.text) for h in r.iterfind("HOSTS/ID"))
            for r in doc.iterfind("REQUIREMENTS/VM")}


def plan_actions(xml: bytes) -> dict[int, int]:
    return {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(xml).iterfind("ACTION")}


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
def _rank_place() -> Path:
    from simhost.frontend import OpenNebulaMissing, locate_install
    try:
        prefix = locate_install()
    except OpenNebulaMissing as exc:
        pytest.fail(f"the real rank placer is needed here: {exc}", pytrace=False)
    return prefix


@pytest.mark.parametrize("name", [n for n in WINDOWS if (FIXTURES / n / "plan.xml").is_file()])
def test_place_program_with_real_rank(name, tmp_path):
    """one_sched's call: base64 document on stdin, plan on stdout, VM messages on stderr."""
    prefix = _rank_place()
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
