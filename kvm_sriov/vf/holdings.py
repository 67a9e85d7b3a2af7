"""The holdings file, ``<pool>.held``: what the committed VF pool holds (VF ->
VM, and the shared-memory regions with their sizes) as plain lines, for the
monitoring probe, which then does not load SQLite (about a fifth of its time).

pool.VfPool.transaction rewrites it under the pool lock whenever a
transaction changed a row: removed before the COMMIT, written after it, so a
file that is there is never older than the database. A missing or torn file
(a crash in between, a pool from an older version) sends the reader to the
database. Standard library only, and nothing that the probe would not load.
"""

from __future__ import annotations

import os

from ..errors import DriverError

SUFFIX = ".held"
HEADER = "kvm-sriov-holdings 1"
END = "end"

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Iterable, Optional


def path_of(db_path) -> str:
    return f"{db_path}{SUFFIX}"


def remove(db_path) -> None:
    """Before the COMMIT; DriverError when it cannot go (the transaction then rolls back)."""
    try:
        os.unlink(path_of(db_path))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DriverError(f"VF pool {path_of(db_path)}: {exc.strerror}") from None


def write(db_path, vfs: Iterable[tuple[str, int]], regions: Iterable[tuple[str, int]]) -> None:
    """After the COMMIT. A failure leaves no file (readers then read the
    database): never a reason to fail the action that committed."""
    path = path_of(db_path)
    tmp = f"{path}.tmp"
    lines = [HEADER] + [f"vf {vf} {vm}" for vf, vm in vfs] + [f"region {n} {mb}" for n, mb in regions]
    try:
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines + [END, ""]))
        os.replace(tmp, path)
    except OSError:
        for name in (tmp, path):
            try:
                os.unlink(name)
            except OSError:
                pass


def from_database(db) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(VF, VM) and (region, MB) rows from an open pool database (the writer's
    connection, or a reader's when the file is missing); sqlite3's errors
    are the caller's."""
    regions = []
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ivshmem_region'").fetchone():
        regions = db.execute("SELECT name, size_mb FROM ivshmem_region ORDER BY name").fetchall()
    return db.execute("SELECT vf, vm_id FROM assignment ORDER BY vf").fetchall(), regions


def read(db_path) -> Optional[tuple[dict[str, int], dict[str, int]]]:
    """(VF -> VM, region -> MB) from the file; None when it is missing or not whole."""
    try:
        with open(path_of(db_path)) as fh:
            lines = fh.read().split("\n")
    except OSError:
        return None
    if lines[0] != HEADER or lines[-2:] != [END, ""]:
        return None
    vfs: dict[str, int] = {}
    regions: dict[str, int] = {}
    try:
        for line in lines[1:-2]:
            kind, name, number = line.split(" ")
            {"vf": vfs, "region": regions}[kind][name] = int(number)
    except (KeyError, ValueError):
        return None
    return vfs, regions
