"""Who uses which shared-memory region on this host, in the pool's SQLite
database (tables ``ivshmem_region``, ``ivshmem_user``), changed inside pool
transactions (functions take ``txn.db``), and reconciled with libvirt.

A region file is made only after its row is committed and removed before
its row goes, so a crash leaves at most a row without a file, which
reconcile settles; never a file nobody knows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

from .errors import DriverError, InputError
from .ivshmem import ATTRIBUTE, NAME, Request
from .ivshmem_region import SHM_DIR, region_path, remove_file, write_header

SCHEMA = """
CREATE TABLE IF NOT EXISTS ivshmem_region (
    name    TEXT PRIMARY KEY,          -- kvm-sriov-ivshmem-u<uid>-g<vmgroup>, a file in /dev/shm
    uid     INTEGER NOT NULL,
    vmgroup INTEGER NOT NULL,
    size_mb INTEGER NOT NULL,
    since   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ivshmem_user (
    vm_id   INTEGER PRIMARY KEY,       -- a VM uses one region at most
    region  TEXT NOT NULL,
    domain  TEXT NOT NULL,
    state   TEXT NOT NULL,             -- reserved | attached (as VFs, pool.py)
    since   REAL NOT NULL
);
"""


class User(NamedTuple):
    vm_id: int
    region: str
    domain: str
    state: str
    since: float


def ensure_schema(db) -> None:
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def users(db, region: Optional[str] = None) -> list[User]:
    ensure_schema(db)
    sql, args = "SELECT vm_id, region, domain, state, since FROM ivshmem_user", ()
    if region is not None:
        sql, args = sql + " WHERE region = ?", (region,)
    return [User(*r) for r in db.execute(sql + " ORDER BY vm_id", args)]


def user_of(db, vm_id: int) -> Optional[User]:
    ensure_schema(db)
    row = db.execute("SELECT vm_id, region, domain, state, since FROM ivshmem_user WHERE vm_id = ?",
                     (vm_id,)).fetchone()
    return User(*row) if row else None


def regions(db) -> dict[str, int]:
    """name -> size in MB."""
    ensure_schema(db)
    return dict(db.execute("SELECT name, size_mb FROM ivshmem_region ORDER BY name"))


def add_user(db, request: Request, vm_id: int, domain: str, now: Optional[float] = None) -> bool:
    """Record the VM as a user of its group's region (reserved); True when
    the region is new here (its file is to be made once this commits)."""
    ensure_schema(db)
    now = time.time() if now is None else now
    row = db.execute("SELECT size_mb FROM ivshmem_region WHERE name = ?", (request.name,)).fetchone()
    if row is not None and row[0] != request.size_mb:
        raise InputError(f"{ATTRIBUTE}: SIZE {request.size_mb} MB, but VM group {request.vmgroup}'s "
                         f"region on this host has {row[0]} MB; all VMs of a group must ask the same")
    held = user_of(db, vm_id)
    if held is not None and held.region != request.name:
        raise DriverError(f"VM {vm_id} already uses shared-memory region {held.region}")
    if row is None:
        db.execute("INSERT INTO ivshmem_region VALUES (?,?,?,?,?)",
                   (request.name, request.uid, request.vmgroup, request.size_mb, now))
    db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
               (vm_id, request.name, domain, "reserved", now))
    return row is None


def set_attached(db, vm_id: int, now: Optional[float] = None) -> None:
    ensure_schema(db)
    db.execute("UPDATE ivshmem_user SET state = 'attached', since = ? WHERE vm_id = ?",
               (time.time() if now is None else now, vm_id))


def drop_user(db, vm_id: int, shm_dir: Path = SHM_DIR) -> Optional[str]:
    """The VM leaves its region; the region goes with its last user (file
    first, row second: a crash in between leaves a row reconcile removes).
    Returns the region's name if it was removed."""
    held = user_of(db, vm_id)
    if held is None:
        return None
    db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (vm_id,))
    return _settle(db, held.region, shm_dir)


def _settle(db, name: str, shm_dir: Path) -> Optional[str]:
    """After a user left: remove an empty region, else refresh its header."""
    left = [u.vm_id for u in users(db, name)]
    size = regions(db).get(name)
    if left:
        if size is not None:
            try:
                write_header(name, size, left, shm_dir)
            except DriverError:
                pass  # a region file someone removed: reconcile says so
        return None
    remove_file(name, shm_dir)
    db.execute("DELETE FROM ivshmem_region WHERE name = ?", (name,))
    return name


def publish(db, name: str, shm_dir: Path = SHM_DIR, create: bool = False) -> None:
    """Write the region's header from the table (create: make the file)."""
    size = regions(db)[name]
    write_header(name, size, [u.vm_id for u in users(db, name)], shm_dir, create)


# -- reconcile -------------------------------------------------------------
class Change(NamedTuple):
    kind: str     # drop | attach | adopt | remove-region
    vm_id: int
    region: str
    why: str

    def __str__(self) -> str:
        return f"ivshmem {self.kind:13} {self.region} (VM {self.vm_id}): {self.why}"


def plan(db, live: dict[str, tuple[int, list[str]]], grace: float, now: float,
         busy: frozenset = frozenset(), abandoned: frozenset = frozenset()) -> list[Change]:
    """live: running domain name -> (vm id, our regions it has a device for)."""
    changes = []
    known = users(db)
    by_vm = {u.vm_id: u for u in known}
    for u in known:
        if u.vm_id in busy:
            continue
        age = now - u.since + (grace + 1 if u.vm_id in abandoned else 0)
        running = live.get(u.domain)
        if running is not None and u.region in running[1]:
            if u.state != "attached":
                changes.append(Change("attach", u.vm_id, u.region, "its domain has the device"))
        elif running is None and (u.state == "attached" or age > grace):
            changes.append(Change("drop", u.vm_id, u.region, f"domain {u.domain} not running"))
        elif running is not None and age > grace:
            changes.append(Change("drop", u.vm_id, u.region, f"domain {u.domain} runs without it"))
    for domain, (vm_id, names) in sorted(live.items()):
        for name in names:
            if vm_id not in busy and (vm_id not in by_vm or by_vm[vm_id].region != name):
                changes.append(Change("adopt", vm_id, name, f"running domain {domain} uses it"))
    dropped = {c.vm_id for c in changes if c.kind == "drop"}
    adopted = {c.region for c in changes if c.kind == "adopt"}
    in_use = {u.region for u in known if u.vm_id not in dropped} | adopted
    for name in regions(db):
        if name not in in_use:
            changes.append(Change("remove-region", -1, name, "no VM uses it"))
    return changes


def apply(db, changes: Iterable[Change], live: dict[str, tuple[int, list[str]]], now: float,
          shm_dir: Path = SHM_DIR, log=None) -> None:
    domains = {vm_id: d for d, (vm_id, _) in live.items()}
    touched = set()
    for c in changes:
        if c.kind == "attach":
            set_attached(db, c.vm_id, now)
        elif c.kind == "drop":
            db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (c.vm_id,))
            touched.add(c.region)
        elif c.kind == "adopt":
            uid, group = (int(x) for x in NAME.match(c.region).groups())
            if c.region not in regions(db):
                path = region_path(c.region, shm_dir)
                size = path.stat().st_size >> 20 if path.exists() else 0
                db.execute("INSERT INTO ivshmem_region VALUES (?,?,?,?,?)", (c.region, uid, group, size, now))
                if not size and log:
                    log("WARN", f"shared-memory region {path} of running VM {c.vm_id} is gone from "
                                f"/dev/shm; VMs joining it now would not share memory with it")
            db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
                       (c.vm_id, c.region, domains.get(c.vm_id, f"one-{c.vm_id}"), "attached", now))
            touched.add(c.region)
        elif c.kind == "remove-region":
            remove_file(c.region, shm_dir)
            db.execute("DELETE FROM ivshmem_region WHERE name = ?", (c.region,))
    for name in touched:
        if name in regions(db) and users(db, name):
            try:
                publish(db, name, shm_dir)
            except DriverError:
                pass
