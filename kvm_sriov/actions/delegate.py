"""OpenNebula's own kvm driver does the hypervisor work of every action:
its script, installed next to ours (remotes/vmm/kvm/<action>), runs exactly
as OpenNebula would run it (same argv, stdin bytes, working directory and
environment; it reads kvmrc itself). kvm-sriov only adds the VF steps around
it, and a call that has nothing to do with VFs is handed over untouched."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from .. import opennebula
from ..domain import domain_xml
from ..domain.domain_xml import MAX_XML_CHARS
from ..errors import DriverError, InputError


class Sent:
    """What OpenNebula sent: the action, its argv and stdin as bytes
    (None when stdin is a terminal or closed: the stock scripts test that).
    Its text and the XML document in it are read once per call, shared by
    every reader (the path check, involves_vfs, the action); derived holds
    what an action read for the call beside it (deploy: vm.xml)."""

    __slots__ = ("action", "argv", "raw", "derived", "_text", "_document")

    def __init__(self, action: str, argv: tuple, raw: Optional[bytes]):
        self.action, self.argv, self.raw = action, argv, raw
        self.derived: dict = {}
        self._text: Optional[str] = None
        self._document = None

    @property
    def text(self) -> str:
        """stdin as the driver reads it (base64 of local actions decoded)."""
        if self._text is None:
            self._text = self._decoded()
        return self._text

    def _decoded(self) -> str:
        if not self.raw:
            return ""
        try:
            return opennebula.read_stdin(io.StringIO(self.raw.decode("utf-8")))
        except UnicodeDecodeError:
            raise InputError(f"{self.action}: stdin is not UTF-8 text") from None

    def document(self, what: str):
        """The XML in stdin (the deployment file, the action XML), parsed by
        domain_xml.parse (its limits) on the first call, the same element
        tree after; what names it in an error (a refused document is not
        kept: the next reader refuses it in its own words)."""
        if self._document is None:
            self._document = domain_xml.parse(self.text, what)
        return self._document

    def raw_is_text(self) -> bool:
        """Does parsing raw (as the path check does, before anything reads
        the text) give exactly what parsing the text gives? Yes when raw is
        the text's own UTF-8 bytes but for ASCII white space around it, not
        base64, no XML declaration (which may name another encoding) or byte
        order mark, within the parser's size limit counted in bytes."""
        if not self.raw or len(self.raw) > MAX_XML_CHARS:
            return False
        start = self.raw.lstrip()[:2]
        if start[:1] != b"<" or start == b"<?":  # cheap, and the text is then never base64
            return False
        try:
            text = self.text
        except InputError:
            return False
        return self.raw.strip() == text.encode()


def read_sent(action: str, argv: Sequence[str], stream=None) -> Sent:
    stream = sys.stdin if stream is None else stream
    if stream is None or stream.closed or stream.isatty():
        return Sent(action, tuple(argv), None)
    data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
    return Sent(action, tuple(argv), data.encode() if isinstance(data, str) else data)


class StockResult(NamedTuple):
    code: int
    stdout: str  # only when captured


def stock_kvm_script(remotes: Optional[Path], action: str) -> Path:
    if remotes is None:
        raise DriverError(f"{action}: the remotes directory is unknown, so OpenNebula's kvm "
                          f"driver (which kvm-sriov runs for the hypervisor work) cannot be found")
    script = Path(remotes) / "vmm" / "kvm" / action
    if not os.access(script, os.X_OK):
        raise DriverError(f"{action}: OpenNebula's kvm driver script {script} is missing; "
                          f"kvm-sriov runs it for the hypervisor work")
    return script


def run_stock(remotes: Optional[Path], sent: Sent, stdin: Optional[bytes] = None,
              capture: bool = False) -> StockResult:
    """Run the stock script for sent.action with sent's argv. stdin: what it
    reads instead of sent.raw (deploy: the XML with the VFs). Its stderr (and
    its stdout unless captured) go straight to OpenNebula."""
    script = stock_kvm_script(remotes, sent.action)
    data = sent.raw if stdin is None else stdin
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    import subprocess  # here: a call handed over whole never needs it (~2 ms of every action)
    p = subprocess.run([str(script), *sent.argv], input=data,
                       stdout=subprocess.PIPE if capture else None)
    code = p.returncode if p.returncode >= 0 else 128 - p.returncode  # killed: as a shell reports it
    return StockResult(code, p.stdout.decode("utf-8", "replace") if capture else "")


class Delegated(Exception):
    """Raised to end an action with the stock script's exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class HandOver(Exception):
    """Nothing to do with VFs: the action ends as the stock script. Raised, so
    that the action lets go of what it holds (pool, libvirt) before that."""

    def __init__(self, remotes: Optional[Path], sent: Sent):
        super().__init__(sent.action)
        self.remotes, self.sent = remotes, sent


def hand_over(remotes: Optional[Path], sent: Sent):
    raise HandOver(remotes, sent)


def finish(handed: HandOver, replace_process) -> int:
    """The stock script's behaviour, byte for byte: in this process's place
    when it is an action script's (no second process to start and wait
    for), else as a child. Returns the exit code (only as a child)."""
    if replace_process:
        become_stock(handed.remotes, handed.sent)
    return run_stock(handed.remotes, handed.sent).code


def stdin_in_memory(raw: Optional[bytes]) -> Optional[int]:
    """A file holding what stdin held (read here already), at its start;
    None when there was no stdin to read (a terminal or closed)."""
    if raw is None:
        return None
    fd = os.memfd_create("stdin")
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def become_stock(remotes: Optional[Path], sent: Sent):
    """exec the stock script with what it would have got from OpenNebula:
    argv, environment, cwd, and stdin (already read here: given back from
    memory, rewound), no other open file, default SIGPIPE (as subprocess)."""
    script = stock_kvm_script(remotes, sent.action)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = stdin_in_memory(sent.raw)
    if fd is not None:
        os.dup2(fd, 0)
        os.close(fd)
    for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; a shell script must not
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.execv(script, [str(script), *sent.argv])
