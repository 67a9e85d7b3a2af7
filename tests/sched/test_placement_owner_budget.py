"""The placer and a host's per-owner shared-memory share (the probe's
KVM_SRIOV_IVSHMEM_MAX_OWNER_MB and KVM_SRIOV_IVSHMEM_OWNERS_MB, docs/ivshmem.md):
a VM whose owner's regions already take its share of a host is not placed
there, with the reason, while another tenant's VM is; bookings of this
window and earlier ones count for the owner too."""

import json
from typing import Optional

from kvm_sriov.scheduler.placement import HostVfs, Ledger
from tests.sched.test_placement import requirements
from tests.sched.test_placement_inputs import _placer, _plan, _planned, _window

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
