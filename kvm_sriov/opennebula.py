"""OpenNebula's VMM driver protocol, as one_vmm_exec.rb speaks it (4.x-7.4).

- argv: the action's own arguments, then ``<vmid> <host>`` appended by the MAD.
- stdin: deploy gets the libvirt domain XML, the others the action XML
  (VMM_DRIVER_ACTION_DATA); actions run on the front-end (``-l``) get it
  base64-encoded on one line.
- exit 0: success, stdout is the reply (deploy: the deploy id).
- exit != 0: failure; stderr lines that do not look like
  ``ERROR|INFO|WARN|DEBUG: ...`` are joined into the reason, lines that do
  become LOG lines in the VM log.
"""

from __future__ import annotations

import base64
import re
import sys
from typing import NamedTuple, Optional, Sequence, TextIO

from .errors import InputError

# Arguments before the <vmid> <host> that the MAD appends to every action.
ACTION_ARGS: dict[str, tuple[str, ...]] = {
    "deploy": ("deployment_file", "host"),
    "shutdown": ("deploy_id", "host"),
    "cancel": ("deploy_id", "host"),
    "reboot": ("deploy_id", "host"),
    "reset": ("deploy_id", "host"),
    "save": ("deploy_id", "checkpoint_file", "host"),
    "restore": ("checkpoint_file", "host", "deploy_id"),
    "migrate": ("deploy_id", "dest_host", "src_host"),
    "attach_nic": ("deploy_id", "mac", "bridge", "model", "vn_mad", "target"),
    "detach_nic": ("deploy_id", "mac"),
}


# A host as OpenNebula names it (DNS name, IPv4, IPv6): it becomes an ssh
# argument and part of a qemu+ssh URI, so nothing else (no leading '-').
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
HOST_ARGS = ("host", "dest_host", "src_host")
MAX_STDIN_CHARS = 8 * 1024 * 1024  # the XML parser refuses more anyway
MAX_ID = 2**31 - 1  # oned's object IDs (VM, user, group, VM group, network) are int32

# What a message shows of a value a tenant chose (a PF selector, an attribute):
# enough to recognise it, never the whole of a 100k-character template value.
MAX_SHOWN = 64
# Every line that leaves the driver (failure reason, VM log): no word longer
# than MAX_WORD, no reason longer than MAX_MESSAGE, whichever step wrote it.
MAX_WORD = 100
MAX_MESSAGE = 2000
_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_WORD + 1))


def shown(value, limit: int = MAX_SHOWN) -> str:
    """``value`` as a message shows it: at most ``limit`` characters, its
    start and its end (a path's file name stays readable)."""
    text = str(value)
    if len(text) <= limit:
        return text
    tail = max(limit // 3, 1)
    return f"{text[:limit - tail - 3]}...{text[-tail:]}"


def bounded(text, limit: int = MAX_MESSAGE) -> str:
    """A message with every over-long word and its whole length cut down."""
    return shown(_LONG_WORD.sub(lambda m: shown(m.group(0), MAX_WORD), str(text)), limit)


def host_name(name: str, what: str = "host") -> str:
    if not HOST_NAME.fullmatch(name):
        raise InputError(f"<{what}> {shown(name)!r} is not a host name")
    return name


def vm_id(text: str, what: str = "<vmid>") -> int:
    """ASCII digits, at most 10 of them (str.isdigit() takes '\u0661\u0662' and '\u00b2')."""
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > MAX_ID:
        raise InputError(f"{what} must be a non-negative integer (a VM ID), got {shown(text)!r}")
    return int(text)


class Call(NamedTuple):
    action: str
    args: dict[str, str]
    vm_id: int
    host: str

    def __getattr__(self, name: str) -> str:
        try:
            return self.args[name]
        except KeyError:
            raise AttributeError(name) from None


def parse_argv(action: str, argv: Sequence[str]) -> Call:
    names = ACTION_ARGS[action]
    if len(argv) != len(names) + 2:
        usage = " ".join(f"<{n}>" for n in names + ("vmid", "host"))
        raise InputError(f"{action}: expected {len(names) + 2} arguments ({usage}), got {len(argv)}")
    values = dict(zip(names, argv))
    for name, value in values.items():
        if not value.strip():
            raise InputError(f"{action}: argument <{name}> is empty")
    vmid, host = argv[-2], argv[-1]
    for name in HOST_ARGS:
        if name in values:
            host_name(values[name], f"{action}: <{name}>")
    return Call(action, values, vm_id(vmid, f"{action}: <vmid>"), host_name(host, f"{action}: <host>"))


def read_stdin(stream: Optional[TextIO] = None) -> str:
    """stdin as text; decodes the base64 form local (-l) actions receive."""
    stream = stream or sys.stdin
    if stream is None or stream.isatty():
        return ""
    try:
        data = stream.read(MAX_STDIN_CHARS + 1)
    except UnicodeDecodeError:
        raise InputError("stdin is not UTF-8 text") from None
    if len(data) > MAX_STDIN_CHARS:
        raise InputError(f"stdin is larger than {MAX_STDIN_CHARS // (1024 * 1024)} MiB")
    data = data.strip()
    if not data or data.startswith("<"):
        return data
    try:
        decoded = base64.b64decode(data, validate=True).decode("utf-8").strip()
    except ValueError:  # not base64 (binascii.Error), not ASCII (a BOM, say), not UTF-8
        return data
    return decoded if decoded.startswith("<") else data


def log(level: str, message: str, stream: Optional[TextIO] = None) -> None:
    """A line OpenNebula copies into the VM log (level: INFO, WARN, ERROR, DEBUG)."""
    for line in str(message).splitlines() or [""]:
        print(f"{level}: {bounded(line)}", file=stream or sys.stderr)


LOG_LINE = re.compile(r"^(ERROR|INFO|WARN|DEBUG):\s+(\d+)?\s*(.*)$")


def reason_from_stderr(stderr: str) -> str:
    """The failure reason OpenNebula would take from a script's stderr."""
    return " ".join(l.strip() for l in stderr.splitlines() if l.strip() and not LOG_LINE.match(l))


def fail(reason: str, stream: Optional[TextIO] = None) -> int:
    """The failure reason OpenNebula shows: plain lines, no level prefix."""
    print(bounded(" ".join(str(reason).split())), file=stream or sys.stderr)
    return 1
