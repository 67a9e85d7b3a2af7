"""OpenNebula VMM actions. ``main`` is what every script in vmm/kvm-sriov runs."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

from .. import config as config_mod
from .. import opennebula
from ..errors import DriverError
from ..host import Host
from . import lifecycle

Action = Callable[[Host, opennebula.Call, str], Optional[str]]

ACTIONS: dict[str, Action] = {
    "deploy": lifecycle.deploy,
    "shutdown": lifecycle.shutdown,
    "cancel": lifecycle.cancel,
    "reboot": lifecycle.reboot,
    "reset": lifecycle.reset,
}


def main(action: str, argv: Sequence[str], remotes_dir: Optional[Path] = None,
         stdin: Optional[TextIO] = None, host: Optional[Host] = None) -> int:
    """Run one action the OpenNebula way; returns the exit code."""
    try:
        if action not in ACTIONS:
            raise DriverError(f"action {action!r} is not implemented by kvm-sriov")
        call = opennebula.parse_argv(action, argv)
        host = host or Host(config_mod.load(remotes_dir))
        try:
            result = ACTIONS[action](host, call, opennebula.read_stdin(stdin))
        finally:
            host.close()
    except DriverError as exc:
        return opennebula.fail(str(exc))
    except Exception as exc:  # a bug: keep the reason short, the trace in the log
        opennebula.log("DEBUG", traceback.format_exc())
        return opennebula.fail(f"kvm-sriov {action}: internal error: {exc!r}")
    if result:
        print(result)
    sys.stdout.flush()
    return 0
