"""The InfiniBand outage of a VM in one live migration, as the source host
that drives it measures it (actions/migrate.py): from the start of the VF
unplug on the source until a VF is plugged again, on the destination or,
after a failure, back on the source. It goes to the VM log as one line and
stays, the VM's last, in the state folder:

    <state_dir>/migration-outage/vm-<id>.json

for whoever reports it (a metrics exporter: :func:`migration_outages`).
Only a migration of a VM with VFs imports this module.
"""

from __future__ import annotations

import json
import os
import time

from ..domain import hotplug
from ..errors import DriverError
from ..files import atomic_write
from ..opennebula import log
from ..vf import state_folder
from .vm import running_domain

FOLDER = "migration-outage"
MAX_BYTES = 4096  # a record is ~300 bytes
OUTCOMES = ("migrated", "back-on-source", "without-vfs")
PHASES = ("unplug", "migration", "plug")


class Outage:
    """Timed on the source's monotonic clock alone, so no two hosts' clocks
    are ever compared: the plug on the destination is its attach's round trip
    from the source (ssh, the peer's start, the hot-plug, and GUIDs only where
    its reserve could not set them; and what follows the confirmed plug there,
    its pool update and answer: some ms too many). The destination's own
    durations, timed on its clock, come back in its answers and are kept
    beside: its pre-warm at reserve (prewarm: the VFs bound to vfio-pci and
    given their GUIDs, before the outage), its GUID programming and hot-plug
    at attach. The unplug starts when this is made."""

    def __init__(self, host, call, prewarm=None):
        self.host, self.call = host, call
        self.prewarm = prewarm
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.phase = 0  # index in PHASES of the phase in progress
        self.mark = time.monotonic()
        self.over = False

    def lap(self) -> None:
        """The phase in progress is over; the next one starts."""
        now = time.monotonic()
        self.seconds[PHASES[self.phase]] += now - self.mark
        self.mark, self.phase = now, min(self.phase + 1, len(PHASES) - 1)

    def failed(self) -> None:
        """The migration failed in the phase in progress: from now until the
        VFs are back on the source is the plug."""
        if PHASES[self.phase] != "plug":
            self.lap()
            self.phase = PHASES.index("plug")

    def undone(self, dom, held) -> None:
        """An undo step, unwound after the VFs' own (node/vm.py: vfs_back):
        the outcome is what the domain holds here now."""
        self.failed()
        try:
            back = (running_domain(self.host, self.call.deploy_id) is not None
                    and {a.vf.address for a in held} <= hotplug.present(dom))
        except Exception:  # libvirt cannot say either: the VFs are not known to be back
            back = False
        self.end("back-on-source" if back else "without-vfs")

    def end(self, outcome: str, destination=None) -> None:
        """The outage is over (migrated, back-on-source) or the driver has
        given up (without-vfs): the VM log's line, then the record.
        destination: the destination's attach answer, if any."""
        if self.over:
            return
        self.over = True
        self.lap()  # the plug
        record = {"vm_id": self.call.vm_id, "outcome": outcome, "source": self.call.src_host,
                  "destination": self.call.dest_host, "ended": round(time.time(), 3),
                  "outage_seconds": round(sum(self.seconds.values()), 3),
                  **{f"{p}_seconds": round(s, 3) for p, s in self.seconds.items()}}
        said = {**(destination if isinstance(destination, dict) else {}), "prewarm_seconds": self.prewarm}
        for key in ("prewarm_seconds", "guid_seconds", "hotplug_seconds"):  # what the destination timed, if it said
            value = said.get(key)
            if _seconds(value, 1e6):
                record[f"destination_{key}"] = round(value, 3)
        log("ERROR" if outcome == "without-vfs" else "INFO", line(record))
        try:
            keep(self.host.config.state_dir, self.call.vm_id, record)
        except Exception as exc:  # the figure is lost, never the steps after it (the release)
            log("WARN", f"could not keep the migration outage of VM {self.call.vm_id}: "
                        f"{exc if isinstance(exc, (DriverError, OSError)) else repr(exc)}")


def line(record: dict) -> str:
    """The VM log's line for an outage record."""
    text = (f"kvm-sriov: IB outage {record['outage_seconds']:.2f} s (unplug {record['unplug_seconds']:.2f} s, "
            f"migration {record['migration_seconds']:.2f} s, plug {record['plug_seconds']:.2f} s)")
    if record["outcome"] == "back-on-source":
        text += f", migration failed: VFs back on {record['source']}"
    elif record["outcome"] == "without-vfs":
        text += ", migration failed: the VM is still without its VFs"
    return text


def keep(state_dir, vm_id: int, record: dict) -> None:
    """``record`` becomes the VM's last migration outage, replaced whole
    (state_folder's rules: the folder and the file are the driver user's alone)."""
    folder = os.path.join(state_dir, FOLDER)
    state_folder.check(state_dir)
    state_folder.subfolder(folder)
    path = os.path.join(folder, f"vm-{vm_id}.json")
    state_folder.check_files(path)
    atomic_write(path, json.dumps(record, sort_keys=True), mode=state_folder.FILE_MODE)


def migration_outages(state_dir) -> list[dict]:
    """Every VM's last migration outage recorded on this host, by VM ID;
    read-only. A file that is not a well-formed record is left out."""
    folder = os.path.join(state_dir, FOLDER)
    state_folder.check(state_dir)
    if not state_folder.subfolder(folder, create=False):
        return []
    with os.scandir(folder) as entries:
        names = sorted((int(e.name[3:-5]), e.name) for e in entries if _record_name(e.name))
    out = []
    for vm_id, name in names:
        try:
            fd = state_folder.open_file(os.path.join(folder, name), os.O_RDONLY)
        except FileNotFoundError:  # replaced or gone meanwhile
            continue
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
        try:
            record = json.loads(data) if len(data) <= MAX_BYTES else None
        except (ValueError, RecursionError):
            record = None
        if _well_formed(record, vm_id):
            out.append(record)
    return out


def _record_name(name: str) -> bool:
    """vm-<VM ID>.json (keep's names; not its temporary files)."""
    digits = name[3:-5]
    return (name.startswith("vm-") and name.endswith(".json") and 0 < len(digits) <= 10
            and digits.isascii() and digits.isdigit())


def _seconds(value, limit: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < limit


def _well_formed(record, vm_id: int) -> bool:
    return (isinstance(record, dict) and record.get("vm_id") == vm_id and record.get("outcome") in OUTCOMES
            and _seconds(record.get("ended"), 1e11)
            and all(_seconds(record.get(f"{p}_seconds"), 1e9) for p in ("outage", *PHASES)))
