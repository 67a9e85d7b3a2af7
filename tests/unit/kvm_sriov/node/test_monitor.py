"""Rate limit of the SIGUSR1 that tells the monitord client to rerun the
system probes (kvm_sriov/node/monitor.py): the client queues one full run per
signal, so a loop of pool changes must not send one each; the last change
is still reported by a trailing signal."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from kvm_sriov.node import monitor
from tests.support.monitord_stand_in import CLIENT


INTERVAL = 1.0


class Client:
    def __init__(self, tmp_path, *extra):
        self.seen = tmp_path / "runs"
        self.proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(self.seen), "monitord-client.rb", *extra])
        deadline = time.monotonic() + 10
        while not self.seen.exists() or self.seen.read_text() == "" or (extra and not self.children()):
            assert time.monotonic() < deadline, "the stand-in client did not start"
            time.sleep(0.01)
        self.pid_file = tmp_path / ".monitor_client.pid"
        self.pid_file.write_text(str(self.proc.pid))
        self.config = SimpleNamespace(state_dir=tmp_path / "state")
        self.config.state_dir.mkdir()

    def children(self):
        return [int(c) for t in os.listdir(f"/proc/{self.proc.pid}/task")
                for c in open(f"/proc/{self.proc.pid}/task/{t}/children").read().split()]

    def runs(self, settle: float = 0.2, until: int = 0) -> int:
        """The signals counted so far (after `until` of them have come: a
        signal from another process arrives when that process gets the CPU)."""
        time.sleep(settle)
        deadline = time.monotonic() + 30
        while int(self.seen.read_text() or 0) < until and time.monotonic() < deadline:
            time.sleep(0.05)
        return int(self.seen.read_text() or 0)

    def change(self):
        return monitor.refresh(str(self.pid_file), config=self.config)

    def stop(self):
        for child in self.children():
            os.kill(child, 9)
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "MIN_INTERVAL", INTERVAL, raising=False)
    c = Client(tmp_path)
    yield c
    c.stop()


def test_a_loop_of_changes_sends_one_signal_then_one_trailing(client, monkeypatch):
    with monkeypatch.context() as m:   # a change never waits for the rate limit in its caller
        m.setattr(monitor, "time", SimpleNamespace(time=time.time, sleep=lambda s: pytest.fail(f"slept {s} s")))
        ways = [client.change() for _ in range(20)]
    assert ways[0] == monitor.SIGNALLED and set(ways[1:]) == {monitor.DEFERRED}
    assert client.runs() == 1
    assert client.runs(until=2) == 2   # the last change is reported
    time.sleep(INTERVAL)
    assert client.runs(0) == 2         # and nothing more


def test_a_change_after_the_interval_goes_out_at_once(client):
    assert client.change() == monitor.SIGNALLED
    time.sleep(INTERVAL + 0.1)
    assert client.change() == monitor.SIGNALLED
    assert client.runs() == 2


def test_the_trailing_signal_waits_for_the_run_in_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "MIN_INTERVAL", INTERVAL, raising=False)
    busy = Client(tmp_path, "/var/tmp/one/im/kvm-probes.d/host/system/linux_host.rb")
    try:
        assert busy.change() == monitor.SIGNALLED
        assert busy.change() == monitor.DEFERRED
        time.sleep(INTERVAL + 0.5)
        assert busy.runs() == 1            # a signal now would only queue behind the run
        for child in busy.children():
            os.kill(child, 9)
        assert busy.runs(until=2) == 2
    finally:
        busy.stop()


def test_without_a_state_directory_it_still_signals(client):
    client.config.state_dir = client.config.state_dir / "missing"
    assert [client.change() for _ in range(2)] == [monitor.SIGNALLED] * 2


def test_inside_the_interval_only_an_idle_client_is_signalled_at_once(tmp_path, monkeypatch):
    """A change made once the last signal's run has started and no system run
    is going on is reported now; otherwise it waits for the trailing signal."""
    monkeypatch.setattr(monitor, "MIN_INTERVAL", 30.0)
    monkeypatch.setattr(monitor, "SETTLE", 0.3)
    for name, extra, second, third in (
            ("quick", (), monitor.DEFERRED, monitor.DEFERRED),   # its run may not have started; then one is due
            ("busy", ("/var/tmp/one/im/kvm-probes.d/host/system/linux_host.rb",), None, monitor.DEFERRED),
            ("idle", (), None, monitor.SIGNALLED)):
        (tmp_path / name).mkdir()
        c = Client(tmp_path / name, *extra)
        try:
            assert c.change() == monitor.SIGNALLED
            if second:
                assert c.change() == second
            time.sleep(0.5)
            assert c.change() == third, name
        finally:
            c.stop()
