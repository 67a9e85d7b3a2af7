"""Rung 1: reconciliation rules (pure: pool rows + what libvirt runs)."""

from kvm_sriov.domain.hypervisor import DomainRef, LiveState
from kvm_sriov.vf.pool import Assignment
from kvm_sriov.node.reconcile import plan

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


# -- a snapshot of libvirt taken before the pool lock -------------------------
def test_a_deploy_finishing_between_snapshot_and_lock_keeps_its_vf(fake_host, make_config, conn):
    """VM 7's deploy starts its domain and marks its VF attached right after
    VM 8's reserve listed the running domains, before it took the pool lock:
    that listing must not free VM 7's VF (and hand it to VM 8)."""
    from kvm_sriov.node.host import Host
    from kvm_sriov.domain.hypervisor import Hypervisor
    from kvm_sriov.vf.policy import VfRequest
    cfg = make_config(fake_host["root"], libvirt={"uri": "test:///default"})
    deploying = Host(cfg)
    [mine] = deploying.reserve(7, "one-7", [VfRequest("02:00:0a:64:00:07")], "deploy")
    bus, rest = mine.vf.address.split(":")[1:]
    slot, fn = rest.split(".")

    def finish_deploy():  # what VM 7's deploy does in the window
        conn.createXML(f"""<domain type='test'><name>one-7</name><memory>1024</memory>
          <os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>
          <source><address domain='0x0000' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/></source>
          </hostdev></devices></domain>""", 0)
        deploying.mark_attached([mine], "deploy")

    class Racing(Hypervisor):
        raced = False

        def live_state(self):
            snapshot = super().live_state()
            if not self.raced:
                self.raced = True
                finish_deploy()
            return snapshot
    other = Host(cfg, hypervisor=Racing("test:///default"))
    try:
        [theirs] = other.reserve(8, "one-8", [VfRequest("02:00:0a:64:00:08")], "deploy")
        assert theirs.vf.address != mine.vf.address
        held = {a.vf: (a.vm_id, a.state) for a in other.assignments()}
        assert held[mine.vf.address] == (7, "attached")
        assert other.reconcile() == []  # and the CLI's reconcile agrees afterwards
    finally:
        other.close()
        deploying.close()


# -- PFs passed through whole: the same rules, "free" = given back -----------------------
def pf_row(pf, vm, state, age):
    from kvm_sriov.vf.pool import PfAssignment
    return PfAssignment(pf, vm, f"one-{vm}", "", state, NOW - age, "deploy", 4)


def test_whole_pfs_follow_the_vf_rules():
    from kvm_sriov.node.reconcile import plan_pfs
    pf = "0000:03:00.0"
    assert plan_pfs([pf_row(pf, 1, "attached", 5)], live(**{"one-1": [pf]}), 300, NOW) == []
    assert kinds(plan_pfs([pf_row(pf, 1, "attached", 1)], live(), 300, NOW)) == [("free", pf)]
    assert plan_pfs([pf_row(pf, 1, "reserved", 10)], live(), 300, NOW) == []        # a deploy under way
    assert kinds(plan_pfs([pf_row(pf, 1, "reserved", 10)], live(), 300, NOW,
                          abandoned_vms=frozenset([1]))) == [("free", pf)]          # its action died
    assert plan_pfs([pf_row(pf, 1, "attached", 1)], live(), 300, NOW, busy_vms=frozenset([1])) == []
    assert kinds(plan_pfs([pf_row(pf, 1, "reserved", 1)], live(**{"one-1": [pf]}), 300, NOW)) == [("attach", pf)]
    [c] = plan_pfs([pf_row(pf, 1, "attached", 1)], live(**{"one-2": [pf]}), 300, NOW)
    assert (c.kind, c.vm_id, c.domain) == ("reassign", 2, "one-2")


def test_a_pf_in_a_domain_without_a_row_and_vfs_of_a_whole_pf_are_not_adopted():
    from kvm_sriov.node.reconcile import plan_pfs
    assert plan_pfs([], live(**{"other": ["0000:03:00.0"]}), 300, NOW) == []
    assert plan([], live(**{"other": ["0000:03:00.2"]}), POOL_VFS, 300, NOW,
                whole_pfs=frozenset(["0000:03:00.0"])) == []
