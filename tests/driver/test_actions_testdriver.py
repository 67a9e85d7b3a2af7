"""Rung 1: the actions in-process, against libvirt's own test driver
(test:///default: real libvirt-python and libvirt, no QEMU), with stand-ins
for OpenNebula's kvm scripts (tests/support/stock_standin.py). Real QEMU and the real
scripts run in tests/driver/test_actions_libvirtd.py."""

import io
import re
from xml.etree import ElementTree as etree

import libvirt
import pytest

from kvm_sriov.actions import main
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from tests.conftest import FIXTURES
from tests.support.actions_in_process import UUID, deployment

def test_deploy_with_two_vfs_then_cancel(run, conn):
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1",
                         stdin=deployment(nics=2))
    assert (code, out.strip()) == (0, UUID), err
    assert run.pool() == [("0000:03:00.1", 42, "attached"), ("0000:81:00.1", 42, "attached")]
    xml = etree.fromstring(conn.lookupByUUIDString(UUID).XMLDesc(0).encode())
    assert len(xml.findall("devices/hostdev")) == 2
    assert [i.find("source").get("bridge") for i in xml.iter("interface")] == ["br0"]
    assert "INFO: NIC 02:00:0a:64:00:2a -> VF 0000:03:00.1" in err

    code, out, err = run("cancel", UUID, "host1", "42", "host1")
    assert code == 0, err
    assert run.pool() == []
    with pytest.raises(libvirt.libvirtError):
        conn.lookupByUUIDString(UUID)


def test_deploy_without_ib_nics_is_the_stock_deploy(run, conn):
    xml = deployment(nics=0)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=xml)
    assert (code, out, err) == (0, UUID + "\n", "")
    assert run.stock.calls == [("deploy", [run.dep(), "host1", "42", "host1"], xml.encode())]
    assert run.pool() == []


def test_deploy_hands_the_stock_script_the_xml_with_the_vfs(run, conn):
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=deployment(nics=2))
    assert (code, out) == (0, UUID + "\n"), err
    [(action, argv, xml)] = run.stock.calls
    assert argv == [run.dep(), "host1", "42", "host1"]
    assert len(etree.fromstring(xml).findall("devices/hostdev")) == 2
    assert open(run.dep(), "rb").read() == xml  # the stock deploy writes the file from it


def test_failed_stock_deploy_gives_everything_back(run, conn):
    guids = run.guids()
    run.stock.codes["deploy"] = 255
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=deployment(nics=2))
    assert (code, out) == (255, "")
    assert run.pool() == [] and run.guids() == guids


def test_exhaustion_fails_and_changes_nothing(run, conn):
    assert run("deploy", run.dep(7), "h", "7", "h", stdin=deployment(nics=4, name="one-7",
               uuid="00000000-0000-0000-0000-000000000007"))[0] == 0
    before = run.pool()
    code, out, err = run("deploy", run.dep(8), "h", "8", "h", stdin=deployment(nics=3, name="one-8",
                         uuid="00000000-0000-0000-0000-000000000008"))
    assert code == 1 and out == ""
    assert "not enough free SR-IOV VFs on this host: the VM needs 3" in err
    assert run.pool() == before
    assert "one-8" not in [d.name() for d in conn.listAllDomains()]


def test_libvirt_failure_releases_everything(run, conn):
    bad = deployment().replace("<memory>8388608</memory>", "<memory>-1</memory>")
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=bad)
    assert code == 255 and "Could not create domain" in err
    assert run.pool() == []
    assert "one-42" not in [d.name() for d in conn.listAllDomains()]


def test_deploy_twice_refused(run):
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment())[0] == 0
    code, _, err = run("deploy", run.dep(), "h", "42", "h", stdin=deployment())
    assert code == 1 and "already running" in err
    assert len(run.pool()) == 1


def test_named_pf_that_does_not_exist(run):
    code, _, err = run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-sriov:mlx5_9"))
    assert code == 1 and "not in this host's VF pool" in err
    assert run.pool() == []


def test_bad_input(run):
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin="<domain><name>x</name>")
    assert code == 1 and "not well-formed" in err and out == ""
    code, _, err = run("deploy", run.dep(), "h", "notanumber", "h", stdin=deployment())
    assert code == 1 and "<vmid> must be" in err
    code, _, err = run("shutdown", "only-one-arg")
    assert code == 1 and "expected 4 arguments" in err
    assert run.pool() == []


def test_shutdown_releases(run):
    run("deploy", run.dep(), "h", "42", "h", stdin=deployment())
    code, _, err = run("shutdown", UUID, "h", "42", "h")
    assert code == 0, err
    assert run.pool() == []


def test_stop_without_vfs_is_the_stock_script(run):
    for action in ("shutdown", "cancel", "save", "reboot", "reset", "exec"):
        run.stock.codes[action] = 3  # whatever it answers is the answer
        argv = [UUID, "/x/datastores/0/42/checkpoint", "h", "42", "h"] if action == "save" else [UUID, "h", "42", "h"]
        assert run(action, *argv)[0] == 3
    assert [c[0] for c in run.stock.calls] == ["shutdown", "cancel", "save", "reboot", "reset", "exec"]


def test_failed_stock_shutdown_keeps_the_vfs(run):
    run("deploy", run.dep(), "h", "42", "h", stdin=deployment())
    before = run.pool()
    run.stock.codes["shutdown"] = 1
    assert run("shutdown", UUID, "h", "42", "h")[0] == 1
    assert run.pool() == before


def test_cancel_of_a_deploy_id_that_does_not_resolve_frees_nothing(run, conn):
    """The stock cancel says success for an unknown domain; the VM's domain
    still runs with its VF: the VF must stay its, GUID and all."""
    run("deploy", run.dep(), "h", "42", "h", stdin=deployment())
    before, guids = run.pool(), run.guids()
    for action in ("cancel", "shutdown"):
        code, _, err = run(action, "no-such-domain", "h", "42", "h")
        assert code == 1 and "domain one-42 still runs" in err
    assert run.pool() == before and run.guids() == guids
    assert conn.lookupByName("one-42").isActive()


def test_restore_that_cannot_plug_keeps_the_checkpoint(run, conn, tmp_path, monkeypatch):
    """The stock restore removes the checkpoint once libvirt read it; when no
    VF can then be plugged, the VM must not run half-restored and the
    checkpoint must be back for a retry. (Save and restore with VFs plugged
    run on rung 3: libvirt's test driver cannot hot-plug.)"""
    from kvm_sriov.domain import hotplug
    from kvm_sriov.errors import HypervisorError
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    ckpt.parent.mkdir(parents=True)
    conn.createXML(deployment(nics=0), 0).save(str(ckpt))  # as our save leaves it: VFs off

    def refuse(*a, **kw):
        raise HypervisorError("the guest did not take the VF")
    monkeypatch.setattr(hotplug, "attach", refuse)
    action = (FIXTURES / "opennebula" / "action-restore.xml").read_text()  # one IB NIC
    action = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{ckpt.parent.parent}</BASE_PATH>", action)  # oned's own
    code, _, err = run("restore", str(ckpt), "h", UUID, "42", "h", stdin=action)
    assert code == 1 and "did not take the VF" in err
    assert [c[0] for c in run.stock.calls] == ["restore"]
    assert ckpt.exists() and run.pool() == []          # kept for a retry, nothing held
    assert UUID not in [d.UUIDString() for d in conn.listAllDomains() if d.isActive()]
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint"]


def test_reboot_and_reset_keep_vfs(run):
    run("deploy", run.dep(), "h", "42", "h", stdin=deployment())
    before = run.pool()
    for action in ("reboot", "reset"):
        assert run(action, UUID, "h", "42", "h")[0] == 0
    assert run.pool() == before
    assert [c[0] for c in run.stock.calls] == ["deploy", "reboot", "reset"]


@pytest.mark.parametrize("action,argv", [
    ("save", [UUID, "../../../../etc/passwd", "h", "42", "h"]),
    ("save", [UUID, "/var/lib/one/datastores/0/42/../../../../etc/passwd", "h", "42", "h"]),
    ("save", [UUID, "/var/lib/one/datastores/0/41/checkpoint", "h", "42", "h"]),
    ("restore", ["/etc/passwd", "h", UUID, "42", "h"]),
    ("deploy", ["deployment.0", "h", "42", "h"]),
    ("deploy", ["/tmp/x/42/deployment.0", "h", "42", "h"]),
])
def test_paths_outside_the_vm_folder_are_refused(run, action, argv):
    code, out, err = run(action, *argv, stdin=deployment() if action == "deploy" else "")
    assert code == 1 and "folder of a system datastore" in err
    assert run.stock.calls == [] and run.pool() == []


def test_path_through_a_symlink_is_refused(run, tmp_path):
    ds = tmp_path / "datastores" / "0"
    ds.mkdir(parents=True)
    (ds / "42").symlink_to("/etc")
    code, _, err = run("save", UUID, str(ds / "42" / "checkpoint"), "h", "42", "h")
    assert code == 1 and "symbolic link" in err
    (ds / "43").mkdir()
    (ds / "43" / "checkpoint").symlink_to("/etc/passwd")
    code, _, err = run("save", UUID, str(ds / "43" / "checkpoint"), "h", "43", "h")
    assert code == 1 and "symbolic link" in err
    assert run.stock.calls == []


def test_unknown_action(tmp_path):
    assert main("frobnicate", [], remotes_dir=tmp_path, stdin=io.StringIO("")) == 1


def test_metadata_keeps_every_vf_nic_while_detached(conn):
    """with_vfs: detached NICs stay recorded (with no VF), so a later restore
    from the image alone still knows every NIC that needs a VF."""
    from kvm_sriov.domain import domain_xml
    from kvm_sriov.node.vm import with_vfs
    from kvm_sriov.vf.discovery import VirtualFunction
    from kvm_sriov.node.host import Allocation
    from kvm_sriov.vf.policy import VfRequest

    root = etree.fromstring(deployment(nics=0).encode())
    domain_xml.record_nics(root, [domain_xml.NicRecord("02:00:00:00:00:01", "ib-sriov", "0000:03:00.1", "pf"),
                                  domain_xml.NicRecord("02:00:00:00:00:02", "ib-sriov:mlx5_0", "0000:03:00.2", "pf")])
    dom = conn.createXML(etree.tostring(root, encoding="unicode"), 0)
    vf = VirtualFunction("0000:03:00.4", 3, "pf", 0, "7", ("0000:03:00.4",), None, (), ())
    detached = with_vfs(dom, [])
    assert [(r.mac, r.bridge, r.vf) for r in detached] == [
        ("02:00:00:00:00:01", "ib-sriov", ""), ("02:00:00:00:00:02", "ib-sriov:mlx5_0", "")]
    one_back = with_vfs(dom, [Allocation(VfRequest("02:00:00:00:00:02", "mlx5_0"), vf)],
                        {"02:00:00:00:00:03": "ib-sriov"}, drop="02:00:00:00:00:01")
    assert [(r.mac, r.vf) for r in one_back] == [("02:00:00:00:00:02", "0000:03:00.4"), ("02:00:00:00:00:03", "")]


def test_other_actions_go_to_the_stock_kvm_driver(tmp_path, capfd):
    """Disks, snapshots, context CD-ROM, plain NICs: OpenNebula's own kvm
    script runs with the same argv and stdin (here a recording stand-in,
    since OpenNebula's scripts are not installed on this machine)."""
    stock = tmp_path / "remotes" / "vmm" / "kvm"
    stock.mkdir(parents=True)
    for action in ("attach_disk", "attach_nic"):
        script = stock / action
        script.write_text(f'#!/bin/sh\necho "{action} $*"\ncat > {tmp_path}/{action}.stdin\nexit 7\n')
        script.chmod(0o755)
    action_xml = (FIXTURES / "opennebula" / "action-attach_nic.xml").read_text()
    code = main("attach_disk", ["uuid", "one-42", "vdb", "42", "host1"],
                remotes_dir=tmp_path / "remotes", stdin=io.StringIO(action_xml))
    assert code == 7
    assert "attach_disk uuid one-42 vdb 42 host1" in capfd.readouterr().out
    assert (tmp_path / "attach_disk.stdin").read_text() == action_xml  # byte for byte


def test_plain_nic_attach_is_delegated(tmp_path, fake_host, make_config, capfd):
    stock = tmp_path / "remotes" / "vmm" / "kvm"
    stock.mkdir(parents=True)
    (stock / "attach_nic").write_text("#!/bin/sh\necho \"stock attach_nic $*\"\n")
    (stock / "attach_nic").chmod(0o755)
    host = Host(make_config(fake_host["root"]), Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")
    code = main("attach_nic", [UUID, "02:00:0a:00:00:99", "br0", "virtio", "bridge", "one-42-2", "42", "h"],
                stdin=io.StringIO(""), host=host)
    assert code == 0
    assert "stock attach_nic " + UUID + " 02:00:0a:00:00:99 br0 virtio bridge one-42-2 42 h" in capfd.readouterr().out
