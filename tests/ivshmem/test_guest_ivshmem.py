"""Rung 1: the guest's kvm-sriov-ivshmem reads the header the host driver
writes (kvm_sriov.ivshmem.region.write_header) from a device's resource2 (here a
regular file in a fake sysfs: mmap works the same) and publishes it."""

import subprocess

from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region
from tests.conftest import REPO
from tests.ivshmem.guest_tool import fake_device, run


def test_publish_the_regions_peers(tmp_path):
    shm, sysfs, runs = tmp_path / "shm", tmp_path / "sys", tmp_path / "run"
    shm.mkdir()
    name = ivshmem.Request(3, 7, 1).name
    gen = ivshmem_region.write_header(name, 1, [51, 52, 60], 0, shm, fresh=True)
    dev = fake_device(sysfs, "0000:07:00.0", shm / name)
    fake_device(sysfs, "0000:00:02.0", shm / name, ids=("0x8086", "0x10d3"))  # not ours
    r = run("publish", "--sysfs", str(sysfs), "--run", str(runs), env={"VMID": "52"})
    assert r.returncode == 0, r.stderr
    out = runs / "ivshmem" / "0"
    assert (out / "device").read_text() == "0000:07:00.0\n"
    assert (out / "resource").read_text().strip() == str(dev / "resource2")
    assert (out / "vms").read_text().split() == ["51", "52", "60"]
    assert (out / "peers").read_text().split() == ["51", "60"]
    assert (out / "size").read_text().strip() == str(1 << 20) and (out / "offset").read_text() == "4096\n"
    assert ((out / "uid").read_text(), (out / "vmgroup").read_text()) == ("3\n", "7\n")
    assert 'KVM_SRIOV_IVSHMEM_PEERS="51 60"' in (runs / "ivshmem" / "env").read_text()
    assert (dev / "enable").read_text().strip() == "1"
    assert not (runs / "ivshmem" / "1").exists()
    # a VM leaves on the host: the next publish shows it
    ivshmem_region.write_header(name, 1, [52, 60], gen, shm)
    assert run("publish", "--sysfs", str(sysfs), "--run", str(runs), "--vmid", "52").returncode == 0
    assert (out / "peers").read_text().split() == ["60"]


def test_nothing_to_do_without_a_device_and_a_foreign_region_is_refused(tmp_path):
    r = run("publish", "--sysfs", str(tmp_path / "sys"), "--run", str(tmp_path / "run"))
    assert r.returncode == 0 and not (tmp_path / "run" / "ivshmem").exists()
    dev = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:07:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1af4\n")
    (dev / "device").write_text("0x1110\n")
    (dev / "resource2").write_bytes(b"\0" * 4096)   # an ivshmem region nobody wrote a header into
    r = run("publish", "--sysfs", str(tmp_path / "sys"), "--run", str(tmp_path / "run"))
    assert r.returncode == 1 and "no kvm-sriov header" in r.stderr


def test_the_context_hook_passes_shellcheck():
    import shutil
    import pytest
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck)")
    hook = REPO / "contextualization" / "ivshmem" / "loc-17-kvm-sriov-ivshmem"
    r = subprocess.run(["shellcheck", str(hook)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
