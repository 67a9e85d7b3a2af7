"""Replace a file whole: a reader sees the old content or the new, never a part.

The new content goes to a file made for this one write (a random name in the
same folder, created with O_EXCL and O_NOFOLLOW: a name planted in the folder,
a link above all, is never written through nor removed), which is then
renamed over the path. On any failure that file is removed and the path is
left as it was.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Optional, Union

from .errors import DriverError


def atomic_write(path: Union[str, os.PathLike], data: Union[bytes, str], *, mode: Optional[int] = None,
                 like: Optional[os.stat_result] = None, fsync: bool = False) -> None:
    """Replace ``path`` with ``data`` (a str is written as UTF-8).

    mode: the new file's permission bits, exactly (None: as open() makes a
    file, 0o666 less the umask). like: a stat of the file being replaced:
    the new one takes its permission bits and, when root writes, its owner
    and group. fsync: on disk before the rename. The rename replaces a link
    at ``path`` itself, never the file it points to."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.kvm-sriov.{secrets.token_hex(8)}")
    if isinstance(data, str):
        data = data.encode()
    if like is not None:
        mode = stat.S_IMODE(like.st_mode)
    # private until its mode is set (a mode of None: the umask decides, as for open())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if like is not None and os.geteuid() == 0:
                os.fchown(fh.fileno(), like.st_uid, like.st_gid)  # before fchmod: chown clears set-id bits
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_bounded(path, max_bytes: int, what: str = "") -> bytes:
    """At most ``max_bytes`` of a file someone named (pipes such as /dev/stdin
    too): DriverError, one line, when it cannot be read or is larger."""
    label = f"{what} {path}" if what else str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise DriverError(f"cannot read {label}: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise DriverError(f"{label} is larger than {max_bytes >> 20} MiB")
    return data
