"""Rung 1: how close each GPU is to each InfiniBand PF, on fake sysfs trees of
real GPU servers (no GPU on this machine), and the one-rail-per-GPU pairing."""

import os

import pytest

from kvm_sriov.errors import InputError
from kvm_sriov.vf import topology
from kvm_sriov.vf.discovery import discover
from kvm_sriov.vf.sysfs import Sysfs
from kvm_sriov.vf.topology import Closeness, gpu_topology, is_gpu, pair_rails
from tests.support.fake_sysfs import FakeSysfs

A100 = ("10de", "20b0", 0x030200)    # A100 SXM4: 3D controller
H100 = ("10de", "2330", 0x030200)    # H100 SXM5: 3D controller


def add_gpu(fs, address, parent, numa, model=A100):
    vendor, device, cls = model
    fs.add_device(address, vendor, device, cls, numa, driver="vfio-pci", parent=parent)


def add_hca(fs, address, parent, numa, n):
    fs.add_pf(address, numa=numa, num_vfs=2, netdev=f"ib{n}", ibdev=f"mlx5_{n}", device="101b",
              vf_device="101c", parent=parent)


def switch_host(root, switches, model):
    """A GPU server from its block diagram: per PCIe switch (host bridge's
    root bus, NUMA node, GPU buses, HCA buses), the switch's upstream port on
    a root port of that host bridge, one downstream port per device."""
    fs = FakeSysfs(root)
    fs.add_numa_node(0, "0-63")
    fs.add_numa_node(1, "64-127")
    n = 0
    for root_bus, node, gpus, hcas in switches:
        port = f"0000:{root_bus:02x}:01.1"
        upstream = f"0000:{root_bus + 1:02x}:00.0"
        fs.add_bridge(port, parent=f"pci0000:{root_bus:02x}", numa=node, vendor="1022", device="1483")
        fs.add_bridge(upstream, parent=port, numa=node, vendor="10b5", device="c010")
        for slot, bus in enumerate([*gpus, *hcas]):
            down = f"0000:{root_bus + 2:02x}:{slot:02x}.0"
            fs.add_bridge(down, parent=upstream, numa=node, vendor="10b5", device="c010")
            if bus in gpus:
                add_gpu(fs, f"0000:{bus:02x}:00.0", down, node, model)
            else:
                add_hca(fs, f"0000:{bus:02x}:00.0", down, node, n)
                n += 1
    return fs


def dgx_a100(root):
    """8 GPUs and 8 HCAs, each pair of GPUs and each pair of ConnectX-6 behind
    one of 4 PCIe Gen4 switches, two switches per CPU socket.

    Sources, public, as read for this fixture:
    - NVIDIA, "Validate PCI Switch System Topology" (GPUDirect Storage),
      https://docs.nvidia.com/ai-enterprise/deployment/bare-metal/latest/gds-appendix-pci-validation.html:
      lstopo of a DGX A100, "The GPUs and the NICs are under the same switch".
    - The DGX A100 node as described from NVIDIA's block diagram ("Inside the
      High-Performance GPU Server: A Deep Dive into A100/A800 & H100
      Topologies", https://www.besthub.dev/articles/inside-the-high-performance-gpu-server-a-deep-dive-into-a100-a800-h100-topologies-512d39aeaa2c):
      two CPU sockets, four PCIe Gen4 switch chips, eight GPUs, eight
      GPU-dedicated network adapters. NVIDIA's own figure is in the DGX A100
      System Architecture whitepaper (section 6, "First Accelerated System With
      All PCIe Gen4"), not read here.
    - The buses a DGX A100 shows: GPUs 07, 0f, 47, 4e, 87, 90, b7, bd
      (nvidia-smi output published by DGX users), compute ports ibp12s0,
      ibp18s0, ibp75s0, ibp84s0, ibp141s0, ibp148s0, ibp186s0, ibp204s0 (HCAs
      0c, 12, 4b, 54, 8d, 94, ba, cc). Numbered depth first, each pair of GPU
      buses interleaves with one pair of HCA buses: that is the grouping used.
    Made up: the bridges' addresses, one level of downstream ports (the real
    switch nests two), and 2 NUMA nodes (the real host, NPS4, has 8)."""
    return switch_host(root, [
        (0x00, 0, (0x07, 0x0f), (0x0c, 0x12)),
        (0x40, 0, (0x47, 0x4e), (0x4b, 0x54)),
        (0x80, 1, (0x87, 0x90), (0x8d, 0x94)),
        (0xa0, 1, (0xb7, 0xbd), (0xba, 0xcc)),
    ], A100)


def dgx_h100(root):
    """8 GPUs and 8 HCAs, one GPU and one ConnectX-7 behind each of 8 PCIe
    switches, four per CPU socket.

    Sources, public, as read for this fixture:
    - "the reference block diagrams for a DGX-H100 [...] each GPU is directly
      wired to a 400Gb/s NIC" (J. Gunthorpe, mailing-list post, July 2023,
      http://mail.spinics.net/lists/linux-wireless/msg238425.html).
    - The compute HCAs' buses 18, 40, 4f, 5e, 9a, c0, ce, dc: NVIDIA DGX
      BasePOD deployment guide,
      https://docs.nvidia.com/dgx-basepod/deployment-guide-dgx-basepod/latest/sriov.html.
    - The GPUs' buses 1b, 43, 52, 61, 9d, c3, d1, df: nvidia-smi on a DGX H100
      of NVIDIA's Eos (published training log); GPUs 0-3 on NUMA node 0, 4-7
      on node 1 (published nvidia-smi topo -m of a DGX H100).
    Each GPU pairs with the HCA whose bus sits just below its own (depth-first
    numbering under one switch). Made up: host bridges and bridge addresses."""
    return switch_host(root, [
        (0x15, 0, (0x1b,), (0x18,)), (0x3d, 0, (0x43,), (0x40,)),
        (0x4c, 0, (0x52,), (0x4f,)), (0x5b, 0, (0x61,), (0x5e,)),
        (0x97, 1, (0x9d,), (0x9a,)), (0xbd, 1, (0xc3,), (0xc0,)),
        (0xcb, 1, (0xd1,), (0xce,)), (0xd9, 1, (0xdf,), (0xdc,)),
    ], H100)


def two_socket(root):
    """A 2-socket 2U server with PCIe GPUs in the slots of socket 0 and the
    HCAs in those of socket 1: every device on its own root port, no switch."""
    fs = FakeSysfs(root)
    fs.add_numa_node(0, "0-31")
    fs.add_numa_node(1, "32-63")
    for n, (bus, node, kind) in enumerate([(0x17, 0, "gpu"), (0x65, 0, "gpu"),
                                           (0xb1, 1, "hca"), (0xca, 1, "hca")]):
        port = f"0000:{bus - 1:02x}:00.0"
        fs.add_bridge(port, parent=f"pci0000:{bus - 1:02x}", numa=node)
        if kind == "gpu":
            add_gpu(fs, f"0000:{bus:02x}:00.0", port, node, ("10de", "26b9", 0x030200))
        else:
            add_hca(fs, f"0000:{bus:02x}:00.0", port, node, n)
    return fs


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
