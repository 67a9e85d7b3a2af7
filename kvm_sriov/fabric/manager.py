"""The partition manager: whatever makes the fabric enforce the partitions.

kvm-sriov's desired partitions are one text, opensm's ``partitions.conf`` as
``ib/partitions.render`` makes it from oned's networks (the network hook and
``kvm-sriov partitions`` render it; base.parse reads it). A manager
takes that text and makes the subnet manager enforce it (``enforce``: one
report per place it went to), and reads back what it enforces now
(``enforced``: for a later drift check). ``for_config`` picks the backend
from ``[fabric] manager``; nobody else knows which one runs:

- ``opensm`` (fabric/opensm.py): the file validated by opensm and installed on
  every SM node (master and standbys), opensm reloaded where it changed;
- ``ufm`` (fabric/ufm.py): PKeys and their GUID members through UFM's REST API.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError, DriverError
from .base import Manager, Report
from .opensm import OpenSM
from .ufm import UFM


def for_config(cfg) -> Manager:
    """The configured backend (nothing is contacted or read yet)."""
    if cfg.fabric_manager == "opensm":
        return OpenSM(cfg)
    if cfg.fabric_manager == "ufm":
        return UFM(cfg)
    raise ConfigError(f"fabric.manager {cfg.fabric_manager!r} is neither opensm nor ufm")


def summary(reports: Sequence[Report]) -> str:
    """One line: the one place's message (after its name, unless it names it), or each
    place's, the failed first."""
    if len(reports) == 1:
        r = reports[0]
        return r.message if not r.where or r.message.startswith(r.where) else f"{r.where}: {r.message}"
    failed = [r for r in reports if not r.ok]
    said = "; ".join(f"{r.where}: {r.message}" for r in failed + [r for r in reports if r.ok])
    if failed:
        return f"{len(failed)} of {len(reports)} failed ({', '.join(r.where for r in failed)}): {said}"
    return said


def enforce(cfg, text: str) -> str:
    """The configured manager enforces ``text``: what was done (one line), or
    DriverError naming each place that failed and why (the others went on)."""
    reports = for_config(cfg).enforce(text)
    line = summary(reports)
    if not all(r.ok for r in reports):
        raise DriverError(line)
    return line
