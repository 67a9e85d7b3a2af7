"""Rung 1: attach_nic / detach_nic of a NIC on a whole-PF network: the PF
is hot-plugged like a VF (stood in: libvirt's test driver cannot), its VFs
off while the VM has it and back once it leaves."""

import pytest

from kvm_sriov.domain import hotplug
from tests.support.actions_in_process import UUID, deployment

PF = "0000:03:00.0"
VFS = [f"0000:03:00.{i}" for i in range(1, 5)]
MAC = "02:00:0a:64:00:77"


@pytest.fixture
def whole(fake_host, monkeypatch, run):
    run.configure(whole_pfs=True)  # off by default (pool.whole_pfs)
    fs = fake_host["fs"]
    fs.free_to_go_whole(monkeypatch, PF)
    fs.plugs = []
    monkeypatch.setattr(hotplug, "detach", lambda dom, names, *a: fs.plugs.append(("unplug", list(names))))
    monkeypatch.setattr(hotplug, "attach", lambda dom, devs, *a: fs.plugs.append(
        ("plug", [(d.address, mac) for d, mac in devs])))
    return fs


def held(run):
    host = run.host()
    return ([(p.pf, p.vm_id, p.mac, p.state) for p in host.pool.pf_assignments()],
            [v.address for v in host.inventory.vfs if v.pf == PF])


def test_attach_then_detach_a_whole_pf(run, whole):
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment(nics=0))[0] == 0
    code, _, err = run("attach_nic", UUID, MAC, "ib-pf", "-", "dummy", "one-42-1", "42", "h")
    assert code == 0, err
    assert "INFO: NIC 02:00:0a:64:00:77 -> PF 0000:03:00.0 (whole)" in err
    assert whole.plugs == [("plug", [(PF, MAC)])]
    assert held(run) == ([(PF, 42, MAC, "attached")], [])
    code, _, err = run("detach_nic", UUID, MAC, "42", "h")
    assert code == 0, err
    assert whole.plugs[1] == ("unplug", [PF])
    assert held(run) == ([], VFS)


def test_an_attach_that_cannot_plug_gives_the_pf_back(run, whole, monkeypatch):
    from kvm_sriov.errors import HypervisorError

    def refuse(*a, **kw):
        raise HypervisorError("the guest did not take the PF")
    monkeypatch.setattr(hotplug, "attach", refuse)
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment(nics=0))[0] == 0
    code, _, err = run("attach_nic", UUID, MAC, "ib-pf", "-", "dummy", "one-42-1", "42", "h")
    assert code == 1 and "did not take the PF" in err
    assert held(run) == ([], VFS)
