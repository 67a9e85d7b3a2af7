"""VM groups together with VF accounting, and networks waiting for their
partition key, on scheduler documents made from a real one (fixture burst-1,
written by oned 7.4: its one-nic VM has a management NIC and one IB NIC).

What OpenNebula 7.4 sends (src/schedm/SchedulerManagerDriver.cc): every VM
of a pending VM's group in VM_POOL, running ones too, with their last
HISTORY; the groups in VM_GROUP_POOL (ROLES/ROLE: NAME, POLICY, VMS,
HOST_AFFINED, HOST_ANTI_AFFINED; TEMPLATE/AFFINED and ANTI_AFFINED rules);
in VNET_POOL only the networks of NETWORK_MODE = auto NICs."""

import base64
import copy
import os
import re
import subprocess
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.scheduler.groups import Groups
from kvm_sriov.scheduler.placement import Ledger
from kvm_sriov.scheduler.placement_program import Window
from tests.support.placement import FIXTURES, PLACE, plan_actions, rank_place, requirements

BASE = FIXTURES / "burst-1" / "input.xml"


def document(free: dict[int, int], pending: list[int], running: dict[int, int] = None,
             groups: str = "", vm_group: dict[int, tuple[int, str]] = None, nic: str = "",
             vnets: str = "") -> bytes:
    """A scheduler input: hosts 0, 1, 2 of the fixture with free[h] VFs on
    their first PF (the others none); VMs copied from its one-nic VM:
    pending ones (every host a candidate) and running ones (VM -> host);
    vm_group: VM -> (group, role); nic: more elements for the IB NIC."""
    running = running or {}
    vm_group = vm_group or {}
    root = ET.parse(BASE).getroot()
    proto = root.find("VM_POOL/VM")
    for h in root.iterfind("HOST_POOL/HOST"):
        hid = int(h.findtext("ID"))
        for i, pf in enumerate(h.iterfind("TEMPLATE/KVM_SRIOV_PF")):
            pf.find("FREE_VFS").text = str(free.get(hid, 0) if i == 0 else 0)
        vms = h.find("VMS")
        for vm, on in running.items():
            if on == hid:
                ET.SubElement(vms, "ID").text = str(vm)
    pool = root.find("VM_POOL")
    for vm in list(pool):
        pool.remove(vm)
    for vm_id in pending + list(running):
        vm = copy.deepcopy(proto)
        vm.find("ID").text = str(vm_id)
        vm.find("NAME").text = f"vm-{vm_id}"
        if vm_id in running:
            vm.find("STATE").text, vm.find("LCM_STATE").text = "3", "3"
            h = ET.SubElement(ET.SubElement(vm, "HISTORY_RECORDS"), "HISTORY")
            ET.SubElement(h, "HID").text = str(running[vm_id])
        if vm_id in vm_group:
            g = ET.SubElement(vm.find("TEMPLATE"), "VMGROUP")
            ET.SubElement(g, "VMGROUP_ID").text = str(vm_group[vm_id][0])
            ET.SubElement(g, "ROLE").text = vm_group[vm_id][1]
        ib = next(n for n in vm.iterfind("TEMPLATE/NIC") if n.findtext("BRIDGE") == "ib-sriov")
        for el in ET.fromstring(f"<x>{nic}</x>"):
            ib.append(el)
        pool.append(vm)
    reqs = root.find("REQUIREMENTS")
    for r in list(reqs):
        reqs.remove(r)
    for vm_id in pending:
        r = ET.SubElement(reqs, "VM")
        ET.SubElement(r, "ID").text = str(vm_id)
        hosts = ET.SubElement(r, "HOSTS")
        for hid in (0, 1, 2):
            ET.SubElement(hosts, "ID").text = str(hid)
        ET.SubElement(ET.SubElement(r, "DATASTORES"), "ID").text = "0"
    root.remove(root.find("VM_GROUP_POOL"))
    root.insert(4, ET.fromstring(f"<VM_GROUP_POOL>{groups}</VM_GROUP_POOL>"))
    if vnets:
        root.find("VNET_POOL").extend(ET.fromstring(f"<x>{vnets}</x>"))
    return ET.tostring(root)


def group(gid: int, roles: list[tuple[str, str, list[int]]], rules: str = "") -> str:
    out = "".join(f"<ROLE><ID>{i}</ID><NAME>{n}</NAME><POLICY>{p}</POLICY><VMS>{','.join(map(str, v))}</VMS></ROLE>"
                  for i, (n, p, v) in enumerate(roles))
    return f"<VM_GROUP><ID>{gid}</ID><NAME>g{gid}</NAME><ROLES>{out}</ROLES><TEMPLATE>{rules}</TEMPLATE></VM_GROUP>"


def role(gid: int, name: str, policy: str, pending: list[int], running: dict[int, int] = None):
    running = running or {}
    members = pending + list(running)
    return dict(pending=pending, running=running, groups=group(gid, [(name, policy, members)]),
                vm_group={v: (gid, name) for v in members})


def message(w: Window, vm: int) -> str:
    return next((m for m in w.messages if m.startswith(f"ERROR: {vm} ")), "")


def plan(*actions: tuple[int, int]) -> bytes:
    return ("<PLAN><ID>-1</ID>" + "".join(f"<ACTION><VM_ID>{v}</VM_ID><OPERATION>deploy</OPERATION>"
                                          f"<HOST_ID>{h}</HOST_ID><DS_ID>0</DS_ID></ACTION>" for v, h in actions)
            + "</PLAN>").encode()


# -- anti-affinity (spread) ------------------------------------------------------------
def test_anti_affined_role_on_every_host_with_a_free_vf_keeps_the_next_vm_pending_with_the_reason():
    w = Window(document({0: 1, 1: 1, 2: 0}, **role(3, "ranks", "ANTI_AFFINED", [20], {10: 0, 11: 1})), Ledger(None))
    w.narrow()
    assert 20 not in w.scheduled()
    # oned's SCHED_MESSAGE keeps 100 characters (the whole line goes to the VM log): the reason comes first
    assert message(w, 20).startswith("ERROR: 20 anti-affinity role ranks of VM group 3: every host with 1 free VF "
                                     "already runs one of its VMs (hosts 0, 1) (kvm-sriov)")


def test_anti_affined_role_keeps_only_hosts_without_its_vms():
    w = Window(document({0: 1, 1: 1, 2: 1}, **role(3, "ranks", "ANTI_AFFINED", [20], {10: 0})), Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: [1, 2]}


def test_a_dropped_vm_never_lands_next_to_one_of_its_role():
    """Rank's plan put two of the role on host 0 (its first choice failed the
    VF booking, or any other reason): the second is dropped, with the rule."""
    w = Window(document({0: 2, 1: 1}, **role(3, "ranks", "ANTI_AFFINED", [20, 21])), Ledger(None))
    w.narrow()
    assert plan_actions(w.check_plan(plan((20, 0), (21, 0)))) == {20: 0}
    assert "anti-affinity role ranks of VM group 3: host 0 already runs one of its VMs" in message(w, 21)


def test_anti_affined_vms_rank_could_not_place_say_why():
    """Two hosts with a VF, three VMs of the role: rank places two; the third
    gets the group's reason instead of rank's 'Cannot dispatch VM to any Host'."""
    w = Window(document({0: 2, 1: 1}, **role(3, "ranks", "ANTI_AFFINED", [20, 21, 22])), Ledger(None))
    w.narrow()
    assert plan_actions(w.check_plan(plan((20, 0), (21, 1)))) == {20: 0, 21: 1}
    assert ("anti-affinity role ranks of VM group 3: every host with 1 free VF already runs one of its VMs "
            "(hosts 0)") in message(w, 22)


def test_inter_role_anti_affinity_rule():
    doc = document({0: 1, 1: 1}, pending=[20], running={10: 0},
                   groups=group(5, [("head", "NONE", [10]), ("workers", "NONE", [20])],
                                "<ANTI_AFFINED>head, workers</ANTI_AFFINED>"),
                   vm_group={10: (5, "head"), 20: (5, "workers")})
    w = Window(doc, Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: [1]}


# -- affinity (pack) --------------------------------------------------------------------
def test_affined_role_waits_for_a_vf_on_its_host_instead_of_going_elsewhere():
    w = Window(document({0: 2, 1: 0}, **role(4, "ranks", "AFFINED", [20], {10: 1})), Ledger(None))
    w.narrow()
    assert 20 not in w.scheduled()
    assert message(w, 20).startswith("ERROR: 20 affinity role ranks of VM group 4: host 1 runs its VMs and has "
                                     "0 of 1 VF free (kvm-sriov)")


def test_affined_role_goes_only_to_its_host():
    w = Window(document({0: 2, 1: 1}, **role(4, "ranks", "AFFINED", [20], {10: 1})), Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: [1]}


@pytest.mark.parametrize("free,expected", [
    ({0: 1, 1: 3, 2: 2}, [1]),        # one host takes all three
    ({0: 2, 1: 2, 2: 1}, [0, 1]),     # none does: those that take the most
    ({0: 3, 1: 4, 2: 4}, [1, 2]),     # all do: those with the most room left for its next VMs
])
def test_affined_role_with_none_placed_goes_where_most_of_it_fits(free, expected):
    w = Window(document(free, **role(4, "ranks", "AFFINED", [20, 21, 22])), Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: expected, 21: expected, 22: expected}


def test_a_pack_whose_first_vm_comes_alone_starts_on_the_roomiest_host():
    """OneFlow creates the head first and the workers once it runs: the
    head alone must not take a host where they cannot follow (seen: the
    head on a 1-VF host beside another service's VM on the 3-VF one, and
    the worker PENDING for good)."""
    w = Window(document({0: 1, 1: 1, 2: 3}, **role(4, "ranks", "AFFINED", [20])), Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: [2]}


def test_affined_vms_the_host_cannot_take_stay_pending_with_the_reason():
    w = Window(document({0: 2, 1: 2}, **role(4, "ranks", "AFFINED", [20, 21, 22])), Ledger(None))
    w.narrow()
    assert plan_actions(w.check_plan(plan((20, 0), (21, 0), (22, 0)))) == {20: 0, 21: 0}
    assert "affinity role ranks of VM group 4: host 0 runs its VMs and has 0 of 1 VF free" in message(w, 22)


def test_affined_vm_planned_away_from_its_set_is_dropped():
    w = Window(document({0: 2, 1: 2}, **role(4, "ranks", "AFFINED", [20, 21])), Ledger(None))
    w.narrow()
    assert plan_actions(w.check_plan(plan((20, 0), (21, 1)))) == {20: 0}
    assert "affinity role ranks of VM group 4: its VMs are on host 0, not 1" in message(w, 21)


def test_host_rules_of_a_role():
    doc = document({0: 1, 1: 1, 2: 1}, **role(6, "ranks", "NONE", [20]))
    doc = doc.replace(b"<POLICY>NONE</POLICY>", b"<POLICY>NONE</POLICY><HOST_ANTI_AFFINED>1</HOST_ANTI_AFFINED>")
    w = Window(doc, Ledger(None))
    w.narrow()
    assert requirements(w.root) == {20: [0, 2]}


def test_running_vms_of_a_group_keep_their_bookings():
    """VM_POOL holds the group's running VMs: they are not pending, and the
    VFs booked for them stay booked until the probe shows them."""
    ledger = Ledger(None)
    ledger.book(10, 0, ["0000:03:00.0"], now=1.0)
    w = Window(document({0: 1, 1: 1}, **role(3, "ranks", "NONE", [20], {10: 0})), ledger)
    assert 10 in ledger.entries and w.hosts[0].free == 0


def test_groups_read_as_oned_writes_them():
    g = Groups(ET.fromstring(document({0: 1}, pending=[20], running={10: 2, 11: 1},
                                      groups=group(3, [("a", "ANTI_AFFINED", [10, 20]), ("b", "AFFINED", [11, 21])],
                                                   "<AFFINED>b, c</AFFINED>"),
                                      vm_group={10: (3, "a"), 20: (3, "a"), 11: (3, "b")})))
    assert g.where == {10: 2, 11: 1}
    assert g.apart_problem(20, 2).label == "role a of VM group 3" and g.apart_problem(20, 1) is None
    assert g.together_hosts(21)[1] == {1}
    g.place(20, 0)
    assert g.apart_problem(10, 0) is not None


# -- the whole program with the real rank placer ----------------------------------------
def _place(doc: bytes, tmp_path) -> tuple[dict[int, int], str]:
    prefix = rank_place()
    loc = tmp_path / "one"      # the same for each window: the ledger is kept
    (loc / "etc" / "schedulers").mkdir(parents=True, exist_ok=True)
    (loc / "var").mkdir(exist_ok=True)
    conf = (prefix / "etc" / "schedulers" / "rank.conf").read_text()
    (loc / "etc" / "schedulers" / "rank.conf").write_text(re.sub(r"(?m)^MAX_HOST\s*=.*$", "MAX_HOST = 4", conf))
    env = dict(os.environ, ONE_LOCATION=str(loc),
               KVM_SRIOV_RANK_PLACE=str(prefix / "var" / "remotes" / "scheduler" / "rank" / "place"))
    done = subprocess.run([str(PLACE)], input=base64.b64encode(doc) + b"\n", capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return plan_actions(done.stdout), done.stderr.decode()


def _last_message(stderr: str, vm: int) -> str:
    return ([line for line in stderr.splitlines() if line.startswith(f"ERROR: {vm} ")] or [""])[-1]


def test_with_rank_anti_affined_role_gets_one_host_each_and_the_rest_waits(tmp_path):
    placed, stderr = _place(document({0: 2, 1: 1, 2: 0}, **role(3, "ranks", "ANTI_AFFINED", [20, 21, 22])), tmp_path)
    assert len(placed) == 2 and sorted(placed.values()) == [0, 1], placed
    (late,) = {20, 21, 22} - set(placed)
    assert "anti-affinity role ranks of VM group 3: every host with 1 free VF already runs" in \
        _last_message(stderr, late), stderr


def test_with_rank_affined_role_packs_where_its_vfs_are(tmp_path):
    free = {0: 1, 1: 2, 2: 0}
    placed, stderr = _place(document(free, **role(4, "ranks", "AFFINED", [20, 21, 22])), tmp_path)
    # rank places the set's first VM alone (the others' CURRENT_VMS rule needs it
    # placed): on host 1, the one host with VFs for two of them
    assert placed == {20: 1}, (placed, stderr)
    # the next window: VM 20 on host 1, not yet in its probe (booked)
    placed, stderr = _place(document(free, **role(4, "ranks", "AFFINED", [21, 22], {20: 1})), tmp_path)
    assert set(placed.values()) == {1} and len(placed) == 1, (placed, stderr)
    (late,) = {21, 22} - set(placed)
    assert "affinity role ranks of VM group 4: host 1 runs its VMs and has 0 of 1 VF free" in \
        _last_message(stderr, late), stderr


# -- the partition key a network waits for ----------------------------------------------
PKEY_MESSAGE = ("network 0 waits for its partition key (KVM_SRIOV_PKEY = AUTO, no VLAN_ID yet): "
                "kvm-sriov network hook")


def _without_vlan(doc: bytes) -> bytes:
    return doc.replace(b"<VLAN_ID>0x8001</VLAN_ID>", b"")


def test_a_vm_on_a_network_waiting_for_its_pkey_stays_pending():
    """The NIC inherits KVM_SRIOV_PKEY (INHERIT_VNET_ATTR): the network of a
    NIC with a fixed network is not in the scheduler's VNET_POOL."""
    w = Window(_without_vlan(document({0: 1}, pending=[20], nic="<KVM_SRIOV_PKEY>auto</KVM_SRIOV_PKEY>")),
               Ledger(None))
    w.narrow()
    assert 20 not in w.scheduled() and message(w, 20).startswith(f"ERROR: 20 {PKEY_MESSAGE}")


def test_the_network_in_the_input_says_auto_too():
    vnet = "<VNET><ID>0</ID><BRIDGE>ib-sriov</BRIDGE><TEMPLATE><KVM_SRIOV_PKEY>AUTO</KVM_SRIOV_PKEY></TEMPLATE></VNET>"
    w = Window(_without_vlan(document({0: 1}, pending=[20], vnets=vnet)), Ledger(None))
    w.narrow()
    assert PKEY_MESSAGE in message(w, 20)


@pytest.mark.parametrize("nic,vlan", [("<KVM_SRIOV_PKEY>AUTO</KVM_SRIOV_PKEY>", True),   # the key came
                                      ("", False), ("<KVM_SRIOV_PKEY>0x8005</KVM_SRIOV_PKEY>", False)])
def test_a_vm_whose_network_has_its_key_or_asks_none_is_placed(nic, vlan):
    doc = document({0: 1}, pending=[20], nic=nic)
    w = Window(doc if vlan else _without_vlan(doc), Ledger(None))
    w.narrow()
    assert 20 in w.scheduled() and not message(w, 20)


def test_an_auto_nic_given_a_network_without_its_key_is_not_deployed():
    """NETWORK_MODE = auto: the plan names the network; its VLAN_ID is what the NIC gets."""
    vnet = ("<VNET><ID>7</ID><BRIDGE>ib-sriov</BRIDGE><VLAN_ID></VLAN_ID>"
            "<TEMPLATE><KVM_SRIOV_PKEY>AUTO</KVM_SRIOV_PKEY></TEMPLATE></VNET>")
    w = Window(document({0: 1}, pending=[20], vnets=vnet), Ledger(None))
    w.narrow()
    rank = plan((20, 0)).replace(b"<DS_ID>0</DS_ID>", b"<DS_ID>0</DS_ID><NIC><NIC_ID>1</NIC_ID><NETWORK_ID>7</NETWORK_ID></NIC>")
    assert plan_actions(w.check_plan(rank)) == {}
    assert "network 7 waits for its partition key" in message(w, 20)
