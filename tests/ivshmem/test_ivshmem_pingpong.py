"""Rung 2: the inter-VM ping-pong (kvm_sriov_bench.shm_pingpong) between two
co-resident VMs of one VM group deployed through the driver: through their
shared region and over their network path (virtio-net NICs joined by a
QEMU udp socket pair), side by side. Prints the ratio; the shared-memory
path must be the faster one."""

import pytest
from lxml import etree

from kvm_sriov_bench import shm_pingpong
from tests.ivshmem.test_ivshmem_libvirtd import Vm, live_shmem
from tests.support.driver_env import wait_for
from simhost import guest_image

pytestmark = pytest.mark.libvirt


@pytest.fixture(scope="module")
def image():
    from tests.ivshmem.guest import ensure_pingpong_guest
    return ensure_pingpong_guest(shm_pingpong.build(guest_image.CACHE_DIR))


def udp_nic(vm, local_port, remote_port):
    """The deployment's plain NIC becomes virtio-net over a udp socket pair on this host."""
    root = etree.fromstring(vm.deployment.encode())
    nic = next(i for i in root.iter("interface") if i.get("type") == "user")
    mac = nic.find("mac").get("address")
    for child in list(nic):
        nic.remove(child)
    nic.set("type", "udp")
    etree.SubElement(nic, "mac", address=mac)
    src = etree.SubElement(nic, "source", address="127.0.0.1", port=str(remote_port))
    etree.SubElement(src, "local", address="127.0.0.1", port=str(local_port))
    etree.SubElement(nic, "model", type="virtio")
    vm.deployment = etree.tostring(root, encoding="unicode")


def test_pingpong_through_the_region_vs_the_network(driver, lvhost, image, tmp_path):
    iters = 20000
    a = Vm(driver, tmp_path, image, 81, probe=f"pp_role=0 pp_ip=10.77.0.1 pp_peer=10.77.0.2 pp_iters={iters}")
    b = Vm(driver, tmp_path, image, 82, probe=f"pp_role=1 pp_ip=10.77.0.2 pp_peer=10.77.0.1 pp_iters={iters}")
    udp_nic(a, 47101, 47102)
    udp_nic(b, 47102, 47101)
    for vm in (b, a):
        r = vm.deploy()
        assert r.code == 0, r.stderr
    assert live_shmem(lvhost, a) == live_shmem(lvhost, b) == ["kvm-sriov-ivshmem-u0-g7"]
    done = wait_for(lambda: "pingpong-guest: done" in a.console(), 400, step=2)
    results = shm_pingpong.parse(a.console())
    assert done and set(results) == {"shm", "tcp"}, a.console()[-3000:]
    print("\n" + shm_pingpong.report(results))
    (tmp_path / "pingpong.txt").write_text(shm_pingpong.report(results))
    assert results["shm"][1] < results["tcp"][1]
    for vm in (a, b):
        assert vm("cancel", vm.uuid).code == 0
