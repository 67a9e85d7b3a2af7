"""Rung 1: reconciliation rules (pure: pool rows + what libvirt runs)."""

from kvm_sriov.hypervisor import DomainRef, LiveState
from kvm_sriov.pool import Assignment
from kvm_sriov.reconcile import plan

NOW = 10_000.0
POOL_VFS = {f"0000:03:00.{i}": "0000:03:00.0" for i in range(1, 5)}


def row(vf, vm, state, age):
    return Assignment(vf, "0000:03:00.0", vm, f"one-{vm}", "", state, NOW - age, "deploy")


def live(**doms):
    refs = {name: DomainRef(name, f"uuid-{name}") for name in doms}
    hostdevs = {vf: refs[name] for name, vfs in doms.items() for vf in vfs}
    return LiveState(refs, hostdevs)


def kinds(changes):
    return sorted((c.kind, c.vf) for c in changes)


def test_consistent_pool_needs_nothing():
    rows = [row("0000:03:00.1", 1, "attached", 5)]
    assert plan(rows, live(**{"one-1": ["0000:03:00.1"]}), POOL_VFS, 300, NOW) == []


def test_attached_but_domain_gone_is_freed_at_once():
    rows = [row("0000:03:00.1", 1, "attached", 1)]
    assert kinds(plan(rows, live(), POOL_VFS, 300, NOW)) == [("free", "0000:03:00.1")]


def test_reservation_kept_during_grace_then_freed():
    rows = [row("0000:03:00.1", 1, "reserved", 10)]
    assert plan(rows, live(), POOL_VFS, 300, NOW) == []
    rows = [row("0000:03:00.1", 1, "reserved", 301)]
    assert kinds(plan(rows, live(), POOL_VFS, 300, NOW)) == [("free", "0000:03:00.1")]


def test_reservation_found_running_becomes_attached():
    rows = [row("0000:03:00.1", 1, "reserved", 1)]
    assert kinds(plan(rows, live(**{"one-1": ["0000:03:00.1"]}), POOL_VFS, 300, NOW)) == [
        ("attach", "0000:03:00.1")]


def test_libvirt_wins_ownership():
    rows = [row("0000:03:00.1", 1, "attached", 1)]
    [c] = plan(rows, live(**{"one-2": ["0000:03:00.1"]}), POOL_VFS, 300, NOW)
    assert (c.kind, c.vm_id, c.domain) == ("reassign", 2, "one-2")


def test_unknown_vf_in_running_domain_is_adopted():
    changes = plan([], live(**{"other-vm": ["0000:03:00.2", "0000:99:00.1"]}), POOL_VFS, 300, NOW)
    assert [(c.kind, c.vf, c.vm_id) for c in changes] == [("adopt", "0000:03:00.2", -1)]


def test_running_vm_that_lost_its_vf():
    rows = [row("0000:03:00.1", 1, "attached", 10)]
    assert plan(rows, live(**{"one-1": []}), POOL_VFS, 300, NOW) == []
    rows = [row("0000:03:00.1", 1, "attached", 400)]
    assert kinds(plan(rows, live(**{"one-1": []}), POOL_VFS, 300, NOW)) == [("free", "0000:03:00.1")]
