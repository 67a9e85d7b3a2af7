"""The probe's GPU pairing (KVM_SRIOV_GPU, docs/gpu.md): per GPU, the pool
PFs at each closeness level and the free VFs at least that close, on the
DGX fixtures; nothing new on a host without GPUs; hostile trees never fail
the run."""

import io
import os

from kvm_sriov.node import probe
from kvm_sriov.vf.pool import VfPool
from tests.support.gpu_hosts import add_gpu, dgx_a100, dgx_h100, two_socket
from tests.support.probe import parse, run_probe


def gpus_of(data) -> dict[str, dict]:
    return {g["ADDRESS"]: g for g in data.get("KVM_SRIOV_GPU", [])}


def test_dgx_a100_each_gpu_sees_the_two_hcas_of_its_switch_and_their_free_vfs(tmp_path):
    dgx_a100(tmp_path / "root")
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:       # one VF of HCA 0c is a VM's
        txn.add("0000:0c:00.1", "0000:0c:00.0", 3, "one-3", "", "attached", "deploy")
    pool.close()
    gpus = gpus_of(run_probe(tmp_path, tmp_path / "root"))
    assert sorted(gpus) == [f"0000:{b}:00.0" for b in ("07", "0f", "47", "4e", "87", "90", "b7", "bd")]
    assert gpus["0000:07:00.0"] == {
        "ADDRESS": "0000:07:00.0", "NUMA_NODE": "0",
        "SWITCH_PFS": "0000:0c:00.0,0000:12:00.0", "ROOT_PFS": "", "NUMA_PFS": "0000:4b:00.0,0000:54:00.0",
        "SWITCH_FREE_VFS": "3", "ROOT_FREE_VFS": "3", "NUMA_FREE_VFS": "7"}
    assert gpus["0000:b7:00.0"]["SWITCH_PFS"] == "0000:ba:00.0,0000:cc:00.0"
    assert (gpus["0000:b7:00.0"]["SWITCH_FREE_VFS"], gpus["0000:b7:00.0"]["NUMA_FREE_VFS"]) == ("4", "8")


def test_dgx_h100_each_gpu_sees_the_one_hca_of_its_switch(tmp_path):
    dgx_h100(tmp_path / "root")
    gpus = gpus_of(run_probe(tmp_path, tmp_path / "root"))
    assert len(gpus) == 8
    assert {g: v["SWITCH_PFS"] for g, v in gpus.items()}["0000:1b:00.0"] == "0000:18:00.0"
    assert all(v["SWITCH_FREE_VFS"] == "2" and v["NUMA_FREE_VFS"] == "8" for v in gpus.values())
    assert gpus["0000:9d:00.0"]["NUMA_PFS"] == "0000:c0:00.0,0000:ce:00.0,0000:dc:00.0"


def test_two_sockets_gpus_far_from_every_hca(tmp_path):
    two_socket(tmp_path / "root")
    gpus = gpus_of(run_probe(tmp_path, tmp_path / "root"))
    assert sorted(gpus) == ["0000:17:00.0", "0000:65:00.0"]
    assert all((v["SWITCH_PFS"], v["ROOT_PFS"], v["NUMA_PFS"], v["NUMA_FREE_VFS"]) == ("", "", "", "0")
               for v in gpus.values())


def test_a_host_without_gpu_reports_and_reads_nothing_new(fake_host, make_config, monkeypatch):
    """The reference host, its free VFs on vfio-pci as on a real host: no
    KVM_SRIOV_GPU, no device class read, no place read."""
    for vf in ("0000:03:00.1", "0000:03:00.4", "0000:81:00.1", "0000:81:00.2", "0000:81:00.3"):
        fake_host["fs"].bind(vf, "vfio-pci")
    read, placed = [], []
    real_read, real_place = probe.read_small, probe.topology.read_place
    monkeypatch.setattr(probe, "read_small", lambda *a, **k: read.append(a[0]) or real_read(*a, **k))
    monkeypatch.setattr(probe.topology, "read_place", lambda *a: placed.append(a[1]) or real_place(*a))
    out = io.StringIO()
    probe.report(make_config(fake_host["root"]), out)
    assert "KVM_SRIOV_GPU" not in parse(out.getvalue())
    assert placed == [] and all("/bus/pci/devices/" not in p for p in read), read


def test_only_gpus_count_not_their_vfs_nor_other_passed_through_devices(tmp_path):
    fs = dgx_h100(tmp_path / "root")
    # an NVMe on vfio-pci, and a VF of the first GPU (vGPU SR-IOV) on vfio-pci
    fs.add_device("0000:e0:00.0", "144d", "a808", 0x010802, 1, driver="vfio-pci")
    vf = "0000:1b:00.4"
    fs.add_device(vf, "10de", "2330", 0x030200, 0, driver="vfio-pci")
    os.symlink("../0000:1b:00.0", fs.dev(vf) / "physfn")
    gpus = gpus_of(run_probe(tmp_path, tmp_path / "root"))
    assert len(gpus) == 8 and vf not in gpus and "0000:e0:00.0" not in gpus


def test_a_gpu_bound_to_its_vendors_driver_counts(tmp_path):
    fs = two_socket(tmp_path / "root")
    fs.bind("0000:17:00.0", "nvidia")
    assert "0000:17:00.0" in gpus_of(run_probe(tmp_path, tmp_path / "root"))


def test_hostile_trees_never_fail_the_run(tmp_path):
    fs = dgx_a100(tmp_path / "root")
    # a GPU whose link leaves the PCI tree (its folder moved out, a newline
    # in the way), one whose path has a link on it: an ERROR on each GPU only
    link = tmp_path / "root/sys/bus/pci/devices/0000:0f:00.0"
    target = os.readlink(link)
    link.unlink()
    elsewhere = tmp_path / "root/x\ny"
    elsewhere.mkdir()
    os.rename(fs.dev("0000:0f:00.0"), elsewhere / "0000:0f:00.0")
    os.symlink("../../../../x\ny/0000:0f:00.0", link)
    real = fs.dev("0000:47:00.0").parent
    os.rename(real, real.with_name("moved"))
    os.symlink("moved", real)
    # a FIFO as the class of a device bound to vfio-pci: skipped, no hang
    add_gpu(fs, "0000:ee:00.0", "pci0000:ee", 1)
    cls = fs.dev("0000:ee:00.0") / "class"
    cls.unlink()
    os.mkfifo(cls)
    # a name in the driver's folder that is no PCI address
    os.symlink(target, tmp_path / "root/sys/bus/pci/drivers/vfio-pci/new_id0")
    data = run_probe(tmp_path, tmp_path / "root")
    gpus = gpus_of(data)
    assert "leads outside" in gpus["0000:0f:00.0"]["ERROR"] and "\n" not in gpus["0000:0f:00.0"]["ERROR"]
    assert "missing or a link" in gpus["0000:47:00.0"]["ERROR"]
    assert "0000:ee:00.0" not in gpus and gpus["0000:07:00.0"]["SWITCH_FREE_VFS"] == "4"
    assert data["KVM_SRIOV_FREE_VFS"] == "16"


def test_gpus_reported_are_bounded(tmp_path):
    fs = two_socket(tmp_path / "root")
    for i in range(70):
        add_gpu(fs, f"0000:{0x20 + i:02x}:00.0", "pci0000:16", 0)
    assert len(gpus_of(run_probe(tmp_path, tmp_path / "root"))) == 64


def test_a_failure_in_the_pairing_leaves_the_vf_counts(tmp_path, make_config, monkeypatch):
    dgx_a100(tmp_path / "root")

    def broken(*_):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(probe.topology, "read_place", broken)
    out = io.StringIO()
    probe.report(make_config(tmp_path / "root"), out)
    data = parse(out.getvalue())
    assert data["KVM_SRIOV_FREE_VFS"] == "16" and len(data["KVM_SRIOV_PF"]) == 8
    assert data["KVM_SRIOV_GPU"] == [{"ERROR": "PermissionError: [Errno 13] Permission denied"}]
