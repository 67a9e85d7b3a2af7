"""One definition of usable and free VFs: the probe, deploy's VF choice,
`kvm-sriov status` and the placement policy agree on the same fake-sysfs host
for every configuration option that narrows the set."""

import contextlib
import io
import json

import pytest

from kvm_sriov import cli
from kvm_sriov.scheduler import placement
from kvm_sriov.errors import PoolExhausted
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import DomainRef, LiveState
from kvm_sriov.vf.policy import VfRequest
from kvm_sriov.vf.pool import VfPool
from tests.support.probe import run_probe

# The reference host (tests/support/fake_sysfs.standard_host): mlx5 03:00.0
# (ib0, NUMA 0, VF .3 up on the host), mlx4 81:00.0 (ib1, NUMA 1, VF .4 shares
# its IOMMU group), mlx5 04:00.0 without VFs, an Ethernet PF 05:00.0. VF
# 81:00.1 is held by VM 3.
CASES = {
    "defaults": ({}, 5),
    "pool.pfs by netdev": ({"pfs": ["ib0"]}, 3),
    "pool.pfs by address": ({"pfs": ["0000:81:00.0"]}, 2),
    "pool.pfs by vendor:device": ({"pfs": ["15b3:1003"]}, 2),
    "pool.pfs takes the Ethernet PF": ({"pfs": ["enp5s0", "ib1"]}, 4),
    "pool.exclude_vfs": ({"exclude_vfs": ["0000:03:00.1", "0000:81:00.2"]}, 3),
    "exclude_vfs of a held VF": ({"exclude_vfs": ["0000:81:00.1"]}, 5),
    "exclude_vfs of an unusable VF": ({"exclude_vfs": ["0000:03:00.3"]}, 5),
    "skip_vfs_in_host_use off": ({"skip_vfs_in_host_use": False}, 6),
    "everything at once": ({"pfs": ["ib0"], "exclude_vfs": ["0000:03:00.4"],
                            "skip_vfs_in_host_use": False}, 3),
}


def _toml_lines(pool: dict) -> list[str]:
    """Keys for the probe's [pool] table (run_probe's file ends inside it)."""
    return [f"{k} = {json.dumps(v)}" for k, v in pool.items()]


def _hold(state_dir):
    pool = VfPool(state_dir / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add("0000:81:00.1", "0000:81:00.0", 3, "one-3", "", "attached", "deploy")
    pool.close()


class _Vm3Running:
    """libvirt as deploy asks it: VM 3 runs with the VF the pool gives it (so
    reconciliation keeps that VF held); reservations of new VMs are fresh."""
    domain = DomainRef("one-3", "00000000-0000-0000-0000-000000000003")

    def live_state(self):
        return LiveState({"one-3": self.domain}, {"0000:81:00.1": self.domain})

    def close(self):
        pass


def _deploy_capacity(cfg) -> int:
    """How many one-VF VMs deploy's VF choice accepts before it refuses."""
    host = Host(cfg, hypervisor=_Vm3Running())
    try:
        for n in range(100, 120):
            try:
                host.reserve(n, f"one-{n}", [VfRequest(f"02:00:00:00:00:{n:02x}")], "deploy")
            except PoolExhausted:
                return n - 100
    finally:
        host.close()
    raise AssertionError("deploy never refused")


def _status_free(cfg) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.cmd_status(cfg, type("A", (), {"json": True})()) == 0
    return sum(p["free"] for p in json.loads(out.getvalue())["pfs"])


@pytest.mark.parametrize("case", CASES)
def test_probe_deploy_status_and_placement_agree(case, tmp_path, fake_host, make_config):
    pool_opts, expected = CASES[case]
    _hold(tmp_path / "state")
    probed = run_probe(tmp_path, fake_host["root"], lines=_toml_lines(pool_opts))
    assert "KVM_SRIOV_ERROR" not in probed, probed
    cfg = make_config(fake_host["root"], pool=dict(pool_opts))
    free_probe = int(probed["KVM_SRIOV_FREE_VFS"])
    free_status = _status_free(cfg)
    free_placement = placement.HostVfs.from_monitoring(probed).free
    free_deploy = _deploy_capacity(cfg)
    assert (free_probe, free_status, free_placement, free_deploy) == (expected,) * 4


def test_numa_counts_agree(tmp_path, fake_host, make_config):
    _hold(tmp_path / "state")
    probed = run_probe(tmp_path, fake_host["root"], lines=_toml_lines({"exclude_vfs": ["0000:03:00.1"]}))
    host = placement.HostVfs.from_monitoring(probed)
    assert host.free_per_node() == {0: 2, 1: 2}
    assert {pf.address: pf.free for pf in host.pfs} == {"0000:03:00.0": 2, "0000:81:00.0": 2,
                                                        "0000:04:00.0": 0}
