"""Fresh counts: a pool change ends with SIGUSR1 to the host's monitord client
(and only to it); nothing else does, and nothing here can fail an action.
The real client, monitord and oned: rung 4 (bench/sched_refresh_bench.py)."""

import os
import subprocess
import sys
import time

import pytest

from kvm_sriov.node import monitor
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import LiveState
from kvm_sriov.vf.policy import VfRequest
from tests.support.monitord_stand_in import CLIENT




def _start_client(tmp_path, monkeypatch, *extra, env=None):
    seen = tmp_path / "probes-run"
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(seen), "monitord-client.rb", *extra],
                            env=env)
    # the child is ready once it has exec'd (until then its command line is the parent's, or empty during exec)
    while not seen.exists() or (extra and not any(b"time.sleep(60)" in _cmdline(c) for c in _children(proc.pid))):
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


def _cmdline(pid) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


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



# -- whether a system run is going on (the bench waits for the start-up runs) ----------
def test_a_system_probe_child_means_a_run_in_progress(tmp_path, monkeypatch):
    runs = _start_client(tmp_path, monkeypatch, "/var/tmp/one/im/kvm-probes.d/host/system/linux_host.rb")
    try:
        assert monitor.system_probes_running(runs.proc.pid) is True
    finally:
        _stop(runs)


def test_no_child_no_run(client):
    assert monitor.system_probes_running(client.proc.pid) is False


def test_with_the_hosts_config_it_still_signals(client, fake_host, make_config):
    # a SYSTEM_HOST message of our own would empty the host's DS and PCI in oned
    cfg = make_config(fake_host["root"])
    assert monitor.refresh(config=cfg) == monitor.SIGNALLED
    assert client(1) == 1
