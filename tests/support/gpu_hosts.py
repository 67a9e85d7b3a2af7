"""GPU servers as fake sysfs trees (rung 1; no GPU on the test machines):
DGX A100- and H100-style hosts, PCIe switches with GPUs and ConnectX HCAs
behind them, and a 2-socket host without switch. Shared by the topology
tests and the GPU-affinity deploy tests."""

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
