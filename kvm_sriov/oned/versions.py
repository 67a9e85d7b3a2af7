"""Which OpenNebula the stock kvm scripts next to the driver belong to, and
whether kvm-sriov was tested with it. OpenNebula records its version in the
remotes (``<remotes>/VERSION``, e.g. ``7.4.0``; `onehost sync` compares it
with each host's copy); kvm-sriov's tested versions are in
``kvm_sriov/supported-opennebula.txt`` (the packages install it as
/usr/share/doc/<package>/supported-opennebula.txt too).

The driver only warns: the stock scripts may work unchanged in another
release, but nobody checked that they do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

SUPPORTED_FILE = Path(__file__).parent.parent / "supported-opennebula.txt"
_VERSION = re.compile(r"\A(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})?(?:[.~+-][A-Za-z0-9.]{1,40})?\Z")
_MAX_BYTES = 256  # OpenNebula's VERSION is one short line; never read more


def supported(path: Path = SUPPORTED_FILE) -> list[str]:
    """The tested major.minor versions, in file order."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def stock_version(remotes: Path) -> Optional[str]:
    """The version in ``remotes/VERSION``, or None when it is missing,
    unreadable or not a version (bounded: the file is never trusted)."""
    try:
        with open(Path(remotes) / "VERSION", "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return text if _VERSION.match(text) else None


def major_minor(version: str) -> Optional[str]:
    m = _VERSION.match(version)
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def is_supported(version: str, tested: Optional[list[str]] = None) -> bool:
    return major_minor(version) in (supported() if tested is None else tested)


def warning(remotes: Path, tested: Optional[list[str]] = None) -> Optional[str]:
    """One line when the stock kvm scripts in ``remotes`` are of a version
    kvm-sriov was not tested with (or their version cannot be told); None
    when they are of a tested one."""
    tested = supported() if tested is None else tested
    want = ", ".join(tested) or "none listed"
    version = stock_version(remotes)
    if version is None:
        return (f"kvm-sriov: cannot tell the OpenNebula version of the stock kvm scripts "
                f"({Path(remotes) / 'VERSION'} missing or not a version); kvm-sriov is tested with {want}")
    if is_supported(version, tested):
        return None
    return (f"kvm-sriov: the stock kvm scripts in {remotes} are OpenNebula {version}; kvm-sriov is tested "
            f"with {want} only: check the release notes before running VMs with it")
