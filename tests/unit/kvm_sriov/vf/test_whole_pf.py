"""Rung 1: a PF passed through whole (vf/whole_pf.py): which PF may be, and
its VFs switched off and back on, on the fake sysfs whose kernel
(tests/support/fake_sysfs.py, kernel_write) makes VFs appear and disappear
as sriov_numvfs is written."""

import errno
import os

import pytest

from kvm_sriov.errors import DriverError
from kvm_sriov.vf import availability, discovery, whole_pf
from kvm_sriov.vf.sysfs import Sysfs
from tests.support.fake_sysfs import FakeSysfs


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Two mlx5 PFs, their netdevs down (not the host's), and the fake kernel."""
    fs = FakeSysfs(tmp_path / "root")
    fs.add_pf("0000:03:00.0", numa=0, num_vfs=4, netdev="ib0", ibdev="mlx5_0")
    fs.add_pf("0000:04:00.0", numa=1, num_vfs=2, netdev="ib1", ibdev="mlx5_1")
    fs.add_netdev("0000:03:00.0", "ib0", up=False)
    fs.add_netdev("0000:04:00.0", "ib1", up=False)
    fs.install_kernel(monkeypatch)
    return fs


def inventory(fs):
    return discovery.discover(Sysfs(fs.root))


def pf_and_vfs(fs, address, skip=True):
    inv = discovery.discover(Sysfs(fs.root), (), skip)
    return inv.pf(address), [v for v in inv.vfs if v.pf == address]


# -- the fake kernel: sriov_numvfs as drivers/pci/iov.c answers it -----------------
def test_the_fake_kernel_switches_vfs_off_and_on_as_the_real_one(host):
    sysfs = Sysfs(host.root)
    numvfs = sysfs.at("bus", "pci", "devices", "0000:03:00.0", "sriov_numvfs")
    before = {v.address for v in inventory(host).vfs}
    sysfs.write(numvfs, "0")
    assert {v.address for v in inventory(host).vfs} == before - {f"0000:03:00.{i}" for i in range(1, 5)}
    for vf in ("0000:03:00.1", "0000:03:00.4"):   # gone from everywhere the kernel names it
        assert not os.path.lexists(sysfs.at("bus", "pci", "devices", vf))
        assert vf not in host.groups
    assert not os.path.exists(sysfs.at("bus", "pci", "devices", "0000:03:00.0", "sriov"))
    sysfs.write(numvfs, "3")
    assert [v.address for v in inventory(host).vfs if v.pf == "0000:03:00.0"] == \
        ["0000:03:00.1", "0000:03:00.2", "0000:03:00.3"]
    assert all(v.eligible for v in inventory(host).vfs)
    with pytest.raises(OSError) as busy:             # a new count only from 0
        sysfs.write(numvfs, "2")
    assert busy.value.errno == errno.EBUSY
    with pytest.raises(OSError) as big:
        sysfs.write(numvfs, "9")
    assert big.value.errno == errno.ERANGE
    sysfs.write(numvfs, "3")                         # the same count: nothing to do
    host.bind("0000:03:00.0", "vfio-pci")
    with pytest.raises(OSError) as unbound:          # no sriov_configure: vfio-pci (as mlx4_core)
        sysfs.write(numvfs, "0")
    assert unbound.value.errno == errno.ENOENT


def test_write_attribute_never_creates_a_file_nor_follows_a_link(tmp_path):
    from kvm_sriov.vf.sysfs import write_attribute
    with pytest.raises(FileNotFoundError):
        write_attribute(tmp_path / "sriov_numvfs", "0")
    assert not (tmp_path / "sriov_numvfs").exists()
    (tmp_path / "victim").write_text("keep\n")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError) as loop:
        write_attribute(tmp_path / "link", "0")
    assert loop.value.errno == errno.ELOOP
    assert (tmp_path / "victim").read_text() == "keep\n"


# -- which PF may be passed through whole ---------------------------------------------------
def test_a_pf_of_the_pool_with_nothing_held_is_free(host):
    pf, vfs = pf_and_vfs(host, "0000:03:00.0")
    assert (pf.iommu_group is not None, pf.group_members, pf.up_netdevs) == (True, ("0000:03:00.0",), ())
    assert whole_pf.problems(pf, vfs, True) == ()
    assert whole_pf.why_not_free(pf, vfs, True, {}, {}) is None


def test_held_vfs_or_a_holder_keep_the_pf(host):
    pf, vfs = pf_and_vfs(host, "0000:03:00.0")
    assert whole_pf.why_not_free(pf, vfs, True, {"0000:03:00.2": 7}, {}) == "1 of its VFs held (0000:03:00.2)"
    assert whole_pf.why_not_free(pf, vfs, True, {"0000:03:00.2", "0000:03:00.4"}, {}) == \
        "2 of its VFs held (0000:03:00.2, ...)"
    assert whole_pf.why_not_free(pf, vfs, True, {}, {"0000:03:00.0": 9}) == "passed through whole to VM 9"


def test_a_pf_the_host_uses_or_that_cannot_be_isolated_is_never_free(host):
    host.add_netdev("0000:03:00.0", "ib0", up=True)              # the host's IPoIB on it
    pf, vfs = pf_and_vfs(host, "0000:03:00.0")
    assert whole_pf.problems(pf, vfs, True) == ("in use on the host (ib0 is up)",)
    assert whole_pf.problems(pf, vfs, False) == ()                # pool.skip_vfs_in_host_use = false
    host.add_netdev("0000:03:00.0", "ib0", up=False)
    host.bind("0000:03:00.2", "mlx5_core")                        # a VF the host uses
    host.add_netdev("0000:03:00.2", "ib7", up=True)
    pf, vfs = pf_and_vfs(host, "0000:03:00.0")
    assert whole_pf.problems(pf, vfs, True) == ("its VF 0000:03:00.2 is in use on the host",)
    host.add_device("0000:03:00.7", group=host.groups["0000:03:00.0"])   # no ACS: shares its group
    pf, vfs = pf_and_vfs(host, "0000:03:00.0")
    assert f"IOMMU group {pf.iommu_group} also holds 0000:03:00.7" in whole_pf.problems(pf, vfs, True)
    host.bind("0000:04:00.0", "vfio-pci")
    pf, vfs = pf_and_vfs(host, "0000:04:00.0")
    assert whole_pf.problems(pf, vfs, True) == ("bound to vfio-pci: passed through by something else",)
    host.bind("0000:04:00.0", None)
    pf, vfs = pf_and_vfs(host, "0000:04:00.0")
    assert whole_pf.problems(pf, vfs, True) == ("bound to no driver, so its VFs cannot be switched off and on",)


def test_the_probe_scan_and_deploy_discovery_agree(host, make_config):
    """availability.whole_pfs (probe, status) on the fast scan says what
    why_not_free says on discovery's records (deploy)."""
    host.bind("0000:03:00.3", "mlx5_core")
    host.add_netdev("0000:03:00.3", "ib9", up=True)
    cfg = make_config(host.root)
    held = availability.Holdings({"0000:04:00.1": 3}, {}, {})
    fast = availability.whole_pfs(availability.scan(cfg), held, cfg.skip_vfs_in_host_use)
    inv = inventory(host)
    slow = {pf.address: whole_pf.why_not_free(pf, [v for v in inv.vfs if v.pf == pf.address], True,
                                              held.vfs, held.pfs) for pf in inv.pfs}
    assert fast == slow == {"0000:03:00.0": "its VF 0000:03:00.3 is in use on the host",
                            "0000:04:00.0": "1 of its VFs held (0000:04:00.1)"}


# -- switching its VFs off and on ---------------------------------------------------
def test_switch_off_then_on_gives_the_same_vfs_back(host):
    sysfs = Sysfs(host.root)
    whole_pf.switch_off(sysfs, "0000:03:00.0")
    assert whole_pf.num_vfs(sysfs, "0000:03:00.0") == 0
    assert [v.pf for v in inventory(host).vfs] == ["0000:04:00.0"] * 2
    whole_pf.switch_off(sysfs, "0000:03:00.0")                  # again: nothing to do
    whole_pf.switch_on(sysfs, "0000:03:00.0", 4)
    assert [v.address for v in inventory(host).vfs if v.pf == "0000:03:00.0"] == \
        [f"0000:03:00.{i}" for i in range(1, 5)]


def test_switch_on_takes_the_pf_off_vfio_pci_first(host):
    """libvirt leaves it on vfio-pci when it could not give it back (say it
    was killed): off vfio-pci, override cleared, its own driver again."""
    sysfs = Sysfs(host.root)
    whole_pf.switch_off(sysfs, "0000:03:00.0")
    (host.dev("0000:03:00.0") / "driver_override").write_text("vfio-pci\n")
    host.bind("0000:03:00.0", "vfio-pci")
    whole_pf.switch_on(sysfs, "0000:03:00.0", 4)
    assert host.driver_of("0000:03:00.0") == "mlx5_core"
    assert (host.dev("0000:03:00.0") / "driver_override").read_text().strip() == "(null)"
    assert whole_pf.num_vfs(sysfs, "0000:03:00.0") == 4


def test_switch_on_from_another_count_goes_through_zero(host):
    sysfs = Sysfs(host.root)
    sysfs.write(sysfs.at("bus", "pci", "devices", "0000:03:00.0", "sriov_numvfs"), "0")
    sysfs.write(sysfs.at("bus", "pci", "devices", "0000:03:00.0", "sriov_numvfs"), "2")
    whole_pf.switch_on(sysfs, "0000:03:00.0", 4)
    assert whole_pf.num_vfs(sysfs, "0000:03:00.0") == 4


def test_a_pf_whose_driver_cannot_change_its_vfs_is_one_line(tmp_path, monkeypatch):
    fs = FakeSysfs(tmp_path / "root")
    fs.add_pf("0000:81:00.0", layout="mlx4", num_vfs=4)           # ConnectX-3: module options
    fs.install_kernel(monkeypatch)
    sysfs = Sysfs(fs.root)
    with pytest.raises(DriverError, match=r"^PF 0000:81:00.0: cannot switch its VFs off: "
                                          r".*/sriov_numvfs: No such file or directory$"):
        whole_pf.switch_off(sysfs, "0000:81:00.0")
    assert whole_pf.num_vfs(sysfs, "0000:81:00.0") == 4         # nothing changed


def test_a_pf_no_driver_takes_back_is_said(host, monkeypatch):
    sysfs = Sysfs(host.root)
    whole_pf.switch_off(sysfs, "0000:03:00.0")
    host.bind("0000:03:00.0", None)
    host.home["0000:03:00.0"] = None                               # mlx5_core unloaded, say
    with pytest.raises(DriverError, match="bound to no driver after a probe, so its 4 VFs cannot be"):
        whole_pf.switch_on(sysfs, "0000:03:00.0", 4)


def test_as_device_is_the_pf_for_hostdev_and_hot_plug(host):
    pf, _ = pf_and_vfs(host, "0000:03:00.0")
    dev = whole_pf.as_device(pf)
    assert (dev.address, dev.pf, dev.pci_parts, whole_pf.is_whole(dev)) == \
        ("0000:03:00.0", "0000:03:00.0", (0, 3, 0, 0), True)
    assert not whole_pf.is_whole(inventory(host).vf("0000:03:00.1"))
