"""Access to sysfs below a configurable root.

Everything the driver learns about PCI devices goes through here, so tests
(and the benchmarks) point the root at a fake tree instead of /. ``at`` gives
plain string paths, for the scans that join hundreds of them. The one
thing written through here is the kernel's attributes that move a PF
passed through whole (whole_pf.py): every such write is write_attribute,
which the rung-1 fake kernel stands in for (tests/support/fake_sysfs.py).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterator, Optional

_HEX = frozenset("0123456789abcdef")


def _hex(text: str, n: int) -> bool:
    return len(text) == n and _HEX.issuperset(text)


def _is_pci_address(text: str) -> bool:
    """dddd:bb:ss.f in lower-case hex, function 0-7."""
    parts = text.split(":")
    if len(parts) != 3 or len(parts[2]) != 4 or parts[2][2] != "." or parts[2][3] not in "01234567":
        return False
    return _hex(parts[0], 4) and _hex(parts[1], 2) and _hex(parts[2][:2], 2)


def normalize_pci_address(text: str) -> Optional[str]:
    """'03:00.1' or '0000:03:00.1' (any case) -> '0000:03:00.1'; else None."""
    text = text.strip().lower()
    if _is_pci_address("0000:" + text):
        text = "0000:" + text
    return text if _is_pci_address(text) else None


class Sysfs:
    def __init__(self, root: os.PathLike | str = "/"):
        self._root = root
        self.top = os.path.join(os.fspath(root), "sys")

    @property
    def root(self) -> Path:
        return Path(self._root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    def at(self, *parts: str) -> str:
        """path() as a plain string."""
        return os.path.join(self.top, *parts)

    # -- generic attribute helpers -------------------------------------
    @staticmethod
    def read(path: os.PathLike | str) -> Optional[str]:
        return read_small(path, errors="strict")[0]  # garbage is the PF's error, as it always was

    @staticmethod
    def link_name(path: os.PathLike | str) -> Optional[str]:
        """Basename of a symlink's target (driver, iommu_group, physfn)."""
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    @staticmethod
    def write(path: os.PathLike | str, text: str) -> None:
        """One kernel attribute; OSError as the kernel answers it."""
        write_attribute(path, text)

    def read_int(self, path: os.PathLike | str, base: int = 10) -> Optional[int]:
        text = self.read(path)
        try:
            return int(text, base) if text is not None else None
        except ValueError:
            return None

    # -- PCI --------------------------------------------------------------
    def pci(self, address: str) -> Path:
        return self.path("bus", "pci", "devices", address)

    def pci_addresses(self) -> Iterator[str]:
        try:
            names = sorted(os.listdir(self.at("bus", "pci", "devices")))
        except OSError:
            return iter(())
        return iter(n for n in names if _is_pci_address(n))

    def iommu_group_members(self, group: str) -> tuple[str, ...]:
        try:
            return tuple(sorted(os.listdir(self.at("kernel", "iommu_groups", group, "devices"))))
        except OSError:
            return ()

    def listdir(self, path: os.PathLike | str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    # -- InfiniBand -------------------------------------------------------
    def ib_class(self, *parts: str) -> Path:
        return self.path("class", "infiniband", *parts)


def write_attribute(path: os.PathLike | str, text: str) -> None:
    """Write one kernel attribute (``sriov_numvfs``, a driver's ``unbind``,
    ``drivers_probe``): the file must already be there (never created) and
    is not followed if it is a symbolic link; the kernel's answer (EBUSY,
    ENOENT, ...) is the OSError raised."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


MAX_READ = 64 * 1024  # a sysfs attribute is one page; /proc/meminfo a few KiB


def read_small(path, limit: int = MAX_READ, errors: str = "replace") -> tuple[Optional[str], Optional[str]]:
    """(text, None), (None, None) when the file does not exist, or (None, why)
    for a file that is not what the kernel puts there. Never blocks: a FIFO
    or a device is refused after a non-blocking open, a link at the file
    itself is not followed, at most ``limit`` bytes are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "is a symbolic link (or a loop of them), not a file"
        return None, exc.strerror or str(exc)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
            return None, f"is {kind}, not a file"
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"holds more than {limit // 1024} KiB: not a kernel attribute"
    return data.decode("utf-8", errors).strip(), None
