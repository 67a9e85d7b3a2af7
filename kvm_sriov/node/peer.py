"""The driver on the other end of a live migration.

The source host drives the migration (OpenNebula runs `migrate` there) but
VFs must be reserved, and later attached, on the destination by the
destination's own pool. The source runs ``kvm-sriov-peer`` there through
``migration.peer_command`` (ssh in production: OpenNebula hosts already
trust each other for migrations) and reads one JSON document back. What
runs there is kvm_sriov/actions/peer.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Sequence

from .. import opennebula
from ..config import Config
from ..domain import domain_xml
from ..errors import DriverError, InputError

SAFE_ARG = re.compile(r"[A-Za-z0-9._:][A-Za-z0-9._:-]*")  # what crosses ssh unquoted (fullmatch)


class Peer:
    """The destination, as seen from the source."""

    def __init__(self, config: Config, host_name: str):
        self.config = config
        self.host_name = opennebula.host_name(host_name, "destination host")

    def _run(self, args: Sequence[str], payload: object = None) -> object:
        for a in args:
            if not SAFE_ARG.fullmatch(a):
                raise InputError(f"refusing to pass {a!r} to {self.host_name}")
        cmd = [a.replace("{host}", self.host_name) for a in self.config.peer_command]
        cmd += [f"{self.config.peer_remotes}/vmm/kvm-sriov/kvm-sriov-peer", *args]
        try:
            p = subprocess.run(cmd, input=json.dumps(payload), capture_output=True, text=True,
                               timeout=self.config.hotplug_seconds + 120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DriverError(f"cannot run kvm-sriov on {self.host_name}: {exc}") from None
        self._relay_log(p.stderr)
        if p.returncode != 0:
            reason = opennebula.reason_from_stderr(p.stderr) or f"exit {p.returncode}"
            raise DriverError(f"on {self.host_name}: {reason}")
        try:
            return json.loads(p.stdout or "null")
        except json.JSONDecodeError:
            raise DriverError(f"unexpected answer from {self.host_name}: {p.stdout[:200]!r}") from None

    def _relay_log(self, stderr: str) -> None:
        """The peer's log lines go to this action's log, so the VM log shows
        what happened on the destination too (reservation, plug times)."""
        for line in stderr.splitlines():
            m = opennebula.LOG_LINE.match(line)
            if m:
                opennebula.log(m.group(1), f"{self.host_name}: {m.group(3)}")

    def reserve(self, vm_id: int, domain: str, records: Sequence[domain_xml.NicRecord],
                numa_nodes=None, numa_policy: str = "ignore", carried=None, guid_spaces=None) -> list[dict]:
        """numa_*: the VM's NUMA wish (its nodes, its policy); carried: the IB
        traffic totals oned shows for it (traffic.known_totals); guid_spaces:
        MAC -> the network its GUIDs are derived with (the domain's record),
        so the destination sets them before the outage (node/prewarm.py). All
        in each NIC's entry, so an older destination, which ignores them,
        still answers. The answer: one entry per VF, each with the
        destination's pre-warm seconds (prewarm_seconds; none from an older
        destination)."""
        wish = {"numa_nodes": sorted(numa_nodes) if isinstance(numa_nodes, frozenset) else None,
                "numa_policy": numa_policy, "ib_traffic": list(carried) if carried else None}
        return self._run(["reserve", str(vm_id), domain],
                         [{"mac": r.mac, "bridge": r.bridge, **wish,
                           **({"guid_space": guid_spaces.get(r.mac)} if guid_spaces is not None else {})}
                          for r in records])

    def attach(self, vm_id: int, domain: str) -> object:
        """The destination's answer: how long its GUIDs and hot-plug took
        there (actions/peer.py: _attach; null from an older destination)."""
        return self._run(["attach", str(vm_id), domain])

    def release(self, vm_id: int) -> None:
        self._run(["release", str(vm_id)])

    def ivshmem_join(self, vm_id: int, domain: str) -> None:
        self._run(["ivshmem-join", str(vm_id), domain])
