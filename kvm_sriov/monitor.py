"""Tell OpenNebula's monitoring that this host's free VFs just changed.

The monitord client on a host runs the system probes (ours among them:
KVM_SRIOV_FREE_VFS) every PROBES_PERIOD/SYSTEM_HOST seconds, 600 by default,
and at once on SIGUSR1 (src/im_mad/remotes/common.d/monitord-client.rb; the
stock kvm driver signals it the same way after a vGPU changes). Without the
signal the scheduler would see a freed or taken VF up to ten minutes late.

Best effort by design: it never raises and never delays the action. The pid
is signalled only when it is a monitord client owned by this user, so a
stale pid file cannot make us signal some unrelated process.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

PID_FILE = "/var/tmp/one_db/.monitor_client.pid"
ENV_PID_FILE = "KVM_SRIOV_MONITOR_PID_FILE"   # simulated hosts sharing one machine
CLIENT_MARK = b"monitord-client"


def _client_pid(pid_file: str) -> Optional[int]:
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


def refresh(pid_file: Optional[str] = None) -> bool:
    """Ask the monitord client to run the system probes now; True when signalled."""
    pid = _client_pid(pid_file or os.environ.get(ENV_PID_FILE) or PID_FILE)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGUSR1)
        return True
    except OSError:
        return False
