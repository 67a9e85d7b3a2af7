"""A OneFlow service as the harness's target (kvm_sriov_bench/oneflow.py,
opennebula.ServiceTarget, `opennebula --service`), against what the real
OneFlow 7.4 and oned answered on rung 4 (data/oneflow/, made by its
record.py): a running two-role service and the ib-mpi-cluster-spread one with
its IB NICs; and hostile answers (huge, wrong types, bad addresses, VMs of
someone else), each refused with one line."""
import base64
import copy
import glob
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import pytest

pyone = pytest.importorskip("pyone", reason="pyone lives in the project venv (rake test:harness)")

from harness_paths import DATA, ROOT  # noqa: E402
from kvm_sriov_bench import oneflow  # noqa: E402
from kvm_sriov_bench.errors import OrchestrationError  # noqa: E402
from kvm_sriov_bench.opennebula import ServiceTarget, guest_outage, hostfile, outage_text  # noqa: E402
from tests.support.standin_oned import StandinOned  # noqa: E402

REC = os.path.join(DATA, "oneflow")
SESSION = "oneadmin:password"


def recorded(name):
    with open(os.path.join(REC, name)) as f:
        return json.load(f)


def vm_xmls(prefix):
    """{VM ID: XML text} of the recorded one.vm.info answers."""
    out = {}
    for path in sorted(glob.glob(os.path.join(REC, f"{prefix}-vm-*.xml"))):
        with open(path) as f:
            out[int(re.search(r"-(\d+)\.xml$", path).group(1))] = f.read()
    return out


RUNNING = recorded("running-service.json")
IB = recorded("ib-service.json")
POOL = recorded("service-pool.json")
RUNNING_VMS = vm_xmls("running")
IB_VMS = vm_xmls("ib")


def one_line(e):
    text = str(e.value)
    assert "\n" not in text and len(text) < 400, text
    return text


# -- the service document -------------------------------------------------------

def test_the_recorded_running_service_gives_its_roles_and_vms():
    body = RUNNING["DOCUMENT"]["TEMPLATE"]["BODY"]
    svc = oneflow.parse_service(RUNNING)
    assert svc.id == int(RUNNING["DOCUMENT"]["ID"]) and svc.name == "two-roles" and svc.state == "RUNNING"
    assert svc.roles == {r["name"]: [int(n["deploy_id"]) for n in r["nodes"]] for r in body["roles"]}
    assert len(svc.roles["head"]) == 1 and len(svc.roles["worker"]) == 2
    assert sorted(svc.vm_ids) == sorted(RUNNING_VMS)
    assert oneflow.service_ids_named(POOL, "two-roles") == [svc.id]
    assert oneflow.service_ids_named(POOL, "nothing-of-that-name") == []
    assert oneflow.parse_service(IB).state == "HOLD"


def test_an_answer_for_another_service_is_refused():
    with pytest.raises(OrchestrationError) as e:
        oneflow.parse_service(RUNNING, want_id=int(RUNNING["DOCUMENT"]["ID"]) + 1)
    assert "answered service" in one_line(e)


def _mutated(fn):
    doc = copy.deepcopy(RUNNING)
    fn(doc["DOCUMENT"], doc["DOCUMENT"]["TEMPLATE"]["BODY"])
    return doc


def _nodes(body, role=1):
    return body["roles"][role]["nodes"]


HOSTILE = {
    "no document": lambda d, b: d.clear(),
    "id a list": lambda d, b: d.__setitem__("ID", ["1"]),
    "id negative": lambda d, b: d.__setitem__("ID", "-1"),
    "name with a newline": lambda d, b: d.__setitem__("NAME", "a\nb"),
    "name huge": lambda d, b: d.__setitem__("NAME", "x" * 100000),
    "name a number": lambda d, b: d.__setitem__("NAME", 7),
    "state a word": lambda d, b: b.__setitem__("state", "RUNNING"),
    "state out of range": lambda d, b: b.__setitem__("state", 99),
    "state true": lambda d, b: b.__setitem__("state", True),
    "roles an object": lambda d, b: b.__setitem__("roles", {"head": []}),
    "a role a string": lambda d, b: b["roles"].append("worker"),
    "role name empty": lambda d, b: b["roles"][0].__setitem__("name", ""),
    "role twice": lambda d, b: b["roles"].append(copy.deepcopy(b["roles"][0])),
    "nodes a string": lambda d, b: b["roles"][0].__setitem__("nodes", "3"),
    "vm id injection": lambda d, b: _nodes(b)[0].__setitem__("deploy_id", "4; rm -rf /"),
    "vm id huge": lambda d, b: _nodes(b)[0].__setitem__("deploy_id", 2 ** 40),
    "vm id a float": lambda d, b: _nodes(b)[0].__setitem__("deploy_id", 4.0),
    "vm id missing": lambda d, b: _nodes(b)[0].pop("deploy_id"),
    "vm twice": lambda d, b: _nodes(b).append(copy.deepcopy(_nodes(b)[0])),
    "too many vms": lambda d, b: b["roles"][1].__setitem__(
        "nodes", [{"deploy_id": i} for i in range(oneflow.MAX_VMS + 1)]),
    "too many roles": lambda d, b: b.__setitem__(
        "roles", [{"name": f"r{i}", "nodes": []} for i in range(oneflow.MAX_ROLES + 1)]),
    "body a string": lambda d, b: d["TEMPLATE"].__setitem__("BODY", "{}"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_service_document_is_refused_in_one_line(case):
    with pytest.raises(OrchestrationError) as e:
        oneflow.parse_service(_mutated(HOSTILE[case]))
    one_line(e)


@pytest.mark.parametrize("url", ["http://user:pass@flow:2474", "ftp://flow", "http://flow:2474?x=1",
                                 "http://flow name", "flow:2474", "http://flow/a/../b", "", "http://[zz]"])
def test_a_bad_oneflow_url_is_refused(url):
    with pytest.raises(OrchestrationError) as e:
        oneflow.check_url(url)
    assert "not http(s)://host" in one_line(e)


def test_good_oneflow_urls():
    assert oneflow.check_url("http://localhost:2474/") == "http://localhost:2474"
    assert oneflow.check_url("https://[::1]:2474/flow") == "https://[::1]:2474/flow"


# -- OneFlow over HTTP ------------------------------------------------------------

class FlowStandin:
    """Answers GET /service and /service/<id> like OneFlow (basic auth checked);
    `answers` maps a path to (status, bytes)."""

    def __init__(self, services=(), session=SESSION):
        self.services = {int(s["DOCUMENT"]["ID"]): s for s in services}
        self.answers = {}
        self.auth = "Basic " + base64.b64encode(session.encode()).decode()
        self.seen = []
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                standin.seen.append((self.path, self.headers.get("Authorization")))
                status, body = standin.answer(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path, auth):
        if auth != self.auth:
            return 401, b"Invalid credentials"
        if path in self.answers:
            return self.answers[path]
        if path == "/service":
            docs = [{"ID": s["DOCUMENT"]["ID"], "NAME": s["DOCUMENT"]["NAME"]} for s in self.services.values()]
            return 200, json.dumps({"DOCUMENT_POOL": {"DOCUMENT": docs}}).encode()
        m = re.fullmatch(r"/service/(\d+)", path)
        if m and int(m.group(1)) in self.services:
            return 200, json.dumps(self.services[int(m.group(1))]).encode()
        return 404, b'{"message": "Error getting document"}'

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flow():
    s = FlowStandin([RUNNING])
    yield s
    s.close()


def test_the_client_sends_the_session_and_finds_a_service_by_name(flow):
    client = oneflow.OneFlow(flow.url, SESSION)
    sid = int(RUNNING["DOCUMENT"]["ID"])
    assert client.service_id("two-roles") == sid and client.service_id(str(sid)) == sid
    assert client.service(sid).vm_ids == oneflow.parse_service(RUNNING).vm_ids
    assert all(auth == flow.auth for _, auth in flow.seen)


def test_wrong_credentials_unknown_names_and_two_of_a_name_are_one_line(flow):
    with pytest.raises(OrchestrationError) as e:
        oneflow.OneFlow(flow.url, "oneadmin:wrong").service(1)
    assert "HTTP 401 Invalid credentials" in one_line(e)
    client = oneflow.OneFlow(flow.url, SESSION)
    with pytest.raises(OrchestrationError) as e:
        client.service_id("nope")
    assert "no service of that name" in one_line(e)
    twin = copy.deepcopy(RUNNING)
    twin["DOCUMENT"]["ID"] = "99"
    flow.services[99] = twin
    with pytest.raises(OrchestrationError) as e:
        client.service_id("two-roles")
    assert "2 services of that name" in one_line(e) and "give the ID" in str(e.value)
    with pytest.raises(OrchestrationError) as e:
        client.service(12345)
    assert "HTTP 404" in one_line(e)


@pytest.mark.parametrize("body", [b"x" * (oneflow.MAX_BYTES + 1), b"not json", b"[" * 100000 + b"]" * 100000,
                                  b'{"DOCUMENT": "\\u0000\\n"}'])
def test_huge_or_broken_answers_are_refused(flow, body):
    flow.answers["/service/5"] = (200, body)
    with pytest.raises(OrchestrationError) as e:
        oneflow.OneFlow(flow.url, SESSION).service(5)
    one_line(e)


def test_an_error_page_is_cut_to_one_short_line(flow):
    flow.answers["/service/5"] = (500, b"boom\n" * 10000)
    with pytest.raises(OrchestrationError) as e:
        oneflow.OneFlow(flow.url, SESSION).service(5)
    assert "HTTP 500 boom boom" in one_line(e)


def test_an_unreachable_oneflow_says_where_to_point():
    with pytest.raises(OrchestrationError) as e:
        oneflow.OneFlow("http://127.0.0.1:9", SESSION, timeout=5).service(1)
    assert "cannot be reached" in one_line(e) and "ONEFLOW_URL" in str(e.value)


# -- the VMs from oned -------------------------------------------------------------

def running_ib_vm(xml, history_from, ib_state="ACTIVE", edit=None):
    """A recorded on-hold IB VM as oned shows it once RUNNING on a host: the
    state, the HISTORY of a recorded running VM, IB_STATE as the guest reports."""
    root = ET.fromstring(xml)
    root.find("STATE").text, root.find("LCM_STATE").text = "3", "3"
    old = root.find("HISTORY_RECORDS")
    root.remove(old)
    root.append(ET.fromstring(history_from).find("HISTORY_RECORDS"))
    if ib_state:
        ET.SubElement(root.find("USER_TEMPLATE"), "IB_STATE").text = ib_state
    if edit:
        edit(root)
    return ET.tostring(root, encoding="unicode")


class FakeOne:
    """pyone's OneServer for one.vm.info only, answering from XML texts
    through pyone's own parser."""

    def __init__(self, xmls):
        self.xmls = dict(xmls)
        self.vm = self
        self.calls = []

    def info(self, vmid):
        self.calls.append(vmid)
        return pyone.bindings.parseString(self.xmls[int(vmid)].encode())

    def server_retry_interval(self):
        return 0.01


class FixedFlow:
    """A OneFlow client giving fixed documents (the HTTP side is tested above)."""

    def __init__(self, *docs):
        self.docs = list(docs)

    def service_id(self, ref):
        return int(self.docs[0]["DOCUMENT"]["ID"])

    def service(self, sid):
        doc = self.docs.pop(0) if len(self.docs) > 1 else self.docs[0]
        return oneflow.parse_service(doc, want_id=sid)


def ib_running_doc():
    doc = copy.deepcopy(IB)
    doc["DOCUMENT"]["TEMPLATE"]["BODY"]["state"] = 2
    return doc


def ib_cluster(edits=None, ib_state="ACTIVE"):
    """The recorded IB service, RUNNING, and its VMs RUNNING on the recorded hosts."""
    histories = list(RUNNING_VMS.values())
    edits = edits or {}
    xmls = {vm: running_ib_vm(x, histories[i % len(histories)], ib_state, edits.get(vm))
            for i, (vm, x) in enumerate(sorted(IB_VMS.items()))}
    return FakeOne(xmls), FixedFlow(ib_running_doc())


def expected_lines(one, ids):
    """`<IB address> slots=<VCPU>` read straight from the XML (the NIC whose BRIDGE is ib-sriov)."""
    lines = []
    for vm in ids:
        root = ET.fromstring(one.xmls[vm])
        nic = [n for n in root.findall("TEMPLATE/NIC") if n.findtext("BRIDGE").startswith("ib-sriov")][0]
        lines.append(f"{nic.findtext('IP')} slots={root.findtext('TEMPLATE/VCPU') or 1}")
    return lines


def test_a_running_ib_service_gives_hosts_addresses_and_a_vcpu_hostfile_head_first():
    one, flow = ib_cluster()
    svc = oneflow.parse_service(IB)
    target = ServiceTarget(one, flow, "ib", poll=0.01, timeout=5)
    vms = target.wait_ready()
    order = svc.roles["head"] + svc.roles["worker"]
    assert [vm.id for vm in vms] == order and [vm.role for vm in vms] == ["head", "worker", "worker"]
    hosts = {ET.fromstring(x).findtext("HISTORY_RECORDS/HISTORY[last()]/HOSTNAME") for x in RUNNING_VMS.values()}
    assert {vm.host for vm in vms} <= hosts and target.hosts == list(dict.fromkeys(vm.host for vm in vms))
    assert hostfile(vms).splitlines() == expected_lines(one, order)
    assert all(line.startswith("10.") for line in hostfile(vms).splitlines())   # not the management NIC
    assert target.service.describe(target.hosts).startswith(f"service {svc.id} 'ib-mpi-cluster-spread'")
    # one role only
    vms = ServiceTarget(one, flow, "ib", roles=["worker"], poll=0.01, timeout=5).wait_ready()
    assert [vm.id for vm in vms] == svc.roles["worker"]


def test_it_waits_for_the_service_and_the_ib_ports():
    one, _ = ib_cluster(ib_state=None)
    deploying = copy.deepcopy(IB)
    deploying["DOCUMENT"]["TEMPLATE"]["BODY"]["state"] = 1
    flow = FixedFlow(deploying, deploying, ib_running_doc())
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(one, flow, "ib", poll=0.01, timeout=0.3).wait_ready()
    assert "timed out" in one_line(e) and "IB_STATE=ACTIVE" in str(e.value)
    assert len(ServiceTarget(one, flow, "ib", poll=0.01, timeout=5, ib_attr=None).wait_ready()) == 3


@pytest.mark.parametrize("state", [3, 5, 7, 9, 13])
def test_a_service_that_will_not_run_fails_at_once(state):
    one, _ = ib_cluster()
    doc = copy.deepcopy(IB)
    doc["DOCUMENT"]["TEMPLATE"]["BODY"]["state"] = state
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(one, FixedFlow(doc), "ib", poll=0.01, timeout=60).wait_ready()
    assert f"is {oneflow.STATES[state]}" in one_line(e) and one.calls == []


def test_an_unknown_role_is_named():
    one, flow = ib_cluster()
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(one, flow, "ib", roles=["workers"], poll=0.01).wait_ready()
    assert "no role 'workers'" in one_line(e) and "head, worker" in str(e.value)


def _set(path, value):
    def edit(root):
        el = root.find(path)
        if el is None:
            el = ET.SubElement(root.find(path.rsplit("/", 1)[0]), path.rsplit("/", 1)[1])
        el.text = value
    return edit


def _ib_ip(value):
    def edit(root):
        for nic in root.findall("TEMPLATE/NIC"):
            if nic.findtext("BRIDGE").startswith("ib-sriov"):
                nic.find("IP").text = value
    return edit


@pytest.mark.parametrize("edit,message", [
    (_ib_ip("10.0.0.1; rm -rf /"), "no NIC with a usable address"),
    (_ib_ip("10.0.0.1 slots=99\n10.6.6.6"), "no NIC with a usable address"),
    (_ib_ip("224.0.0.1"), "no NIC with a usable address"),
    (_ib_ip("127.0.0.1"), "no NIC with a usable address"),
    (_ib_ip("0.0.0.0"), "no NIC with a usable address"),
    (_ib_ip("256.1.1.1"), "no NIC with a usable address"),
    # a scope id: ipaddress takes any text after '%', a newline and a second host too
    (_ib_ip("fd00::1%x\n10.6.6.6 slots=999"), "no NIC with a usable address"),
    (_ib_ip("fd00::1%ib0"), "no NIC with a usable address"),
    (_ib_ip("10.0.0.1\n"), "no NIC with a usable address"),
    (_set("TEMPLATE/VCPU", "0"), "not a slot count"),
    (_set("TEMPLATE/VCPU", "99999"), "not a slot count"),
    (_set("TEMPLATE/VCPU", "2; x"), "not a slot count"),
    (_set("TEMPLATE/VCPU", "\u00b2"), "not a slot count"),
    (_set("HISTORY_RECORDS/HISTORY/HOSTNAME", "host1; reboot"), "not a host name"),
    (_set("HISTORY_RECORDS/HISTORY/HOSTNAME", "-oProxyCommand=x"), "not a host name"),
    (_set("USER_TEMPLATE/SERVICE_ID", "12345"), "is not a VM of service"),
    (_set("LCM_STATE", "36"), "BOOT_FAILURE"),
    (_set("STATE", "8"), "POWEROFF"),
])
def test_a_hostile_or_failed_vm_is_refused_in_one_line(edit, message):
    worker = oneflow.parse_service(IB).roles["worker"][1]
    one, flow = ib_cluster({worker: edit})
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(one, flow, "ib", poll=0.01, timeout=5).wait_ready()
    assert message in one_line(e) and f"VM {worker}" in str(e.value)


def _outage(seconds, ended="1795458819"):
    def edit(root):
        for name, value in (("IB_OUTAGE_SECONDS", seconds), ("IB_OUTAGE_ENDED", ended)):
            if value is not None:
                ET.SubElement(root.find("USER_TEMPLATE"), name).text = value
    return edit


def test_the_outage_a_guest_reported_comes_with_its_vm():
    """A migrated VM's guest put IB_OUTAGE_SECONDS/_ENDED into its USER_TEMPLATE
    (contextualization's hot-plug handler, through OneGate); the others did not."""
    worker = oneflow.parse_service(IB).roles["worker"][0]
    one, flow = ib_cluster({worker: _outage("5.75")})
    vms = {vm.id: vm for vm in ServiceTarget(one, flow, "ib", poll=0.01, timeout=5).wait_ready()}
    assert (vms[worker].ib_outage_seconds, vms[worker].ib_outage_ended) == (5.75, 1795458819)
    assert outage_text(vms[worker]) == ("IB outage 5.75 s as its guest timed it (VF removed until ACTIVE again), "
                                        "ended 2026-11-23 18:33:39 UTC")
    assert all(vm.ib_outage_seconds is None and vm.ib_outage_ended is None for k, vm in vms.items() if k != worker)


@pytest.mark.parametrize("seconds,ended,taken", [
    ("5.75", None, (5.75, None)),
    ("12", "x", (12.0, None)),
    ("5.75", "1795458819\n1", (5.75, None)),
    ("5.75", "-1", (5.75, None)),
    ("5.75", "123456789012", (5.75, None)),
    ("5.75\nVM 9: IB outage 0.01 s", "1", None),
    ("-1", "1", None),
    ("1e9", "1", None),
    ("nan", "1", None),
    ("inf", "1", None),
    ("5.75 s", "1", None),
    ("12345678", "1", None),
    ("5.7512", "1", None),
    ("", "1", None),
    (None, "1", None),
])
def test_a_reported_outage_that_is_not_a_plain_figure_is_left_out(seconds, ended, taken):
    worker = oneflow.parse_service(IB).roles["worker"][0]
    one, flow = ib_cluster({worker: _outage(seconds, ended)})
    vm = [vm for vm in ServiceTarget(one, flow, "ib", poll=0.01, timeout=5).wait_ready() if vm.id == worker][0]
    assert (vm.ib_outage_seconds, vm.ib_outage_ended) == (taken or (None, None))


def test_an_outage_given_as_a_vector_is_left_out():
    assert guest_outage({"IB_OUTAGE_SECONDS": {"A": "1"}, "IB_OUTAGE_ENDED": "1"}) is None
    assert guest_outage({"IB_OUTAGE_SECONDS": ["1", "2"]}) is None
    assert guest_outage(None) is None and guest_outage({}) is None


def test_two_vms_with_one_address_are_refused():
    svc = oneflow.parse_service(IB)
    head_ip = expected_lines(ib_cluster()[0], svc.roles["head"])[0].split()[0]
    one, flow = ib_cluster({svc.roles["worker"][0]: _ib_ip(head_ip)})
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(one, flow, "ib", poll=0.01, timeout=5).wait_ready()
    assert "same IB address" in one_line(e)


def test_the_recorded_running_vms_have_no_ib_nic_and_are_refused():
    doc = copy.deepcopy(RUNNING)
    with pytest.raises(OrchestrationError) as e:
        ServiceTarget(FakeOne(RUNNING_VMS), FixedFlow(doc), "two-roles", poll=0.01, ib_attr=None).wait_ready()
    assert "no NIC with a usable address on an ib-sriov network" in one_line(e)


# -- the command -------------------------------------------------------------------

def bench(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kvm_sriov_bench", "opennebula", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_cli_service_end_to_end_leaves_the_service_running(tmp_path, mpi_env):
    """Three VMs of a service (stand-in oned, VCPU 2) found through a OneFlow
    stand-in serving the recorded document with their IDs, the ping-pong run
    locally, the hostfile with VCPU slots, the service named in runs.jsonl and
    the report, no VM terminated."""
    template = ('NAME = "node"\nCPU = "1"\nVCPU = "2"\nMEMORY = "512"\n'
                'NIC = [ NETWORK = "mgmt", BRIDGE = "br0" ]\n'
                'NIC = [ NETWORK = "ib-7", BRIDGE = "ib-sriov", VLAN_ID = "0x8002" ]\n')
    doc = ib_running_doc()
    sid = int(doc["DOCUMENT"]["ID"])
    with StandinOned(hosts=["node1", "node2"], templates={0: template}) as oned:
        import pyone as p
        one = p.OneServer(oned.endpoint, session=SESSION)
        ids = []
        for role in doc["DOCUMENT"]["TEMPLATE"]["BODY"]["roles"]:
            for node in role["nodes"]:
                vm = one.template.instantiate(0, f"{role['name']}_{len(ids)}", True,
                                              f'SERVICE_ID = "{sid}"\nROLE_NAME = "{role["name"]}"', False)
                one.vm.deploy(vm, len(ids) % 2, False, -1)
                node["deploy_id"] = vm
                ids.append(vm)
        # the head's guest timed an outage after a migration and reported it (OneGate)
        oned.vms[ids[0]].user_template += [("IB_OUTAGE_SECONDS", "2.31"), ("IB_OUTAGE_ENDED", "1795458819")]
        flow = FlowStandin([doc])
        try:
            out = tmp_path / "res"
            r = bench("--endpoint", oned.endpoint, "--session", SESSION, "--oneflow", flow.url,
                      "--service", doc["DOCUMENT"]["NAME"], "--pingpong", "--max-size", "8",
                      "--iterations", "20", "--warmup", "2", "--trials", "1", "--launch-locally",
                      "--oversubscribe", "--bind", "none", "--no-progress", "--out", str(out))
        finally:
            flow.close()
        assert r.returncode == 0, r.stderr
        assert "vm.action" not in oned.calls and "vm.recover" not in oned.calls
        assert all(v.state == 3 for v in oned.vms.values())
    lines = (out / "hostfiles" / "vm-h2-v2.txt").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["slots=2"] * 3
    ib = [[n["IP"] for k, n in oned.vms[v].template if k == "NIC" and n["BRIDGE"] == "ib-sriov"][0] for v in ids]
    assert [line.split()[0] for line in lines] == ib
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert run["service"]["id"] == sid and run["service"]["hosts"] == ["node1", "node2"]
    assert [vm["id"] for vm in run["service"]["vms"]] == ids and run["hosts"] == 2
    assert run["target"].startswith(f"service {sid} 'ib-mpi-cluster-spread'")
    assert f"service {sid}" in r.stdout and "left running" in r.stdout
    assert (f"   VM {ids[0]} (head on node1): IB outage 2.31 s as its guest timed it (VF removed until ACTIVE "
            "again), ended 2026-11-23 18:33:39 UTC\n") in r.stdout
    assert r.stdout.count("IB outage") == 1
    assert run["service"]["vms"][0]["ib_outage_seconds"] == 2.31
    assert run["service"]["vms"][0]["ib_outage_ended"] == 1795458819
    assert "ib_outage_seconds" not in run["service"]["vms"][1]
    from kvm_sriov_bench import report
    head, rows = report._meta_table([run])
    assert f"service {sid}" in rows[0][head.index("config")]


@pytest.mark.parametrize("args,message", [
    (["--service", "x", "--hosts", "n1"], "no --hosts"),
    (["--service", "x", "--template", "0"], "give --template"),
    ([], "give --template"),
    (["--template", "0", "--role", "head"], "--role is for --service"),
    (["--service", "x", "--oneflow", "http://u:p@h:2474"], "not http(s)://host"),
])
def test_cli_refuses_mixed_targets_in_one_line(args, message, tmp_path):
    r = bench("--session", SESSION, "--endpoint", "http://127.0.0.1:9/RPC2", "--pingpong",
              "--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_without_pyone_the_command_says_what_to_install(tmp_path):
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import pyone"], capture_output=True).returncode == 0:
        pytest.skip("this machine's Debian python has pyone")
    r = subprocess.run([python, "-m", "kvm_sriov_bench", "opennebula", "--session", SESSION,
                        "--service", "7", "--pingpong", "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install pyone" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
