"""Tell OpenNebula's monitoring that this host's free VFs just changed.

The monitord client on a host runs the system probes (ours among them:
KVM_SRIOV_FREE_VFS) every PROBES_PERIOD/SYSTEM_HOST seconds, 600 by default,
and at once on SIGUSR1 (src/im_mad/remotes/common.d/monitord-client.rb; the
stock kvm driver signals it the same way after a vGPU changes). Without
either the scheduler would see a freed or taken VF up to ten minutes late.

A SIGUSR1 reruns *every* stock system probe (about 4 s on a host; ours is
0.08 s of it), so when it can, refresh() sends our probe's attributes to
monitord itself, as one SYSTEM_HOST message of the client's own format
(src/im_mad/remotes/lib/monitord_client.rb). oned merges a SYSTEM_HOST
template into the host's (Host::update_info: attributes of the message
replace those of the same name, the others stay), so this updates exactly
the KVM_SRIOV_* attributes, ~0.03 s later. It falls back to the signal when:

- the client is running its system probes right now: that run may have read
  our probe before the change and would overwrite the pushed counts when it
  ends; the signal makes it run again afterwards (as before);
- monitord encrypts (NETWORK/PUBKEY set: RSA is not in the standard library),
  the client's configuration or monitord's address is unknown, or the send
  fails.

Pushes of one host are serialized (read the pool, send) under a lock, so
the last one sent is the latest state, and spaced by PUSH_GAP: monitord
reads datagrams in several threads, so two sent back to back could reach
oned in either order (a message is handled in well under a millisecond;
a thread stalled for longer than the gap could still swap two of them, and
the next change or system run puts it right).

Best effort by design: nothing here raises into the action. The pid is used only when it is a monitord client
owned by this user, so a stale pid file cannot make us signal some
unrelated process.
"""

from __future__ import annotations

import base64
import fcntl
import io
import os
import signal
import socket
import time
import zlib
from pathlib import Path
from typing import Callable, Optional
from xml.etree import ElementTree as ET

PID_FILE = "/var/tmp/one_db/.monitor_client.pid"
ENV_PID_FILE = "KVM_SRIOV_MONITOR_PID_FILE"   # simulated hosts sharing one machine
CLIENT_MARK = b"monitord-client"
CLIENT_CONFIG = "config"        # the client's copy of monitord's configuration, next to its pid file
SYSTEM_PROBES = b"/host/system/"
PUSH_LOCK = "monitor-push.lock"  # in the pool's state dir; holds the time of the last push
PUSHED, SIGNALLED = "pushed", "signalled"
PUSH_GAP = 0.05                  # seconds between two pushes of one host (only bursts wait)


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


def system_probes_running(pid: int) -> bool:
    """True when the client runs a system probe now (or we cannot tell)."""
    try:
        children = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                children += fh.read().split()
    except OSError:
        return True
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                if SYSTEM_PROBES in fh.read():
                    return True
        except OSError:
            continue   # exited meanwhile
    return False


class Destination:
    """Where the client sends its messages: monitord's address and this host's ID."""

    def __init__(self, address: str, port: int, host_id: int):
        self.address, self.port, self.host_id = address, port, host_id

    @classmethod
    def of_client(cls, pid: int, pid_file: str) -> Optional["Destination"]:
        """From the configuration the client was started with (it writes it
        next to its pid file); None when the messages would be encrypted or
        anything is missing."""
        try:
            root = ET.parse(os.path.join(os.path.dirname(pid_file), CLIENT_CONFIG)).getroot()
            if (root.findtext("NETWORK/PUBKEY") or "").strip():
                return None
            address = (root.findtext("NETWORK/MONITOR_ADDRESS") or "").strip()
            if address == "auto":   # the client answers to whoever started it over ssh
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
                address = env.get(b"SSH_CLIENT", b"").decode().split(" ")[0]
            port, host_id = int(root.findtext("NETWORK/PORT")), int(root.findtext("HOST_ID"))
        except (OSError, ET.ParseError, TypeError, ValueError, UnicodeDecodeError):
            return None
        return cls(address, port, host_id) if address else None

    def send_system_host(self, attributes: str) -> None:
        packed = base64.b64encode(zlib.compress(attributes.encode(), 9)).decode()
        message = f"SYSTEM_HOST SUCCESS {self.host_id} {int(time.time())} {packed}".encode()
        family, kind, proto, _, addr = socket.getaddrinfo(self.address, self.port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.sendto(message, addr)


def _probe_report(config) -> str:
    from . import probe   # only when pushing: the action path does not pay for it
    out = io.StringIO()
    probe.report(config, out)
    return out.getvalue()


def push(config, pid: int, pid_file: str, report: Callable[[object], str] = _probe_report) -> bool:
    """Send our probe's attributes to monitord now; False when the signal is
    needed instead (see the module's docstring)."""
    dest = Destination.of_client(pid, pid_file)
    if dest is None:
        return False
    with open(Path(config.state_dir) / PUSH_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if system_probes_running(pid):
            return False
        lock.seek(0)
        try:
            last = float(lock.read() or 0)
        except ValueError:
            last = 0.0
        wait = last + PUSH_GAP - time.time()
        if 0 < wait <= PUSH_GAP:
            time.sleep(wait)
        dest.send_system_host(report(config))
        lock.truncate(0)
        lock.write(repr(time.time()))
        lock.flush()
    # A run we did not see (between two of its probes, no child) may have read
    # our probe before the change: let it run again after.
    return not system_probes_running(pid)


def refresh(pid_file: Optional[str] = None, config=None) -> Optional[str]:
    """Make oned see this host's current VF counts soon: "pushed" (monitord
    was sent them), "signalled" (the client reruns its system probes) or None
    (no client to tell). With config (the host's), push them; else, or when
    that is not safe, signal the client."""
    pid_file = pid_file or os.environ.get(ENV_PID_FILE) or PID_FILE
    pid = client_pid(pid_file)
    if pid is None:
        return None
    if config is not None:
        try:
            if push(config, pid, pid_file):
                return PUSHED
        except Exception:   # never fail the action; the signal still refreshes
            pass
    try:
        os.kill(pid, signal.SIGUSR1)
        return SIGNALLED
    except OSError:
        return None
