"""Rung 1: each action parses each document once (the deployment file or
the action XML on stdin, vm.xml, the checkpoint's image XML, the live
domain's XML as long as nothing changed it): the path check, involves_vfs
and the action share one parsed tree, and the hardened parser
(domain_xml.parse) is still what reads every one of them."""

import re
from collections import Counter
from pathlib import Path

import libvirt
import pytest

from kvm_sriov.actions import migrate
from kvm_sriov.actions.delegate import StockResult
from kvm_sriov.domain import domain_xml, hotplug
from tests.conftest import FIXTURES
from tests.support import actions_in_process as actions

UUID = actions.UUID


@pytest.fixture
def parses(monkeypatch):
    """Counts domain_xml.parse calls per document (its text, as parsed)."""
    seen = Counter()
    names = {}
    real = domain_xml.parse

    def counting(text, what="domain XML"):
        key = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).strip()
        seen[key] += 1
        names.setdefault(key, what)
        return real(text, what)
    monkeypatch.setattr(domain_xml, "parse", counting)
    seen.names = names
    return seen


def twice(parses) -> list:
    return [f"{parses.names[k]} parsed {n} times" for k, n in parses.items() if n > 1]


def vm_xml(run, vm_id=42, user=""):
    """oned's vm.xml beside the deployment file."""
    doc = (f"<VM><ID>{vm_id}</ID><UID>3</UID><GID>0</GID><TEMPLATE><NIC><MAC>02:00:0a:64:00:2a</MAC>"
           f"<NETWORK_ID>5</NETWORK_ID></NIC></TEMPLATE><USER_TEMPLATE>{user}</USER_TEMPLATE></VM>")
    folder = Path(run.dep(vm_id)).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vm.xml").write_text(doc)
    return doc


def action_xml(name, datastores):
    text = (FIXTURES / "opennebula" / f"action-{name}.xml").read_text()
    return re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH><![CDATA[{datastores}/0]]></BASE_PATH>", text)


def test_deploy_parses_the_deployment_file_and_vm_xml_once(run, parses):
    doc = vm_xml(run)
    dep = actions.deployment(nics=1)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=dep)
    assert code == 0, err
    assert parses[dep.strip()] == 1 and parses[doc] == 1
    assert twice(parses) == []


def test_a_deploy_ours_by_its_attribute_alone_reads_vm_xml_once(run, parses, conn):
    """No VF NIC: involves_vfs parses vm.xml for the attribute, deploy uses it."""
    doc = vm_xml(run, user="<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC>")
    dep = actions.deployment(nics=0)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=dep)
    assert code == 0, err
    assert "HPC profile" in err  # it was ours
    assert parses[dep.strip()] == 1 and parses[doc] == 1
    assert twice(parses) == []


def test_a_deploy_handed_to_the_stock_script_parses_its_file_once(run, parses):
    dep = actions.deployment(nics=0)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=dep)
    assert (code, err) == (0, "")
    assert [c[0] for c in run.stock.calls] == ["deploy"]
    assert dict(parses) == {dep.strip(): 1}  # vm.xml: none here


def test_restore_parses_the_action_xml_and_the_image_once(run, parses, conn, monkeypatch, tmp_path):
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: None)
    root = domain_xml.parse(actions.deployment(nics=0))
    domain_xml.record_nics(root, [domain_xml.NicRecord("02:00:0a:64:00:2a", "ib-sriov", space=5)])
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    ckpt.parent.mkdir(parents=True)
    conn.createXML(domain_xml.to_string(root), 0).save(str(ckpt))
    image = conn.saveImageGetXMLDesc(str(ckpt), 0)
    parses.clear()
    action = action_xml("restore", tmp_path / "datastores")
    code, _, err = run("restore", str(ckpt), "h", UUID, "42", "h", stdin=action)
    assert code == 0, err
    assert parses[action.strip()] == 1 and parses[image.strip()] == 1
    assert twice(parses) == []


def _unplugged(dom, vfs, seconds, retry):
    """The test driver cannot hot-unplug: the live XML changes as it would."""
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, f"unplugged {len(vfs)}", None, None,
                    libvirt.VIR_DOMAIN_AFFECT_LIVE)


def test_save_parses_the_live_xml_once_before_the_detach(run, parses, conn, monkeypatch, tmp_path):
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))[0] == 0
    monkeypatch.setattr(hotplug, "detach", _unplugged)
    live = conn.lookupByUUIDString(UUID).XMLDesc(0)
    parses.clear()
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    action = action_xml("save", tmp_path / "datastores")
    code, _, err = run("save", UUID, str(ckpt), "h", "42", "h", stdin=action)
    assert code == 0, err
    assert parses[live.strip()] == 1 and parses[action.strip()] == 1
    assert twice(parses) == []


class _Peer:
    def __init__(self, config, host):
        pass

    def reserve(self, vm_id, name, nics, nodes, numa_policy, carried=None, guid_spaces=None):
        return [{"vf": "0000:03:00.2"}]

    def attach(self, vm_id, name):
        pass

    def release(self, vm_id):
        pass


def test_migrate_parses_the_action_xml_and_the_live_xml_once(run, parses, conn, monkeypatch, tmp_path):
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=1))[0] == 0
    monkeypatch.setattr(hotplug, "detach", _unplugged)
    monkeypatch.setattr(migrate, "Peer", _Peer)
    monkeypatch.setattr(migrate, "run_stock", lambda remotes, sent, *a, **kw: StockResult(0, ""))
    live = conn.lookupByUUIDString(UUID).XMLDesc(0)
    parses.clear()
    action = action_xml("migrate", tmp_path / "datastores")
    code, _, err = run("migrate", UUID, "host2", "host1", "42", "host1", stdin=action)
    assert code == 0, err
    assert parses[live.strip()] == 1 and parses[action.strip()] == 1
    assert twice(parses) == []


def test_detach_nic_parses_the_live_xml_once(run, parses, conn, monkeypatch):
    """After the detach, the VF NICs left and their record come from one
    parse (the pool holds the NIC's VF: no look before it)."""
    assert run("deploy", run.dep(), "host1", "42", "host1", stdin=actions.deployment(nics=2))[0] == 0
    monkeypatch.setattr(hotplug, "detach", _unplugged)
    parses.clear()
    code, _, err = run("detach_nic", UUID, "02:00:0a:64:01:01", "42", "host1")
    assert code == 0, err
    assert "released VF" in err
    assert list(parses.values()) == [1]


def test_the_migration_destination_parses_the_live_xml_once_before_the_attach(run, parses, conn,
                                                                               monkeypatch):
    from kvm_sriov.actions import peer
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: _unplugged(dom, vfs, seconds, 0))
    root = domain_xml.parse(actions.deployment(nics=0))
    domain_xml.record_nics(root, [domain_xml.NicRecord("02:00:0a:64:00:2a", "ib-sriov")])
    conn.createXML(domain_xml.to_string(root), 0)
    host = run.host()
    peer._reserve(host, 42, "one-42", [{"mac": "02:00:0a:64:00:2a", "bridge": "ib-sriov"}])
    parses.clear()
    peer._attach(host, 42, "one-42")
    assert sorted(parses.values()) == [1, 1] and twice(parses) == []  # before and after the attach


OURS = "<VMM_DRIVER_ACTION_DATA><DATASTORE><BASE_PATH>/srv/one/datastores/0</BASE_PATH></DATASTORE></VMM_DRIVER_ACTION_DATA>"


@pytest.mark.parametrize("raw", [
    OURS.encode(), b"\n  " + OURS.encode() + b"\n",
    __import__("base64").b64encode(OURS.encode()),                  # local actions: not shared
    b'<?xml version="1.0" encoding="UTF-16"?>' + OURS.encode(),      # refused as bytes, fine as text
    b'<?xml version="1.0" encoding="ISO-8859-1"?>' + OURS.encode(),
    "\u00a0".encode() + OURS.encode(), "\ufeff".encode() + OURS.encode(), b"\x1c" + OURS.encode(),
    OURS.encode() + "\u2003".encode(), b"\xff" + OURS.encode(),      # not UTF-8
    b"<not xml", b"", b"   ",
])
def test_the_path_check_sees_what_it_saw_before(raw):
    """The datastores directory from a shared parse is what parsing raw gave."""
    from types import SimpleNamespace
    from kvm_sriov.actions import paths
    from kvm_sriov.actions.delegate import Sent
    cfg = SimpleNamespace()
    sent = Sent("restore", (), raw)
    assert paths.datastores_of(cfg, sent=sent) == paths.datastores_of(cfg, raw)
