"""OpenNebula VMM actions. ``main`` is what every script in vmm/kvm-sriov runs.

Every action is OpenNebula's own kvm script of the same name (delegate.py)
with the VF steps kvm-sriov owns around it; a call that has nothing to do
with VFs is handed to that script untouched, so such a VM behaves exactly as
under the stock kvm driver.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Optional, Sequence, TextIO

from .. import config as config_mod, opennebula
from ..errors import DriverError
from ..node.host import Host
from . import paths
from .delegate import Delegated, HandOver, finish, hand_over, read_sent

# action -> module in this package; only the one that runs is imported, since
# every millisecond of start-up is paid by every OpenNebula action. Any other
# action (reboot, disks, snapshots, exec, ...) leaves the VFs as they are.
ACTIONS: dict[str, str] = {
    "deploy": "lifecycle", "shutdown": "lifecycle", "cancel": "lifecycle",
    "save": "checkpoint", "restore": "checkpoint",
    "migrate": "migrate",
    "attach_nic": "nic", "detach_nic": "nic",
}


def action_module(action: str):
    return importlib.import_module(f".{ACTIONS[action]}", __name__)


def main(action: str, argv: Sequence[str], remotes_dir: Optional[Path] = None,
         stdin: Optional[TextIO] = None, host=None, replace_process=False) -> int:
    """Run one action the OpenNebula way; returns the exit code.
    replace_process: the caller is the action script's own process, which a
    call handed to the stock script becomes (delegate.finish)."""
    try:
        if action not in ACTIONS:
            remotes = remotes_dir if host is None else host.remotes_dir
            return hand_over(remotes, read_sent(action, argv, stdin))
        call = opennebula.parse_argv(action, argv)
        sent = read_sent(action, argv, stdin)
        cfg = host.config if host is not None else config_mod.load(remotes_dir)
        paths.check(action, call.args, call.vm_id,  # before anything runs
                    paths.datastores_of(cfg, sent=sent) if action in paths.PATH_ARGS else None)
        if host is None:
            host = Host(cfg, remotes_dir=remotes_dir)
        try:
            module = action_module(action)
            if not module.involves_vfs(host, call, sent):
                return hand_over(host.remotes_dir, sent)
            result = getattr(module, action)(host, call, sent)
        finally:
            host.close()
    except Delegated as handed:
        return handed.code
    except HandOver as handed:  # here, once the host is closed
        try:
            return finish(handed, replace_process)
        except (DriverError, OSError) as exc:  # no stock script to run: say so, as any failure
            return opennebula.fail(str(exc))
    except DriverError as exc:
        return opennebula.fail(str(exc))
    except Exception as exc:  # a bug: keep the reason short, the trace in the log
        import traceback  # here: only a bug needs it (~2 ms of every action)
        opennebula.log("DEBUG", traceback.format_exc())
        return opennebula.fail(f"kvm-sriov {action}: internal error: {exc!r}")
    if result:
        print(result)
    sys.stdout.flush()
    return 0
