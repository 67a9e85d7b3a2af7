"""Who uses which shared-memory region on this host, in the pool's SQLite
database (tables ``ivshmem_region``, ``ivshmem_user``), changed inside pool
transactions (functions take ``txn.db``), and reconciled with libvirt.

A region file is made only after its row is committed and removed before
its row goes, so a crash leaves at most a row without a file, which
reconcile settles; never a file nobody knows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

from ..errors import DriverError, InputError
from .device import ATTRIBUTE, NAME, Request
from .region import region_path, remove_file, write_header

SCHEMA = """
CREATE TABLE IF NOT EXISTS ivshmem_region (
    name    TEXT PRIMARY KEY,          -- kvm-sriov-ivshmem-u<uid>-g<vmgroup>, a file in /dev/shm
    uid     INTEGER NOT NULL,
    vmgroup INTEGER NOT NULL,
    size_mb INTEGER NOT NULL,
    since   REAL NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,  -- the header's, kept here: guests can write the header
    made    INTEGER NOT NULL DEFAULT 1      -- 0: its file is still to be made (fresh)
);
CREATE TABLE IF NOT EXISTS ivshmem_user (
    vm_id   INTEGER PRIMARY KEY,       -- a VM uses one region at most
    region  TEXT NOT NULL,
    domain  TEXT NOT NULL,
    state   TEXT NOT NULL,             -- reserved | attached (as VFs, pool.py)
    since   REAL NOT NULL
);
"""
# columns added after the first release: (name, declaration) for ALTER TABLE
_ADDED = (("generation", "INTEGER NOT NULL DEFAULT 0"), ("made", "INTEGER NOT NULL DEFAULT 1"))


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
    have = {row[1] for row in db.execute("PRAGMA table_info(ivshmem_region)")}
    for column, declaration in _ADDED:
        if column not in have:
            db.execute(f"ALTER TABLE ivshmem_region ADD COLUMN {column} {declaration}")


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


class Budget(NamedTuple):
    """What regions may take on this host (config [ivshmem]; docs/ivshmem.md)."""
    max_region_mb: int
    max_host_mb: int     # all regions together
    max_owner_mb: int    # all regions of one owner (uid) together


def fits(request: Request, budget: Budget, used_mb: int = 0, owner_used_mb: int = 0) -> None:
    """Refuse a new region the host's budget, or its owner's share of it
    (owner_used_mb: what the owner's regions here take), has no room for."""
    if request.size_mb > budget.max_region_mb:
        raise InputError(f"{ATTRIBUTE}: SIZE {request.size_mb} MB is above this host's limit of "
                         f"{budget.max_region_mb} MB per region (ivshmem.max_region_mb)")
    if owner_used_mb + request.size_mb > budget.max_owner_mb:
        raise InputError(f"{ATTRIBUTE}: SIZE {request.size_mb} MB does not fit owner uid {request.uid}'s "
                         f"shared-memory budget on this host: {owner_used_mb} of {budget.max_owner_mb} MB "
                         f"in use by its regions (ivshmem.max_owner_mb)")
    if used_mb + request.size_mb > budget.max_host_mb:
        raise InputError(f"{ATTRIBUTE}: SIZE {request.size_mb} MB does not fit this host's shared-memory "
                         f"budget: {used_mb} of {budget.max_host_mb} MB in use (ivshmem.max_host_mb)")


def used_mb(db, uid: Optional[int] = None) -> int:
    """What the regions on this host take (uid: those of that owner)."""
    ensure_schema(db)
    sql, args = "SELECT COALESCE(SUM(size_mb), 0) FROM ivshmem_region", ()
    if uid is not None:
        sql, args = sql + " WHERE uid = ?", (uid,)
    return db.execute(sql, args).fetchone()[0]


def add_user(db, request: Request, vm_id: int, domain: str, now: Optional[float] = None,
             budget: Optional[Budget] = None) -> bool:
    """Record the VM as a user of its group's region (reserved); True when
    the region is new here (its file is to be made once this commits). A
    new region must fit the budget, its owner's share included (counted in
    this transaction); joining one that exists costs nothing."""
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
        if budget is not None:
            fits(request, budget, used_mb(db), used_mb(db, request.uid))
        db.execute("INSERT INTO ivshmem_region (name, uid, vmgroup, size_mb, since, generation, made) "
                   "VALUES (?,?,?,?,?,0,0)", (request.name, request.uid, request.vmgroup, request.size_mb, now))
    db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
               (vm_id, request.name, domain, "reserved", now))
    return row is None


def set_attached(db, vm_id: int, now: Optional[float] = None) -> None:
    ensure_schema(db)
    db.execute("UPDATE ivshmem_user SET state = 'attached', since = ? WHERE vm_id = ?",
               (time.time() if now is None else now, vm_id))


def drop_user(db, vm_id: int, shm: Optional[Path] = None, log=None) -> Optional[str]:
    """The VM leaves its region; the region goes with its last user (file
    first, row second: a crash in between leaves a row reconcile removes).
    Returns the region's name if it was removed. Never fails on the file:
    a file error is logged and left to reconcile."""
    held = user_of(db, vm_id)
    if held is None:
        return None
    db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (vm_id,))
    return _settle(db, held.region, shm, log)


def _say(log, level: str, message: str) -> None:
    if log is not None:
        log(level, message)


def _settle(db, name: str, shm: Optional[Path], log) -> Optional[str]:
    """After a user left: remove an empty region, else refresh its header."""
    if users(db, name):
        if name in regions(db):
            try:
                publish(db, name, shm)
            except (DriverError, OSError) as exc:  # a region file someone removed or replaced
                _say(log, "WARN", f"shared-memory region {name}: header not rewritten: {exc}")
        return None
    return remove_region(db, name, shm, log)


def remove_region(db, name: str, shm: Optional[Path] = None, log=None) -> Optional[str]:
    """File (if ours) first, then the row. A file someone else made under
    the name is not ours: left alone, and the row goes all the same; any
    other error keeps the row for the next reconcile."""
    try:
        mine = remove_file(name, shm)
    except InputError:  # a row no region can have (IDs out of range): nothing to remove
        mine = True
    except OSError as exc:
        _say(log, "WARN", f"could not remove shared-memory region {name}: {exc.strerror}; "
                          f"reconcile tries again")
        return None
    if not mine:
        _say(log, "WARN", f"{region_path(name, shm)} was not made by this driver: left alone, "
                          f"no longer a region of ours (kvm-sriov doctor lists such files)")
    db.execute("DELETE FROM ivshmem_region WHERE name = ?", (name,))
    return name


def publish(db, name: str, shm: Optional[Path] = None) -> None:
    """Write the region's header from the tables (the file is made if the
    region is new, or missing); its generation is kept in the table."""
    ensure_schema(db)
    size, generation, made = db.execute("SELECT size_mb, generation, made FROM ivshmem_region "
                                        "WHERE name = ?", (name,)).fetchone()
    generation = write_header(name, size, [u.vm_id for u in users(db, name)], generation, shm,
                              fresh=not made)
    db.execute("UPDATE ivshmem_region SET generation = ?, made = 1 WHERE name = ?", (generation, name))


# -- reconcile -------------------------------------------------------------
class Change(NamedTuple):
    kind: str     # drop | attach | adopt | remove-region
    vm_id: int
    region: str
    why: str

    def __str__(self) -> str:
        return f"ivshmem {self.kind:13} {self.region} (VM {self.vm_id}): {self.why}"


def plan(db, live: dict[str, tuple[int, dict[str, int]]], grace: float, now: float,
         busy: frozenset = frozenset(), abandoned: frozenset = frozenset()) -> list[Change]:
    """live: running domain name -> (vm id, {region: size in MB}: the regions
    its own record names and it has a device for; see ivshmem_host)."""
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


def apply(db, changes: Iterable[Change], live: dict[str, tuple[int, dict[str, int]]], now: float,
          shm: Optional[Path] = None, log=None) -> None:
    """live: running domain -> (vm id, {region: size in MB} its record names).
    A region's file error never stops the other changes: logged, and the
    next reconcile tries again."""
    domains = {vm_id: d for d, (vm_id, _) in live.items()}
    sizes = {name: size for _, named in live.values() for name, size in named.items()}
    touched = set()
    for c in changes:
        try:
            _apply_one(db, c, domains, sizes, touched, now, shm, log)
        except (DriverError, OSError) as exc:
            _say(log, "WARN", f"{c}: not done ({exc}); the next reconcile tries again")
    for name in sorted(touched):
        if name in regions(db) and users(db, name):
            try:
                publish(db, name, shm)
            except (DriverError, OSError) as exc:
                _say(log, "WARN", f"shared-memory region {name}: header not rewritten: {exc}")


def _apply_one(db, c: Change, domains: dict, sizes: dict, touched: set, now: float,
               shm: Optional[Path], log) -> None:
    if c.kind == "attach":
        set_attached(db, c.vm_id, now)
    elif c.kind == "drop":
        db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (c.vm_id,))
        touched.add(c.region)
    elif c.kind == "adopt":
        path = region_path(c.region, shm)
        uid, group = (int(x) for x in NAME.match(c.region).groups())
        if c.region not in regions(db):
            db.execute("INSERT INTO ivshmem_region (name, uid, vmgroup, size_mb, since, generation, made) "
                       "VALUES (?,?,?,?,?,0,1)", (c.region, uid, group, sizes.get(c.region, 0), now))
            if not os.path.lexists(path):
                _say(log, "WARN", f"shared-memory region {path} of running VM {c.vm_id} is gone from "
                                  f"/dev/shm; VMs joining it now would not share memory with it")
        db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
                   (c.vm_id, c.region, domains.get(c.vm_id, f"one-{c.vm_id}"), "attached", now))
        touched.add(c.region)
    elif c.kind == "remove-region":
        remove_region(db, c.region, shm, log)
