"""Rung 2: save, restore, live and paused migration through the installed
scripts, between two real libvirtd hosts in their own network namespaces.
No VFs here (rung 3 has them), but the destination-full and the
libvirt-down paths are real."""

import time
from pathlib import Path
import uuid as uuidlib

import libvirt
import pytest
from lxml import etree

from tests.support.driver_env import action_xml, cluster_config, destroy_all, install_remotes, node_env, wait_for
from tests.support.fake_sysfs import standard_host
from simhost.opennebula_call import one_call
from tests.support.runnable import runnable_deployment

pytestmark = pytest.mark.libvirt

simhost = pytest.importorskip("simhost.libvirt_host")
from simhost.guest_image import ensure_guest_image, last_counter  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    # each host its own /var/tmp/one, as `onehost sync` leaves them: the
    # stock scripts act on the libvirtd of the host they run in
    remotes = {name: install_remotes(work / name) for name in ("h1", "h2")}
    with simhost.two_hosts(work) as (h1, h2):
        yield {"work": work, "remotes": remotes, "hosts": {"h1": h1, "h2": h2}}


@pytest.fixture(scope="module")
def image():
    return ensure_guest_image()


class Driver:
    """The driver on each simulated host, called as OpenNebula calls it."""

    def __init__(self, cluster, tmp_path):
        self.cluster, self.dir = cluster, tmp_path
        for name in cluster["hosts"]:
            self.configure(name)

    def configure(self, name, uri=None, dest_uri=None, sysfs="/", live=True, exclude=()):
        host = self.cluster["hosts"][name]
        migration = {"live": live, **({"dest_uri": dest_uri} if dest_uri else {})}
        cluster_config(self.dir, self.cluster["remotes"][name], host, pool={"exclude_vfs": list(exclude)},
                       libvirt={"uri": uri or host.uri}, sysfs={"root": str(sysfs)},
                       timeouts={"hotplug_seconds": 10}, migration=migration)

    def __call__(self, on, action, args, vmid=42, stdin=""):
        remotes = self.cluster["remotes"][on]
        env = node_env(remotes, KVM_SRIOV_CONFIG=str(self.dir / f"{on}.toml"))
        return one_call(remotes, action, args, vmid, on, stdin, env=env,
                        wrapper=self.cluster["hosts"][on].nsenter())

    def vm_file(self, name, vmid=42, ds=0):
        """<system datastore>/<vm>/<name>, as OpenNebula names the VM's files."""
        return str(self.dir / "datastores" / str(ds) / str(vmid) / name)

    def domain(self, on, uuid):
        conn = self.cluster["hosts"][on].open()
        try:
            dom = conn.lookupByUUIDString(uuid)
            return dom.isActive()
        except libvirt.libvirtError:
            return False
        finally:
            conn.close()


@pytest.fixture
def driver(cluster, tmp_path):
    yield Driver(cluster, tmp_path)
    for h in cluster["hosts"].values():
        destroy_all(h.uri)


def deploy(driver, image, tmp_path, on="h1", vmid=42, disk=None):
    uuid = str(uuidlib.uuid4())
    serial = tmp_path / f"serial-{vmid}.log"
    xml = runnable_deployment(f"one-{vmid}", uuid, serial, image, ib_nics=0)
    if disk:
        root = etree.fromstring(xml.encode())
        root.find("devices").append(etree.fromstring(
            f"<disk type='file' device='disk'><driver name='qemu' type='raw'/>"
            f"<source file='{disk}'/><target dev='vdb' bus='virtio'/></disk>"))
        xml = etree.tostring(root, encoding="unicode")
    r = driver(on, "deploy", [driver.vm_file("deployment.0", vmid), on], vmid=vmid, stdin=xml)
    assert r.code == 0, r.stderr
    assert wait_for(lambda: (last_counter(serial) or 0) >= 2), "guest did not start counting"
    return uuid, serial


def test_save_then_restore_keeps_guest_state(driver, image, tmp_path):
    uuid, serial = deploy(driver, image, tmp_path)
    ckpt = Path(driver.vm_file("checkpoint"))
    r = driver("h1", "save", [uuid, str(ckpt), "h1"], stdin=action_xml("save", ib_nic=False, system_ds=ckpt.parents[1]))
    assert r.code == 0, r.stderr
    assert not driver.domain("h1", uuid) and ckpt.stat().st_size > 0
    before = last_counter(serial)
    time.sleep(2)
    assert last_counter(serial) == before       # frozen while saved
    r = driver("h1", "restore", [str(ckpt), "h1", uuid], stdin=action_xml("restore", ib_nic=False, system_ds=ckpt.parents[1]))
    assert r.code == 0, r.stderr
    assert driver.domain("h1", uuid)
    assert wait_for(lambda: last_counter(serial) > before + 1)
    assert serial.read_text().count("simhost-guest: up") == 1   # resumed, not rebooted
    assert not ckpt.exists()                    # like the stock driver, consumed on success


def test_cold_migration_is_save_here_restore_there(driver, image, tmp_path):
    uuid, serial = deploy(driver, image, tmp_path)
    ckpt = Path(driver.vm_file("checkpoint"))
    assert driver("h1", "save", [uuid, str(ckpt), "h1"]).code == 0
    r = driver("h2", "restore", [str(ckpt), "h2", uuid], stdin=action_xml("restore", ib_nic=False, system_ds=ckpt.parents[1]))
    assert r.code == 0, r.stderr
    assert driver.domain("h2", uuid) and not driver.domain("h1", uuid)
    before = last_counter(serial)
    assert wait_for(lambda: last_counter(serial) > before + 1)


def test_live_migration_of_a_vm_without_vfs_on_a_shared_datastore(driver, image, tmp_path):
    uuid, serial = deploy(driver, image, tmp_path)
    r = driver("h1", "migrate", [uuid, "h2", "h1"],
               stdin=action_xml("migrate", ib_nic=False, system_ds=driver.dir / "datastores" / "0"))
    assert r.code == 0, r.stderr
    assert driver.domain("h2", uuid) and not driver.domain("h1", uuid)
    before = last_counter(serial)
    assert wait_for(lambda: last_counter(serial) > before + 1)
    assert serial.read_text().count("simhost-guest: up") == 1


def test_live_migration_of_a_vm_without_vfs_on_a_local_datastore(driver, cluster, image, tmp_path):
    """OpenNebula's default system datastore (TM_MAD local): the stock migrate
    copies the disks along (--copy-storage-all) into the destination's own
    datastore folder, which each simulated host has at the same path."""
    work = cluster["work"]
    system_ds = work / "datastores" / "0"          # the path inside every host
    on_h1, on_h2 = (work / h / "datastores" / "0" / "42" for h in ("h1", "h2"))
    on_h1.mkdir(parents=True, exist_ok=True)
    disk = on_h1 / "disk.1"
    disk.write_bytes(b"kvm-sriov" + bytes(1024 * 1024 - 9))
    (on_h1 / "vm.xml").write_text("<VM/>")          # OpenNebula keeps vm.xml there
    uuid, serial = deploy(driver, image, tmp_path, disk=system_ds / "42" / "disk.1")
    r = driver("h1", "migrate", [uuid, "h2", "h1"],
               stdin=action_xml("migrate", ib_nic=False, system_ds=system_ds, shared=False))
    assert r.code == 0, r.stderr
    assert driver.domain("h2", uuid) and not driver.domain("h1", uuid)
    assert (on_h2 / "disk.1").read_bytes()[:9] == b"kvm-sriov"   # copied by the migration
    before = last_counter(serial)
    assert wait_for(lambda: last_counter(serial) > before + 1)
    assert serial.read_text().count("simhost-guest: up") == 1


def test_destination_full_aborts_before_touching_the_vm(driver, image, tmp_path):
    """The VM's NIC list (from oned) has an IB NIC; h2 has no free VF."""
    standard_host(tmp_path / "fake")
    driver.configure("h2", sysfs=tmp_path / "fake",
                     exclude=["0000:03:00.1", "0000:03:00.2", "0000:03:00.4",
                              "0000:81:00.1", "0000:81:00.2", "0000:81:00.3"])
    uuid, serial = deploy(driver, image, tmp_path)
    r = driver("h1", "migrate", [uuid, "h2", "h1"], stdin=action_xml("migrate", ib_nic=True))
    assert r.code != 0
    assert "on h2: not enough free SR-IOV VFs" in r.reason
    assert driver.domain("h1", uuid) and not driver.domain("h2", uuid)


def test_restore_without_free_vf_leaves_nothing(driver, image, tmp_path):
    uuid, serial = deploy(driver, image, tmp_path)
    ckpt = Path(driver.vm_file("checkpoint"))
    assert driver("h1", "save", [uuid, str(ckpt), "h1"]).code == 0
    r = driver("h2", "restore", [str(ckpt), "h2", uuid], stdin=action_xml("restore", ib_nic=True, system_ds=ckpt.parents[1]))
    assert r.code != 0 and "not enough free SR-IOV VFs" in r.reason
    assert not driver.domain("h2", uuid)
    assert ckpt.exists()                         # kept for a retry


def test_destination_unreachable(driver, image, tmp_path):
    uuid, _ = deploy(driver, image, tmp_path)
    r = driver("h1", "migrate", [uuid, "10.99.0.99", "h1"],
               stdin=action_xml("migrate", ib_nic=False, system_ds=driver.dir / "datastores" / "0"))
    assert r.code != 0
    assert driver.domain("h1", uuid)


def test_save_of_a_domain_that_is_not_there(driver, tmp_path):
    r = driver("h1", "save", [str(uuidlib.uuid4()), driver.vm_file("checkpoint"), "h1"])
    assert r.code != 0 and "Could not save" in r.stderr


def test_checkpoint_unwritable_keeps_vm_running(driver, image, tmp_path):
    uuid, serial = deploy(driver, image, tmp_path)
    blocked = Path(driver.vm_file("checkpoint"))
    blocked.mkdir()  # a directory where the image file would go
    r = driver("h1", "save", [uuid, str(blocked), "h1"])
    assert r.code != 0 and "Could not save" in r.stderr
    assert driver.domain("h1", uuid)
    before = last_counter(serial)
    assert wait_for(lambda: last_counter(serial) > before)
