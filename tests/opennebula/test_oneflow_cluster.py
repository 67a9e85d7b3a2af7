"""Rung 4: IB MPI clusters of two tenants as they get them, end to end. The
operator registers templates/oneflow with create-ib-mpi-cluster.sh; tenant
A (oneadmin) instantiates ib-mpi-cluster-spread, a head and 3 workers (tiny
VMs instead of the Debian node) over four simulated hosts (host4 has three
VFs, the others one): every VM on its own host with a VF of its host's pool
on the service's own IB network, the service and every VM RUNNING. Tenant B,
a user of its own group in its own VDC (hosts, datastores and the
management network only: the default VDC would let it use every network,
A's included), instantiates the shared ib-mpi-cluster-pack: a head and a
worker on one host (affinity), sharing one memory region. The partitions
made from oned's networks (checked by the real opensm) give each service its
own PKey and every running VM's port GUID in its own partition only; B can
neither read nor use A's network, nor take A's key. The hostfile tool, run
as the head VM runs it (its OneGate token), lists every VM's IPoIB address,
and kvm-sriov-bench's service target reads the same from OneFlow and oned.
A worker scaled away gives its VF back, one scaled in claims one. The
operator then changes the VLAN_ID (PKey) of A's network under its RUNNING
VMs: oned updates each NIC (the dummy network driver's update_nic), the
network ends READY and the subnet manager moves the VMs' GUIDs to the new
key. Deleting the services leaves every pool and region empty and the
networks and partitions gone.

A VF of these hosts exists only in their fake sysfs, so libvirt cannot pass
it through: a stand-in `virsh` (a shell function in each host's kvmrc, which
the stock scripts source) starts the domain without the fake VFs'
<hostdev>s and without the management NIC (these hosts have no bridge for
it), after the driver chose, claimed and programmed the VF and wrote the
hostdev into the deployment file, which the test reads back. Everything
else is the real driver, oned, placer, OneFlow and OneGate.

Prints the seconds from instantiate to all RUNNING for each service (they
deploy at the same time), from each network's creation and from the
VLAN_ID change to opensm's reload."""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
import xml.etree.ElementTree as ET
from typing import NamedTuple

import pytest

from kvm_sriov.ib import opensm_check
from kvm_sriov.ivshmem import region as ivshmem_region
from simhost.frontend import FrontEnd
from simhost.oneflow import SERVICE_STATES
from tests.conftest import REPO
from tests.ivshmem.oned.test_ivshmem_oned import header, regions_of
from tests.opennebula.conftest import KVMRC, PF, vm_template
from tests.opennebula.test_network_hooks import RANGE, Hooked, partition
from tests.opennebula.test_oneflow import role_vms, services, wait_all_running
from tests.sched.sched_frontend import fake_host, running

pytestmark = pytest.mark.skipif(os.environ.get("KVM_SRIOV_ONEFLOW_RUNG4") != "1",
                                reason="runs in rake test:oneflow (KVM_SRIOV_ONEFLOW_RUNG4=1)")

LOG_DIR = REPO / "build" / "test-logs" / "oneflow-cluster"
TIMINGS = REPO / "build" / "test-logs" / "oneflow-cluster-timings.json"
# host4 takes a spread rank and the pack cluster (head + worker) beside it
VFS = {"host1": 1, "host2": 1, "host3": 1, "host4": 3}
HOSTS = tuple(VFS)
TOOL = REPO / "contextualization" / "hostfile" / "kvm-sriov-hostfile"
SERVICE_TEMPLATE_DOCUMENT = 101   # OneFlow's service templates are oned documents of this type
READY, UPDATE_FAILURE = "1", "6"  # VirtualNetwork::VirtualNetworkState

# The stand-in virsh: `create FILE` gets FILE without the <hostdev>s of the
# fake PF's VFs and without NICs on a bridge the host lacks (the management
# network's; these hosts have none), as a copy beside it; every other
# command goes to the real virsh.
VIRSH = f"""#!/usr/bin/python3
import os, sys, xml.etree.ElementTree as ET
args = sys.argv[1:]
if "create" in args and args.index("create") + 1 < len(args):
    at = args.index("create") + 1
    root = ET.parse(args[at]).getroot()
    devices = root.find("devices")
    for dev in list(devices.iterfind("hostdev")):
        a = dev.find("source/address")
        if a is not None and int(a.get("bus"), 16) == 0x{PF.split(":")[1]}:
            devices.remove(dev)
    for nic in list(devices.iterfind("interface[@type='bridge']")):
        if not os.path.exists("/sys/class/net/" + nic.find("source").get("bridge")):
            devices.remove(nic)
    args[at] += ".no-fake-vf"
    ET.ElementTree(root).write(args[at])
os.execv("/usr/bin/virsh", ["virsh"] + args)
"""


@pytest.fixture(scope="module")
def flow(request):
    work = REPO / "build" / "rung4-oneflow-cluster"
    shutil.rmtree(work, ignore_errors=True)
    shim = work / "stand-in"
    shim.mkdir(parents=True)
    (shim / "virsh").write_text(VIRSH)
    (shim / "virsh").chmod(0o755)
    config = {h: {"sysfs": {"root": str(fake_host(work / "sysfs" / h, [(PF, "ib0", "mlx5_0", 0, vfs)]))},
                  # the domain runs without its (fake) VF: reconcile must not take it back meanwhile
                  "pool": {"reservation_grace_seconds": 3600}}
              for h, vfs in VFS.items()}
    fe = FrontEnd(work / "fe", list(HOSTS), host_config=config, kvmrc=KVMRC)
    failed = lambda: request.session.testsfailed  # noqa: E731
    with running(fe, LOG_DIR, failed) as fe, services(fe, LOG_DIR, failed) as svc:
        # in each host's synced kvmrc, after oned's restart: scripts_common.sh
        # puts /usr/bin first on PATH, a shell function still wins
        for h in HOSTS:
            with open(fe.host(h).root / "var-tmp" / "one" / "etc" / "vmm" / "kvm" / "kvmrc", "a") as rc:
                rc.write(f'\nvirsh() {{ {shim}/virsh "$@"; }}\n')
        (work / "sm" / "sm").mkdir(parents=True)
        svc.hooks = Hooked(fe, work / "sm")   # the SM is local here; its reload asks opensm
        setup = subprocess.run([str(svc.hooks.kvm_sriov), "setup-hooks", "--command", svc.hooks.command],
                               env=fe.env, capture_output=True, text=True, timeout=120)
        assert setup.returncode == 0, setup.stderr
        yield svc


def pool(fe, host: str, table: str, columns: str = "*") -> list:
    """Rows of a table of the host's pool database ([] before it exists)."""
    db = fe.host(host).state_dir / "pool.sqlite3"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            return []
        return conn.execute(f"SELECT {columns} FROM {table}").fetchall()


def claimed(fe, vm: int) -> int:
    """The port GUID of the one VF the VM holds in its host's pool, after
    checking that its deployment file has that VF as a hostdev."""
    host = fe.vm_host(vm)
    vfs = [vf for vf, vm_id, state in pool(fe, host, "assignment", "vf, vm_id, state")
           if vm_id == vm and state == "attached"]
    assert len(vfs) == 1, (vm, host, pool(fe, host, "assignment"))
    dep = ET.parse(fe.host(host).root / "datastores-0" / str(vm) / "deployment.0").getroot()
    hostdevs = ["0000:{}:{}.{}".format(*(a.get(k)[2:] for k in ("bus", "slot", "function")))
                for a in dep.iterfind("devices/hostdev/source/address")]
    assert hostdevs == vfs, (vm, hostdevs, vfs)
    guids = [g for g, vm_id in pool(fe, host, "guid", "port_guid, vm_id") if vm_id == vm]
    assert len(guids) == 1, pool(fe, host, "guid")
    return int(guids[0].replace(":", ""), 16)


def pools_empty(fe) -> dict:
    """What any host's pool still holds (VFs, intents, GUIDs, shared-memory regions)."""
    left = {}
    for host in HOSTS:
        for table in ("assignment", "intent", "guid", "ivshmem_region", "ivshmem_user"):
            if pool(fe, host, table):
                left[f"{host}.{table}"] = pool(fe, host, table)
    return left


def partitions(text: str) -> dict:
    """{PKey: set of port GUIDs} of a partitions file."""
    keys = {}
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for stanza in text.split(";"):
        m = re.match(r"\s*[\w.]+=(0x[0-9a-f]+)[^:]*(?::(.*))?$", stanza, re.S)
        if m:
            keys[int(m.group(1), 16)] = {int(g, 16) for g in re.findall(r"0x[0-9a-f]+", m.group(2) or "")}
    return keys


def isolated(flow, services: dict) -> dict:
    """The SM's file as opensm accepts it, each {PKey: GUIDs of its VMs} in its
    own partition and in no other one; the file's {PKey: GUIDs}."""
    text = flow.hooks.partitions.read_text()
    assert opensm_check.check_text(text).accepted
    keys = partitions(text)
    for pkey, guids in services.items():
        assert guids and guids <= keys[pkey | 0x8000], (hex(pkey), sorted(map(hex, guids - keys[pkey | 0x8000])))
        for other in set(keys) - {pkey | 0x8000}:
            assert not guids & keys[other], (hex(pkey), hex(other), sorted(map(hex, guids & keys[other])))
    return keys


def network_of(fe, name: str):
    """The ID of the network of that name (None while there is none)."""
    ok, body = fe.rpc("one.vnpool.info", -2, -1, -1)
    assert ok, body
    return next((int(v.findtext("ID")) for v in ET.fromstring(body) if v.findtext("NAME") == name), None)


def network_reloaded(flow, service: int, since: float) -> tuple[int, int, float]:
    """Wait for the service's network and for opensm's reload with its
    partition: (network ID, its PKey, seconds from the network's creation
    (oned's log of the call, whole seconds: up to 1 s more) to that reload).
    A service OneFlow gave up on fails the test at once, with OneFlow's reason."""
    fe, deadline = flow.fe, time.monotonic() + 300
    while (vid := network_of(fe, f"ib-{service}")) is None:
        failed = flow.failure(service)
        assert not failed, failed
        assert time.monotonic() < deadline, f"OneFlow made no network ib-{service}: {flow.service_state(service)}"
        time.sleep(0.5)
    reloaded = since + flow.hooks.reloaded_with(since, present=[f"one_vnet_{vid}=0x"])
    # OneFlow makes it with one.vntemplate.instantiate; oned logs the call in local time
    made = re.search(rf"^(.{{24}}) \[Z0\]\[ReM\]\[D\]: Req:\d+ UID:\d+ one\.vntemplate\.instantiate "
                     rf"result SUCCESS, {vid}$", (fe.one_location / "var" / "oned.log").read_text(), re.M)
    assert made, f"oned.log has no one.vntemplate.instantiate of network {vid}"
    created = time.mktime(time.strptime(made.group(1), "%a %b %d %H:%M:%S %Y"))
    return vid, int(flow.hooks.vlan(vid), 16), reloaded - created


def instantiate(flow, template, merge: dict, name: str, auth=None) -> int:
    path = flow.fe.workdir / "templates" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merge))
    out = flow.flow("oneflow-template", "instantiate", template, path, auth_file=auth).stdout
    return int(out.split("ID:")[1].split()[0])


def object_id(fe, kind: str, name: str, *extra) -> int:
    ok, body = fe.rpc(f"one.{kind}pool.info", -2, -1, -1, *extra)
    assert ok, body
    ids = [int(o.findtext("ID")) for o in ET.fromstring(body) if o.findtext("NAME") == name]
    assert len(ids) == 1, (kind, name, ids)
    return ids[0]


class Tenant(NamedTuple):
    uid: int
    session: str
    auth_file: str


def tenant_b(flow, tiny: int, image: int, public: int, a_net: int) -> Tenant:
    """What an operator does for a second tenant: a group (the CLI adds its
    users' rights to create VMs, VM groups, documents), a user in it, its
    own VDC with the hosts, the datastores and the management network (not
    the default VDC, which every new group joins and which lets it use every
    network of the cluster), the templates shared (USE for others) and the
    pack's VM group given to it (VMs name their group by name, in their
    owner's groups)."""
    fe, rpc = flow.fe, flow.hooks.rpc
    gid = fe.create("group", "tenant-b")
    session = "tenant-b:tenant-b-secret"
    uid = rpc("one.user.allocate", "tenant-b", "tenant-b-secret", "core", [gid])
    in_default, body = fe.rpc("one.vn.info", a_net, session=session)
    print(f"tenant B in the default VDC: one.vn.info of A's network {'allowed' if in_default else 'refused'}")
    rpc("one.vdc.delgroup", 0, gid)
    vdc = rpc("one.vdc.allocate", 'NAME = "tenant-b"')
    rpc("one.vdc.addgroup", vdc, gid)
    for h in HOSTS:
        rpc("one.vdc.addhost", vdc, 0, fe.host(h).id)
    for ds in (0, int(fe.info("image", image).findtext("DATASTORE_ID"))):
        rpc("one.vdc.adddatastore", vdc, 0, ds)
    rpc("one.vdc.addvnet", vdc, 0, public)
    other_use = (-1, -1, -1, -1, -1, -1, 1, -1, -1)
    for kind, oid in (("template", tiny), ("image", image),
                      ("vntemplate", object_id(fe, "vntemplate", "ib-mpi-cluster-net")),
                      ("document", object_id(fe, "document", "ib-mpi-cluster-pack", SERVICE_TEMPLATE_DOCUMENT))):
        rpc(f"one.{kind}.chmod", oid, *other_use)
    rpc("one.vmgroup.chown", object_id(fe, "vmgroup", "ib-mpi-pack"), uid, gid)
    auth = fe.workdir / "tenant-b.auth"
    auth.write_text(session + "\n")
    auth.chmod(0o600)
    return Tenant(uid, session, str(auth))


def hostfile(flow, vm: int) -> list:
    """The hostfile tool as the VM runs it: OneGate's endpoint, its VMID, the token oned gave it."""
    out = flow.fe.workdir / f"hostfile-{vm}"
    env = dict(os.environ, ONEGATE_ENDPOINT=flow.gate_endpoint, VMID=str(vm), TOKENTXT=flow.vm_token(vm))
    # the tool gives OneGate IB_HOSTFILE_TIMEOUT (120 s) itself: only a hang ends here
    p = subprocess.run(["/usr/bin/python3", str(TOOL), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out.read_text().splitlines()


def ib_nic(fe, vm: int, network: str) -> ET.Element:
    nics = [n for n in fe.info("vm", vm).findall("TEMPLATE/NIC") if n.findtext("NETWORK") == network]
    assert len(nics) == 1, (vm, network)
    return nics[0]


def ib_line(fe, vm: int, network: str) -> str:
    return f'{ib_nic(fe, vm, network).findtext("IP")} slots={fe.info("vm", vm).findtext("TEMPLATE/VCPU")}'


def bench_target(flow, service: int, members: list, net: str) -> None:
    """kvm-sriov-bench's service target: OneFlow's API and oned (pyone) as the
    harness reads them give the service's VMs head first, their hosts, and the
    hostfile the head's OneGate tool wrote; the service is left running."""
    from kvm_sriov_bench.oneflow import OneFlow
    from kvm_sriov_bench.opennebula import OneCluster, ServiceTarget, hostfile as bench_hostfile
    fe = flow.fe
    started = time.monotonic()
    target = ServiceTarget(OneCluster.connect(fe.endpoint, fe.session), OneFlow(flow.flow_endpoint, fe.session),
                           f"{service}", ib_attr=None, timeout=60, poll=1)   # tiny guests report no IB_STATE
    vms = target.wait_ready()
    print(f"kvm-sriov-bench --service {service}: {target.service.describe(target.hosts)} "
          f"in {time.monotonic() - started:.1f} s")
    assert [vm.id for vm in vms] == members
    assert [vm.host for vm in vms] == [fe.host(fe.vm_host(v)).one_name for v in members]
    assert bench_hostfile(vms).splitlines() == [ib_line(fe, v, net) for v in members]


def shared_region(fe, vms: list) -> str:
    """The pack's VMs share one region on their one host, as the ivshmem-oned
    suite checks it (the domains' devices, the region's header); its name."""
    info = fe.info("vm", vms[0])
    name = f'kvm-sriov-ivshmem-u{info.findtext("UID")}-g{info.findtext(".//VMGROUP/VMGROUP_ID")}'
    host = fe.vm_host(vms[0])
    for vm in vms:
        assert fe.vm_host(vm) == host and regions_of(fe, host, vm) == [name], (vm, fe.vm_host(vm))
    assert header(name)["vms"] == sorted(vms)
    return name


def keys_of(fe, vms: list, net: str) -> dict:
    """{VM: the PKey its NIC on the network carries (its VLAN_ID; -1 for none)}."""
    return {vm: int(ib_nic(fe, vm, net).findtext("VLAN_ID") or "-1", 16) for vm in vms}


def nic_updates(fe, vm: int) -> int:
    """The NIC updates the network driver's update_nic reported done for the VM
    (oned logs "VM nic updated." in its vm.log on each, and only on success)."""
    log = fe.one_location / "var" / "vms" / str(vm) / "vm.log"
    return log.read_text(errors="replace").count("VM nic updated.") if log.exists() else 0


def ids(vnet: ET.Element, kind: str) -> set:
    """A network's UPDATED_VMS, OUTDATED_VMS, UPDATING_VMS or ERROR_VMS."""
    return {int(x.text) for x in vnet.findall(f"{kind}/ID")}


def change_vlan(flow, vid: int, old: int, new: int, vms: list, net: str) -> float:
    """The operator's `onevnet update --append` of the network's VLAN_ID under
    its RUNNING VMs: the SM moves their GUIDs to the new key, every NIC gets the
    new VLAN_ID through the network driver's update_nic, the network ends READY
    with every VM in UPDATED_VMS; returns the seconds to opensm's reload.

    What says oned's update is over: it updates the VMs one at a time
    (LifeCycleManager::trigger_updatevnet) and takes each out of OUTDATED_VMS,
    and saves the network, before it puts it in UPDATING_VMS (or UPDATED_VMS);
    a read in between sees it in no list, its NIC maybe already changed. The
    update is over once VNET_UPDATE, the attribute that holds the change, is
    gone from the network (oned drops it when no VM is left outdated) and no
    VM is outdated or updating."""
    fe, hooks = flow.fe, flow.hooks
    before = {vm: nic_updates(fe, vm) for vm in vms}
    t0, started = time.time(), time.monotonic()
    hooks.rpc("one.vn.update", vid, f'VLAN_ID = "0x{new:04x}"', 1)   # what `onevnet update --append` sends
    took = hooks.reloaded_with(t0, present=[partition(vid, new)], absent=[partition(vid, old)])
    deadline = time.monotonic() + 180
    while True:
        v = fe.info("vn", vid)
        if v.find("TEMPLATE/VNET_UPDATE") is None and not ids(v, "OUTDATED_VMS") | ids(v, "UPDATING_VMS"):
            break
        assert v.findtext("STATE") != UPDATE_FAILURE, f"network {vid}: UPDATE_FAILURE, VMs {ids(v, 'ERROR_VMS')}"
        assert time.monotonic() < deadline, (f"network {vid}: oned's update of its VMs not over: outdated "
                                             f"{ids(v, 'OUTDATED_VMS')}, updating {ids(v, 'UPDATING_VMS')}")
        time.sleep(1)
    print(f"VLAN_ID 0x{old:04x} -> 0x{new:04x} of network {vid} under {len(vms)} RUNNING VMs: opensm reloaded "
          f"in {took:.1f} s, oned's update of every NIC over in {time.monotonic() - started:.1f} s")
    assert v.findtext("STATE") == READY and not ids(v, "ERROR_VMS"), (v.findtext("STATE"), ids(v, "ERROR_VMS"))
    assert ids(v, "UPDATED_VMS") == set(vms), (ids(v, "UPDATED_VMS"), vms)
    assert keys_of(fe, vms, net) == {vm: new for vm in vms}
    through_driver = {vm: nic_updates(fe, vm) - before[vm] for vm in vms}
    assert all(n >= 1 for n in through_driver.values()), f"update_nic per VM: {through_driver}"
    assert all(fe.vm_state(vm) == "RUNNING" for vm in vms)
    return took


def all_running(flow, started: dict, counts: dict, timeout: float = 900) -> dict:
    """Wait until each service (ID: its VM count) is RUNNING in OneFlow and
    all its VMs RUNNING in oned: {service: (body, seconds from started[service])}."""
    fe, done, deadline = flow.fe, {}, time.monotonic() + timeout
    while len(done) < len(counts):
        for sid in set(counts) - set(done):
            body = flow.service(sid)["TEMPLATE"]["BODY"]
            state = SERVICE_STATES[int(body["state"])]
            gave_up = flow.failure(sid, body)
            assert not gave_up, gave_up
            vms = {v: fe.vm_state(v) for role in role_vms(body).values() for v in role}
            failed = [v for v, s in vms.items() if s.endswith("FAILURE")]
            assert not failed, f"VM {failed[0]} is {vms[failed[0]]}: {fe.vm_error(failed[0])}"
            if state == "RUNNING" and len(vms) == counts[sid] and set(vms.values()) == {"RUNNING"}:
                done[sid] = (body, time.monotonic() - started[sid])
        assert time.monotonic() < deadline, f"services {sorted(set(counts) - set(done))} not all RUNNING"
        time.sleep(1)
    return done


def test_two_tenants_clusters_are_isolated_scale_follow_a_new_pkey_and_leave_nothing(flow):
    fe, hooks = flow.fe, flow.hooks
    public = fe.create("vnet", 'NAME = "public"\nVN_MAD = "dummy"\nBRIDGE = "br-mgmt"\n'
                               'AR = [ TYPE = "IP4", IP = "192.168.60.10", SIZE = "50" ]\n')
    flow.flow(REPO / "templates" / "oneflow" / "create-ib-mpi-cluster.sh", "public")
    image = fe.tiny_image("ib-tiny", "default")
    # the node template's ranking: the host with the most free VFs first
    tiny = vm_template(fe, "ib-tiny-node", image, extra='CONTEXT = [ NETWORK = "YES", TOKEN = "YES" ]\n'
                                                         'SCHED_RANK = "KVM_SRIOV_FREE_VFS"\n')

    def merge(workers):  # the PKey: none given, the network template asks for one
        return {"roles": [{"name": "head", "template_id": tiny},
                          {"name": "worker", "template_id": tiny, "cardinality": workers, "cooldown": 1}]}

    # tenant A's cluster: head + 3 workers, one per host, each with a VF; its partition in seconds
    t0, started = time.time(), time.monotonic()
    service = instantiate(flow, "ib-mpi-cluster-spread", merge(3), "cluster")
    vid, pkey, took = network_reloaded(flow, service, t0)
    print(f"\noneflow cluster: network ib-{service} created -> opensm reloaded with its PKey 0x{pkey:04x}: "
          f"{took:.1f} s (oned logs whole seconds)")
    assert RANGE[0] <= pkey <= RANGE[1]
    net = f"ib-{service}"

    # tenant B: the operator's set-up, then its own pack cluster (head + 1 worker) beside A's
    b = tenant_b(flow, tiny, image, public, vid)
    pack_template = object_id(fe, "document", "ib-mpi-cluster-pack", SERVICE_TEMPLATE_DOCUMENT)
    t1, b_started = time.time(), time.monotonic()
    other = instantiate(flow, pack_template, merge(1), "pack", auth=b.auth_file)
    other_vid, other_pkey, b_took = network_reloaded(flow, other, t1)
    print(f"tenant B's pack cluster: network ib-{other} -> reload {b_took:.1f} s, PKey 0x{other_pkey:04x}")
    assert other_pkey != pkey and RANGE[0] <= other_pkey <= RANGE[1]
    other_net = f"ib-{other}"
    assert int(fe.info("vn", other_vid).findtext("UID")) == b.uid

    ready = all_running(flow, {service: started, other: b_started}, {service: 4, other: 2})
    (body, seconds), (b_body, b_seconds) = ready[service], ready[other]
    print(f"oneflow cluster (A, spread): instantiate to all RUNNING (service + 4 VMs with VFs): {seconds:.1f} s")
    print(f"oneflow cluster (B, pack, deploying beside A): instantiate to all RUNNING (service + 2 VMs "
          f"with VFs): {b_seconds:.1f} s")
    vms = role_vms(body)
    members = vms["head"] + vms["worker"]
    assert len(vms["head"]) == 1 and len(vms["worker"]) == 3
    assert sorted(fe.vm_host(v) for v in members) == sorted(HOSTS)    # spread: one rank per host
    guids = {vm: claimed(fe, vm) for vm in members}
    b_vms = role_vms(b_body)["head"] + role_vms(b_body)["worker"]
    assert len(b_vms) == 2 and all(int(fe.info("vm", v).findtext("UID")) == b.uid for v in b_vms)
    b_guids = {vm: claimed(fe, vm) for vm in b_vms}
    # every NIC has its network's key, also a VM made while the hook was writing it (oned carries
    # the new VLAN_ID into the NICs of the network's VMs; the guest's context takes it from there)
    assert keys_of(fe, members, net) == {vm: pkey for vm in members}
    assert keys_of(fe, b_vms, other_net) == {vm: other_pkey for vm in b_vms}
    region = shared_region(fe, b_vms)                                # pack: one host, one region
    print(f"tenant B's pack: VMs {b_vms} on {fe.vm_host(b_vms[0])}, region {region}")

    # the SM: each tenant's GUIDs in its own partition only (opensm accepts the file)
    keys = isolated(flow, {pkey: set(guids.values()), other_pkey: set(b_guids.values())})
    assert not keys[pkey | 0x8000] & keys[other_pkey | 0x8000]
    # oned: B neither reads nor uses A's network, nor takes A's key for its own
    ok, why = fe.rpc("one.vn.info", vid, session=b.session)
    assert not ok and "Not authorized" in why, why
    ok, why = fe.rpc("one.vm.allocate", f'NAME = "b-on-a"\nCPU = "0.1"\nMEMORY = "64"\nNIC = [ NETWORK_ID = "{vid}" ]\n',
                     True, session=b.session)
    assert not ok and "Not authorized" in why, why
    assert fe.rpc("one.vn.info", other_vid, session=b.session)[0]
    ok, key_why = fe.rpc("one.vn.update", other_vid, f'VLAN_ID = "{pkey}"', 1, session=b.session)
    assert not ok and int(hooks.vlan(other_vid), 16) == other_pkey, key_why
    print(f"tenant B refused: a VM on A's network ({why}); A's key for its own network ({key_why})")

    # the head's hostfile, from OneGate with its own token; the harness's view of the service
    assert hostfile(flow, members[0]) == [ib_line(fe, v, net) for v in members]
    assert hostfile(flow, b_vms[0]) == [ib_line(fe, v, other_net) for v in b_vms]
    bench_target(flow, service, members, net)

    # a worker scaled away gives its VF back; one scaled in claims one
    flow.scale(service, "worker", 2)
    body = wait_all_running(flow, service, 3)
    gone = set(vms["worker"]) - set(role_vms(body)["worker"])
    assert len(gone) == 1
    gone = gone.pop()
    print(f"scale down removed worker VM {gone} of {vms['worker']}")
    fe.wait_vm(gone, "DONE", timeout=180)
    freed = next(h for h in HOSTS if h not in {fe.vm_host(v) for v in set(members) - {gone}})
    assert [vm for (vm,) in pool(fe, freed, "assignment", "vm_id") + pool(fe, freed, "guid", "vm_id")
            if vm == gone] == []
    flow.scale(service, "worker", 3)
    body = wait_all_running(flow, service, 4)
    added = set(role_vms(body)["worker"]) - set(vms["worker"])
    assert len(added) == 1
    added = added.pop()
    assert fe.vm_host(added) == freed
    assert claimed(fe, added) in keys[pkey | 0x8000]
    members = role_vms(body)["head"] + role_vms(body)["worker"]
    assert hostfile(flow, members[0]) == [ib_line(fe, v, net) for v in members]

    # the operator moves A's network to another key under its RUNNING VMs
    new = next(k for k in range(RANGE[0], RANGE[1] + 1) if k not in (pkey, other_pkey))
    vlan_took = change_vlan(flow, vid, pkey, new, members, net)
    isolated(flow, {new: {claimed(fe, v) for v in members}, other_pkey: set(b_guids.values())})
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({"instantiate_to_all_running_s": round(seconds, 1), "vms": 4,
                                   "pack_instantiate_to_all_running_s": round(b_seconds, 1), "pack_vms": 2,
                                   "network_to_sm_reload_s": round(took, 1),
                                   "pack_network_to_sm_reload_s": round(b_took, 1),
                                   "vlan_change_to_sm_reload_s": round(vlan_took, 1)}) + "\n")

    # delete both: every VM DONE, every pool and region empty, the networks and their partitions gone
    t2 = time.time()
    flow.flow("oneflow", "delete", service)
    flow.flow("oneflow", "delete", other, auth_file=b.auth_file)
    for vm in members + b_vms:
        fe.wait_vm(vm, "DONE", timeout=300)
    deadline = time.monotonic() + 180
    while any(fe.cli("onevnet", "show", n, check=False).returncode == 0 for n in (net, other_net)):
        assert time.monotonic() < deadline, "a service's network outlived its service"
        time.sleep(1)
    hooks.reloaded_with(t2, absent=[f"one_vnet_{vid}=", f"one_vnet_{other_vid}="])
    assert not {new | 0x8000, other_pkey | 0x8000} & set(partitions(hooks.partitions.read_text()))
    assert pools_empty(fe) == {}
    assert not (ivshmem_region.SHM_DIR / region).exists()
