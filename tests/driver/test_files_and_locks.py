"""The two shared helpers under every writer and waiter of the library:
files.atomic_write (a file replaced whole) and locks.acquire (an flock with
a deadline)."""

import fcntl
import os
import signal
import stat
import threading

import pytest

from kvm_sriov import files, locks
from kvm_sriov.errors import DriverError


# -- files.atomic_write -------------------------------------------------------------------
def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_the_file_is_replaced_whole_through_a_new_hidden_name_each_time(tmp_path, monkeypatch):
    path = tmp_path / "partitions.conf"
    path.write_text("old\n")
    renamed = []
    replace = os.replace

    def seen(src, dst):
        renamed.append((src, os.fspath(dst)))
        replace(src, dst)
    monkeypatch.setattr(os, "replace", seen)
    files.atomic_write(path, "new\n")
    files.atomic_write(path, b"newer\n")
    assert path.read_text() == "newer\n" and _names(tmp_path) == ["partitions.conf"]
    (first, _), (second, _) = renamed
    assert first != second and all(dst == str(path) for _, dst in renamed)
    for tmp in (first, second):
        assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".partitions.conf.")


def test_a_str_is_written_as_utf8(tmp_path):
    files.atomic_write(tmp_path / "f", "Zürich\n")
    assert (tmp_path / "f").read_bytes() == "Zürich\n".encode()


@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_failure_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch, where):
    import errno
    path = tmp_path / "status.json"
    path.write_text("old")
    if where == "write":
        fdopen = os.fdopen

        def onto_a_full_disk(fd, *args, **kwargs):
            os.close(fd)
            return fdopen(os.open("/dev/full", os.O_WRONLY), *args, **kwargs)
        monkeypatch.setattr(os, "fdopen", onto_a_full_disk)
    else:
        def refused(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(OSError):
        files.atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and _names(tmp_path) == ["status.json"]


def test_an_interrupt_during_the_write_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "oned.conf", b"x", fsync=True)
    monkeypatch.undo()
    assert _names(tmp_path) == []


def test_a_link_planted_at_the_temporary_name_is_neither_followed_nor_removed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "guessed")
    planted = tmp_path / ".ledger.json.kvm-sriov.guessed"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.atomic_write(tmp_path / "ledger.json", "{}")
    assert victim.read_text() == "victim's\n" and planted.is_symlink() and not (tmp_path / "ledger.json").exists()
    planted.unlink()
    planted.mkdir()   # nor a folder: O_EXCL refuses any name that is there
    with pytest.raises(FileExistsError):
        files.atomic_write(tmp_path / "ledger.json", "{}")


def test_a_link_at_the_path_itself_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    path = tmp_path / "partitions.conf"
    path.symlink_to(victim)
    files.atomic_write(path, "new\n", mode=0o644)
    assert victim.read_text() == "victim's\n" and not path.is_symlink() and path.read_text() == "new\n"


def test_mode_is_exact_and_none_is_as_open_makes_it(tmp_path):
    old = os.umask(0o077)
    try:
        files.atomic_write(tmp_path / "exact", "x", mode=0o644)
        files.atomic_write(tmp_path / "private", "x", mode=0o600)
        files.atomic_write(tmp_path / "as-open", "x")
        with open(tmp_path / "by-open", "w"):
            pass
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"exact": 0o644, "private": 0o600, "as-open": modes["by-open"], "by-open": 0o600}


def test_like_gives_the_new_file_the_old_ones_mode_and_as_root_its_owner(tmp_path):
    path = tmp_path / "oned.conf"
    path.write_text("old\n")
    path.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65533)
    files.atomic_write(path, b"new\n", like=path.stat(), fsync=True)
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and path.read_text() == "new\n"
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65533)


def test_fsync_is_asked_for(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd)))
    files.atomic_write(tmp_path / "a", "x")
    assert synced == []
    files.atomic_write(tmp_path / "b", "x", fsync=True)
    assert len(synced) == 1


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
