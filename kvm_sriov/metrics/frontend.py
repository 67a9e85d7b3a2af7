"""The front-end's figures: the network hook's runs and failures, its last push
to the subnet manager and the partitions that push carried.

All from the status file the hook writes after each run
(frontend/network_hook.py, ``<state_dir>/network-hook.json``), read through the
hook's own reader; nothing here talks to oned or to the SM node. A machine
whose hook never ran has no such file and no front-end figures.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Optional

from ..config import Config
from ..frontend import network_hook


def read(cfg: Config) -> Optional[dict]:
    return network_hook.read_status(cfg.state_dir)


def _number(value) -> Optional[float]:
    """A figure of the status file: a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _pkey(value) -> Optional[str]:
    if isinstance(value, str):
        try:
            value = int(value, 16)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 0x7FFF:
        return None
    return f"0x{value:04x}"


def _drift_findings(drift) -> Optional[float]:
    """The findings of the hook's last drift check (every place's counts summed); None
    when there is none, or it could not read a place back (its exit 2: unknown, not 0)."""
    if not isinstance(drift, dict) or drift.get("exit_code") not in (0, 1):
        return None
    counts = drift.get("counts") if isinstance(drift.get("counts"), dict) else {}
    numbers = [_number(n) for place in counts.values() if isinstance(place, dict) for n in place.values()]
    return sum(n for n in numbers if n is not None)


def families(status: dict) -> list:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    out = [
        CounterMetricFamily("kvm_sriov_network_hook_runs", "Network hook runs that recorded an outcome "
                            "(partitions sent, unchanged, or a failure)", value=_number(status.get("runs")) or 0),
        CounterMetricFamily("kvm_sriov_network_hook_failures", "Network hook runs that failed (exit 1: oned, "
                            "a network or the SM node)", value=_number(status.get("failures")) or 0),
    ]
    when = _number(status.get("time"))
    if when is not None:
        out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_run_timestamp_seconds",
                                     "When the last recorded run started", value=when))
    out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_run_success",
                                 "1 when the last recorded run succeeded", value=int(status.get("ok") is True)))
    out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_sm_reload_success",
                                 "1 when the SM node took the last partitions file sent (0: it keeps an older one)",
                                 value=int(status.get("sm_ok") is True)))
    seconds, pushed = _number(status.get("sm_seconds")), _number(status.get("sm_time"))
    if seconds is not None:
        out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_sm_reload_duration_seconds",
                                     "How long the last successful push to the SM node took (validation, "
                                     "install, reload)", value=seconds))
    if pushed is not None:
        out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_sm_reload_timestamp_seconds",
                                     "When the last successful push to the SM node ended", value=pushed))
    found = _drift_findings(status.get("drift"))
    if found is not None:
        out.append(GaugeMetricFamily("kvm_sriov_network_hook_last_drift_findings",
                                     "What the check after the last push that changed the partitions found "
                                     "the SM side enforcing unlike oned (kvm-sriov partitions --check)",
                                     value=found))
    pkeys = status.get("pkeys") if isinstance(status.get("pkeys"), dict) else {}
    networks = Counter(k for k in map(_pkey, pkeys.values()) if k)
    given = status.get("members") if isinstance(status.get("members"), dict) else {}
    members = {k: int(n) for k, n in ((_pkey(k), _number(v)) for k, v in given.items())
               if k and n is not None}
    out.append(GaugeMetricFamily("kvm_sriov_partitions",
                                 "Partitions (PKeys) in the file the SM node took last, Default aside",
                                 value=len(set(networks) | set(members))))
    per_net = GaugeMetricFamily("kvm_sriov_partition_networks", "OpenNebula networks in a partition",
                                labels=["pkey"])
    for key, n in sorted(networks.items()):
        per_net.add_metric([key], n)
    per_member = GaugeMetricFamily("kvm_sriov_partition_members", "Port GUIDs a partition lists",
                                   labels=["pkey"])
    for key, n in sorted(members.items()):
        per_member.add_metric([key], n)
    return out + [per_net, per_member]
