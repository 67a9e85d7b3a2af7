"""Read-only access to sysfs below a configurable root.

Everything the driver learns about PCI devices goes through here, so tests
(and the benchmarks) point the root at a fake tree instead of /.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, Optional

PCI_ADDRESS = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
SHORT_PCI_ADDRESS = re.compile(r"^([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def normalize_pci_address(text: str) -> Optional[str]:
    """'03:00.1' or '0000:03:00.1' (any case) -> '0000:03:00.1'; else None."""
    text = text.strip().lower()
    if SHORT_PCI_ADDRESS.match(text):
        text = "0000:" + text
    return text if PCI_ADDRESS.match(text) else None


class Sysfs:
    def __init__(self, root: os.PathLike | str = "/"):
        self.root = Path(root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    # -- generic attribute helpers -------------------------------------
    @staticmethod
    def read(path: Path) -> Optional[str]:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    @staticmethod
    def link_name(path: Path) -> Optional[str]:
        """Basename of a symlink's target (driver, iommu_group, physfn)."""
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    def read_int(self, path: Path, base: int = 10) -> Optional[int]:
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
            names = sorted(os.listdir(self.path("bus", "pci", "devices")))
        except OSError:
            return iter(())
        return iter(n for n in names if PCI_ADDRESS.match(n))

    def iommu_group_members(self, group: str) -> tuple[str, ...]:
        try:
            return tuple(sorted(os.listdir(self.path("kernel", "iommu_groups", group, "devices"))))
        except OSError:
            return ()

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    # -- InfiniBand -------------------------------------------------------
    def ib_class(self, *parts: str) -> Path:
        return self.path("class", "infiniband", *parts)
