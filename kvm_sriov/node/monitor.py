"""Tell OpenNebula's monitoring that this host's free VFs just changed.

The monitord client on a host runs the system probes (ours among them:
KVM_SRIOV_FREE_VFS) every PROBES_PERIOD/SYSTEM_HOST seconds, 600 by default,
and at once on SIGUSR1 (src/im_mad/remotes/common.d/monitord-client.rb; the
stock kvm driver signals it the same way after a vGPU changes). Without the
signal the scheduler would see a freed or taken VF up to ten minutes late.

The signal reruns *every* stock system probe (4-5 s on an idle host; ours is
0.08 s of it) and one that arrives during a run waits for that run. Sending
only our attributes to monitord as a SYSTEM_HOST message of our own would
reach oned in ~0.03 s, but it is not safe: oned's host share takes the system
datastore (DS, DS_LOCATION_*) and PCI devices out of every SYSTEM_HOST
message it gets (HostShareDatastore/HostSharePCI::set_monitorization), so a
message without them empties the host's system-datastore capacity ("Not
enough capacity on datastores") and drops its PCI devices until the next
full run. So the whole system run it is (docs/scheduling.md, "Fresh counts").

Best effort by design: it never raises and never delays the action. The pid
is signalled only when it is a monitord client owned by this user, so a
stale pid file cannot make us signal some unrelated process.

Rate limit: the client does not merge signals (each one is a byte in a pipe
and each byte is one more full run), so a tenant looping attach/detach used
to queue runs faster than they ran, and the host kept probing long after.
Now a host sends at most one signal per MIN_INTERVAL seconds (state in the
pool's state directory, under a lock, as every action is its own process).
A change inside the interval is not dropped: one trailing signal goes out
when the interval ends (a detached process, so the action does not wait),
and it also waits for a system run in progress to end, so the client's pipe
never holds more than the one run it is about to start, however slow the
runs get. MIN_INTERVAL is about one system run on an idle host. Inside it a
change still goes out at once when the client is idle: no system run going
on and the last signal SETTLE seconds old (its run has started, so this one
queues behind nothing); a change made after the last one was reported (as an
administrator, the scheduler or bench-sched-refresh make them) is thus never
delayed, and a loop costs at most one run at a time, never a backlog.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Optional

PID_FILE = "/var/tmp/one_db/.monitor_client.pid"
ENV_PID_FILE = "KVM_SRIOV_MONITOR_PID_FILE"   # simulated hosts sharing one machine
CLIENT_MARK = b"monitord-client"
SYSTEM_PROBES = b"/host/system/"
SIGNALLED = "signalled"
DEFERRED = "deferred"          # a trailing signal will report the change
STATE_FILE = "monitor-signal.json"
MIN_INTERVAL = 4.0             # seconds between two signals of one host, unless the client is idle
SETTLE = 1.0                   # by then the last signal's run has started (or is over)
MAX_RUN_WAIT = 60.0            # a trailing signal waits at most this long for a run to end


def client_pid(pid_file: str = PID_FILE) -> Optional[int]:
    """The monitord client's pid, when the pid file names one of this user's."""
    try:
        with open(pid_file) as fh:
            pid = int(fh.read().strip())
        if pid <= 1:
            return None
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if CLIENT_MARK not in fh.read():
                return None
        return pid
    except (OSError, ValueError):
        return None


def system_probes_running(pid: int, unknown: bool = True) -> bool:
    """True when the client runs a system probe now (`unknown` when we cannot
    tell): a signal now takes the rest of that run and one more."""
    try:
        children = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                children += fh.read().split()
    except OSError:
        return unknown
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                if SYSTEM_PROBES in fh.read():
                    return True
        except OSError:
            continue   # exited meanwhile
    return False


def _signal(pid: int) -> Optional[str]:
    try:
        os.kill(pid, signal.SIGUSR1)
        return SIGNALLED
    except OSError:
        return None


class _State:
    """The host's last signal and pending trailing signal, locked while open."""

    def __init__(self, state_dir: str):
        from .. import locks
        from ..vf import state_folder   # the one way into the state folder
        state_folder.check(state_dir)
        self.fd = state_folder.open_file(os.path.join(state_dir, STATE_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            locks.acquire(self.fd)
            raw = os.read(self.fd, 4096)
            data = json.loads(raw) if raw.strip() else {}
            self.last = float(data.get("last", 0))
            self.trailing_due = float(data.get("trailing_due", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            self.last = self.trailing_due = 0.0
        except BaseException:
            os.close(self.fd)
            raise

    def save(self) -> None:
        body = json.dumps({"last": self.last, "trailing_due": self.trailing_due}).encode()
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, body)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # drops the lock


def refresh(pid_file: Optional[str] = None, config=None) -> Optional[str]:
    """Ask the monitord client to run the system probes: "signalled" (now),
    "deferred" (a trailing signal will, see the module's doc), or None when
    there is no client to ask. Without config (the host's: its state
    directory keeps the rate limit) the signal goes out at once."""
    pid_file = pid_file or os.environ.get(ENV_PID_FILE) or PID_FILE
    pid = client_pid(pid_file)
    if pid is None:
        return None
    if config is None:
        return _signal(pid)
    from ..errors import DriverError   # (this file also runs alone: the trailing signal)
    try:
        with _State(os.fspath(config.state_dir)) as state:
            now = time.time()
            recent = state.last <= now < state.last + MIN_INTERVAL  # (a clock set back counts as elapsed)
            idle = (not recent or (now >= state.last + SETTLE and not state.trailing_due
                                   and not system_probes_running(pid)))
            if idle:
                way = _signal(pid)
                state.last = now
                state.save()
                return way
            if state.trailing_due and now < state.trailing_due + MAX_RUN_WAIT + 10:
                return DEFERRED  # one is on its way, and goes out after this change
            state.trailing_due = state.last + MIN_INTERVAL
            _start_trailing(state.trailing_due, pid_file, os.fspath(config.state_dir))
            state.save()
            return DEFERRED
    except (OSError, DriverError):
        return _signal(pid)  # no rate limit rather than no signal


def _start_trailing(due: float, pid_file: str, state_dir: str) -> None:
    """This file as a detached process (sh's & makes init its parent: no
    zombie in a long-lived caller, no stdio of the action held open)."""
    import subprocess
    python = sys.executable or "/usr/bin/python3"
    subprocess.run(["/bin/sh", "-c", 'exec "$@" &', "sh", python, "-I", "-S", os.path.abspath(__file__),
                    "trailing", repr(due), pid_file, state_dir],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   close_fds=True, start_new_session=True, cwd="/", timeout=10, check=False)


def trailing(due: float, pid_file: str, state_dir: str) -> None:
    """The trailing signal: at `due`, once no system run is going on."""
    time.sleep(max(0.0, due - time.time()))
    give_up = time.time() + MAX_RUN_WAIT
    while time.time() < give_up:
        pid = client_pid(pid_file)
        if pid is None or not system_probes_running(pid, unknown=False):
            break
        time.sleep(0.2)
    with _State(state_dir) as state:
        pid = client_pid(pid_file)
        if pid is not None:
            _signal(pid)
        state.last = time.time()
        state.trailing_due = 0.0
        state.save()


if __name__ == "__main__" and sys.argv[1:2] == ["trailing"] and len(sys.argv) == 5:
    # run as the package's module, so that it reaches the state folder as every opener does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from kvm_sriov.node import monitor
    monitor.trailing(float(sys.argv[2]), sys.argv[3], sys.argv[4])
