"""The region files in /dev/shm and the host's header at their start.

The first HEADER_BYTES of a region are the host's: the VMs using it on this
host (the guest side publishes them: contextualization/ivshmem), rewritten
on every join and leave; guests use the bytes after it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterable

from .errors import DriverError, InputError
from .ivshmem import NAME

# libvirt hands QEMU /dev/shm/<name>: the region must be there, whatever the config
SHM_DIR = Path("/dev/shm")

# The host's header at the start of the region (little endian); guests use
# the bytes from HEADER_BYTES on.
HEADER_BYTES = 4096
MAGIC = b"KSRIVSHM"
VERSION = 1
_HEAD = struct.Struct("<8sIIIIQII")  # magic version generation header_bytes count size uid vmgroup
MAX_USERS = (HEADER_BYTES - _HEAD.size) // 4


def region_path(name: str, shm_dir: Path = SHM_DIR) -> Path:
    if not NAME.match(name):
        raise InputError(f"{name!r} is not a kvm-sriov shared-memory region")
    return shm_dir / name


def _open_region(name: str, shm_dir: Path) -> int:
    """/dev/shm is writable by everyone: never follow a link, never use a
    file someone else made (it could be read by them)."""
    path = region_path(name, shm_dir)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
    except OSError as exc:
        raise DriverError(f"shared-memory region {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o002 or not (st.st_mode & 0o170000 == 0o100000):
        os.close(fd)
        raise DriverError(f"shared-memory region {path} exists but was not made by this driver "
                          f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}); remove it")
    return fd


def write_header(name: str, size: int, users: Iterable[int], shm_dir: Path = SHM_DIR,
                 create: bool = False) -> None:
    """(Re)write the host's header. The file is made (sized) when missing:
    a region whose row is committed may not have its file yet (a join
    between another join's two transactions). create: a new region, so a
    file left by a crash is sized afresh."""
    uid, group = (int(x) for x in NAME.match(name).groups())
    ids = sorted(set(users))[:MAX_USERS]
    fd = _open_region(name, shm_dir)
    try:
        if create or os.fstat(fd).st_size == 0:  # QEMU runs as the driver's user or its group
            os.fchmod(fd, 0o660)
            os.ftruncate(fd, size * 1024 * 1024)
        old = os.pread(fd, _HEAD.size, 0)
        gen = _HEAD.unpack(old)[2] if len(old) == _HEAD.size and old[:8] == MAGIC else 0
        gen += 1 + (gen & 1)  # odd while being written (alone, first): a reader retries
        os.pwrite(fd, struct.pack("<I", gen), 12)
        body = struct.pack(f"<{len(ids)}I", *ids).ljust(HEADER_BYTES - _HEAD.size, b"\0")
        os.pwrite(fd, _HEAD.pack(MAGIC, VERSION, gen, HEADER_BYTES, len(ids), size << 20, uid, group), 0)
        os.pwrite(fd, body, _HEAD.size)
        os.pwrite(fd, struct.pack("<I", gen + 1), 12)
    finally:
        os.close(fd)


def read_header(data: bytes) -> dict:
    """The header as a dict (the tests and the guest side read it this way)."""
    magic, version, gen, hbytes, count, size, uid, group = _HEAD.unpack(data[:_HEAD.size])
    if magic != MAGIC:
        raise ValueError("no kvm-sriov ivshmem header")
    users = list(struct.unpack(f"<{count}I", data[_HEAD.size:_HEAD.size + 4 * count]))
    return {"version": version, "generation": gen, "header_bytes": hbytes, "size": size,
            "uid": uid, "vmgroup": group, "vms": users}


def remove_file(name: str, shm_dir: Path = SHM_DIR) -> None:
    region_path(name, shm_dir).unlink(missing_ok=True)
