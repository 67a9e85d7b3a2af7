"""Rung 2: what libvirt/QEMU do with <shmem> (ivshmem-plain), the facts
docs/ivshmem.md builds on, checked on this machine's libvirt and QEMU with
the busybox guest (domains made directly through libvirt, no driver)."""

import os

import libvirt
import pytest

from simhost.guest_image import domain_xml
from tests.support.driver_env import wait_for

pytestmark = pytest.mark.libvirt

ROOT_PORTS = "".join(f"<controller type='pci' index='{i}' model='pcie-root-port'/>" for i in (1, 2, 3))
ON_PORT_3 = "<address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/>"
ON_PCIE_0 = "<address type='pci' domain='0x0000' bus='0x00' slot='0x1e' function='0x0'/>"


def shmem(name, size=4, role=None, address=""):
    r = f" role='{role}'" if role else ""
    return f"<shmem name='{name}'{r}><model type='ivshmem-plain'/><size unit='M'>{size}</size>{address}</shmem>"


@pytest.fixture
def start(lvhost, image, tmp_path):
    conn = lvhost.open()
    names = []

    def start(name, devices):
        names.append(name)
        return conn.createXML(domain_xml(name, image, tmp_path / f"{name}.log", devices=devices), 0)
    yield start
    for dom in conn.listAllDomains():
        if dom.isActive():
            dom.destroy()
    for n in names:
        for f in (f"/dev/shm/kvs-fact-{n}", f"/dev/shm/kvs-fact-{n}-peer"):
            if os.path.exists(f):
                os.unlink(f)


@pytest.fixture(scope="module")
def image():
    from simhost.guest_image import ensure_guest_image
    return ensure_guest_image()


def has_shmem(dom):
    return "<shmem" in dom.XMLDesc(0)


def test_qemu_makes_the_file_libvirt_never_removes_it(start):
    dom = start("keep", shmem("kvs-fact-keep"))
    st = os.stat("/dev/shm/kvs-fact-keep")
    assert st.st_size == 4 << 20
    dom.destroy()
    assert os.path.exists("/dev/shm/kvs-fact-keep")


def test_sizes_and_existing_files(start):
    with pytest.raises(libvirt.libvirtError, match="power of two"):
        start("three", shmem("kvs-fact-three", size=3))
    fd = os.open("/dev/shm/kvs-fact-small", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 2 << 20)
    os.close(fd)
    with pytest.raises(libvirt.libvirtError, match="does not match"):
        start("small", shmem("kvs-fact-small"))
    fd = os.open("/dev/shm/kvs-fact-kept", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4 << 20)
    os.pwrite(fd, b"HEADER", 0)
    os.close(fd)
    start("kept", shmem("kvs-fact-kept"))
    assert open("/dev/shm/kvs-fact-kept", "rb").read(6) == b"HEADER"
    assert os.stat("/dev/shm/kvs-fact-kept").st_mode & 0o777 == 0o600


def test_a_peer_cannot_be_saved_a_master_restore_overwrites_the_region(start, tmp_path):
    peer = start("peer", shmem("kvs-fact-peer"))
    with pytest.raises(libvirt.libvirtError, match="peer mode"):
        peer.save(str(tmp_path / "peer.save"))
    master = start("master", ROOT_PORTS + shmem("kvs-fact-master", role="master"))
    path = "/dev/shm/kvs-fact-master"
    with open(path, "r+b") as f:
        f.write(b"ATSAVE")
    master.save(str(tmp_path / "m.save"))
    with open(path, "r+b") as f:
        f.write(b"AFTERS")      # what the group's other VMs wrote meanwhile
    master.connect().restore(str(tmp_path / "m.save"))
    assert open(path, "rb").read(6) == b"ATSAVE"


def test_hotplug_only_behind_a_root_port(start, tmp_path):
    dom = start("plug", ROOT_PORTS + shmem("kvs-fact-plug", address=ON_PCIE_0))
    with pytest.raises(libvirt.libvirtError, match="does not support hotplugging"):
        dom.detachDeviceFlags(shmem("kvs-fact-plug", address=ON_PCIE_0), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    dom = start("port", ROOT_PORTS + shmem("kvs-fact-port", address=ON_PORT_3))
    log = tmp_path / "port.log"  # the guest must be up to answer the slot's attention button
    assert wait_for(lambda: log.exists() and "simhost-guest: up" in log.read_text(errors="replace"), 120)
    dom.detachDeviceFlags(shmem("kvs-fact-port", address=ON_PORT_3), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert wait_for(lambda: not has_shmem(dom), 30)
    dom.attachDeviceFlags(shmem("kvs-fact-port", address=ON_PORT_3), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert has_shmem(dom)
