"""Rung 4: an IB MPI cluster as a tenant gets it, end to end. The operator
registers templates/oneflow with create-ib-mpi-cluster.sh; the service
template ib-mpi-cluster-spread is instantiated with a head and 3 workers
(tiny VMs instead of the Debian node) over four simulated hosts of one VF
each: every VM on its own host with a VF of its host's pool on the service's
own IB network, the service and every VM RUNNING. A second service gets its
own network and PKey; the partitions made from oned's networks (checked by
the real opensm) give each its own PKey and disjoint GUIDs, every running
VM's port GUID in its own partition only. The hostfile tool, run as the head
VM runs it (its OneGate token), lists every VM's IPoIB address. A worker
scaled away gives its VF back, one scaled in claims one. Deleting the
services leaves every pool empty and the networks and partitions gone.

A VF of these hosts exists only in their fake sysfs, so libvirt cannot pass
it through: a stand-in `virsh` (a shell function in each host's kvmrc, which
the stock scripts source) starts the domain without the fake VFs'
<hostdev>s and without the management NIC (these hosts have no bridge for
it), after the driver chose, claimed and programmed the VF and wrote the
hostdev into the deployment file, which the test reads back. Everything
else is the real driver, oned, placer, OneFlow and OneGate.

Prints the seconds from instantiate to all RUNNING."""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest

from kvm_sriov.ib import opensm_check
from simhost.frontend import FrontEnd
from tests.conftest import REPO
from tests.opennebula.conftest import KVMRC, PF, vm_template
from tests.opennebula.test_network_hooks import RANGE, WITHIN, Hooked
from tests.opennebula.test_oneflow import role_vms, services, wait_all_running
from tests.sched.sched_frontend import fake_host, running

pytestmark = pytest.mark.skipif(os.environ.get("KVM_SRIOV_ONEFLOW_RUNG4") != "1",
                                reason="runs in rake test:oneflow (KVM_SRIOV_ONEFLOW_RUNG4=1)")

LOG_DIR = REPO / "build" / "test-logs" / "oneflow-cluster"
TIMINGS = REPO / "build" / "test-logs" / "oneflow-cluster-timings.json"
HOSTS = ("host1", "host2", "host3", "host4")   # one VF each
TOOL = REPO / "contextualization" / "hostfile" / "kvm-sriov-hostfile"

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
    config = {h: {"sysfs": {"root": str(fake_host(work / "sysfs" / h, [(PF, "ib0", "mlx5_0", 0, 1)]))},
                  # the domain runs without its (fake) VF: reconcile must not take it back meanwhile
                  "pool": {"reservation_grace_seconds": 3600}}
              for h in HOSTS}
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


def network_reloaded(flow, service: int, since: float) -> tuple[int, int, float]:
    """Wait for the service's network and for opensm's reload with its
    partition: (network ID, its PKey, seconds from the network's creation
    (oned's log of the call, whole seconds: up to 1 s more) to that reload)."""
    fe, deadline = flow.fe, time.monotonic() + 300
    while fe.cli("onevnet", "show", f"ib-{service}", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"OneFlow made no network ib-{service}"
        time.sleep(0.5)
    vid = int(fe.xml("onevnet", "show", f"ib-{service}").findtext("ID"))
    reloaded = since + flow.hooks.reloaded_with(since, present=[f"one_vnet_{vid}=0x"])
    # OneFlow makes it with one.vntemplate.instantiate; oned logs the call in local time
    made = re.search(rf"^(.{{24}}) \[Z0\]\[ReM\]\[D\]: Req:\d+ UID:\d+ one\.vntemplate\.instantiate "
                     rf"result SUCCESS, {vid}$", (fe.one_location / "var" / "oned.log").read_text(), re.M)
    assert made, f"oned.log has no one.vntemplate.instantiate of network {vid}"
    created = time.mktime(time.strptime(made.group(1), "%a %b %d %H:%M:%S %Y"))
    return vid, int(flow.hooks.vlan(vid), 16), reloaded - created


def instantiate(flow, merge: dict, name: str) -> int:
    path = flow.fe.workdir / "templates" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merge))
    out = flow.flow("oneflow-template", "instantiate", "ib-mpi-cluster-spread", path).stdout
    return int(out.split("ID:")[1].split()[0])


def hostfile(flow, vm: int) -> list:
    """The hostfile tool as the VM runs it: OneGate's endpoint, its VMID, the token oned gave it."""
    out = flow.fe.workdir / f"hostfile-{vm}"
    env = dict(os.environ, ONEGATE_ENDPOINT=flow.gate_endpoint, VMID=str(vm), TOKENTXT=flow.vm_token(vm))
    p = subprocess.run(["/usr/bin/python3", str(TOOL), str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return out.read_text().splitlines()


def ib_line(fe, vm: int, network: str) -> str:
    info = fe.info("vm", vm)
    ips = [n.findtext("IP") for n in info.findall("TEMPLATE/NIC") if n.findtext("NETWORK") == network]
    assert len(ips) == 1, (vm, network)
    return f'{ips[0]} slots={info.findtext("TEMPLATE/VCPU")}'


def test_ib_mpi_cluster_spread_runs_on_vfs_scales_and_leaves_nothing(flow):
    fe, hooks = flow.fe, flow.hooks
    fe.create("vnet", 'NAME = "public"\nVN_MAD = "dummy"\nBRIDGE = "br-mgmt"\n'
                      'AR = [ TYPE = "IP4", IP = "192.168.60.10", SIZE = "50" ]\n')
    flow.flow(REPO / "templates" / "oneflow" / "create-ib-mpi-cluster.sh", "public")
    tiny = vm_template(fe, "ib-tiny-node", fe.tiny_image("ib-tiny", "default"),
                       extra='CONTEXT = [ NETWORK = "YES", TOKEN = "YES" ]\n')

    def merge(workers, on_hold=False):  # the PKey: none given, the network template asks for one
        return {"on_hold": on_hold,
                "roles": [{"name": "head", "template_id": tiny},
                          {"name": "worker", "template_id": tiny, "cardinality": workers, "cooldown": 1}]}

    # the cluster: head + 3 workers, one per host, each with a VF; its partition in seconds
    t0, started = time.time(), time.monotonic()
    service = instantiate(flow, merge(3), "cluster")
    vid, pkey, took = network_reloaded(flow, service, t0)
    print(f"\noneflow cluster: network ib-{service} created -> opensm reloaded with its PKey 0x{pkey:04x}: "
          f"{took:.1f} s (oned logs whole seconds)")
    assert took < WITHIN + 1 and RANGE[0] <= pkey <= RANGE[1]
    body = wait_all_running(flow, service, 4, timeout=900)
    seconds = time.monotonic() - started
    print(f"oneflow cluster: instantiate to all RUNNING (service + 4 VMs with VFs): {seconds:.1f} s")
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({"instantiate_to_all_running_s": round(seconds, 1), "vms": 4,
                                   "network_to_sm_reload_s": round(took, 1)}) + "\n")
    vms = role_vms(body)
    members = vms["head"] + vms["worker"]
    assert len(vms["head"]) == 1 and len(vms["worker"]) == 3
    net = f"ib-{service}"
    assert sorted(fe.vm_host(v) for v in members) == sorted(HOSTS)    # spread: one rank per host
    guids = {vm: claimed(fe, vm) for vm in members}

    # a second cluster (on hold: its network and PKey are what matter here)
    t1 = time.time()
    other = instantiate(flow, merge(1, on_hold=True), "other")
    other_vid, other_pkey, took = network_reloaded(flow, other, t1)
    print(f"second cluster: network -> reload {took:.1f} s, PKey 0x{other_pkey:04x}")
    flow.wait_service(other, "HOLD")
    assert other_pkey != pkey and RANGE[0] <= other_pkey <= RANGE[1]
    text = hooks.partitions.read_text()
    assert opensm_check.check_text(text).accepted
    keys = partitions(text)
    assert keys[pkey | 0x8000] and keys[other_pkey | 0x8000] and not keys[pkey | 0x8000] & keys[other_pkey | 0x8000]
    for vm, g in guids.items():
        assert g in keys[pkey | 0x8000] and g not in keys[other_pkey | 0x8000], (vm, hex(g))

    # the head's hostfile, from OneGate with its own token
    assert hostfile(flow, members[0]) == [ib_line(fe, v, net) for v in members]

    # a worker scaled away gives its VF back; one scaled in claims one
    flow.flow("oneflow", "scale", service, "worker", 2)
    body = wait_all_running(flow, service, 3)
    gone = set(vms["worker"]) - set(role_vms(body)["worker"])
    assert len(gone) == 1
    gone = gone.pop()
    print(f"scale down removed worker VM {gone} of {vms['worker']}")
    fe.wait_vm(gone, "DONE", timeout=180)
    freed = next(h for h in HOSTS if h not in {fe.vm_host(v) for v in set(members) - {gone}})
    assert pool(fe, freed, "assignment") == [] and pool(fe, freed, "guid") == []
    flow.flow("oneflow", "scale", service, "worker", 3)
    body = wait_all_running(flow, service, 4)
    added = set(role_vms(body)["worker"]) - set(vms["worker"])
    assert len(added) == 1
    added = added.pop()
    assert fe.vm_host(added) == freed
    assert claimed(fe, added) in keys[pkey | 0x8000]
    members = role_vms(body)["head"] + role_vms(body)["worker"]
    assert hostfile(flow, members[0]) == [ib_line(fe, v, net) for v in members]

    # delete both: every VM DONE, every pool empty, the networks and their partitions gone
    t2 = time.time()
    flow.flow("oneflow", "delete", service)
    flow.flow("oneflow", "delete", other)
    for vm in members:
        fe.wait_vm(vm, "DONE", timeout=300)
    deadline = time.monotonic() + 180
    while any(fe.cli("onevnet", "show", n, check=False).returncode == 0 for n in (net, f"ib-{other}")):
        assert time.monotonic() < deadline, "a service's network outlived its service"
        time.sleep(1)
    hooks.reloaded_with(t2, absent=[f"one_vnet_{vid}=", f"one_vnet_{other_vid}="])
    assert not {pkey | 0x8000, other_pkey | 0x8000} & set(partitions(hooks.partitions.read_text()))
    assert pools_empty(fe) == {}
