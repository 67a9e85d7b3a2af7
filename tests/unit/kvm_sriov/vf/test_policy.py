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
