"""Rung 2: live migration of a VM with a shared-memory region between two
simulated hosts, each with its own /dev/shm (as real hosts have): the
device comes off on the source, the stock migrate moves the VM, the
destination's driver (kvm-sriov-peer over ssh, as in production) joins the
group's region there and plugs the device in; the source's region goes with
its last user."""

import uuid as uuidlib

import pytest

from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region
from tests.ivshmem.test_ivshmem_libvirtd import vm_xml
from tests.support.driver_env import action_xml, cluster_config, destroy_all, install_remotes, node_env, wait_for
from tests.support.runnable import runnable_deployment
from simhost.opennebula_call import one_call

pytestmark = pytest.mark.libvirt

simhost = pytest.importorskip("simhost.libvirt_host")
REGION = "kvm-sriov-ivshmem-u0-g7"


class HostWithShm(simhost.LibvirtHost):
    """A simulated host whose /dev/shm is its own folder (<root>/shm)."""

    @property
    def _mounts(self) -> dict:
        return dict(super()._mounts, shm="/dev/shm")

    @property
    def shm(self):
        return self.root / "shm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    remotes = {name: install_remotes(work / name) for name in ("h1", "h2")}
    with HostWithShm("h1", work, ip="10.99.0.1") as h1, HostWithShm("h2", work, ip="10.99.0.2") as h2:
        yield {"work": work, "remotes": remotes, "hosts": {"h1": h1, "h2": h2}}


@pytest.fixture(scope="module")
def image():
    from tests.ivshmem.guest import ensure_ivshmem_guest
    return ensure_ivshmem_guest()


def test_live_migration_joins_the_groups_region_on_the_destination(cluster, image, tmp_path):
    hosts, remotes = cluster["hosts"], cluster["remotes"]
    for name, host in hosts.items():
        # the destination's kvm-sriov-peer runs there, through ssh (production's way)
        cluster_config(tmp_path, remotes[name], host, timeouts={"hotplug_seconds": 60},
                       migration={"peer_command": ["ssh", "{host}", "env", f"KVM_SRIOV_CONFIG={tmp_path}/{{host}}.toml"],
                                  "peer_remotes": str(remotes["h2"])})

    def call(on, action, args, vmid, stdin=""):
        env = node_env(remotes[on], KVM_SRIOV_CONFIG=str(tmp_path / f"{on}.toml"))
        return one_call(remotes[on], action, args, vmid, on, stdin, env=env, wrapper=hosts[on].nsenter())

    vms = {}
    for vmid, on in ((91, "h1"), (92, "h2")):
        uuid, serial = str(uuidlib.uuid4()), tmp_path / f"serial-{vmid}.log"
        dep = tmp_path / "datastores" / "0" / str(vmid) / "deployment.0"
        dep.parent.mkdir(parents=True)
        (dep.parent / "vm.xml").write_text(vm_xml(vmid))
        xml = runnable_deployment(f"one-{vmid}", uuid, serial, image, ib_nics=0)
        r = call(on, "deploy", [str(dep), on], vmid, xml)
        assert r.code == 0, r.stderr
        vms[vmid] = (uuid, serial)
    try:
        assert ivshmem_region.read_header((hosts["h1"].shm / REGION).read_bytes())["vms"] == [91]
        assert ivshmem_region.read_header((hosts["h2"].shm / REGION).read_bytes())["vms"] == [92]
        uuid, serial = vms[91]
        assert wait_for(lambda: "simhost-guest: up" in serial.read_text(errors="replace"), 120)
        with open(hosts["h1"].shm / REGION, "r+b") as f:   # h1's region: not carried along
            f.seek(ivshmem_region.HEADER_BYTES)
            f.write(b"h1-only")
        r = call("h1", "migrate", [uuid, "h2", "h1"], 91,
                 action_xml("migrate", ib_nic=False, system_ds=tmp_path / "datastores" / "0"))
        assert r.code == 0, r.stderr
        conn = hosts["h2"].open()
        from kvm_sriov.domain import domain_xml
        dom = conn.lookupByUUIDString(uuid)
        assert dom.isActive()
        assert ivshmem.live_regions(domain_xml.parse(dom.XMLDesc(0))) == [REGION]
        assert not (hosts["h1"].shm / REGION).exists()            # its last user left h1
        region = (hosts["h2"].shm / REGION).read_bytes()
        assert ivshmem_region.read_header(region)["vms"] == [91, 92]     # joined the group there
        assert region[ivshmem_region.HEADER_BYTES:ivshmem_region.HEADER_BYTES + 7] != b"h1-only"
        for vmid, on in ((91, "h2"), (92, "h2")):
            assert call(on, "cancel", [vms[vmid][0], on], vmid).code == 0
        assert not (hosts["h2"].shm / REGION).exists()
    finally:
        for h in hosts.values():
            destroy_all(h.uri)
