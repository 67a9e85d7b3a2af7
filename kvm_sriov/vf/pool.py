"""The per-host VF pool: who holds which VF, persisted in SQLite.

Why SQLite: its transactions are atomic, survive kill -9 and stay consistent
across power loss (WAL). Writers wait on an flock next to the database and
then take ``BEGIN IMMEDIATE``, which OpenNebula's ``-p`` (parallel actions
per host) needs. The kernel lets any waiter win when the flock is dropped;
a first-come-first-served queue in front of it was measured and removed
(16 processes on 2 CPUs: worst allocate 63 ms with it, 57 ms without). The VF address is the primary key, so the database itself
refuses to hand one VF to two VMs whatever the code above it does.

A PF passed through whole (whole_pf.py) is a row of ``pf_assignment``, with
the VF count it had, written before its VFs are switched off and removed
only once they are back. Two triggers make the database refuse what would
be double use: a whole PF while one of its VFs is held, and a VF of a PF
that is held whole.

This module only stores state; which VF to pick is :mod:`kvm_sriov.vf.policy`,
and agreement with libvirt is :mod:`kvm_sriov.node.reconcile`.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

from .. import locks
from ..errors import DriverError
from . import state_folder

# reserved: taken for a VM whose domain does not (yet) hold it
# attached: in the VM's running domain
STATES = ("reserved", "attached")

SCHEMA = """
CREATE TABLE IF NOT EXISTS assignment (
    vf      TEXT PRIMARY KEY,          -- VF PCI address: one holder, ever
    pf      TEXT NOT NULL,
    vm_id   INTEGER NOT NULL,          -- OpenNebula VM id (-1: not ours)
    domain  TEXT NOT NULL,             -- libvirt domain name
    mac     TEXT NOT NULL DEFAULT '',  -- the OpenNebula NIC it stands for
    state   TEXT NOT NULL,
    since   REAL NOT NULL,             -- when it entered this state (epoch s)
    op      TEXT NOT NULL DEFAULT ''   -- the action that last wrote it
);
CREATE INDEX IF NOT EXISTS assignment_vm ON assignment(vm_id);
-- what a multi-step action is in the middle of (see intents.py)
-- PFs passed through whole: while a row is here, its VFs are switched off
-- (or about to be) and none of them is anyone's
CREATE TABLE IF NOT EXISTS pf_assignment (
    pf      TEXT PRIMARY KEY,          -- PF PCI address: one holder, ever
    vm_id   INTEGER NOT NULL,
    domain  TEXT NOT NULL,
    mac     TEXT NOT NULL DEFAULT '',
    state   TEXT NOT NULL,             -- as a VF's (STATES)
    since   REAL NOT NULL,
    op      TEXT NOT NULL DEFAULT '',
    num_vfs INTEGER NOT NULL           -- its sriov_numvfs before: what it gets back
);
CREATE INDEX IF NOT EXISTS pf_assignment_vm ON pf_assignment(vm_id);
CREATE INDEX IF NOT EXISTS assignment_pf ON assignment(pf);
CREATE TRIGGER IF NOT EXISTS vf_of_a_whole_pf BEFORE INSERT ON assignment
    WHEN EXISTS (SELECT 1 FROM pf_assignment WHERE pf = NEW.pf OR pf = NEW.vf)
    BEGIN SELECT RAISE(ABORT, 'its PF is passed through whole'); END;
CREATE TRIGGER IF NOT EXISTS whole_pf_with_a_vf_held BEFORE INSERT ON pf_assignment
    WHEN EXISTS (SELECT 1 FROM assignment WHERE pf = NEW.pf OR vf = NEW.pf)
    BEGIN SELECT RAISE(ABORT, 'one of its VFs is held'); END;
CREATE TABLE IF NOT EXISTS intent (
    vm_id   INTEGER PRIMARY KEY,
    action  TEXT NOT NULL,
    step    TEXT NOT NULL,
    data    TEXT NOT NULL DEFAULT '{}',
    since   REAL NOT NULL,
    expires REAL                       -- lease for work another host drives
);
"""


# checkpoint() copies the log into the database past this size
WAL_LIMIT_BYTES = 1 << 20
# Pages of new pools (an existing database keeps its own): each transaction
# writes ~3 pages to the log, so 1 KB pages write a quarter of 4 KB ones,
# and the log reaches WAL_LIMIT_BYTES (a checkpoint) 4x less often.
PAGE_BYTES = 1024


def sqlite_files(db_path) -> list[str]:
    """The files SQLite opens by name for the database (state_folder.py)."""
    return [f"{db_path}{end}" for end in ("", "-wal", "-shm", "-journal")]


class Assignment(NamedTuple):
    vf: str
    pf: str
    vm_id: int
    domain: str
    mac: str
    state: str
    since: float
    op: str


class PfAssignment(NamedTuple):
    """A PF passed through whole (the VM's NIC is the PF itself)."""
    pf: str
    vm_id: int
    domain: str
    mac: str
    state: str
    since: float
    op: str
    num_vfs: int       # what sriov_numvfs was before: what it is set to again


class PoolLocked(DriverError):
    pass


def _in_wal_mode(path: Path) -> bool:
    """A complete SQLite file already switched to WAL (header bytes 18-19)."""
    try:
        fd = state_folder.open_file(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        head = os.pread(fd, 20, 0)
    finally:
        os.close(fd)
    return len(head) == 20 and head.startswith(b"SQLite format 3\0") and head[18:20] == b"\x02\x02"


class VfPool:
    def __init__(self, db_path: os.PathLike | str, lock_seconds: float = 60.0):
        self.path = Path(db_path)
        self.lock_seconds = lock_seconds
        self._db: Optional[sqlite3.Connection] = None
        # a committed transaction gave, took or moved a VF: the host's free
        # counts changed (Host.close() tells monitoring, monitor.py)
        self.changed = False

    # -- connection ---------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            state_folder.make(self.path.parent)
            # SQLite opens these by name, following links: look first
            state_folder.check_files(*sqlite_files(self.path))
            try:
                if _in_wal_mode(self.path):
                    db = self._setup()
                else:
                    with self._setup_lock():
                        db = self._setup()
            except sqlite3.Error as exc:
                raise DriverError(f"VF pool {self.path}: {exc}") from None
            except OSError as exc:
                raise DriverError(f"VF pool {self.path}: {exc.strerror}") from None
            self._db = db
        return self._db

    @contextmanager
    def _setup_lock(self) -> Iterator[None]:
        """The pool flock around creating the database: on a fresh host the
        first actions create it at the same instant, and SQLite answers a
        second switch to WAL mode with 'database is locked' at once, without
        waiting (seen with 16 processes). Once the file is in WAL mode,
        opening it needs no lock (and must not bypass the queue)."""
        fd = self._open_lock()
        try:
            try:
                locks.acquire(fd, self.lock_seconds)
            except locks.LockTimeout:
                raise PoolLocked(f"VF pool {self.path} stayed locked for "
                                 f"{self.lock_seconds:.0f}s by another action") from None
            yield
        finally:
            os.close(fd)

    def _setup(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.lock_seconds, isolation_level=None)
        try:
            db.execute(f"PRAGMA page_size={PAGE_BYTES}")  # a no-op once the file exists
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a killed process loses nothing; a power
            # loss may lose the last commits, but then libvirt's domains
            # are gone as well and reconcile starts from empty anyway.
            db.execute("PRAGMA synchronous=NORMAL")
            # No checkpoint inside a commit: SQLite's automatic one (every
            # 1000 WAL pages) fsyncs the database while this process holds
            # the pool lock, and every queued action waits for that disk
            # flush. checkpoint() runs after the lock is dropped instead.
            db.execute("PRAGMA wal_autocheckpoint=0")
            # The WAL file is reused from its start after a checkpoint, not
            # shrunk: its size alone would then say "checkpoint" forever,
            # and each action would fsync the database. Cut back to this
            # size when the log restarts, so the size tracks what is new.
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES // 4}")
            db.executescript(SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @contextmanager
    def transaction(self) -> Iterator["Transaction"]:
        """Exclusive across processes until the block ends; all or nothing."""
        db = self._connect()
        fd = self._open_lock()
        try:
            try:
                locks.acquire(fd, self.lock_seconds)
            except locks.LockTimeout:
                raise PoolLocked(f"VF pool {self.path} stayed locked for "
                                 f"{self.lock_seconds:.0f}s by another action") from None
            db.execute("BEGIN IMMEDIATE")
            txn = Transaction(db)
            try:
                yield txn
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")
                self.changed = self.changed or txn.changed
                self._finish_checkpoint(db)
        finally:
            os.close(fd)  # drops the flock
            # Let a waiter run now: it was woken by that drop, but on
            # a busy host it would wait until this process blocks or uses up
            # its time slice (measured, 16 processes on 2 CPUs: p99 allocate
            # ~22 -> ~18 ms, and throughput +8 %).
            os.sched_yield()
        self.checkpoint()

    def _open_lock(self) -> int:
        try:
            return state_folder.open_file(f"{self.path}.lock", os.O_RDWR | os.O_CREAT)
        except OSError as exc:  # e.g. made by root (the admin CLI): say which file, not "internal error"
            raise DriverError(f"VF pool lock {self.path}.lock: {exc.strerror}") from None

    def checkpoint(self, wal_bytes: int = WAL_LIMIT_BYTES) -> None:
        """Copy the write-ahead log into the database once it has grown past
        ``wal_bytes``, outside the pool lock (PASSIVE: it neither waits for
        nor blocks a writer). This copies the bulk of the log and pays its
        fsyncs; the frames the others commit meanwhile are copied by the
        next holder of the pool lock (_finish_checkpoint), after which the
        log restarts at its start and is cut back.

        In the caller, not in a thread beside it: a thread copying while the
        others kept writing kept the log from restarting at its start, so it
        stayed past the size and nearly every transaction (1,617 of 2,000,
        16 processes) started another copy and waited for its fsyncs."""
        try:
            if os.stat(f"{self.path}-wal").st_size < wal_bytes:
                return
            log = self._log_generation()
            if log and log == self._bulk_copied():
                return  # done for this log: the next holder finishes it
            busy, _, _ = self._connect().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if not busy and log:
                self._mark_bulk_copied(log)
        except (OSError, sqlite3.Error, DriverError):
            pass  # the data is safe in the WAL; the next transaction tries again

    def _finish_checkpoint(self, db: sqlite3.Connection) -> None:
        """Under the pool lock, right after a commit: once checkpoint() has
        copied the bulk of this log, copy the rest. Only here can a copy
        catch up with the writers (none writes while we hold the lock), and
        a log restarts only once all of it is copied: with the copy done
        only outside the lock, under 16 processes it seldom caught up
        (measured under load: 1,763 checkpoints in 2,000 transactions, the
        log at 7 MB). The rest is a few transactions' frames, so the two
        fsyncs here are small ones."""
        try:
            if os.stat(f"{self.path}-wal").st_size < WAL_LIMIT_BYTES:
                return
            log = self._log_generation()
            if log and log == self._bulk_copied():
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except (OSError, sqlite3.Error, DriverError):
            pass  # committed already; a later transaction tries again

    # Which log checkpoint() has copied the bulk of, in <db>.ckpt: the WAL
    # header's checkpoint sequence number and salts (bytes 12-23), which
    # change each time the log restarts, so an old mark never matches.
    # (Only the -wal and .ckpt files are opened here: closing a descriptor
    # of the database or of its -shm would drop SQLite's POSIX locks on it.)
    def _log_generation(self) -> bytes:
        fd = state_folder.open_file(f"{self.path}-wal", os.O_RDONLY)
        try:
            head = os.pread(fd, 24, 0)
        finally:
            os.close(fd)
        return head[12:24] if len(head) == 24 else b""

    def _bulk_copied(self) -> bytes:
        try:
            fd = state_folder.open_file(f"{self.path}.ckpt", os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, 12, 0)
        finally:
            os.close(fd)

    def _mark_bulk_copied(self, log: bytes) -> None:
        fd = state_folder.open_file(f"{self.path}.ckpt", os.O_WRONLY | os.O_CREAT)
        try:
            os.pwrite(fd, log, 0)
        finally:
            os.close(fd)

    def assignments(self) -> list[Assignment]:
        return Transaction(self._connect()).assignments()

    def pf_assignments(self) -> list[PfAssignment]:
        return Transaction(self._connect()).pf_assignments()


class Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.changed = False   # an assignment was added, moved or removed

    def assignments(self, vm_id: Optional[int] = None) -> list[Assignment]:
        sql = "SELECT vf, pf, vm_id, domain, mac, state, since, op FROM assignment"
        args: tuple = ()
        if vm_id is not None:
            sql += " WHERE vm_id = ?"
            args = (vm_id,)
        return [Assignment(*row) for row in self.db.execute(sql + " ORDER BY vf", args)]

    def held(self) -> set[str]:
        return {row[0] for row in self.db.execute("SELECT vf FROM assignment")}

    def add(self, vf: str, pf: str, vm_id: int, domain: str, mac: str,
            state: str, op: str, now: Optional[float] = None) -> Assignment:
        assert state in STATES, state
        a = Assignment(vf, pf, vm_id, domain, mac, state, now or time.time(), op)
        try:
            self.db.execute("INSERT INTO assignment VALUES (?,?,?,?,?,?,?,?)",
                            (a.vf, a.pf, a.vm_id, a.domain, a.mac, a.state, a.since, a.op))
        except sqlite3.IntegrityError as exc:
            if "passed through whole" in str(exc):
                raise DriverError(f"VF {vf}: its PF {pf} is passed through whole "
                                  f"(refusing to assign the VF too)") from None
            raise DriverError(f"VF {vf} is already assigned (refusing to assign it twice)") from None
        self.changed = True
        return a

    def set_state(self, vfs: Iterable[str], state: str, op: str,
                  now: Optional[float] = None) -> None:
        assert state in STATES, state
        self.db.executemany(
            "UPDATE assignment SET state = ?, since = ?, op = ? WHERE vf = ?",
            [(state, now or time.time(), op, vf) for vf in vfs])

    def reassign(self, vf: str, vm_id: int, domain: str, op: str) -> None:
        if self.db.execute("UPDATE assignment SET vm_id = ?, domain = ?, op = ? WHERE vf = ?",
                           (vm_id, domain, op, vf)).rowcount:
            self.changed = True

    def release(self, vfs: Iterable[str]) -> None:
        if self.db.executemany("DELETE FROM assignment WHERE vf = ?", [(vf,) for vf in vfs]).rowcount:
            self.changed = True

    def release_vm(self, vm_id: int) -> list[Assignment]:
        """The VM's VFs (its whole PFs need their VFs back first: release_pf)."""
        gone = self.assignments(vm_id)
        if self.db.execute("DELETE FROM assignment WHERE vm_id = ?", (vm_id,)).rowcount:
            self.changed = True
        return gone

    # -- PFs passed through whole ------------------------------------------
    def pf_assignments(self, vm_id: Optional[int] = None) -> list[PfAssignment]:
        sql = "SELECT pf, vm_id, domain, mac, state, since, op, num_vfs FROM pf_assignment"
        args: tuple = ()
        if vm_id is not None:
            sql += " WHERE vm_id = ?"
            args = (vm_id,)
        return [PfAssignment(*row) for row in self.db.execute(sql + " ORDER BY pf", args)]

    def add_pf(self, pf: str, vm_id: int, domain: str, mac: str, state: str, op: str,
               num_vfs: int, now: Optional[float] = None) -> PfAssignment:
        assert state in STATES, state
        a = PfAssignment(pf, vm_id, domain, mac, state, now or time.time(), op, num_vfs)
        try:
            self.db.execute("INSERT INTO pf_assignment VALUES (?,?,?,?,?,?,?,?)", a)
        except sqlite3.IntegrityError as exc:
            if "VFs is held" in str(exc):
                raise DriverError(f"PF {pf}: one of its VFs is held (refusing to pass it through whole)") from None
            raise DriverError(f"PF {pf} is already passed through whole (refusing to assign it twice)") from None
        self.changed = True
        return a

    def set_pf_state(self, pfs: Iterable[str], state: str, op: str, now: Optional[float] = None) -> None:
        assert state in STATES, state
        self.db.executemany("UPDATE pf_assignment SET state = ?, since = ?, op = ? WHERE pf = ?",
                            [(state, now or time.time(), op, pf) for pf in pfs])

    def reassign_pf(self, pf: str, vm_id: int, domain: str, op: str) -> None:
        if self.db.execute("UPDATE pf_assignment SET vm_id = ?, domain = ?, op = ? WHERE pf = ?",
                           (vm_id, domain, op, pf)).rowcount:
            self.changed = True

    def release_pf(self, held: PfAssignment) -> None:
        """Forget this holding (once the PF has its VFs back), and only this
        one: a row another VM wrote for the PF since is left alone."""
        if self.db.execute("DELETE FROM pf_assignment WHERE pf = ? AND vm_id = ? AND since = ?",
                           (held.pf, held.vm_id, held.since)).rowcount:
            self.changed = True


def read_only(db_path: os.PathLike | str, timeout: float = 5.0) -> Optional[sqlite3.Connection]:
    """A connection that only reads an existing pool: no pool lock, no set-up,
    no write (a WAL reader neither waits for nor blocks the writers, and each
    read transaction sees one committed state). For a look that changes
    nothing, e.g. whether a VM has anything here, or what the probe reports.
    None when that is not to be had: no database, one not (yet) in WAL mode,
    or SQLite refused; Untrusted when the state folder or a file is not ours."""
    path = Path(db_path).absolute()
    if not os.path.lexists(path):
        return None
    state_folder.check(path.parent)
    state_folder.check_files(*sqlite_files(path))
    if not _in_wal_mode(path):
        return None
    try:
        return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    except sqlite3.Error:
        return None
