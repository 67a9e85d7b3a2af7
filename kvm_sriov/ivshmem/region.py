"""The region files in /dev/shm and the host's header at their start.

The first HEADER_BYTES of a region are the host's: the VMs using it on this
host (the guest side publishes them: contextualization/ivshmem), rewritten
on every join and leave; guests use the bytes after it.

Trust boundary: the whole region, header included, is inside the BAR every
guest of the group maps read-write. The host only ever writes the header,
from its own state (the pool's region table: size, owner, group, users,
generation); it never reads a byte of a region back.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path
from typing import Iterable, Optional

from ..errors import DriverError, InputError
from .device import MAX_ID, NAME

# device.PREFIX's region names begin so, then the owner uid (owner_of)
_NAME_HEAD = "kvm-sriov-ivshmem-u"

# libvirt hands QEMU /dev/shm/<name>: the region must be there, whatever the
# config. Read at each call, so tests can point it elsewhere.
SHM_DIR = Path("/dev/shm")

# The host's header at the start of the region (little endian); guests use
# the bytes from HEADER_BYTES on.
HEADER_BYTES = 4096
MAGIC = b"KSRIVSHM"
VERSION = 1
_HEAD = struct.Struct("<8sIIIIQII")  # magic version generation header_bytes count size uid vmgroup
MAX_USERS = (HEADER_BYTES - _HEAD.size) // 4
_WORD = 0xFFFFFFFF


class NotOurs(DriverError):
    """A file under a region's name that this driver did not make."""


def shm_dir(given: Optional[Path] = None) -> Path:
    return given if given is not None else SHM_DIR


def region_path(name: str, shm: Optional[Path] = None) -> Path:
    m = NAME.match(name)
    if not m or any(int(x) > MAX_ID for x in m.groups()):
        raise InputError(f"{name[:80]!r} is not a kvm-sriov shared-memory region")
    return shm_dir(shm) / name


def ours(st: os.stat_result, only_link: bool = True, uid: Optional[int] = None) -> bool:
    """Made by this driver (uid: the driver's user, default this process's):
    a regular file of its, not writable by others and (only_link) no other
    name for it (a hard link could give another group's name to this
    group's memory)."""
    return (stat.S_ISREG(st.st_mode) and st.st_uid == (os.geteuid() if uid is None else uid)
            and not st.st_mode & 0o002 and (st.st_nlink == 1 or not only_link))


def _open_region(path: Path, fresh: bool) -> int:
    """/dev/shm is writable by everyone: never follow a link, never use a
    file someone else made (it could be read by them). fresh: a new region,
    made here and now (O_EXCL), never a file that was there before."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if fresh else 0)
    try:
        fd = os.open(path, flags, 0o660)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ELOOP, errno.EACCES, errno.EPERM):
            raise NotOurs(f"shared-memory region {path} exists but was not made by this driver; "
                          f"remove it") from None
        raise DriverError(f"shared-memory region {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not ours(st):
        os.close(fd)
        raise NotOurs(f"shared-memory region {path} exists but was not made by this driver "
                      f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}, {st.st_nlink} links); "
                      f"remove it")
    return fd


def _reserve(fd: int, path: Path, size_mb: int) -> None:
    """All the region's pages now (tmpfs): a full /dev/shm refuses this join
    instead of a guest's first touch killing its QEMU (SIGBUS) later."""
    os.fchmod(fd, 0o660)  # QEMU runs as the driver's user or its group
    os.ftruncate(fd, size_mb << 20)
    try:
        os.posix_fallocate(fd, 0, size_mb << 20)
    except OSError as exc:
        raise DriverError(f"cannot reserve {size_mb} MB for shared-memory region {path.name} in "
                          f"{path.parent}: {exc.strerror}; make /dev/shm larger or the region smaller"
                          ) from None


def next_generation(generation: int) -> tuple[int, int]:
    """(odd while writing, even when done) after ``generation``, wrapping at 2^32."""
    base = generation & _WORD & ~1
    return (base + 1) & _WORD, (base + 2) & _WORD


def write_header(name: str, size_mb: int, users: Iterable[int], generation: int,
                 shm: Optional[Path] = None, fresh: bool = False) -> int:
    """(Re)write the host's header from host state only; returns the new
    generation (for the caller to keep). Total: every value is bounded
    before it is packed. A file that is missing is made; fresh: a new region
    (any file of ours under its name is a leftover and replaced)."""
    path = region_path(name, shm)
    uid, group = (int(x) for x in NAME.match(name).groups())
    ids = sorted({i for i in users if 0 <= i <= MAX_ID})[:MAX_USERS]
    odd, even = next_generation(generation)
    if fresh:
        remove_file(name, shm)
    fd = _open_region(path, fresh)
    try:
        try:
            if fresh or os.fstat(fd).st_size == 0:
                _reserve(fd, path, size_mb)
        except BaseException:
            os.unlink(path)  # just made by us: no half-made region stays
            raise
        os.pwrite(fd, struct.pack("<I", odd), 12)  # odd while being written (alone, first): a reader retries
        body = struct.pack(f"<{len(ids)}I", *ids).ljust(HEADER_BYTES - _HEAD.size, b"\0")
        os.pwrite(fd, _HEAD.pack(MAGIC, VERSION, odd, HEADER_BYTES, len(ids), size_mb << 20, uid, group), 0)
        os.pwrite(fd, body, _HEAD.size)
        os.pwrite(fd, struct.pack("<I", even), 12)
    finally:
        os.close(fd)
    return even


def read_header(data: bytes) -> dict:
    """The header as a dict (the tests read it this way; never the host)."""
    magic, version, gen, hbytes, count, size, uid, group = _HEAD.unpack(data[:_HEAD.size])
    if magic != MAGIC:
        raise ValueError("no kvm-sriov ivshmem header")
    count = min(count, MAX_USERS, (len(data) - _HEAD.size) // 4)
    users = list(struct.unpack(f"<{count}I", data[_HEAD.size:_HEAD.size + 4 * count]))
    return {"version": version, "generation": gen, "header_bytes": hbytes, "size": size,
            "uid": uid, "vmgroup": group, "vms": users}


def remove_file(name: str, shm: Optional[Path] = None) -> bool:
    """Remove the region's file if it is ours; False (left alone) if what
    has that name was not made by this driver. In the sticky /dev/shm no
    one else can swap a file of ours for another between look and unlink."""
    path = region_path(name, shm)
    try:
        if not ours(os.lstat(path), only_link=False):
            return False
        path.unlink()
    except FileNotFoundError:
        pass
    return True


def region_files(shm: Optional[Path] = None, uid: Optional[int] = None) -> dict[str, bool]:
    """Files in /dev/shm named like our regions -> made by this driver (uid)?"""
    out = {}
    try:
        entries = list(os.scandir(shm_dir(shm)))
    except OSError:
        return out
    for entry in entries:
        if NAME.match(entry.name):
            try:
                out[entry.name] = ours(entry.stat(follow_symlinks=False), uid=uid)
            except OSError:
                continue
    return dict(sorted(out.items()))


def shm_mb(shm: Optional[Path] = None) -> tuple[int, int]:
    """(size, free) of the file system the regions live in, in MB."""
    try:
        st = os.statvfs(shm_dir(shm))
    except OSError:
        return 0, 0
    return (st.f_blocks * st.f_frsize) >> 20, (st.f_bavail * st.f_frsize) >> 20


def host_budget_mb(max_host_mb: int, shm: Optional[Path] = None) -> int:
    """What all regions on this host may take together: the configured
    total, or (0) half of /dev/shm's size."""
    return max_host_mb if max_host_mb > 0 else shm_mb(shm)[0] // 2


def owner_budget_mb(max_owner_mb: int, host_mb: int) -> int:
    """What one owner's regions may take together on this host: the
    configured figure, or (0) half of the host's budget, so that no tenant
    can ever take all of it (docs/ivshmem.md)."""
    return max_owner_mb if max_owner_mb > 0 else host_mb // 2


def owner_of(name: str) -> Optional[int]:
    """The owner uid in a region's name (kvm-sriov-ivshmem-u<uid>-g<group>),
    None if the name is not one; by hand: the probe imports no re."""
    if not name.startswith(_NAME_HEAD):
        return None
    uid, sep, group = name[len(_NAME_HEAD):].partition("-g")
    ok = sep and all(0 < len(x) <= 10 and x.isascii() and x.isdigit() for x in (uid, group))
    return int(uid) if ok else None
