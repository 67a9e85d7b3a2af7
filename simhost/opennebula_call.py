"""Run an installed action script exactly as OpenNebula 7.4's MAD does on a
host: through a shell stream, `cat << 'EOT' | <script> 'arg' ... <vmid> <host>`,
with the data and a newline as here-doc (see shared notes,
opennebula-observed-calls.md). Local (-l) actions get base64 on one line."""

from __future__ import annotations

import base64
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def reason(self) -> str:
        """What OpenNebula would show as the failure reason."""
        import re
        keep = [l for l in self.stderr.splitlines()
                if not re.match(r"^(ERROR|INFO|WARN|DEBUG):\s+(\d+)?\s*(.*)$", l)]
        return " ".join(keep)


def one_call(remotes: Path, action: str, args: list, vmid: int, host: str, stdin: str = "",
             env: Optional[dict] = None, local: bool = False, timeout: float = 600,
             wrapper: Sequence[str] = (), driver: str = "kvm-sriov") -> Result:
    """wrapper: a command the shell runs under (e.g. nsenter into a host);
    driver: the remotes/vmm/<driver> whose script runs."""
    script = remotes / "vmm" / driver / action
    quoted = " ".join(shlex.quote(str(a)) for a in args)
    payload = base64.b64encode(stdin.encode()).decode() if local else stdin + "\n"
    assert "\nEOT\n" not in payload
    stream = f"cat << 'EOT' | {script} {quoted} {vmid} {host}\n{payload}\nEOT\n"
    p = subprocess.run([*wrapper, "bash", "-s"], input=stream, capture_output=True, text=True,
                       env=env, timeout=timeout, cwd="/")
    return Result(p.returncode, p.stdout, p.stderr)
