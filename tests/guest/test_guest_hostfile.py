"""The MPI hostfile of a OneFlow service (contextualization/hostfile): what
kvm-sriov-hostfile makes of OneGate's answer, recorded from the real 7.4
OneGate of rung 4 (fixtures/onegate-service-extended.json: a service of a
head and two workers, each with a management NIC and an IB NIC, on hold), and
what it does with hostile answers, paths and settings; the one-context hook
run for real against a local OneGate stand-in, refreshed when the service
scales."""
import contextlib
import copy
import http.server
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from guest_helpers import CTX

TOOL = CTX / "hostfile" / "kvm-sriov-hostfile"
FIXTURE = json.loads((CTX.parent / "tests" / "guest" / "fixtures" / "onegate-service-extended.json").read_text())
TOKEN = "xD6HKnnhQteNWMRIqfJtfw=="


def load_tool():
    loader = importlib.machinery.SourceFileLoader("kvm_sriov_hostfile", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


hf = load_tool()


def vms(doc):
    return [n["vm_info"]["VM"] for r in doc["SERVICE"]["roles"] for n in r["nodes"]]


def running(doc, ids=None):
    doc = copy.deepcopy(doc)
    for vm in vms(doc):
        if ids is None or vm["ID"] in ids:
            vm["STATE"], vm["LCM_STATE"] = "3", "3"
    return doc


def test_the_recorded_answer_gives_the_ib_addresses_and_vcpu_slots_head_first():
    lines, warnings = hf.hostfile_lines(running(FIXTURE))
    assert lines == ["10.100.0.10 slots=1", "10.100.0.11 slots=4", "10.100.0.12 slots=4"]
    assert warnings == []
    # the management NIC when the context names its network
    lines, _ = hf.hostfile_lines(running(FIXTURE), network="mgmt")
    assert lines == ["192.168.50.10 slots=1", "192.168.50.11 slots=4", "192.168.50.12 slots=4"]


def test_only_running_vms_are_listed():
    assert hf.hostfile_lines(FIXTURE) == ([], [])  # recorded on hold
    lines, _ = hf.hostfile_lines(running(FIXTURE, ids={"4"}))
    assert lines == ["10.100.0.11 slots=4"]
    assert len(hf.hostfile_lines(FIXTURE, states="any")[0]) == 3


def test_a_single_nic_as_onegate_gives_it_an_object_not_a_list():
    doc = running(FIXTURE)
    for vm in vms(doc):
        vm["TEMPLATE"]["NIC"] = vm["TEMPLATE"]["NIC"][1]
    assert len(hf.hostfile_lines(doc)[0]) == 3


BAD_ADDRESSES = ["10.0.0.1; rm -rf /", "10.0.0.1 slots=99\n10.6.6.6", "256.1.1.1", "224.0.0.1", "0.0.0.0",
                 "127.0.0.1", "", None, 42, ["10.0.0.1"],
                 # a scope id: ipaddress takes any text after '%', newlines included
                 "fd00::1%x\n10.6.6.6 slots=999", "fd00::1%ib0", "fd00::1%", "fe80::1%ib0",
                 "10.0.0.1\n", " 10.0.0.1", "10.0.0.1\x00", "fd00::1\r", "fd00::1 fd00::2"]


@pytest.mark.parametrize("ip", BAD_ADDRESSES, ids=map(repr, BAD_ADDRESSES))
def test_a_bad_address_leaves_the_vm_out(ip):
    doc = running(FIXTURE)
    vms(doc)[1]["TEMPLATE"]["NIC"][1]["IP"] = ip
    lines, warnings = hf.hostfile_lines(doc)
    assert lines == ["10.100.0.10 slots=1", "10.100.0.12 slots=4"]
    assert any("VM 4" in w for w in warnings)


@pytest.mark.parametrize("field", ["IP6_GLOBAL", "IP6"])
def test_an_ipv6_address_is_one_host_on_one_line(field):
    doc = running(FIXTURE)
    nic = vms(doc)[1]["TEMPLATE"]["NIC"][1]
    del nic["IP"]
    nic[field] = "FD00:0:0::11"
    assert hf.hostfile_lines(doc)[0][1] == "fd00::11 slots=4"
    nic[field] = "fd00::11%x\n10.6.6.6 slots=999"
    lines, warnings = hf.hostfile_lines(doc)
    assert lines == ["10.100.0.10 slots=1", "10.100.0.12 slots=4"] and any("VM 4" in w for w in warnings)


@pytest.mark.parametrize("template", ["x", ["x"], 7])
def test_a_template_that_is_not_an_object_leaves_the_vm_out(template):
    doc = running(FIXTURE)
    vms(doc)[1]["TEMPLATE"] = template
    lines, warnings = hf.hostfile_lines(doc)
    assert lines == ["10.100.0.10 slots=1", "10.100.0.12 slots=4"] and any("VM 4" in w for w in warnings)


@pytest.mark.parametrize("vcpu", ["0", "-1", "99999", "4 slots=100", "4\n10.6.6.6", "x", 4.5])
def test_a_bad_vcpu_leaves_the_vm_out(vcpu):
    doc = running(FIXTURE)
    vms(doc)[2]["TEMPLATE"]["VCPU"] = vcpu
    lines, _ = hf.hostfile_lines(doc)
    assert lines == ["10.100.0.10 slots=1", "10.100.0.11 slots=4"]


def test_a_second_vm_claiming_the_same_address_is_left_out():
    doc = running(FIXTURE)
    vms(doc)[2]["TEMPLATE"]["NIC"][1]["IP"] = "10.100.0.11"
    lines, warnings = hf.hostfile_lines(doc)
    assert lines == ["10.100.0.10 slots=1", "10.100.0.11 slots=4"] and len(warnings) == 1


@pytest.mark.parametrize("doc", [[], {"SERVICE": []}, {"SERVICE": {"roles": "x"}}, "SERVICE", None])
def test_an_answer_of_the_wrong_shape_is_refused(doc):
    with pytest.raises(hf.Refused):
        hf.hostfile_lines(doc)


def test_too_many_nodes_is_refused():
    node = FIXTURE["SERVICE"]["roles"][1]["nodes"][0]
    doc = {"SERVICE": {"roles": [{"name": "worker", "nodes": [node] * (hf.MAX_NODES + 1)}]}}
    with pytest.raises(hf.Refused, match="more than"):
        hf.hostfile_lines(doc)


@pytest.mark.parametrize("env, error", [
    ({"ONEGATE_ENDPOINT": "http://u:p@10.0.0.1:5030", "VMID": "3", "TOKENTXT": TOKEN}, "ONEGATE_ENDPOINT"),
    ({"ONEGATE_ENDPOINT": "file:///etc/shadow", "VMID": "3", "TOKENTXT": TOKEN}, "ONEGATE_ENDPOINT"),
    ({"ONEGATE_ENDPOINT": "http://10.0.0.1:5030", "VMID": "3; reboot", "TOKENTXT": TOKEN}, "VMID"),
    ({"ONEGATE_ENDPOINT": "http://10.0.0.1:5030", "VMID": "3", "TOKENTXT": "a\r\nX-Evil: 1"}, "token"),
    ({"ONEGATE_ENDPOINT": "http://10.0.0.1:5030", "VMID": "3"}, "token"),
])
def test_bad_settings_are_refused(tmp_path, env, error):
    with pytest.raises(hf.Refused, match=error):
        hf.settings(env, str(tmp_path / "none"))


def test_settings_come_from_one_env_as_text_never_run(tmp_path):
    marker = tmp_path / "ran"
    one_env = tmp_path / "one_env"
    one_env.write_text(f'export TOKENTXT="{TOKEN}"\nexport VMID="4"\n'
                       'export ONEGATE_ENDPOINT="http://169.254.16.9:5030"\n'
                       f'export OTHER="$(touch {marker})"\n')
    assert hf.settings({}, str(one_env)) == ("http://169.254.16.9:5030", "4", TOKEN)
    one_env.write_text(f'export TOKENTXT="$(touch {marker})"\nexport VMID="4"\n'
                       'export ONEGATE_ENDPOINT="http://169.254.16.9:5030"\n')
    with pytest.raises(hf.Refused):
        hf.settings({}, str(one_env))
    assert not marker.exists()


# --- against a OneGate stand-in on 127.0.0.1 -----------------------------------

class FakeGate:
    """Answers GET /service?extended=true with .doc (or .raw) to the right token."""

    def __init__(self):
        self.doc, self.raw, self.requests, self.delay = running(FIXTURE), None, [], 0.0
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                gate.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                time.sleep(gate.delay)
                if self.headers.get("X-ONEGATE-TOKEN") != TOKEN or self.headers.get("X-ONEGATE-VMID") != "3":
                    body, code = b"Not authorized", 401
                else:
                    body, code = gate.raw if gate.raw is not None else json.dumps(gate.doc).encode(), 200
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.env = {"ONEGATE_ENDPOINT": f"http://127.0.0.1:{self.server.server_port}", "VMID": "3",
                    "TOKENTXT": TOKEN}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gate():
    g = FakeGate()
    yield g
    g.close()


def run_tool(gate, *args, extra=None):
    env = {**os.environ, **gate.env, **(extra or {})}
    return subprocess.run(["/usr/bin/python3", str(TOOL), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_file_is_written_atomically_as_the_onegate_client_asks(gate, tmp_path):
    path = tmp_path / "etc" / "mpi-hostfile"
    r = run_tool(gate, "--once", path)
    assert r.returncode == 0, r.stderr
    assert path.read_text() == "10.100.0.10 slots=1\n10.100.0.11 slots=4\n10.100.0.12 slots=4\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(path.parent) == ["mpi-hostfile"]  # no temporary file left
    request_path, headers = gate.requests[-1]
    assert request_path == "/service?extended=true"
    assert headers["x-onegate-token"] == TOKEN and headers["x-onegate-vmid"] == "3"
    inode = path.stat().st_ino
    assert run_tool(gate, "--once", path).returncode == 0
    assert path.stat().st_ino == inode  # unchanged: not rewritten


def test_a_wrong_token_an_oversized_or_broken_answer_leaves_the_file_as_it_was(gate, tmp_path):
    path = tmp_path / "mpi-hostfile"
    path.write_text("old\n")
    r = run_tool(gate, "--once", path, extra={"TOKENTXT": "AAAAAAAAAAAAAAAAAAAAAA=="})
    assert r.returncode == 1 and "401" in r.stderr
    gate.raw = b"[" * (hf.MAX_BYTES + 10)
    r = run_tool(gate, "--once", path)
    assert r.returncode == 1 and "over" in r.stderr
    gate.raw = b"{not json"
    r = run_tool(gate, "--once", path)
    assert r.returncode == 1 and "not JSON" in r.stderr
    for deep in (100, 100000):   # within and past Python's own recursion limit
        gate.raw = b"[" * deep + b"]" * deep
        r = run_tool(gate, "--once", path)
        assert r.returncode == 1 and "nested more than" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["mpi-hostfile"]


def test_a_slow_onegate_is_waited_for_as_long_as_ib_hostfile_timeout_says(gate, tmp_path):
    """OneGate asks oned for every VM of the service in turn: 4 VMs took 10-20 s
    on a loaded rung-4 front-end, more than the 20 s the tool used to wait."""
    assert hf.DEFAULT_TIMEOUT >= 60
    path = tmp_path / "mpi-hostfile"
    gate.delay = 2.5
    r = run_tool(gate, "--once", path, extra={"IB_HOSTFILE_TIMEOUT": "1"})
    assert r.returncode == 1 and "timed out" in r.stderr and not path.exists()
    r = run_tool(gate, "--once", path, extra={"IB_HOSTFILE_TIMEOUT": "10"})
    assert r.returncode == 0 and path.read_text().count("slots=") == 3, r.stderr
    for bad in ("0", "-1", "abc", "99999", "1e3"):
        r = run_tool(gate, "--once", path, extra={"IB_HOSTFILE_TIMEOUT": bad})
        assert r.returncode == 2 and "IB_HOSTFILE_TIMEOUT" in r.stderr, bad


@pytest.mark.parametrize("given", ["relative/hostfile", "/tmp/../etc/hostfile", "/tmp/a\nb"])
def test_a_bad_path_is_refused(gate, given):
    r = run_tool(gate, "--once", given)
    assert r.returncode == 2 and "ERROR" in r.stderr


def test_a_symlink_or_directory_at_the_path_is_not_replaced(gate, tmp_path):
    target = tmp_path / "target"
    target.write_text("keep\n")
    link = tmp_path / "hostfile"
    link.symlink_to(target)
    r = run_tool(gate, "--once", link)
    assert r.returncode == 2 and "symlink" in r.stderr
    assert target.read_text() == "keep\n" and link.is_symlink()
    r = run_tool(gate, "--once", tmp_path)
    assert r.returncode == 2


def test_the_hook_writes_the_file_and_its_loop_follows_a_scale(gate, tmp_path):
    root = tmp_path / "image"
    subprocess.run([str(CTX / "install.sh"), "--root", str(root), "--hostfile"], check=True, capture_output=True)
    hook = root / "etc/one-context.d/net-95-kvm-sriov-hostfile"
    state = tmp_path / "state"
    path = tmp_path / "mpi-hostfile"
    env = dict(os.environ, **gate.env, IB_HOSTFILE_STATE_DIR=str(state))
    # nothing without IB_HOSTFILE
    assert subprocess.run([str(hook), "network"], env=env, capture_output=True).returncode == 0
    assert not path.exists()
    env.update(IB_HOSTFILE=str(path), IB_HOSTFILE_INTERVAL="5")
    r = subprocess.run([str(hook), "network"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int((state / "hostfile.pid").read_text())
    try:
        assert path.read_text().count("slots=") == 3
        # the service scales up: a fourth VM
        node = copy.deepcopy(gate.doc["SERVICE"]["roles"][1]["nodes"][0])
        node["deploy_id"] = 9
        node["vm_info"]["VM"]["ID"] = "9"
        node["vm_info"]["VM"]["TEMPLATE"]["NIC"][1]["IP"] = "10.100.0.13"
        gate.doc["SERVICE"]["roles"][1]["nodes"].append(node)
        deadline = time.monotonic() + 30
        while "10.100.0.13 slots=4" not in path.read_text():
            assert time.monotonic() < deadline, "the loop did not follow the scale"
            time.sleep(0.5)
        # a second run replaces the loop (one loop per VM)
        r = subprocess.run([str(hook), "network"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0
        new = int((state / "hostfile.pid").read_text())
        assert new != pid
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline, "the old loop still runs"
            time.sleep(0.2)
        pid = new
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
