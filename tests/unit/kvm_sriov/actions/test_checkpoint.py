"""Rung 1: save and restore of a VM with a whole PF (BRIDGE = "ib-pf"): the
actions in-process against libvirt's test driver (the `run` fixture) on the
fake sysfs whose kernel makes VFs appear and disappear. The test driver
cannot hot-plug: the confirmed unplug/plug (domain/hotplug.py) is stood in
for and recorded; rung 3 plugs a real PF."""

import re

import pytest

from kvm_sriov.domain import hotplug
from kvm_sriov.errors import HypervisorError
from tests.conftest import FIXTURES
from tests.support.actions_in_process import UUID, deployment

PF = "0000:03:00.0"
VFS = [f"0000:03:00.{i}" for i in range(1, 5)]
MAC = "02:00:0a:64:00:2a"


@pytest.fixture
def whole(fake_host, monkeypatch, run):
    """03:00.0 free to go whole, the fake kernel on, the hot-plug recorded."""
    run.configure(whole_pfs=True)  # off by default (pool.whole_pfs)
    fs = fake_host["fs"]
    fs.free_to_go_whole(monkeypatch, PF)
    fs.plugs = []
    monkeypatch.setattr(hotplug, "detach", lambda dom, names, *a: fs.plugs.append(("unplug", list(names))))
    monkeypatch.setattr(hotplug, "attach", lambda dom, devs, *a: fs.plugs.append(
        ("plug", [(d.address, d.index, mac) for d, mac in devs])))
    return fs


def held(run):
    host = run.host()
    return ([(p.pf, p.vm_id, p.state) for p in host.pool.pf_assignments()],
            [v.address for v in host.inventory.vfs if v.pf == PF])


def restore_action(ckpt, bridge="ib-pf"):
    action = (FIXTURES / "opennebula" / "action-restore.xml").read_text()
    action = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{ckpt.parent.parent}</BASE_PATH>", action)
    return action.replace("<BRIDGE><![CDATA[ib-sriov]]></BRIDGE>", f"<BRIDGE><![CDATA[{bridge}]]></BRIDGE>")


def test_save_unplugs_the_pf_and_gives_its_vfs_back_restore_takes_one_again(run, whole, tmp_path, conn):
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))[0] == 0
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    code, _, err = run("save", UUID, str(ckpt), "h", "42", "h")
    assert code == 0, err
    assert whole.plugs == [("unplug", [PF])]
    assert held(run) == ([], VFS)                                  # back to the host, VFs and all
    code, _, err = run("restore", str(ckpt), "h", UUID, "42", "h", stdin=restore_action(ckpt))
    assert code == 0, err
    assert whole.plugs[1] == ("plug", [(PF, -1, MAC)])             # the PF itself, as the NIC
    assert held(run) == ([(PF, 42, "attached")], [])
    assert run("cancel", UUID, "h", "42", "h")[0] == 0
    assert held(run) == ([], VFS)


def test_a_failed_save_plugs_the_pf_back_and_keeps_it(run, whole, tmp_path):
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))[0] == 0
    run.stock.codes["save"] = 1
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    assert run("save", UUID, str(ckpt), "h", "42", "h")[0] == 1
    assert whole.plugs == [("unplug", [PF]), ("plug", [(PF, -1, MAC)])]
    assert held(run) == ([(PF, 42, "attached")], [])


def test_a_restore_that_cannot_plug_the_pf_gives_it_back_and_keeps_the_checkpoint(run, whole, tmp_path, conn,
                                                                                     monkeypatch):
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    ckpt.parent.mkdir(parents=True)
    conn.createXML(deployment(nics=0), 0).save(str(ckpt))

    def refuse(*a, **kw):
        raise HypervisorError("the guest did not take the PF")
    monkeypatch.setattr(hotplug, "attach", refuse)
    code, _, err = run("restore", str(ckpt), "h", UUID, "42", "h", stdin=restore_action(ckpt))
    assert code == 1 and "did not take the PF" in err
    assert ckpt.exists() and held(run) == ([], VFS)
    assert UUID not in [d.UUIDString() for d in conn.listAllDomains() if d.isActive()]
