"""Rung 1: which VFs a VM gets."""

import pytest

from kvm_sriov.vf import discovery
from kvm_sriov.errors import InputError, PoolExhausted
from kvm_sriov.vf.policy import VfRequest, choose
from kvm_sriov.vf.sysfs import Sysfs


@pytest.fixture
def inventory(fake_host):
    return discovery.discover(Sysfs(fake_host["root"]))


def pick(inventory, *selectors, taken=()):
    free = [v for v in inventory.eligible_vfs() if v.address not in taken]
    pfs = {p.address: p for p in inventory.pfs}
    reqs = [VfRequest(f"02:00:00:00:00:{i:02x}", s) for i, s in enumerate(selectors)]
    return [v.address for v in choose(reqs, free, pfs)]


def test_two_nics_go_to_two_pfs(inventory):
    assert pick(inventory, None, None) == ["0000:03:00.1", "0000:81:00.1"]


def test_named_pf_is_honoured(inventory):
    assert pick(inventory, "mlx4_0") == ["0000:81:00.1"]
    assert pick(inventory, "ib0", None) == ["0000:03:00.1", "0000:81:00.1"]


def test_most_free_pf_first(inventory):
    # 03:00 has 3 eligible (one is busy on the host), 81:00 has 3 (one shares a group)
    taken = {"0000:03:00.1"}
    assert pick(inventory, None, taken=taken) == ["0000:81:00.1"]


def test_exhausted_names_what_is_missing(inventory):
    with pytest.raises(PoolExhausted, match=r"needs 4 \(4 on mlx5_0\); free: 3 on 0000:03:00.0"):
        pick(inventory, "mlx5_0", "mlx5_0", "mlx5_0", "mlx5_0")


def test_unknown_pf_in_bridge_is_input_error(inventory):
    with pytest.raises(InputError, match="not in this host's VF pool"):
        pick(inventory, "mlx5_7")


def test_deterministic(inventory):
    assert pick(inventory, None, None, None) == pick(inventory, None, None, None)


# -- whole PFs (BRIDGE = "ib-pf") ---------------------------------------------------------
def test_a_nic_request_says_vf_or_whole_pf_from_its_bridge():
    from kvm_sriov.vf.policy import is_whole_pf_bridge, nic_request
    mac = "02:00:00:00:00:01"
    assert nic_request(mac, "ib-sriov", "ib-sriov") == VfRequest(mac, None, False)
    assert nic_request(mac, "ib-sriov:mlx5_0 ", "ib-sriov") == VfRequest(mac, "mlx5_0", False)
    assert nic_request(mac, " ib-sriov", "ib-sriov") is None          # as the bridge is written
    assert nic_request(mac, "ib-pf", "ib-sriov") == VfRequest(mac, None, True)
    assert nic_request(mac, "ib-pf:0000:03:00.0", "ib-sriov") == VfRequest(mac, "0000:03:00.0", True)
    for other in ("br0", "ib-pf:", "ib-pf: ", "ib-pfx", "ib-sriov:", "", "ib-sriovx"):
        assert nic_request(mac, other, "ib-sriov") is None, other
    assert is_whole_pf_bridge("ib-pf:ib1") and not is_whole_pf_bridge("ib-sriov")


def _pf(address, numa=0, num_vfs=4, netdev="ib0"):
    return discovery.PhysicalFunction(address, "15b3", "1017", 0x020700, "mlx5_core", numa,
                                      (netdev,), (), 8, num_vfs)


def whole(pfs, *selectors, why_not=None, nodes=None, policy="ignore"):
    from kvm_sriov.vf.policy import choose_whole_pfs
    reqs = [VfRequest(f"02:00:00:00:00:{i:02x}", s, True) for i, s in enumerate(selectors)]
    return [pf.address for pf in choose_whole_pfs(reqs, pfs, why_not or {}, nodes, policy)]


def test_whole_pf_the_one_with_fewest_vfs_then_the_lowest_address():
    pfs = [_pf("0000:03:00.0", num_vfs=4, netdev="ib0"), _pf("0000:04:00.0", num_vfs=2, netdev="ib1"),
           _pf("0000:05:00.0", num_vfs=2, netdev="ib2")]
    assert whole(pfs, None) == ["0000:04:00.0"]            # leaves the most VFs in the pool
    assert whole(pfs, None, None, None) == ["0000:04:00.0", "0000:05:00.0", "0000:03:00.0"]
    assert whole(pfs, None, "ib0") == ["0000:04:00.0", "0000:03:00.0"]   # a named PF picks first
    assert whole(pfs, None, why_not={"0000:04:00.0": "1 of its VFs held (0000:04:00.1)"}) == ["0000:05:00.0"]


def test_whole_pf_numa_wish():
    pfs = [_pf("0000:03:00.0", numa=0, num_vfs=1), _pf("0000:81:00.0", numa=1, num_vfs=4, netdev="ib1")]
    assert whole(pfs, None, nodes=frozenset([1]), policy="prefer") == ["0000:81:00.0"]
    assert whole(pfs, None, nodes=frozenset([1]), policy="ignore") == ["0000:03:00.0"]
    assert whole(pfs, None, None, nodes=frozenset([1]), policy="prefer") == ["0000:81:00.0", "0000:03:00.0"]
    with pytest.raises(PoolExhausted, match=r"^NUMA policy 'require': no PF to pass through whole for NIC "
                                            r"02:00:00:00:00:01 on NUMA node\(s\) 1 .*0000:03:00.0 on node 0"):
        whole(pfs, None, None, nodes=frozenset([1]), policy="require")
    from kvm_sriov.vf.policy import AUTO
    assert whole(pfs + [_pf("0000:82:00.0", numa=1, netdev="ib2")], None, nodes=AUTO, policy="require") \
        == ["0000:81:00.0"]                                 # the node with the most free PFs


def test_no_whole_pf_names_each_pf_and_why():
    pfs = [_pf("0000:03:00.0"), _pf("0000:04:00.0", netdev="ib1")]
    why = {"0000:03:00.0": "2 of its VFs held (0000:03:00.1, ...)", "0000:04:00.0": "in use on the host (ib1 is up)"}
    with pytest.raises(PoolExhausted) as refused:
        whole(pfs, None, why_not=why)
    assert str(refused.value) == (
        "no PF of this host can be passed through whole for NIC 02:00:00:00:00:00 (the VM needs 1 whole PF): "
        "0000:03:00.0: 2 of its VFs held (0000:03:00.1, ...); 0000:04:00.0: in use on the host (ib1 is up)")
    with pytest.raises(PoolExhausted, match=r"needs 2 whole PFs\): 0000:03:00.0: taken by another NIC of the VM; 0000:04:00.0: x$"):
        whole(pfs, None, None, why_not={"0000:04:00.0": "x"})
    with pytest.raises(InputError, match="asks for a PF that is not in this host's pool"):
        whole(pfs, "mlx5_9")
    many = [_pf(f"0000:{n:02x}:00.0", netdev=f"ib{n}") for n in range(10)]
    with pytest.raises(PoolExhausted, match=r"; 0000:05:00.0: held and 4 more$"):
        whole(many, None, why_not={pf.address: "held" for pf in many})


def test_a_vm_with_vf_and_whole_pf_nics_gets_no_vf_of_its_whole_pf(inventory):
    from kvm_sriov.vf.policy import choose_all
    pfs = {p.address: p for p in inventory.pfs}
    reqs = [VfRequest("02:00:00:00:00:01"), VfRequest("02:00:00:00:00:02", None, True), VfRequest("02:00:00:00:00:03")]
    got = choose_all(reqs, inventory.eligible_vfs(), pfs, {"0000:04:00.0": "in use on the host (ib2 is up)"})
    assert [d.address for d in got] == ["0000:81:00.1", "0000:03:00.0", "0000:81:00.2"]
    assert got[1].index == -1 and got[1].pf == "0000:03:00.0"    # the PF itself (whole_pf.as_device)
    # without whole-PF NICs: exactly choose()
    assert choose_all(reqs[:1], inventory.eligible_vfs(), pfs, {}) == choose(reqs[:1], inventory.eligible_vfs(), pfs)


def test_an_unpinned_numa_vm_has_its_vfs_wished_where_its_whole_pf_is(inventory):
    from kvm_sriov.vf.policy import AUTO, choose_all
    pfs = {p.address: p for p in inventory.pfs}
    why = {"0000:03:00.0": "x", "0000:04:00.0": "x"}                # only the node-1 PF may go whole
    reqs = [VfRequest("02:00:00:00:00:01", None, True), VfRequest("02:00:00:00:00:02")]
    with pytest.raises(PoolExhausted, match="NUMA policy 'require': no free VF .* on NUMA node\\(s\\) 1"):
        choose_all(reqs, inventory.eligible_vfs(), pfs, why, AUTO, "require")
    got = choose_all(reqs, inventory.eligible_vfs(), pfs, why, AUTO, "prefer")
    assert [d.address for d in got] == ["0000:81:00.0", "0000:03:00.1"]
