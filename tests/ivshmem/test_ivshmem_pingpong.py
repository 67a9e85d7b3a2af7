"""Rung 2: the inter-VM ping-pong (kvm_sriov_bench.shm_pingpong) between two
co-resident VMs of one VM group deployed through the driver works through
their shared region and over their network path (virtio-net NICs joined by
a QEMU udp socket pair): every round trip completes, and the last words the
guests passed are in the region on the host, past its header. Which path is
faster is bench/ivshmem_pingpong_bench.py's question (a speed under TCG on a
shared machine is a benchmark's figure, never a test's verdict); it runs
the pair made here."""

import socket
import struct

import pytest
from lxml import etree

from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region
from kvm_sriov_bench import shm_pingpong
from tests.ivshmem.test_ivshmem_libvirtd import Vm, header, live_shmem
from tests.support.driver_env import wait_for
from simhost import guest_image

pytestmark = pytest.mark.libvirt

ITERS = 2000                  # round trips through the region; a tenth of them over TCP
WORDS_AT = 4096               # where the guests' ping, pong and ready words start in BAR2 (shm_pingpong.c)


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


def free_udp_ports(n: int) -> list:
    """Ports nothing on this machine holds now (the simulated host shares its network)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_pair(driver, lvhost, image, tmp_path, iters: int, group: str = "7"):
    """VMs 81 (role 0, sends and reports) and 82 (role 1, echoes) of one
    group deployed through the driver, sharing one region; returns them and
    the region's name. The guests start the ping-pong as they boot."""
    a = Vm(driver, tmp_path, image, 81, group=group,
           probe=f"pp_role=0 pp_ip=10.77.0.1 pp_peer=10.77.0.2 pp_iters={iters}")
    b = Vm(driver, tmp_path, image, 82, group=group,
           probe=f"pp_role=1 pp_ip=10.77.0.2 pp_peer=10.77.0.1 pp_iters={iters}")
    port_a, port_b = free_udp_ports(2)
    udp_nic(a, port_a, port_b)
    udp_nic(b, port_b, port_a)
    for vm in (b, a):
        r = vm.deploy()
        assert r.code == 0, r.stderr
    region = f"{ivshmem.PREFIX}-u0-g{group}"
    assert live_shmem(lvhost, a) == live_shmem(lvhost, b) == [region]
    return a, b, region


def results_of(a, iters: int, timeout: float = 400) -> dict:
    """Role 0's figures once the guest is done: {kind: (round trips, avg µs)},
    every round trip of both paths completed."""
    done = wait_for(lambda: "pingpong-guest: done" in a.console(), timeout, step=2)
    results = shm_pingpong.parse(a.console())
    assert done and set(results) == {"shm", "tcp"}, a.console()[-3000:]
    assert results["shm"][0] == iters and results["tcp"][0] == iters // 10, results
    return results


def test_pingpong_round_trips_through_the_region_and_the_network(driver, lvhost, image, tmp_path):
    a, b, region = start_pair(driver, lvhost, image, tmp_path, ITERS)
    results = results_of(a, ITERS)
    print("\n" + shm_pingpong.report(results))
    # role 1 echoed each number back through the region: the last ones are there on the host,
    # and the guests' words left the host's header alone
    data = (ivshmem_region.SHM_DIR / region).read_bytes()
    ping, pong, ready = (struct.unpack_from("<Q", data, WORDS_AT + at)[0] for at in (0, 64, 128))
    assert (ping, pong, ready) == (ITERS, ITERS, 0), (ping, pong, hex(ready))
    assert header(region)["vms"] == [81, 82]
    for vm in (a, b):
        assert vm("cancel", vm.uuid).code == 0
    assert not (ivshmem_region.SHM_DIR / region).exists()
