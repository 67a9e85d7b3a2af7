"""Rung 1: which VF each IB NIC of a VM with passed-through GPUs gets when it
asks for VFs close to them (KVM_SRIOV_GPU_AFFINITY), on DGX A100- and
H100-style fake sysfs trees (tests/support/gpu_hosts.py): policy.choose with
the closeness topology.vm_gpus reads."""

import pytest

from kvm_sriov.errors import PoolExhausted
from kvm_sriov.vf.discovery import discover
from kvm_sriov.vf.gpu_affinity import GpuWish, GuestPair, guest_pairs, served
from kvm_sriov.vf.policy import AUTO, FreeVfs, VfRequest, choose
from kvm_sriov.vf.sysfs import Sysfs
from kvm_sriov.vf.topology import Closeness, vm_gpus
from tests.support.gpu_hosts import dgx_a100, dgx_h100

A100_GPUS = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
H100_GPUS = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]


def addr(bus):
    return f"0000:{bus}:00.0"


class Host:
    """A fake GPU server: its pool's VFs, and choose() for a VM's GPUs."""

    def __init__(self, root, build):
        build(root)
        self.sysfs = Sysfs(root)
        self.inventory = discover(self.sysfs)
        self.pfs = {pf.address: pf for pf in self.inventory.pfs}
        self.taken = set()

    def take_all_of(self, *buses):
        self.taken |= {vf.address for vf in self.inventory.eligible_vfs() if vf.pf[5:7] in buses}

    def wish(self, level, gpu_buses):
        topo = vm_gpus(self.sysfs, [addr(b) for b in gpu_buses], self.inventory.pfs)
        assert topo.problems == ()
        return GpuWish(level, topo.gpus, topo.closeness)

    def choose(self, nics, level=None, gpu_buses=(), **numa):
        free = [vf for vf in self.inventory.eligible_vfs() if vf.address not in self.taken]
        requests = [VfRequest(f"02:00:00:00:00:{n:02x}") for n in range(nics)]
        gpus = self.wish(level, gpu_buses) if level else None
        return choose(requests, FreeVfs.of(free), self.pfs, gpus=gpus, **numa)


def pfs_of(chosen):
    return [vf.pf[5:7] for vf in chosen]


def test_dgx_a100_eight_gpus_eight_nics_one_rail_each_behind_its_switch(tmp_path):
    host = Host(tmp_path, dgx_a100)
    got = host.choose(8, "switch", A100_GPUS)
    # NIC i is GPU i's rail (GPUs in address order): pair_rails' answer
    assert pfs_of(got) == ["0c", "12", "4b", "54", "8d", "94", "ba", "cc"]
    wish = host.wish("switch", A100_GPUS)
    assert [served(wish, 8, i, vf.pf)[1:3] for i, vf in enumerate(got)] == [
        (vf.pf, "switch") for vf in got]


def test_dgx_h100_each_nic_from_its_gpus_switch(tmp_path):
    host = Host(tmp_path, dgx_h100)
    assert pfs_of(host.choose(8, "switch", H100_GPUS)) == ["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]
    # a VM with two GPUs on different sockets: each NIC from its own GPU's switch
    assert pfs_of(host.choose(2, "switch", ["9d", "1b"])) == ["18", "9a"]


def test_without_a_gpu_wish_the_choice_is_todays(tmp_path):
    """Today's rule spreads two NICs over the PFs with the most free VFs,
    whatever GPUs the VM has; the wish is what moves them."""
    host = Host(tmp_path, dgx_a100)
    assert pfs_of(host.choose(2)) == ["0c", "12"]
    assert pfs_of(host.choose(2, "switch", ["b7", "bd"])) == ["ba", "cc"]
    # a wish without GPU is no wish
    empty = GpuWish("switch", (), ())
    free = [vf for vf in host.inventory.eligible_vfs()]
    requests = [VfRequest("02:00:00:00:00:01"), VfRequest("02:00:00:00:00:02")]
    assert choose(requests, free, host.pfs, gpus=empty) == choose(requests, free, host.pfs)


def test_fewer_nics_than_gpus_take_the_closest_pfs_spread(tmp_path):
    host = Host(tmp_path, dgx_a100)
    # one NIC, GPUs on two switches: a PF behind either switch
    assert pfs_of(host.choose(1, "switch", ["07", "87"])) == ["0c"]
    # three NICs, two GPUs behind one switch: its two HCAs first, then the
    # third NIC shares one of them rather than going farther
    assert pfs_of(host.choose(3, "switch", ["07", "0f"])) == ["0c", "12", "0c"]


def test_a_full_switch_fails_switch_and_falls_back_to_numa(tmp_path):
    host = Host(tmp_path, dgx_a100)
    host.take_all_of("0c", "12")
    for level in ("switch", "root"):   # no root-port-only PF on this host either
        with pytest.raises(PoolExhausted) as refused:
            host.choose(1, level, ["07"])
        message = str(refused.value)
        assert "\n" not in message and "GPU 0000:07:00.0" in message
        assert message.startswith(f'KVM_SRIOV_GPU_AFFINITY = "{level}": no free VF ')
        assert message.endswith("nearest first: 0000:4b:00.0 (numa), 0000:54:00.0 (numa), "
                                "0000:8d:00.0 (far), 0000:94:00.0 (far) and 2 more")
    # numa: a PF on the GPU's node
    assert pfs_of(host.choose(1, "numa", ["07"])) == ["4b"]


def test_the_refusal_names_the_gpu_whose_rail_is_gone(tmp_path):
    """Two GPUs behind one switch, one free VF left behind it: the first
    GPU's NIC gets it, the second GPU has none close enough, and choose
    raises before anything is taken (the caller's pool is untouched)."""
    host = Host(tmp_path, dgx_a100)
    host.take_all_of("0c")
    host.taken.add("0000:12:00.1")
    with pytest.raises(PoolExhausted) as refused:
        host.choose(2, "switch", ["07", "0f"])
    assert "PCIe switch of GPU 0000:0f:00.0 for NIC 02:00:00:00:00:01" in str(refused.value)
    # "numa" is met on the same socket's other switch
    assert pfs_of(host.choose(2, "numa", ["07", "0f"])) == ["12", "4b"]


def test_auto_numa_node_follows_the_gpus(tmp_path):
    """An unpinned HPC VM (numa AUTO) asking 'require': the node is the one
    its GPUs' close PFs are on, not the one with the most free VFs."""
    host = Host(tmp_path, dgx_a100)
    host.take_all_of("94")                     # node 1 now has fewer free VFs
    assert host.choose(1, numa_nodes=AUTO, numa_policy="require")[0].numa_node == 0
    got = host.choose(1, "switch", ["87"], numa_nodes=AUTO, numa_policy="require")
    assert pfs_of(got) == ["8d"] and got[0].numa_node == 1


def test_a_named_pf_must_be_close_enough_too(tmp_path):
    host = Host(tmp_path, dgx_a100)
    free = FreeVfs.of(host.inventory.eligible_vfs())
    wish = host.wish("switch", ["07"])
    with pytest.raises(PoolExhausted, match="GPU 0000:07:00.0"):
        choose([VfRequest("02:00:00:00:00:01", "mlx5_4")], free, host.pfs, gpus=wish)
    got = choose([VfRequest("02:00:00:00:00:01", "mlx5_1")], free, host.pfs, gpus=wish)
    assert pfs_of(got) == ["12"]


# -- which VFs the guest sees beside their GPU (guest_pairs) ------------------
def test_guest_pairs_one_rail_per_gpu_on_the_dgx_a100(tmp_path):
    host = Host(tmp_path, dgx_a100)
    got = host.choose(8, "switch", A100_GPUS)
    pairs = guest_pairs(host.wish("switch", A100_GPUS), [vf.pf for vf in got])
    assert pairs == [GuestPair(addr(g), 0 if n < 4 else 1, (n,)) for n, g in enumerate(A100_GPUS)]


def test_guest_pairs_more_nics_than_gpus_go_with_the_gpu_each_serves(tmp_path):
    host = Host(tmp_path, dgx_a100)
    got = host.choose(3, "switch", ["87", "90"])
    wish = host.wish("switch", ["87", "90"])
    # the VM log's GPU for each VF (served): the closest, lowest address on a tie
    assert [served(wish, 3, i, vf.pf).gpu for i, vf in enumerate(got)] == [addr("87")] * 3
    assert guest_pairs(wish, [vf.pf for vf in got]) == [GuestPair(addr("87"), 1, (0, 1, 2))]


def test_guest_pairs_none_without_a_wish_or_with_fewer_nics_than_gpus(tmp_path):
    host = Host(tmp_path, dgx_a100)
    wish = host.wish("switch", ["87", "90"])
    assert guest_pairs(None, ["0000:8d:00.0"]) == []
    assert guest_pairs(wish, ["0000:8d:00.0"]) == []


def test_guest_pairs_leave_out_vfs_only_numa_close_to_their_gpu(tmp_path):
    """A pair whose peer traffic crosses the host's root complex is not shown
    as behind one switch: NCCL would take GPUDirect RDMA there."""
    host = Host(tmp_path, dgx_a100)
    host.take_all_of("8d", "94")
    got = host.choose(1, "numa", ["87"])
    assert pfs_of(got) == ["ba"]
    assert guest_pairs(host.wish("numa", ["87"]), [vf.pf for vf in got]) == []


def test_guest_pairs_root_close_counts_and_an_unknown_node_is_none():
    wish = GpuWish("root", ("0000:07:00.0", "0000:08:00.0"), (
        Closeness("0000:07:00.0", "0000:0c:00.0", "root", "0000:00:01.0", None),
        Closeness("0000:08:00.0", "0000:0d:00.0", "switch", "0000:01:00.0", 0),
        Closeness("0000:08:00.0", "0000:0e:00.0", "switch", "0000:01:00.0", 1)))
    assert guest_pairs(wish, ["0000:0c:00.0", "0000:0d:00.0"]) == [
        GuestPair("0000:07:00.0", None, (0,)), GuestPair("0000:08:00.0", 0, (1,))]
    # two VFs of one GPU on different host nodes: no one node for its switch
    assert guest_pairs(wish, ["0000:0c:00.0", "0000:0d:00.0", "0000:0e:00.0"])[1] == \
        GuestPair("0000:08:00.0", None, (1, 2))
