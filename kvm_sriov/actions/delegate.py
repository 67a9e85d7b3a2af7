"""Everything that is not about VFs is OpenNebula's own kvm driver's job
(disks, snapshots, resize, context CD-ROM, plain NICs): run its script,
which sits next to ours in the remotes, with the same arguments and input."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import DriverError
from ..opennebula import Call

if TYPE_CHECKING:  # importing the host costs every delegated action ~60 ms
    from ..host import Host


def stock_kvm_script(remotes: Path, action: str) -> Path:
    script = remotes / "vmm" / "kvm" / action
    if not os.access(script, os.X_OK):
        raise DriverError(f"{action}: OpenNebula's kvm driver script {script} is missing; "
                          f"kvm-sriov hands this action to it")
    return script


def run_stock(remotes: Path, action: str, argv, stdin: str) -> int:
    """Run the stock script; its stdout and stderr are passed straight on."""
    sys.stdout.flush()
    import subprocess  # only for delegated actions
    return subprocess.run([str(stock_kvm_script(remotes, action)), *argv],
                          input=stdin + "\n" if stdin else None, text=True).returncode


class Delegated(Exception):
    """Raised to hand a call to the stock driver with its exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def stock_kvm(host: "Host", call: Call, stdin: str):
    remotes = host.remotes_dir
    if remotes is None:
        raise DriverError(f"{call.action}: not ours and the remotes directory is unknown")
    argv = [*call.args.values(), str(call.vm_id), call.host]
    raise Delegated(run_stock(remotes, call.action, argv, stdin))
