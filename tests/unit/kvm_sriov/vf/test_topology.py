"""Rung 1: how close each GPU is to each InfiniBand PF, on fake sysfs trees of
real GPU servers (no GPU on this machine), and the one-rail-per-GPU pairing."""

import os

import pytest

from kvm_sriov.errors import InputError
from kvm_sriov.vf import topology
from kvm_sriov.vf.discovery import discover
from kvm_sriov.vf.sysfs import Sysfs
from kvm_sriov.vf.topology import Closeness, gpu_topology, is_gpu, pair_rails, vm_gpus
from tests.support.fake_sysfs import FakeSysfs
from tests.support.gpu_hosts import add_gpu, add_hca, dgx_a100, dgx_h100, two_socket


def levels(topo):
    return {(c.gpu[5:7], c.pf[5:7]): c.level for c in topo.closeness}


def rails(topo):
    return {c.gpu[5:7]: (c.pf[5:7], c.level) for c in pair_rails(topo.closeness)}


def test_the_gpu_rule():
    assert is_gpu("10de", 0x030200) and is_gpu("1002", 0x030000) and is_gpu("10de", 0x030000)
    assert not is_gpu("10de", 0x040300)     # the GPU's own audio function
    assert not is_gpu("8086", 0x030000)     # the board's VGA
    assert not is_gpu("15b3", 0x020700)


def test_dgx_a100_each_gpu_has_the_two_hcas_of_its_switch(tmp_path):
    dgx_a100(tmp_path)
    sysfs = Sysfs(tmp_path)
    inventory = discover(sysfs)
    topo = gpu_topology(sysfs, inventory.pfs)
    assert topo.problems == ()
    assert [g[5:7] for g in topo.gpus] == ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
    assert len(topo.pfs) == 8 and len(topo.closeness) == 64
    close = {g[5:7]: sorted(c.pf[5:7] for c in topo.of(g) if c.level == "switch") for g in topo.gpus}
    assert close == {"07": ["0c", "12"], "0f": ["0c", "12"], "47": ["4b", "54"], "4e": ["4b", "54"],
                     "87": ["8d", "94"], "90": ["8d", "94"], "b7": ["ba", "cc"], "bd": ["ba", "cc"]}
    got = levels(topo)
    assert got["07", "4b"] == "numa" and got["07", "8d"] == "far" and got["b7", "0c"] == "far"
    first = topo.of("0000:07:00.0")[0]
    assert first == Closeness("0000:07:00.0", "0000:0c:00.0", "switch", "0000:01:00.0", 0)
    # one rail per GPU: every GPU a PF of its own behind its switch
    assert rails(topo) == {"07": ("0c", "switch"), "0f": ("12", "switch"),
                           "47": ("4b", "switch"), "4e": ("54", "switch"),
                           "87": ("8d", "switch"), "90": ("94", "switch"),
                           "b7": ("ba", "switch"), "bd": ("cc", "switch")}


def test_dgx_h100_one_gpu_one_hca_per_switch(tmp_path):
    dgx_h100(tmp_path)
    sysfs = Sysfs(tmp_path)
    topo = gpu_topology(sysfs)        # the PFs: every InfiniBand SR-IOV PF
    assert topo.problems == () and len(topo.gpus) == 8 and len(topo.pfs) == 8
    pairs = {c.gpu[5:7]: c.pf[5:7] for c in topo.closeness if c.level == "switch"}
    assert pairs == {"1b": "18", "43": "40", "52": "4f", "61": "5e",
                     "9d": "9a", "c3": "c0", "d1": "ce", "df": "dc"}
    assert sum(c.level == "switch" for c in topo.closeness) == 8
    assert rails(topo) == {g: (p, "switch") for g, p in pairs.items()}
    # a VM with two of the GPUs and two offered PFs that are not theirs: NUMA first
    wanted = [c for c in topo.closeness if c.gpu[5:7] in ("1b", "9d") and c.pf[5:7] in ("40", "c0")]
    assert rails(topo._replace(closeness=tuple(wanted))) == {"1b": ("40", "numa"), "9d": ("c0", "numa")}


def test_two_sockets_no_switch_everything_far(tmp_path):
    two_socket(tmp_path)
    topo = gpu_topology(Sysfs(tmp_path))
    assert topo.problems == ()
    assert set(levels(topo).values()) == {"far"}
    assert all(c.shared is None and c.numa_node is None for c in topo.closeness)
    # far everywhere: still one PF per GPU
    assert rails(topo) == {"17": ("b1", "far"), "65": ("ca", "far")}


def test_same_root_port_and_same_node(tmp_path):
    """root: both behind one root port with no switch's shape below it (a
    PCIe-to-PCI bridge here); numa: different root ports, same node."""
    fs = FakeSysfs(tmp_path)
    fs.add_bridge("0000:00:01.0", parent="pci0000:00")
    fs.add_bridge("0000:01:00.0", parent="0000:00:01.0")
    add_gpu(fs, "0000:02:00.0", "0000:01:00.0", 0)
    add_hca(fs, "0000:02:01.0", "0000:01:00.0", 0, 0)
    fs.add_bridge("0000:00:02.0", parent="pci0000:00")
    add_hca(fs, "0000:03:00.0", "0000:00:02.0", 0, 1)
    add_hca(fs, "0000:04:00.0", "pci0000:00", 0, 2)   # on the root bus itself
    topo = gpu_topology(Sysfs(tmp_path))
    assert topo.problems == ()
    assert [tuple(c[2:]) for c in topo.closeness] == [
        ("root", "0000:00:01.0", 0), ("numa", None, 0), ("numa", None, 0)]


def test_nested_switches_count_as_one_level(tmp_path):
    """A switch behind a switch's downstream port: a PF in the inner switch
    and a GPU in the outer one share the outer switch; the deepest shared
    bridge is named."""
    fs = FakeSysfs(tmp_path)
    fs.add_bridge("0000:00:01.0", parent="pci0000:00")
    fs.add_bridge("0000:01:00.0", parent="0000:00:01.0")            # outer upstream
    fs.add_bridge("0000:02:00.0", parent="0000:01:00.0")            # outer downstream
    fs.add_bridge("0000:02:01.0", parent="0000:01:00.0")
    add_gpu(fs, "0000:03:00.0", "0000:02:00.0", 0)
    fs.add_bridge("0000:04:00.0", parent="0000:02:01.0")            # inner upstream
    fs.add_bridge("0000:05:00.0", parent="0000:04:00.0")            # inner downstream
    fs.add_bridge("0000:05:01.0", parent="0000:04:00.0")
    add_gpu(fs, "0000:06:00.0", "0000:05:00.0", 0)
    add_hca(fs, "0000:07:00.0", "0000:05:01.0", 0, 0)
    topo = gpu_topology(Sysfs(tmp_path))
    assert [(c.gpu, c.level, c.shared) for c in topo.closeness] == [
        ("0000:03:00.0", "switch", "0000:01:00.0"), ("0000:06:00.0", "switch", "0000:04:00.0")]


def test_a_host_without_gpu_changes_nothing(fake_host):
    sysfs = Sysfs(fake_host["root"])
    before = discover(sysfs)
    topo = gpu_topology(sysfs, before.pfs)
    assert (topo.gpus, topo.closeness, topo.problems) == ((), (), ())
    assert discover(sysfs) == before
    assert pair_rails(topo.closeness) == []


def test_pfs_under_a_switch_are_discovered_as_before(tmp_path):
    dgx_a100(tmp_path)
    inventory = discover(Sysfs(tmp_path))
    assert len(inventory.pfs) == 8 and len(inventory.eligible_vfs()) == 16
    vf = inventory.vf("0000:0c:00.1")
    assert vf.pf == "0000:0c:00.0" and vf.numa_node == 0


def c(gpu, pf, level):
    return Closeness(gpu, pf, level, None, None)


def test_pairing_moves_a_gpu_to_free_the_only_close_pf_of_another():
    # A is as close to P1 as to P2; B only to P1: A takes P2
    got = pair_rails([c("A", "P1", "switch"), c("A", "P2", "switch"),
                      c("B", "P1", "switch"), c("B", "P2", "numa")])
    assert [(r.gpu, r.pf) for r in got] == [("A", "P2"), ("B", "P1")]


def test_pairing_never_moves_a_gpu_farther_to_spread():
    # both GPUs are closest to P1 only: they share it rather than one taking far P2
    got = pair_rails([c("A", "P1", "switch"), c("A", "P2", "far"),
                      c("B", "P1", "switch"), c("B", "P2", "far")])
    assert [(r.pf, r.level) for r in got] == [("P1", "switch"), ("P1", "switch")]


def test_pairing_more_gpus_than_pfs_shares_evenly():
    got = pair_rails([c(g, p, "numa") for g in "ABCD" for p in ("P1", "P2")])
    assert [r.pf for r in got] == ["P1", "P2", "P1", "P2"]


def test_pairing_is_bounded():
    with pytest.raises(InputError):
        pair_rails([c(f"G{i:03}", "P1", "far") for i in range(topology.MAX_RAILS + 1)])


# -- hostile trees: bounded, one line per device left out, never a hang -------

def test_links_that_loop_or_leave_the_pci_tree(tmp_path):
    fs = dgx_a100(tmp_path)
    links = fs.sys / "bus/pci/devices"
    (links / "0000:07:00.0").unlink()
    os.symlink("0000:07:00.0", links / "0000:07:00.0")                # a link to itself
    (links / "0000:0f:00.0").unlink()
    elsewhere = tmp_path / "x\ny"                                         # a newline in the target
    elsewhere.mkdir()
    os.rename(fs.dev("0000:0f:00.0"), elsewhere / "0000:0f:00.0")
    os.symlink("../../../../x\ny/0000:0f:00.0", links / "0000:0f:00.0")   # out of /sys
    # a folder on the path (the GPU's downstream port) replaced by a link
    real = fs.dev("0000:47:00.0").parent
    os.rename(real, real.with_name("moved"))
    os.symlink("moved", real)
    topo = gpu_topology(Sysfs(tmp_path))
    assert [g[5:7] for g in topo.gpus] == ["4e", "87", "90", "b7", "bd"]
    assert len(topo.problems) == 3 and all("\n" not in p for p in topo.problems)
    loop, outside, link = topo.problems
    assert loop.startswith("0000:07:00.0: its class is a symbolic link (or a loop")
    assert outside.startswith("0000:0f:00.0: its link leads outside /sys/devices/pci*/")
    assert link.startswith("0000:47:00.0: a folder on its path is missing or a link")


def test_planted_fifo_and_garbage_in_class_files(tmp_path):
    fs = dgx_a100(tmp_path)
    gpu_class = fs.dev("0000:07:00.0") / "class"
    gpu_class.unlink()
    os.mkfifo(gpu_class)                       # would block a plain open
    upstream_class = fs.dev("0000:41:00.0") / "class"
    upstream_class.unlink()
    os.mkfifo(upstream_class)
    (fs.dev("0000:0f:00.0") / "class").write_bytes(b"\xff\xfe0x0302\n")
    (fs.dev("0000:87:00.0") / "vendor").write_text("0x10de" + "0" * 100000)
    topo = gpu_topology(Sysfs(tmp_path))
    assert [g[5:7] for g in topo.gpus] == ["47", "4e", "90", "b7", "bd"]
    assert topo.problems == ("0000:07:00.0: its class is a FIFO, not a file",
                             "0000:41:00.0: its class is a FIFO, not a file")
    # the switch above 47/4e no longer shows as one: its upstream port's class is unknown
    assert {c.level for g in ("0000:47:00.0", "0000:4e:00.0") for c in topo.of(g)} == {"root", "numa", "far"}


def test_too_deep_and_too_many(tmp_path, monkeypatch):
    fs = FakeSysfs(tmp_path)
    parent = "pci0000:00"
    for depth in range(topology.MAX_DEPTH + 1):
        address = f"0000:{depth + 1:02x}:00.0"
        fs.add_bridge(address, parent=parent)
        parent = address
    add_gpu(fs, "0000:f0:00.0", parent, 0)
    topo = gpu_topology(Sysfs(tmp_path), [])
    assert topo.gpus == () and topo.problems == (f"0000:f0:00.0: more than {topology.MAX_DEPTH} bridges above it",)
    monkeypatch.setattr(topology, "MAX_DEVICES", 5)
    topo = gpu_topology(Sysfs(tmp_path), [])
    assert topo.problems == ("more than 5 PCI devices: only the first 5 looked at",)


def test_a_gpus_own_vfs_are_not_gpus(tmp_path):
    fs = FakeSysfs(tmp_path)
    fs.add_bridge("0000:00:01.0", parent="pci0000:00")
    add_gpu(fs, "0000:01:00.0", "0000:00:01.0", 0)
    add_gpu(fs, "0000:01:00.4", "0000:00:01.0", 0)
    fs._link(fs.dev("0000:01:00.4") / "physfn", fs.dev("0000:01:00.0"))
    assert gpu_topology(Sysfs(tmp_path), []).gpus == ("0000:01:00.0",)


# -- a VM's own devices (vm_gpus): named by a tenant, so nothing is trusted ----

def test_vm_gpus_reads_only_the_named_gpus(tmp_path):
    dgx_a100(tmp_path)
    sysfs = Sysfs(tmp_path)
    pfs = discover(sysfs).pfs
    topo = vm_gpus(sysfs, ["0000:0f:00.0", "0000:07:00.0", "0000:07:00.0"], pfs)
    assert topo.gpus == ("0000:07:00.0", "0000:0f:00.0") and topo.problems == ()
    assert topo.closeness == tuple(c for c in gpu_topology(sysfs, pfs).closeness
                                   if c.gpu in topo.gpus)


def test_vm_gpus_leaves_out_what_is_not_a_gpu(tmp_path):
    """An HCA, one of the pool's VFs, a switch port: naming them gains nothing."""
    dgx_a100(tmp_path)
    sysfs = Sysfs(tmp_path)
    topo = vm_gpus(sysfs, ["0000:0c:00.0", "0000:0c:00.1", "0000:01:00.0"], discover(sysfs).pfs)
    assert topo.gpus == () and topo.closeness == ()


@pytest.mark.parametrize("named,why", [
    ("../../../etc", "is not a PCI address"),
    ("0000:07:00.0/../../..", "is not a PCI address"),
    ("0000:07:00.0\n", "is not a PCI address"),
    ("0000:33:00.0", "0000:33:00.0: /sys/bus/pci/devices/0000:33:00.0 is not a link"),
])
def test_vm_gpus_refuses_names_that_are_no_device_here(tmp_path, named, why):
    dgx_a100(tmp_path)
    with pytest.raises(InputError) as refused:
        vm_gpus(Sysfs(tmp_path), [named], [])
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_vm_gpus_refuses_a_link_to_another_device_and_a_planted_class(tmp_path):
    fs = dgx_a100(tmp_path)
    link = fs.sys / "bus/pci/devices/0000:07:00.0"
    link.unlink()
    os.symlink(os.path.relpath(fs.dev("0000:0c:00.0"), link.parent), link)   # an HCA's folder
    with pytest.raises(InputError, match="0000:07:00.0: its link leads outside"):
        vm_gpus(Sysfs(tmp_path), ["0000:07:00.0"], [])
    gpu_class = fs.dev("0000:0f:00.0") / "class"
    gpu_class.unlink()
    os.mkfifo(gpu_class)                                                  # would block a plain open
    with pytest.raises(InputError, match="0000:0f:00.0: its class is a FIFO"):
        vm_gpus(Sysfs(tmp_path), ["0000:0f:00.0"], [])


def test_vm_gpus_is_bounded_and_a_pf_out_of_place_is_left_out(tmp_path):
    fs = dgx_a100(tmp_path)
    sysfs = Sysfs(tmp_path)
    pfs = discover(sysfs).pfs
    with pytest.raises(InputError, match=f"more than {topology.MAX_RAILS} PCI devices"):
        vm_gpus(sysfs, (f"0000:{b:02x}:00.0" for b in range(256)), pfs)
    link = fs.sys / "bus/pci/devices/0000:12:00.0"
    link.unlink()
    os.symlink("0000:12:00.0", link)                                      # a loop
    topo = vm_gpus(sysfs, ["0000:07:00.0"], pfs)
    assert "0000:12:00.0" not in topo.pfs and len(topo.pfs) == 7
    assert topo.problems == ("0000:12:00.0: its link leads outside /sys/devices/pci*/ ('0000:12:00.0')",)
