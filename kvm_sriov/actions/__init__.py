"""OpenNebula VMM actions. ``main`` is what every script in vmm/kvm-sriov runs.

Actions about VFs are ours; any other action OpenNebula's kvm driver knows
(disks, snapshots, resize, context CD-ROM, ...) is handed to that driver.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

from .. import config as config_mod
from .. import opennebula
from ..errors import DriverError
from ..host import Host
from . import checkpoint, lifecycle, migrate, nic
from .delegate import Delegated, run_stock

Action = Callable[[Host, opennebula.Call, str], Optional[str]]

ACTIONS: dict[str, Action] = {
    "deploy": lifecycle.deploy,
    "shutdown": lifecycle.shutdown,
    "cancel": lifecycle.cancel,
    "reboot": lifecycle.reboot,
    "reset": lifecycle.reset,
    "save": checkpoint.save,
    "restore": checkpoint.restore,
    "migrate": migrate.migrate,
    "attach_nic": nic.attach_nic,
    "detach_nic": nic.detach_nic,
}


def main(action: str, argv: Sequence[str], remotes_dir: Optional[Path] = None,
         stdin: Optional[TextIO] = None, host: Optional[Host] = None) -> int:
    """Run one action the OpenNebula way; returns the exit code."""
    try:
        data = opennebula.read_stdin(stdin)
        if action not in ACTIONS:
            if remotes_dir is None:
                raise DriverError(f"action {action!r} is not implemented by kvm-sriov")
            return run_stock(remotes_dir, action, argv, data)
        call = opennebula.parse_argv(action, argv)
        host = host or Host(config_mod.load(remotes_dir), remotes_dir=remotes_dir)
        try:
            result = ACTIONS[action](host, call, data)
        finally:
            host.close()
    except Delegated as handed:
        return handed.code
    except DriverError as exc:
        return opennebula.fail(str(exc))
    except Exception as exc:  # a bug: keep the reason short, the trace in the log
        opennebula.log("DEBUG", traceback.format_exc())
        return opennebula.fail(f"kvm-sriov {action}: internal error: {exc!r}")
    if result:
        print(result)
    sys.stdout.flush()
    return 0
