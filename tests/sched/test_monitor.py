"""Fresh counts: a pool change ends with our probe's attributes pushed to
monitord (one SYSTEM_HOST datagram in the monitord client's format) or, when
that is not safe, with SIGUSR1 to the host's monitord client (and only to
it); nothing else does, and nothing here can fail an action. The real
monitord and oned take these on rung 4 (bench/sched_refresh_bench.py)."""

import base64
import os
import socket
import subprocess
import sys
import time
import zlib

import pytest

from kvm_sriov import monitor, probe
from kvm_sriov.host import Host
from kvm_sriov.hypervisor import LiveState
from kvm_sriov.policy import VfRequest

# A stand-in for monitord-client.rb with the same contract: its command line
# names monitord-client, SIGUSR1 makes it "run the probes" (here: count).
CLIENT = """
import signal, sys, time
count = 0
def probe(*_):
    global count
    count += 1
    open(sys.argv[1], "w").write(str(count))
signal.signal(signal.SIGUSR1, probe)
if len(sys.argv) > 3:   # busy: one of its system probes is running
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[3]])
open(sys.argv[1], "w").write("0")
while True:
    time.sleep(0.05)
"""


def _start_client(tmp_path, monkeypatch, *extra, env=None):
    seen = tmp_path / "probes-run"
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(seen), "monitord-client.rb", *extra],
                            env=env)
    while not seen.exists() or (extra and not _children(proc.pid)):
        time.sleep(0.01)
    pid_file = tmp_path / ".monitor_client.pid"
    pid_file.write_text(str(proc.pid))
    monkeypatch.setenv(monitor.ENV_PID_FILE, str(pid_file))

    def runs(expected=None):
        deadline = time.time() + 5
        while True:
            n = int(seen.read_text() or 0)
            if expected is None or n == expected or time.time() > deadline:
                return n
            time.sleep(0.02)
    runs.proc, runs.pid_file = proc, pid_file
    return runs


def _children(pid):
    return [c for t in os.listdir(f"/proc/{pid}/task") for c in open(f"/proc/{pid}/task/{t}/children").read().split()]


def _stop(runs):
    for child in _children(runs.proc.pid):
        os.kill(int(child), 9)
    runs.proc.kill()
    runs.proc.wait()


@pytest.fixture
def client(tmp_path, monkeypatch):
    runs = _start_client(tmp_path, monkeypatch)
    yield runs
    _stop(runs)


class _NoDomains:
    def live_state(self):
        return LiveState({}, {})

    def close(self):
        pass


def test_pool_change_signals_the_client(client, fake_host, make_config):
    host = Host(make_config(fake_host["root"]), hypervisor=_NoDomains())
    host.reserve(7, "one-7", [VfRequest("02:00:00:00:00:07")], "deploy")
    host.close()
    assert client(1) == 1
    host = Host(make_config(fake_host["root"]), hypervisor=_NoDomains())
    host.release_vm(7)
    host.close()
    assert client(2) == 2


def test_no_pool_change_no_signal(client, fake_host, make_config):
    host = Host(make_config(fake_host["root"]), hypervisor=_NoDomains())
    host.assignments()
    host.release_vm(99)            # nothing held: nothing changed
    host.close()
    time.sleep(0.3)
    assert client() == 0


def test_rolled_back_change_no_signal(client, fake_host, make_config):
    host = Host(make_config(fake_host["root"]), hypervisor=_NoDomains())
    with pytest.raises(RuntimeError):
        with host.pool.transaction() as txn:
            txn.add("0000:03:00.1", "0000:03:00.0", 5, "one-5", "", "reserved", "deploy")
            raise RuntimeError("the action failed")
    host.close()
    time.sleep(0.3)
    assert client() == 0


@pytest.mark.parametrize("content", ["", "garbage", "-1", "1", "999999999"])
def test_bad_pid_files_are_ignored(tmp_path, content):
    pid_file = tmp_path / "pid"
    pid_file.write_text(content)
    assert monitor.refresh(str(pid_file)) is None
    assert monitor.refresh(str(tmp_path / "missing")) is None


def test_a_process_that_is_not_the_client_is_never_signalled(tmp_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        pid_file = tmp_path / "pid"
        pid_file.write_text(str(other.pid))
        assert monitor.refresh(str(pid_file)) is None
        time.sleep(0.1)
        assert other.poll() is None          # SIGUSR1 would have killed sleep
    finally:
        other.kill()
        other.wait()



# -- the push: our attributes straight to monitord ------------------------------------
@pytest.fixture
def monitord():
    """A UDP socket where monitord would listen (the real one: rung 4)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.5)
        yield s


def _client_config(pid_file, port, address="127.0.0.1", pubkey=""):
    # what monitord-client.rb writes next to its pid file (DB_PATH/config), trimmed
    (pid_file.parent / "config").write_text(
        f"<MONITOR_CONFIGURATION><HOST_ID>7</HOST_ID><NETWORK><MONITOR_ADDRESS>{address}</MONITOR_ADDRESS>"
        f"<PORT>{port}</PORT><PUBKEY>{pubkey}</PUBKEY></NETWORK></MONITOR_CONFIGURATION>")


def _received(sock):
    try:
        data = sock.recv(65536).decode()
    except socket.timeout:
        return None
    kind, status, host, ts, payload = data.split(" ")
    assert (kind, status, host) == ("SYSTEM_HOST", "SUCCESS", "7")
    assert abs(int(ts) - time.time()) < 5
    return zlib.decompress(base64.b64decode(payload)).decode()


def _changed_pool(fake_host, make_config):
    host = Host(make_config(fake_host["root"]), hypervisor=_NoDomains())
    host.reserve(7, "one-7", [VfRequest("02:00:00:00:00:07")], "deploy")
    host.pool.close()
    return host.config


def test_pool_change_pushes_our_attributes_to_monitord(client, monitord, fake_host, make_config):
    _client_config(client.pid_file, monitord.getsockname()[1])
    cfg = _changed_pool(fake_host, make_config)
    assert monitor.refresh(config=cfg) == monitor.PUSHED
    text = _received(monitord)
    expected = __import__("io").StringIO()
    probe.report(cfg, expected)
    assert text == expected.getvalue()
    total = int(next(v for v in text.splitlines() if v.startswith("KVM_SRIOV_TOTAL_VFS")).split("=")[1])
    assert f"KVM_SRIOV_FREE_VFS = {total - 1}" in text.splitlines()
    assert 'KVM_SRIOV_VMS = "7"' in text
    time.sleep(0.2)
    assert client() == 0              # no rerun of every system probe


def test_monitor_address_auto_is_where_the_client_was_started_from(tmp_path, monkeypatch, monitord,
                                                                    fake_host, make_config):
    runs = _start_client(tmp_path, monkeypatch, env=dict(os.environ, SSH_CLIENT="127.0.0.1 50000 22"))
    try:
        _client_config(runs.pid_file, monitord.getsockname()[1], address="auto")
        assert monitor.refresh(config=_changed_pool(fake_host, make_config)) == monitor.PUSHED
        assert "KVM_SRIOV_FREE_VFS" in _received(monitord)
        assert runs() == 0
    finally:
        _stop(runs)


def test_system_probes_running_means_signal_not_push(tmp_path, monkeypatch, monitord, fake_host, make_config):
    # that run may have read our probe before the change: it must run again
    runs = _start_client(tmp_path, monkeypatch, "/var/tmp/one/im/kvm-probes.d/host/system/linux_host.rb")
    try:
        _client_config(runs.pid_file, monitord.getsockname()[1])
        assert monitor.refresh(config=_changed_pool(fake_host, make_config)) == monitor.SIGNALLED
        assert _received(monitord) is None
        assert runs(1) == 1
    finally:
        _stop(runs)


@pytest.mark.parametrize("why", ["encrypted", "no config", "bad port"])
def test_no_push_possible_means_signal(client, monitord, fake_host, make_config, why):
    if why == "encrypted":
        _client_config(client.pid_file, monitord.getsockname()[1], pubkey="-----BEGIN RSA PUBLIC KEY----- x")
    elif why == "bad port":
        _client_config(client.pid_file, "nope")
    assert monitor.refresh(config=_changed_pool(fake_host, make_config)) == monitor.SIGNALLED
    assert _received(monitord) is None
    assert client(1) == 1


def test_pushes_of_a_burst_arrive_in_order_and_spaced(client, monitord, fake_host, make_config):
    _client_config(client.pid_file, monitord.getsockname()[1])
    cfg = _changed_pool(fake_host, make_config)
    host = Host(cfg, hypervisor=_NoDomains())
    sent = []
    for vm in (8, 9):
        host.reserve(vm, f"one-{vm}", [VfRequest(f"02:00:00:00:00:0{vm}")], "deploy")
        host.pool.close()
        monitor.refresh(config=cfg)
        sent.append(time.monotonic())
    first, second = _received(monitord), _received(monitord)
    assert 'KVM_SRIOV_VMS = "7 8"' in first and 'KVM_SRIOV_VMS = "7 8 9"' in second
    assert sent[1] - sent[0] >= monitor.PUSH_GAP * 0.9
    assert client() == 0
