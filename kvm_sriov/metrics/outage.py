"""Each VM's last live migration from this host: its InfiniBand outage, whole
and per phase, and when it ended.

From the records the migration's source keeps (node/outage.py,
``<state_dir>/migration-outage/vm-<id>.json``), read through that module's own
reader: read-only, a file that is not a well-formed record left out. A record
stays until the VM's next migration from this host, so the VMs that never
leave from here again (deleted, or gone for good) would keep their series for
ever: only records that ended within MAX_AGE_SECONDS are exported.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple, Optional

from ..config import Config
from ..node import outage

# A day: the last outage stays on the dashboard and in the alerts' reach through
# a night or a Prometheus down for hours, and the series end by themselves.
# Prometheus keeps their history (the dashboard's time range shows older ones).
MAX_AGE_SECONDS = 24 * 3600
MAX_HOST_NAME = 255     # the destination label: an OpenNebula host name


class MigrationOutage(NamedTuple):
    vm: int
    outcome: str            # migrated | back-on-source | without-vfs
    destination: str
    ended: float            # the source's wall clock
    seconds: float          # the whole outage
    phases: dict[str, float]  # node.outage.PHASES -> seconds; they add up to ``seconds``


def read(cfg: Config, now: Optional[float] = None) -> list[MigrationOutage]:
    """The recent records, by VM ID; none without their folder (no migration
    from here yet: nothing checked, nothing made). DriverError when the state
    folder, theirs or a record is not the driver user's alone (state_folder's
    rules), as for the pool."""
    if not os.path.lexists(os.path.join(cfg.state_dir, outage.FOLDER)):
        return []
    now = time.time() if now is None else now
    out = []
    for r in outage.migration_outages(cfg.state_dir):
        destination = r.get("destination")
        # a clock set back makes records from the future: no less doubtful than old ones
        if abs(now - r["ended"]) >= MAX_AGE_SECONDS or not _host_name(destination):
            continue
        out.append(MigrationOutage(r["vm_id"], r["outcome"], destination, float(r["ended"]),
                                   float(r["outage_seconds"]),
                                   {p: float(r[f"{p}_seconds"]) for p in outage.PHASES}))
    return out


def _host_name(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_HOST_NAME and value.isprintable()


def families(outages: list[MigrationOutage]) -> list:
    from prometheus_client.core import GaugeMetricFamily
    labels = ["vm", "outcome", "destination"]
    whole = GaugeMetricFamily("kvm_sriov_migration_outage_seconds",
                              "A VM's InfiniBand outage in its last live migration from this host: from its "
                              "VFs' unplug here until VFs were plugged again (there, or back here), or until the "
                              "driver gave up (outcome without-vfs)", labels=labels)
    phase = GaugeMetricFamily("kvm_sriov_migration_outage_phase_seconds",
                              "The same outage per phase (unplug, migration, plug); they add up to it",
                              labels=[*labels, "phase"])
    ended = GaugeMetricFamily("kvm_sriov_migration_outage_timestamp_seconds",
                              "When that outage ended (this host's clock)", labels=labels)
    for o in outages:
        key = [str(o.vm), o.outcome, o.destination]
        whole.add_metric(key, o.seconds)
        for name in outage.PHASES:
            phase.add_metric([*key, name], o.phases[name])
        ended.add_metric(key, o.ended)
    return [whole, phase, ended]
