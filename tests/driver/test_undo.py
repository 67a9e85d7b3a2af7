"""Rollback is one stack of undo steps (kvm_sriov/actions/undo.py): each
step pushed as it succeeds, unwound once, every undo step run even when one
before it fails."""

import pytest

from kvm_sriov.actions.undo import Undo
from kvm_sriov.errors import DriverError
from kvm_sriov.node.host import Host
from tests.driver import test_actions_testdriver as actions

run = actions.run  # the fixture: the actions on libvirt's test driver


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
