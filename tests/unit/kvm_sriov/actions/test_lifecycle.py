"""Rung 1: deploy, shutdown and cancel of VMs with NICs on a whole-PF network
(BRIDGE = "ib-pf"): the actions in-process against libvirt's test driver
(the `run` fixture) on the fake sysfs whose kernel makes VFs appear and
disappear as sriov_numvfs is written."""

from xml.etree import ElementTree as etree

import pytest

from kvm_sriov.node.host import Host
from tests.support.actions_in_process import UUID, deployment

PF = "0000:03:00.0"
VFS = [f"0000:03:00.{i}" for i in range(1, 5)]


@pytest.fixture
def whole(fake_host, monkeypatch, run):
    """03:00.0 free to go whole (not the host's), the fake kernel on; the
    VF-less mlx5_1 (ib2) and the mlx4 PF (ib1) stay the host's."""
    run.configure(whole_pfs=True)  # off by default (pool.whole_pfs)
    fs = fake_host["fs"]
    fs.free_to_go_whole(monkeypatch, PF)
    return fs


def state(run):
    """(VF rows, whole-PF rows, the PF's VFs in sysfs)."""
    host = run.host()
    return (run.pool(), [(p.pf, p.vm_id, p.state, p.num_vfs) for p in host.pool.pf_assignments()],
            [v.address for v in host.inventory.vfs if v.pf == PF])


def mixed(*bridges):
    """The reference deployment with one NIC per bridge."""
    root = etree.fromstring(deployment(nics=len(bridges)).encode())
    ifaces = [i for i in root.iter("interface") if i.find("source").get("bridge") == "ib-sriov"]
    for iface, bridge in zip(ifaces, bridges):
        iface.find("source").set("bridge", bridge)
    return etree.tostring(root, encoding="unicode")


def test_deploy_passes_the_pf_whole_and_cancel_gives_its_vfs_back(run, whole, conn):
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))
    assert (code, out.strip()) == (0, UUID), err
    assert "INFO: NIC 02:00:0a:64:00:2a -> PF 0000:03:00.0 (whole)" in err
    assert state(run) == ([], [(PF, 42, "attached", 4)], [])
    hostdevs = etree.fromstring(conn.lookupByUUIDString(UUID).XMLDesc(0)).findall("devices/hostdev")
    assert [(h.find("source/address").get("bus"), h.find("source/address").get("function")) for h in hostdevs] \
        == [("0x03", "0x0")]
    assert run.guids() == []                                   # its port GUID is its own
    code, _, err = run("cancel", UUID, "h", "42", "h")
    assert code == 0, err
    assert state(run) == ([], [], VFS)


def test_a_vm_with_vf_and_whole_pf_nics_and_shutdown(run, whole):
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=mixed("ib-sriov", "ib-pf"))
    assert code == 0, err
    assert state(run) == ([("0000:81:00.1", 42, "attached")], [(PF, 42, "attached", 4)], [])
    assert run("shutdown", UUID, "h", "42", "h")[0] == 0
    assert state(run) == ([], [], VFS)


@pytest.mark.parametrize("failure", ["stock deploy", "libvirt"])
def test_a_failed_deploy_gives_everything_back(run, whole, failure):
    guids = run.guids()
    xml = mixed("ib-pf", "ib-sriov")
    if failure == "stock deploy":
        run.stock.codes["deploy"] = 255
    else:
        xml = xml.replace("<memory>8388608</memory>", "<memory>-1</memory>")
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=xml)
    assert code == 255 and out == ""
    assert state(run) == ([], [], VFS) and run.guids() == guids
    assert run.host().inventory.pf(PF).driver == "mlx5_core"


def test_whole_pfs_off_refuses_in_one_line_naming_the_setting(run, whole):
    """pool.whole_pfs off (the default; the fixture turned it on): an ib-pf
    NIC is refused before anything changes, naming the setting."""
    run.configure(whole_pfs=False)
    before = state(run)
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))
    assert code == 1 and out == ""
    assert "0000:03:00.0: whole PFs are off on this host (pool.whole_pfs = false" in err.strip().splitlines()[-1]
    assert state(run) == before and run.stock.calls == []


def test_no_pf_free_whole_is_one_line_and_changes_nothing(run, whole, fake_host):
    fake_host["fs"].add_netdev(PF, "ib0", up=True)             # the host uses it now
    before = state(run)
    code, out, err = run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == (
        "no PF of this host can be passed through whole for NIC 02:00:0a:64:00:2a (the VM needs 1 whole "
        "PF): 0000:03:00.0: in use on the host (ib0 is up); 0000:04:00.0: in use on the host (ib2 is up); "
        "0000:81:00.0: in use on the host (ib1 is up)")
    assert state(run) == before and run.stock.calls == []


def test_a_pf_whose_vfs_cannot_be_switched_off_unwinds(run, whole):
    whole.SRIOV_CONFIGURE = ()                                  # the kernel refuses sriov_numvfs
    code, _, err = run("deploy", run.dep(), "h", "42", "h", stdin=mixed("ib-sriov", "ib-pf"))
    assert code == 1 and "cannot switch its VFs off" in err
    assert state(run) == ([], [], VFS) and run.stock.calls == []


def test_a_vf_vm_cannot_take_a_vf_of_a_whole_pf(run, whole):
    assert run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))[0] == 0
    code, _, err = run("deploy", run.dep(43), "h", "43", "h", stdin=deployment(
        bridge="ib-sriov:mlx5_0", name="one-43", uuid="00000000-0000-0000-0000-000000000043"))
    assert code == 1 and "not enough free SR-IOV VFs on this host" in err
    assert state(run)[1] == [(PF, 42, "attached", 4)]


def test_shutdown_of_a_whole_pf_vm_is_ours_even_without_a_vf(run, whole):
    """vf_state: a VM holding only a whole PF is not handed to the stock
    script alone (its PF would stay with its VFs off)."""
    from kvm_sriov.node.vm import vf_state
    run("deploy", run.dep(), "h", "42", "h", stdin=deployment(bridge="ib-pf"))
    assert vf_state(Host(run.host().config), 42)
    run.stock.codes["shutdown"] = 1                              # the stock shutdown fails: all stays
    assert run("shutdown", UUID, "h", "42", "h")[0] == 1
    assert state(run)[1:] == ([(PF, 42, "attached", 4)], [])
