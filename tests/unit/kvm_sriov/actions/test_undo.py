"""Rollback is one stack of undo steps (kvm_sriov/actions/undo.py): each
step pushed as it succeeds, unwound once, every undo step run even when one
before it fails."""

from types import SimpleNamespace

import pytest

from kvm_sriov.actions import lifecycle, peer
from kvm_sriov.actions.delegate import StockResult
from kvm_sriov.actions.undo import Undo
from kvm_sriov.domain import hotplug
from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.errors import DriverError, HypervisorError
from kvm_sriov.ivshmem import host as ivshmem_host
from kvm_sriov.node import prewarm
from kvm_sriov.node.host import Host
from tests.support import actions_in_process as actions



def test_a_failing_undo_step_does_not_skip_the_ones_after_it(capsys):
    done = []

    def broken():
        raise OSError("disk gone")

    with pytest.raises(DriverError, match="the action failed"):
        with Undo("deploy") as undo:
            undo.push(done.append, "first pushed, last undone")
            undo.push(broken)
            undo.push(done.append, "last pushed, first undone")
            raise DriverError("the action failed")  # the action's own error goes on up
    assert done == ["last pushed, first undone", "first pushed, last undone"]
    assert "ERROR: deploy: undo step broken failed: OSError: disk gone" in capsys.readouterr().err


def test_unwind_returns_the_first_undo_error_and_runs_once():
    undo = Undo("restore")
    calls = []
    undo.push(calls.append, 1)
    undo.push(lambda: (_ for _ in ()).throw(ValueError("second")))
    undo.push(lambda: (_ for _ in ()).throw(KeyError("first")))
    first = undo.unwind()
    assert isinstance(first, KeyError) and calls == [1]
    assert undo.unwind() is None and calls == [1]


def test_success_and_commit_undo_nothing():
    calls = []
    with Undo("save") as undo:
        undo.push(calls.append, "undone")
    with pytest.raises(RuntimeError):
        with Undo("migrate") as undo:
            undo.push(calls.append, "undone")
            undo.commit()  # past the point of no return
            raise RuntimeError
    assert calls == []


def test_a_deploy_whose_guid_undo_fails_still_gives_its_vfs_back(run, monkeypatch):
    """The stock deploy fails; putting the GUIDs back then fails too: the VFs
    are still released and the stock script's failure is what is reported."""
    def restore_fails(self, vm_id):
        raise RuntimeError("GUID table unreadable")
    monkeypatch.setattr(Host, "restore_guids", restore_fails)
    run.stock.codes["deploy"] = 255
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))
    assert (code, out) == (255, "")
    assert "undo step restore_guids failed: RuntimeError: GUID table unreadable" in err
    assert run.pool() == []


# Each action that changes state unwinds through Undo: an undo step that
# fails does not skip the ones after it, and the action's own error is the
# one reported.
def _refused_hotplug(*args, **kw):
    raise HypervisorError("VF 0000:81:00.2 did not appear in one-42 within 1s")


def test_a_nic_attach_whose_guid_undo_fails_still_gives_its_vf_back(run, monkeypatch):
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment())[0] == 0
    before = run.pool()
    monkeypatch.setattr(hotplug, "attach", _refused_hotplug)
    def restore_vf_guids(self, vfs):
        raise RuntimeError("GUID table unreadable")
    monkeypatch.setattr(Host, "restore_vf_guids", restore_vf_guids)
    code, out, err = run("attach_nic", actions.UUID, "02:00:0a:64:01:09", "ib-sriov", "-", "dummy",
                         "one-42-1", "42", "host1")
    assert run.pool() == before  # the new NIC's VF went back to the pool
    assert code != 0
    assert "did not appear in one-42" in err  # the attach's own error, not the undo's
    assert "undo step restore_vf_guids failed: RuntimeError: GUID table unreadable" in err


def test_a_migrate_in_whose_guid_undo_fails_reports_the_attach_error(run, monkeypatch, capsys):
    monkeypatch.setattr(hotplug, "attach", _refused_hotplug)
    # the attach's undo gives back the GUIDs and the drivers of its pre-warm (node/prewarm.py)
    monkeypatch.setattr(prewarm, "revert_in", lambda *args: (_ for _ in ()).throw(
        RuntimeError("GUID table unreadable")))
    host = run.host()
    with pytest.raises(HypervisorError, match="did not appear in one-42"):
        peer._attach(host, 42, "test")  # the test driver's running domain
    assert "undo step revert failed: RuntimeError: GUID table unreadable" in capsys.readouterr().err


def test_a_migrate_in_whose_device_cannot_be_plugged_leaves_the_region(run, monkeypatch):
    """One undo step (leave never raises): the hand-written version had no gap
    here; it goes through Undo like every other action."""
    done = []
    record = SimpleNamespace(request=SimpleNamespace(name="kvs-0-group"))
    monkeypatch.setattr(ivshmem_host, "record_of", lambda dom: record)
    monkeypatch.setattr(ivshmem_host, "join", lambda host, vm_id, domain, request: done.append("join"))
    monkeypatch.setattr(ivshmem_host, "plug", lambda *args: (_ for _ in ()).throw(
        HypervisorError("shared-memory region kvs-0-group did not appear in test")))
    monkeypatch.setattr(ivshmem_host, "leave", lambda host, vm_id: done.append("leave"))
    monkeypatch.setattr(ivshmem_host, "attached", lambda host, vm_id: done.append("attached"))
    with pytest.raises(HypervisorError, match="did not appear in test"):
        peer._ivshmem_join(run.host(), 42, "test")
    assert done == ["join", "leave"]


def _stock_deploy_then(result, monkeypatch, run):
    """The stock deploy starts the domain, then answers with result (killed
    after the start, say, or printing a deploy id that names nothing)."""
    def stock(*args, **kw):
        run.stock(*args, **kw)
        return result
    monkeypatch.setattr(lifecycle, "run_stock", stock)


def test_a_failed_deploy_whose_domain_cannot_be_destroyed_still_undoes_the_rest(run, monkeypatch, conn):
    guids = run.guids()
    _stock_deploy_then(StockResult(255, ""), monkeypatch, run)
    monkeypatch.setattr(Hypervisor, "destroy", lambda self, dom: (_ for _ in ()).throw(
        HypervisorError(f"could not destroy {dom.name()}: busy")))
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))
    assert (code, out) == (255, "")  # the stock script's failure, not the undo's
    assert "undo step destroy_if_running failed: HypervisorError: could not destroy one-42: busy" in err
    assert run.pool() == [] and run.guids() == guids


def test_a_deploy_whose_domain_cannot_be_found_is_not_left_running(run, monkeypatch, conn):
    """The stock deploy succeeds but prints a deploy id that names nothing:
    the domain it started must not keep running with VFs the pool frees."""
    _stock_deploy_then(StockResult(0, "no-such-domain\n"), monkeypatch, run)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))
    assert code != 0 and "domain one-42 does not run" in err
    assert run.pool() == []
    assert "one-42" not in [d.name() for d in conn.listAllDomains() if d.isActive()]
