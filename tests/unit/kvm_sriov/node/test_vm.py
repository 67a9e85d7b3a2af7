"""Rung 1: taking the VFs off a running domain for a save or a migration
(node.vm.detach_for_move) is undone through the action's undo stack like
every other step: its undo is pushed before the detach, so a half-done
detach, or metadata that cannot be written after it, gives the VM its VFs
back, and the error reported is the action's own, not the undo's."""

import re

from kvm_sriov.domain import hotplug
from kvm_sriov.domain.hypervisor import Hypervisor
from kvm_sriov.errors import HypervisorError
from tests.conftest import FIXTURES
from tests.support import actions_in_process as actions

UUID = actions.UUID


def _save(run, tmp_path):
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    action = (FIXTURES / "opennebula" / "action-save.xml").read_text()
    action = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{tmp_path / 'datastores'}/0</BASE_PATH>", action)
    return run("save", UUID, str(ckpt), "h", "42", "h", stdin=action)


def _deployed(run):
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))[0] == 0
    return run.pool()


def _half_detach(dom, vfs, seconds, retry):
    raise HypervisorError(f"the guest of {dom.name()} did not release VF {vfs[-1]} within 1s")


def test_a_half_done_detach_gives_the_vfs_back(run, monkeypatch, tmp_path):
    before = _deployed(run)
    plugged = []
    monkeypatch.setattr(hotplug, "detach", _half_detach)
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.extend(vf.address for vf, _ in vfs))
    code, _, err = _save(run, tmp_path)
    assert code != 0 and "did not release VF" in err
    assert sorted(plugged) == [vf for vf, _, _ in before]
    assert "the VM keeps running with its VFs" in err
    assert run.pool() == before and [c[0] for c in run.stock.calls] == ["deploy"]


def test_a_failing_reattach_does_not_hide_the_detachs_error(run, monkeypatch, tmp_path):
    """Before, the reattach's error replaced the detach's."""
    before = _deployed(run)
    monkeypatch.setattr(hotplug, "detach", _half_detach)
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: (_ for _ in ()).throw(
        HypervisorError("libvirt refused to attach VF 0000:03:00.1 to one-42")))
    code, _, err = _save(run, tmp_path)
    assert code != 0
    assert err.rstrip().splitlines()[-1].startswith("the guest of one-42 did not release VF")
    assert "undo step vfs_back failed: HypervisorError: libvirt refused to attach" in err
    assert run.pool() == before


def test_metadata_that_cannot_be_written_after_the_detach_gives_the_vfs_back(run, monkeypatch, tmp_path):
    """Before, the VM went on running without its VFs."""
    before = _deployed(run)
    plugged = []
    monkeypatch.setattr(hotplug, "detach", lambda dom, vfs, seconds, retry: None)
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.extend(vf.address for vf, _ in vfs))
    real = Hypervisor.set_metadata

    def set_metadata(self, dom, records):
        if not any(r.vf for r in records):  # the detached record
            raise HypervisorError("libvirt refused the metadata")
        return real(self, dom, records)
    monkeypatch.setattr(Hypervisor, "set_metadata", set_metadata)
    code, _, err = _save(run, tmp_path)
    assert code != 0 and "libvirt refused the metadata" in err
    assert sorted(plugged) == [vf for vf, _, _ in before]
    assert run.pool() == before
