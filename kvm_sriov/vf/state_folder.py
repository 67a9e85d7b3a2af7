"""The state folder (``pool.state_dir``): the driver's user's alone.

What the driver keeps on a host lives there: the pool database and its
lock and checkpoint files, the VMs' locks, monitoring's rate limit,
the front-end's network-hook status. A user who could add names there could
plant a link under one of them that sends the driver user's writes to its
own files (its one_auth, its authorized_keys), or a FIFO that hangs whoever
reads it. So every opener goes through here:

- the folder must be the running user's (oneadmin's for actions and the
  probe; root's when root runs the CLI, which first becomes the folder's
  owner when that is another user: cli._as_state_owner) and writable by
  nobody else (no group or other write bit). The configured folder may be a
  link the administrator made (the folders above it are theirs, as for
  datastores: docs/conventions.md); a folder inside it may not.
- a file there is opened without following a link and without blocking,
  and used only when it is a regular file of the running user with no
  other name (a hard link would make writes land in that other file).
  SQLite opens its own files by name: :func:`check_files` looks at them
  first, and as nobody else can add names to the folder, they stay as seen.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import DriverError

FOLDER_MODE = 0o750
FILE_MODE = 0o640


class Untrusted(DriverError):
    """The folder or a file in it is not the driver user's alone."""


def _refuse_folder(folder, st: os.stat_result) -> None:
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        what = "a link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise Untrusted(f"state folder {folder} is {what}: remove it")
    if st.st_uid != me:
        raise Untrusted(f"state folder {folder} belongs to uid {st.st_uid}, not to uid {me} that runs "
                        f"the driver: chown {me} {folder} (or run as its owner)")
    if st.st_mode & 0o022:
        raise Untrusted(f"state folder {folder} is writable by group or others "
                        f"(mode {stat.S_IMODE(st.st_mode):o}): chmod go-w {folder}")


def check(folder) -> None:
    """Untrusted unless ``folder`` (the configured state folder) is the
    running user's directory that nobody else can write."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise DriverError(f"state folder {folder}: {exc.strerror}") from None
    _refuse_folder(folder, st)


def make(folder) -> None:
    """The configured state folder, made (mode 0750) when missing, then checked."""
    try:
        os.makedirs(folder, FOLDER_MODE, exist_ok=True)
    except OSError as exc:
        raise DriverError(f"state folder {folder}: {exc.strerror}") from None
    check(folder)


def subfolder(path, create: bool = True) -> bool:
    """A folder inside the (checked) state folder: never a link. False when
    it does not exist (and ``create`` is False)."""
    if create:
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DriverError(f"state folder {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise DriverError(f"state folder {path}: {exc.strerror}") from None
    _refuse_folder(path, st)
    return True


def _refuse_file(path, st: os.stat_result) -> None:
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        what = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise Untrusted(f"{path} is {what}: the driver only uses regular files there; remove it")
    if st.st_uid != me:
        raise Untrusted(f"{path} belongs to uid {st.st_uid}, not to uid {me} that runs the driver: "
                        f"chown {me} {path} or remove it")
    # 0 names: removed after it was looked up (sqlite deletes its journal at
    # each commit), no other file shares what is written to it
    if st.st_nlink > 1:
        raise Untrusted(f"{path} has {st.st_nlink} names (a hard link): remove it")


def open_file(path, flags: int, mode: int = FILE_MODE) -> int:
    """os.open for a file in the (checked) state folder: OSError as
    os.open raises it (FileNotFoundError without O_CREAT), Untrusted for a
    link, FIFO, device, another user's file or a hard link. O_TRUNC is
    applied only once the file is known to be ours."""
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
            _refuse_file(path, os.lstat(path))
        raise
    try:
        _refuse_file(path, os.fstat(fd))
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_files(*paths) -> None:
    """Untrusted unless each of ``paths`` is missing or a regular file of
    ours with one name (for files that another library opens by name)."""
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise DriverError(f"{path}: {exc.strerror}") from None
        _refuse_file(path, st)
