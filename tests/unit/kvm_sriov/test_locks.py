"""locks.acquire, the flock with a deadline under every waiter of the library."""

import fcntl
import os
import signal
import threading

import pytest

from kvm_sriov import locks
from kvm_sriov.errors import DriverError


# -- locks.acquire ------------------------------------------------------------------------
@pytest.fixture
def lock_file(tmp_path):
    """Two descriptors of one file: flock locks conflict between them as
    between two processes."""
    path = tmp_path / "pool.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    waiter = os.open(path, os.O_RDWR)
    yield path, holder, waiter
    os.close(holder)
    os.close(waiter)


def _free(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_free_lock_is_taken_and_held_until_closed(lock_file):
    path, holder, _ = lock_file
    locks.acquire(holder, 5)
    assert not _free(path)
    fcntl.flock(holder, fcntl.LOCK_UN)
    assert _free(path)


def test_a_held_lock_times_out_with_one_clear_error_and_nothing_held(lock_file):
    path, holder, waiter = lock_file
    locks.acquire(holder)
    mine = lambda *a: None   # noqa: E731 - the caller's own handler, which must come back
    previous = signal.signal(signal.SIGALRM, mine)
    try:
        with pytest.raises(locks.LockTimeout, match=r"^VF pool lock stayed locked by another process for 0.2s$"):
            locks.acquire(waiter, 0.2, what="VF pool lock")
        assert signal.getsignal(signal.SIGALRM) is mine and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert issubclass(locks.LockTimeout, DriverError)   # a one-line error for the operator, never a traceback
    fcntl.flock(holder, fcntl.LOCK_UN)
    assert _free(path)   # the waiter that gave up holds nothing


def test_a_timeout_of_zero_tries_once(lock_file):
    _, holder, waiter = lock_file
    locks.acquire(holder)
    with pytest.raises(locks.LockTimeout, match="^the lock is locked by another process$"):
        locks.acquire(waiter, 0)
    fcntl.flock(holder, fcntl.LOCK_UN)
    locks.acquire(waiter, 0)


def test_a_waiter_gets_the_lock_when_the_holder_lets_go(lock_file):
    path, holder, waiter = lock_file
    locks.acquire(holder)
    threading.Timer(0.2, fcntl.flock, (holder, fcntl.LOCK_UN)).start()
    locks.acquire(waiter, 60)
    assert not _free(path)


def test_a_file_object_and_a_thread_other_than_the_main_one_work_too(lock_file):
    path, holder, _ = lock_file
    locks.acquire(holder)
    outcome = []

    def wait():
        with open(path, "a") as fh:
            try:
                locks.acquire(fh, 0.2)
                outcome.append("taken")
            except locks.LockTimeout as exc:
                outcome.append(str(exc))
            fcntl.flock(holder, fcntl.LOCK_UN)
            locks.acquire(fh, 60)
            outcome.append("taken")
    worker = threading.Thread(target=wait)
    worker.start()
    worker.join(120)
    assert outcome == ["the lock stayed locked by another process for 0.2s", "taken"]


def test_an_exception_while_waiting_leaves_nothing_held_and_the_alarm_as_it_was(lock_file):
    path, holder, waiter = lock_file
    locks.acquire(holder)

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt
    alarm = signal.getsignal(signal.SIGALRM)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(KeyboardInterrupt):
            locks.acquire(waiter, 60)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert signal.getsignal(signal.SIGALRM) is alarm and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    fcntl.flock(holder, fcntl.LOCK_UN)
    assert _free(path)


def test_a_vm_lock_is_released_when_its_block_raises(tmp_path):
    from kvm_sriov.vf.intents import VmLock
    state = tmp_path / "state"
    with pytest.raises(RuntimeError):
        with VmLock(state, 7, 5):
            assert VmLock.held_by_someone(state, 7)
            raise RuntimeError("a step failed")
    assert not VmLock.held_by_someone(state, 7)


def test_a_busy_vm_says_so_in_one_line(tmp_path):
    from kvm_sriov.vf.intents import VmLock
    state = tmp_path / "state"
    with VmLock(state, 7, 5):
        with pytest.raises(DriverError, match=r"^VM 7 is busy with another kvm-sriov action for more than 0s$"):
            with VmLock(state, 7, 0.2):
                pass
    with VmLock(state, 7, 0):
        pass
