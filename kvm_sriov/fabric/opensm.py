"""opensm as the partition manager: partitions.conf on every SM node.

A fabric with standby SMs (opensm with priorities on two or more nodes)
needs the file on each of them: after a failover the standby enforces its
own copy. ``fabric.sm_nodes`` names them (master and standbys); each gets
the file on stdin of ``infiniband.sm_push_command`` with ``{node}`` replaced
by its name (``ssh ... {node} kvm-sriov partitions --install - --reload``:
there opensm validates it, it is installed when it differs, opensm reloaded
then). The pushes run side by side, each within ``sm_push_seconds``; one
node failing stops no other, and each node's result is reported.

Without ``fabric.sm_nodes`` it is the one SM node of before, byte for byte:
``sm_push_command`` as it is, or, when that is empty, this machine
(validated by the real opensm, ``partitions_file`` written, opensm
reloaded when it changed).

Read back (``enforced``): this machine's ``partitions_file``, or the output
of ``fabric.sm_read_command`` (``{node}`` replaced) for each node, side by side
as the pushes are. ``enforce(text, only)`` goes to the named nodes alone
(``kvm-sriov partitions --repair``: the nodes whose file differs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

from .. import files
from ..config import NODE
from ..errors import DriverError, InputError
from ..ib import opensm_check, partitions
from .base import Manager, Reading, Report, one_line, parse

MAX_ANSWER_BYTES = 64 * 1024            # the SM node says a line or two
MAX_FILE_BYTES = 256 * 1024 * 1024      # a partitions file read back (a large cloud, with room)
MAX_MESSAGE_LOCAL = 400                 # opensm's lines about a file it rejects


class OpenSM(Manager):
    name = "opensm"

    def __init__(self, cfg):
        self.cfg = cfg
        self.fix = ("make the SM node reachable (infiniband.sm_push_command) and opensm accept the file"
                    if not cfg.sm_nodes else
                    "make each failed SM node reachable (fabric.sm_nodes, infiniband.sm_push_command) and "
                    "opensm there accept the file")

    def targets(self) -> list[tuple[str, tuple[str, ...]]]:
        """(node, its push command); the node "" is the one SM node without fabric.sm_nodes."""
        cfg = self.cfg
        if not cfg.sm_nodes:
            return [("", tuple(cfg.sm_push_command))]
        return [(node, _for_node(cfg.sm_push_command, node)) for node in cfg.sm_nodes]

    def enforce(self, text: str, only: Optional[set[str]] = None) -> list[Report]:
        targets = [t for t in self.targets() if only is None or t[0] in only]
        return _each(targets, lambda target: self._push(*target, text))

    def missing(self) -> str:
        if any(push for _node, push in self.targets()):
            if not self.cfg.sm_read_command:
                return ("fabric.sm_read_command is empty: set it to print an SM node's partitions file, e.g. "
                        "[\"ssh\", \"-o\", \"BatchMode=yes\", \"--\", \"{node}\", \"cat\", "
                        "\"/etc/opensm/partitions.conf\"]")
            return ""
        if not opensm_check.available():    # this machine validates the file before installing it
            return f"cannot check partitions.conf with opensm: install {opensm_check.PACKAGES}"
        return ""

    def _push(self, node: str, command: tuple[str, ...], text: str) -> Report:
        try:
            return Report(node, True, install_here(self.cfg, text) if not command
                          else _send(command, self.cfg.sm_push_seconds, text))
        except DriverError as exc:
            return Report(node, False, str(exc))

    def enforced(self) -> list[Reading]:
        """Each node's file, read side by side (each within sm_push_seconds), in the order
        of fabric.sm_nodes."""
        return _each(self.targets(), lambda target: self._read(*target))

    def _read(self, node: str, push: tuple[str, ...]) -> Reading:
        try:
            if not push:
                text = _read_here(self.cfg.partitions_file)
            elif not self.cfg.sm_read_command:
                raise DriverError(f"fabric.sm_read_command is empty: the file on {node or 'the SM node'} "
                                  f"cannot be read back")
            else:
                command = _for_node(self.cfg.sm_read_command, node) if node else self.cfg.sm_read_command
                code, answer = run_bounded(command, self.cfg.sm_push_seconds, "", MAX_FILE_BYTES)
                if code != 0:
                    raise DriverError(f"{' '.join(command)} failed (exit {code}): "
                                      f"{one_line(' | '.join(answer.strip().splitlines()[-2:]))}")
                text = answer
            return Reading(node, parse(text))
        except (DriverError, InputError) as exc:
            return Reading(node, None, one_line(exc))


def _each(targets: list, work: Callable) -> list:
    """work(target) for each target, side by side when there are several (one slow node
    holds up no other), the results in the targets' order."""
    if len(targets) <= 1:
        return [work(t) for t in targets]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return list(pool.map(work, targets))


def _for_node(command: Sequence[str], node: str) -> tuple[str, ...]:
    return tuple(arg.replace(NODE, node) for arg in command)


# -- this machine is the SM node ------------------------------------------------------------
def install_here(cfg, text: str) -> str:
    """Validate (the real opensm), install and, when changed, reload; what was done,
    or DriverError (one line) with the file left as it was."""
    target = cfg.partitions_file
    try:
        changed = partitions.install(target, text)
    except DriverError as exc:
        raise DriverError(str(exc)[:MAX_MESSAGE_LOCAL]) from None
    except OSError as exc:
        raise DriverError(f"cannot write {target}: {exc.strerror}") from None
    if not changed:
        return f"{target} unchanged, no reload"
    partitions.reload_sm(cfg.sm_reload_command)
    return f"{target} written, opensm reloaded"


def _read_here(path: Path) -> str:
    return files.read_bounded(path, MAX_FILE_BYTES).decode("utf-8", "replace")


# -- an SM node reached through a command ------------------------------------------------
def _send(command: tuple[str, ...], seconds: float, text: str) -> str:
    code, answer = run_bounded(command, seconds, text, MAX_ANSWER_BYTES)
    shown = " ".join(command)
    lines = answer.strip().splitlines()
    if code != 0:
        raise DriverError(f"the SM node refused or could not be reached ({shown}, "
                          f"exit {code}): {one_line(' | '.join(lines[-2:]))}")
    return one_line(lines[-1]) if lines else "sent to the SM node"


def run_bounded(command: Sequence[str], seconds: float, text: str, limit: int) -> tuple[int, str]:
    """command with text on stdin: (exit code, what it said on stdout and stderr). It and
    what it started are killed after ``seconds``, or once it has said more than ``limit``
    bytes (DriverError)."""
    shown = " ".join(command)
    with tempfile.TemporaryFile() as given:   # no name: nobody else can open it
        given.write(text.encode())
        given.seek(0)
        try:
            proc = subprocess.Popen(list(command), stdin=given, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise DriverError(f"{command[0]}: {exc.strerror}") from None
    expired = threading.Event()

    def stop():
        expired.set()
        _kill_session(proc.pid)

    timer = threading.Timer(seconds, stop)
    timer.start()
    try:
        with proc.stdout:
            answer = proc.stdout.read(limit + 1)
        if len(answer) > limit:
            _kill_session(proc.pid)
        code = proc.wait()
    finally:
        timer.cancel()
    if expired.is_set():
        raise DriverError(f"the SM node did not answer in {seconds:.0f} s ({shown}): "
                          f"its partitions file is unchanged")
    if len(answer) > limit:
        raise DriverError(f"the SM node said more than {limit >> 10} KiB ({shown}): "
                          f"not an answer kvm-sriov gives, refused")
    return code, answer.decode("utf-8", "replace")


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already

