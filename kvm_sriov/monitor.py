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
"""

from __future__ import annotations

import os
import signal
from typing import Optional

PID_FILE = "/var/tmp/one_db/.monitor_client.pid"
ENV_PID_FILE = "KVM_SRIOV_MONITOR_PID_FILE"   # simulated hosts sharing one machine
CLIENT_MARK = b"monitord-client"
SYSTEM_PROBES = b"/host/system/"
SIGNALLED = "signalled"


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
    """True when the client runs a system probe now (or we cannot tell): a
    signal now takes the rest of that run and one more."""
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


def refresh(pid_file: Optional[str] = None, config=None) -> Optional[str]:
    """Ask the monitord client to run the system probes now: "signalled", or
    None when there is no client to ask. config (the host's) is accepted for
    callers that pass it; the signal does not need it."""
    pid = client_pid(pid_file or os.environ.get(ENV_PID_FILE) or PID_FILE)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGUSR1)
        return SIGNALLED
    except OSError:
        return None
