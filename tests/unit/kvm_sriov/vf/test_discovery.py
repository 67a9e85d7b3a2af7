"""Rung 1: VF discovery on a fake sysfs (mlx5 + mlx4, two NUMA nodes)."""

import pytest

from kvm_sriov.vf import discovery
from kvm_sriov.errors import ConfigError
from kvm_sriov.vf.sysfs import Sysfs


def inv(fake_host, selectors=(), skip=True):
    return discovery.discover(Sysfs(fake_host["root"]), selectors, skip)


def test_default_selects_infiniband_pfs_only(fake_host):
    pfs = {pf.address for pf in inv(fake_host).pfs}
    # the Ethernet ConnectX (class 0x0200) is left out; the VF-less PF is listed but gives nothing
    assert pfs == {"0000:03:00.0", "0000:04:00.0", "0000:81:00.0"}


def test_vf_details_mlx5(fake_host):
    vf = inv(fake_host).vf("0000:03:00.1")
    assert (vf.index, vf.pf, vf.numa_node, vf.driver) == (0, "0000:03:00.0", 0, None)
    assert vf.group_members == ("0000:03:00.1",)
    assert vf.iommu_group is not None and vf.eligible


def test_vf_details_mlx4_second_numa_node(fake_host):
    inventory = inv(fake_host)
    pf = inventory.pf("0000:81:00.0")
    assert (pf.driver, pf.numa_node, pf.ib_devices, pf.netdevs) == ("mlx4_core", 1, ("mlx4_0",), ("ib1",))
    vfs = [v for v in inventory.vfs if v.pf == pf.address]
    assert [v.index for v in vfs] == [0, 1, 2, 3]
    assert {v.numa_node for v in vfs} == {1}


def test_pf_itself_never_offered(fake_host):
    addresses = {v.address for v in inv(fake_host).vfs}
    assert not addresses & {"0000:03:00.0", "0000:81:00.0", "0000:04:00.0"}


def test_shared_iommu_group_refused(fake_host):
    vf = inv(fake_host).vf("0000:81:00.4")
    assert not vf.eligible
    assert "0000:80:01.0" in vf.group_members
    assert "also holds 0000:80:01.0" in vf.problems[0]


def test_vf_in_host_use_refused_unless_config_allows(fake_host):
    busy = inv(fake_host).vf("0000:03:00.3")
    assert busy.driver == "mlx5_core" and not busy.eligible
    assert "ib3 is up" in busy.problems[0]
    idle = inv(fake_host).vf("0000:03:00.2")   # host driver bound, netdev down: libvirt may take it
    assert idle.eligible
    assert inv(fake_host, skip=False).vf("0000:03:00.3").eligible


def test_pf_with_vfs_disabled_gives_none(fake_host):
    inventory = inv(fake_host)
    pf = inventory.pf("0000:04:00.0")
    assert (pf.num_vfs, pf.total_vfs) == (0, 8)
    assert not [v for v in inventory.vfs if v.pf == pf.address]


def test_ib_ports(fake_host):
    pf = inv(fake_host).pf("0000:03:00.0")
    assert [(p.device, p.port) for p in pf.ib_ports] == [("mlx5_0", 1)]


@pytest.mark.parametrize("selector, expected", [
    ("0000:03:00.0", {"0000:03:00.0"}),
    ("03:00.0", {"0000:03:00.0"}),
    ("ib1", {"0000:81:00.0"}),
    ("mlx5_0", {"0000:03:00.0"}),
    ("mlx4_0:1", {"0000:81:00.0"}),
    ("15b3:1017", {"0000:03:00.0", "0000:04:00.0"}),
    ("15b3:1015", {"0000:05:00.0"}),          # an explicit selector may name a non-IB PF
])
def test_selectors(fake_host, selector, expected):
    assert {pf.address for pf in inv(fake_host, [selector]).pfs} == expected


def test_unknown_selector_is_a_config_error(fake_host):
    with pytest.raises(ConfigError, match="'mlx5_9' matches no SR-IOV PF"):
        inv(fake_host, ["mlx5_9"])


def test_no_iommu_group_refused(tmp_path):
    from tests.support.fake_sysfs import FakeSysfs
    fs = FakeSysfs(tmp_path)
    fs.add_pf("0000:03:00.0", num_vfs=1, iommu=False)
    vf = discovery.discover(Sysfs(tmp_path)).vfs[0]
    assert not vf.eligible and "IOMMU" in vf.problems[0]


def test_empty_sysfs(tmp_path):
    assert discovery.discover(Sysfs(tmp_path)).vfs == ()
