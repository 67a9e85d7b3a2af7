"""OpenNebula VMM actions. ``main`` is what every script in vmm/kvm-sriov runs.

Actions about VFs are ours; any other action OpenNebula's kvm driver knows
(disks, snapshots, resize, context CD-ROM, ...) is handed to that driver.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

from .. import config as config_mod
from .. import opennebula
from ..errors import DriverError
from .delegate import Delegated, run_stock

# action -> module in this package; only the one that runs is imported, since
# every millisecond of start-up is paid by every OpenNebula action.
ACTIONS: dict[str, str] = {
    "deploy": "lifecycle", "shutdown": "lifecycle", "cancel": "lifecycle",
    "reboot": "lifecycle", "reset": "lifecycle",
    "save": "checkpoint", "restore": "checkpoint",
    "migrate": "migrate",
    "attach_nic": "nic", "detach_nic": "nic",
}


def action_function(action: str) -> Callable:
    return getattr(importlib.import_module(f".{ACTIONS[action]}", __name__), action)


def main(action: str, argv: Sequence[str], remotes_dir: Optional[Path] = None,
         stdin: Optional[TextIO] = None, host=None) -> int:
    """Run one action the OpenNebula way; returns the exit code."""
    try:
        data = opennebula.read_stdin(stdin)
        if action not in ACTIONS:
            if remotes_dir is None:
                raise DriverError(f"action {action!r} is not implemented by kvm-sriov")
            return run_stock(remotes_dir, action, argv, data)
        call = opennebula.parse_argv(action, argv)
        if host is None:
            from ..host import Host
            host = Host(config_mod.load(remotes_dir), remotes_dir=remotes_dir)
        try:
            result = action_function(action)(host, call, data)
        finally:
            host.close()
    except Delegated as handed:
        return handed.code
    except DriverError as exc:
        return opennebula.fail(str(exc))
    except Exception as exc:  # a bug: keep the reason short, the trace in the log
        import traceback  # only here: every import is start-up paid by every action
        opennebula.log("DEBUG", traceback.format_exc())
        return opennebula.fail(f"kvm-sriov {action}: internal error: {exc!r}")
    if result:
        print(result)
    sys.stdout.flush()
    return 0
