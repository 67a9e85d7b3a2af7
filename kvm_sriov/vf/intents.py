"""What a multi-step action is in the middle of, written before it acts.

Each action holds an flock on ``<state_dir>/locks/vm-<id>.lock`` while it
works on a VM; the kernel drops it when the process dies, even by SIGKILL.
An intent whose VM lock is free (and whose lease, if it has one, expired)
was abandoned: reconcile may then converge that VM to libvirt's truth at
once instead of waiting for the grace period.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple, Optional

from .. import locks
from ..errors import DriverError
from . import state_folder
from .pool import Transaction


class Intent(NamedTuple):
    vm_id: int
    action: str
    step: str
    data: dict
    since: float
    expires: Optional[float]


class VmLock:
    """Exclusive per-VM lock between actions on this host."""

    def __init__(self, state_dir: Path, vm_id: int, timeout: float):
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "locks" / f"vm-{vm_id}.lock"
        self.vm_id = vm_id
        self.timeout = timeout
        self._fd: Optional[int] = None

    def __enter__(self) -> "VmLock":
        state_folder.make(self.state_dir)
        state_folder.subfolder(self.path.parent)
        try:
            self._fd = state_folder.open_file(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise DriverError(f"VM lock {self.path}: {exc.strerror}") from None
        try:
            locks.acquire(self._fd, self.timeout)
        except BaseException as exc:
            os.close(self._fd)
            self._fd = None
            if isinstance(exc, locks.LockTimeout):
                raise DriverError(f"VM {self.vm_id} is busy with another kvm-sriov action "
                                  f"for more than {self.timeout:.0f}s") from None
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @staticmethod
    def held_by_someone(state_dir: Path, vm_id: int) -> bool:
        path = Path(state_dir) / "locks" / f"vm-{vm_id}.lock"
        state_folder.check(state_dir)
        if not state_folder.subfolder(path.parent, create=False):
            return False
        try:
            fd = state_folder.open_file(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            locks.acquire(fd, 0)
            return False
        except locks.LockTimeout:
            return True
        finally:
            os.close(fd)


def record(txn: Transaction, vm_id: int, action: str, step: str, data: dict,
           expires: Optional[float] = None) -> None:
    txn.db.execute("INSERT OR REPLACE INTO intent VALUES (?,?,?,?,?,?)",
                   (vm_id, action, step, json.dumps(data, sort_keys=True), time.time(), expires))


def advance(txn: Transaction, vm_id: int, step: str, **data) -> None:
    row = txn.db.execute("SELECT data FROM intent WHERE vm_id = ?", (vm_id,)).fetchone()
    merged = dict(json.loads(row[0]) if row else {}, **data)
    txn.db.execute("UPDATE intent SET step = ?, data = ? WHERE vm_id = ?",
                   (step, json.dumps(merged, sort_keys=True), vm_id))


def clear(txn: Transaction, vm_id: int) -> None:
    txn.db.execute("DELETE FROM intent WHERE vm_id = ?", (vm_id,))


def all_intents(txn: Transaction) -> list[Intent]:
    return [Intent(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5]) for r in
            txn.db.execute("SELECT vm_id, action, step, data, since, expires FROM intent ORDER BY vm_id")]


def is_active(intent: Intent, state_dir: Path, now: Optional[float] = None) -> bool:
    now = time.time() if now is None else now
    if intent.expires is not None and intent.expires > now:
        return True
    return VmLock.held_by_someone(state_dir, intent.vm_id)


def of_vm(txn: Transaction, vm_id: int) -> Optional[Intent]:
    row = txn.db.execute("SELECT vm_id, action, step, data, since, expires FROM intent WHERE vm_id = ?",
                         (vm_id,)).fetchone()
    return Intent(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5]) if row else None


def remote_pending(intent: Intent) -> bool:
    """A migration that may have left VFs reserved on its destination."""
    return (intent.action == "migrate" and bool(intent.data.get("dest"))
            and intent.step != "attached-remote")
