"""An exclusive flock with a deadline, waited for in the kernel's queue.

A waiter sleeps in flock(2) and wakes as soon as the holder is done. A poll
(try, sleep, try again) wakes only at its next step, and under a dozen
parallel actions those steps are what the slowest ones wait for (SQLite's
busy handler sleeps up to 100 ms a step: half a second for the slowest
allocations). The deadline is an alarm signal, which only the main thread
can take: another thread tries every few milliseconds instead.
"""

from __future__ import annotations

import fcntl
import signal
import threading
import time
from typing import Optional

from .errors import DriverError

THREAD_POLL_SECONDS = 0.005


class LockTimeout(DriverError):
    """Another process still held the lock at the deadline."""


class _Expired(Exception):
    pass


def acquire(fd, timeout: Optional[float] = None, what: str = "the lock") -> None:
    """An exclusive flock on ``fd`` (a descriptor or a file object), held
    until it is unlocked or closed. Waits at most ``timeout`` seconds (None:
    as long as it takes; 0: not at all), then LockTimeout, with nothing held.
    In the main thread the wait uses SIGALRM and ITIMER_REAL: a caller's own
    alarm would be cancelled."""
    if _try(fd):
        return
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    if timeout > 0:
        if threading.current_thread() is threading.main_thread():
            if _wait_with_alarm(fd, timeout):
                return
        else:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                time.sleep(THREAD_POLL_SECONDS)
                if _try(fd):
                    return
        raise LockTimeout(f"{what} stayed locked by another process for {timeout:g}s")
    raise LockTimeout(f"{what} is locked by another process")


def _try(fd) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _wait_with_alarm(fd, timeout: float) -> bool:
    waiting = True

    def expired(_signum, _frame):
        if waiting:   # an alarm that comes once the lock is ours changes nothing
            raise _Expired()
    previous = signal.signal(signal.SIGALRM, expired)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        fcntl.flock(fd, fcntl.LOCK_EX)
        waiting = False
        return True
    except _Expired:
        fcntl.flock(fd, fcntl.LOCK_UN)   # granted just before the alarm came: not ours after all
        return False
    finally:
        waiting = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
