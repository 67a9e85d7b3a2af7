"""Register kvm-sriov with oned, and take it back: the front-end's one-time
set-up that the packages leave to the operator (a package never edits
another package's configuration on its own).

    python3 -m kvm_sriov.frontend.oned_conf setup [--oned-conf /etc/one/oned.conf] [--no-placer] [--vm-mad FILE]
    python3 -m kvm_sriov.frontend.oned_conf check [same options]   exit 0: setup would change nothing
    python3 -m kvm_sriov.frontend.oned_conf undo  [--oned-conf /etc/one/oned.conf]
    python3 -m kvm_sriov.frontend.oned_conf in-use [--oned-conf ...]  exit 3: oned.conf still uses
                                                  kvm-sriov (the front-end package's removal guard)

setup, in oned.conf:
  * adds the VM_MAD of templates/oned/oned.conf.vm_mad (or --vm-mad's, as
    Puppet renders its parameters) between two marker lines, right after
    the last VM_MAD already there; a block of the older Puppet module's
    markers is replaced by it;
  * selects the kvm-sriov placer: SCHED_MAD's ARGUMENTS are read as
    one_sched reads them (GetoptLong: `-p WORD`, `-pWORD`, `--placer WORD`,
    `--placer=WORD`, `--pl WORD`, ...; the last one wins) and the placer
    one_sched would use becomes kvm-sriov, in the same form (the word it
    replaced is written in the block, so undo can put it back); without any,
    `-p kvm-sriov` goes first; with --no-placer, a placer an earlier setup
    selected is put back as it was;
  * in the same block, INHERIT_VNET_ATTR KVM_SRIOV_PKEY (the placer sees a
    NIC's pending key) and VNET_RESTRICTED_ATTR VLAN_ID (a tenant cannot
    write a network's partition key);
and writes the VM_MAD's defaults file (vmm_exec/vmm_exec_kvm-sriov.conf)
from the installed vmm_exec_kvm.conf (kvm_sriov/oned/oned_defaults.py).

Everything else in oned.conf stays byte for byte, comments and the
operator's own edits included. The first setup that changes oned.conf keeps
a copy of it (oned.conf.kvm-sriov-backup). Running setup again changes
nothing. undo removes exactly what setup added; when nobody edited oned.conf
in between, the result is the backup, byte for byte (checked, then the
backup is removed); otherwise the operator's later edits stay and so does
the backup. Lines an operator added inside the block are the operator's:
undo leaves them where the block was, setup moves them below it. oned reads
oned.conf when it starts: restart it after either.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from kvm_sriov.files import atomic_write
from kvm_sriov.oned import oned_defaults, versions

BEGIN = "# BEGIN kvm-sriov (written by `kvm-sriov setup-frontend`; `kvm-sriov setup-frontend --undo` removes it)"
END = "# END kvm-sriov"
PLACER_NOTE = "# kvm-sriov: SCHED_MAD placer before setup: "
PLACER = "kvm-sriov"
NO_PLACER = "(none)"
BACKUP_SUFFIX = ".kvm-sriov-backup"
DEFAULTS_NAME = "vmm_exec_kvm-sriov.conf"
# the markers of the Puppet module's own helper before it ran setup too
PUPPET_BEGIN = "# BEGIN kvm-sriov VM_MAD (managed by Puppet)"
PUPPET_END = "# END kvm-sriov VM_MAD"
MAX_BYTES = 4 << 20  # oned.conf is ~50 KB; refuse anything absurd rather than read it
# OpenNebula 7.4's one_sched: oned hands ARGUMENTS to a shell script that splits
# them at blanks ($*), then Ruby's GetoptLong reads these options (a long name
# may be shortened while it stays unambiguous).
SCHED_OPTIONS = {"--threads": "optional", "--placer": "required", "--optimizer": "required"}
SCHED_SHORT = {"-t": "--threads", "-p": "--placer", "-o": "--optimizer"}
_WORD = re.compile(r"[^ \t\n]+")


class Refused(Exception):
    """What setup/undo will not do, said in one line."""


def template_dirs() -> list[Path]:
    """Where templates/oned/ is looked for: $KVM_SRIOV_TEMPLATES, the
    checkout this module is in, the packages' /usr/share/kvm-sriov/templates."""
    env = os.environ.get("KVM_SRIOV_TEMPLATES")
    return ([Path(env)] if env else []) + [Path(__file__).resolve().parents[2] / "templates",
                                           Path("/usr/share/kvm-sriov/templates")]


def find_templates(given: Optional[Path] = None) -> Path:
    for d in ([given] if given else template_dirs()):
        if (d / "oned" / "oned.conf.vm_mad").is_file() and (d / "oned" / DEFAULTS_NAME).is_file():
            return d
    where = given or " or ".join(str(d) for d in template_dirs())
    raise Refused(f"kvm-sriov's templates/oned not found in {where} "
                  "(install the opennebula-kvm-sriov package, or give --templates DIR)")


def vm_mad_text(templates: Path, given: Optional[Path] = None) -> str:
    """The VM_MAD vector of the template (or of the given file), without its comment lines."""
    path = given or templates / "oned" / "oned.conf.vm_mad"
    data, _ = read_file(path)
    lines = decode(data, path).splitlines()
    body = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    text = "\n".join(body) + "\n"
    attrs = oned_defaults.parse(text, path.name)
    if [a.name for a in attrs] != ["VM_MAD"] or not isinstance(attrs[0].value, dict):
        raise Refused(f"{path}: expected one VM_MAD vector")
    return text


def mad_name(vm_mad: str) -> str:
    return oned_defaults.parse(vm_mad, "VM_MAD")[0].value.get("NAME", "")


# --- reading and writing oned.conf ------------------------------------------

def read_file(path: Path) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file, never through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise Refused(f"{path}: no such file (is OpenNebula installed? --oned-conf names the file)") from None
    except OSError as exc:
        if os.path.islink(path):
            raise Refused(f"{path} is a symlink: name the real file with --oned-conf") from None
        raise Refused(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Refused(f"{path} is over {MAX_BYTES >> 20} MiB: not an oned.conf")
    return data, st


def write_like(path: Path, data: bytes, like: os.stat_result) -> None:
    """Replace path with data atomically, with the owner and mode of `like`
    (oned.conf is root:oneadmin 0640 in OpenNebula's packages)."""
    atomic_write(path, data, like=like, fsync=True)


def decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(f"{path} is not UTF-8 text") from None


class Block(NamedTuple):
    start: int   # offset of the BEGIN line
    end: int     # offset past what setup added (END line and the blank line after it)
    placer: Optional[str]  # the SCHED_MAD `-p` word before setup, as recorded
    body_end: int  # offset of the END line


def find_block(text: str, where: Path) -> Optional[Block]:
    starts = [m.start() for m in re.finditer(r"(?m)^" + re.escape(BEGIN) + r"\n", text)]
    if not starts:
        return None
    if len(starts) > 1:
        raise Refused(f"{where} has {len(starts)} kvm-sriov blocks: keep one (between '{BEGIN[:16]}...' lines)")
    start = starts[0]
    m = re.compile(r"(?m)^" + re.escape(END) + r"\n").search(text, start)
    if not m:
        raise Refused(f"{where}: the kvm-sriov block has no '{END}' line: put it back or remove the block by hand")
    end = m.end() + (1 if text.startswith("\n", m.end()) else 0)
    note = re.compile(r"(?m)^" + re.escape(PLACER_NOTE) + r"(\S+)$").search(text, start, m.start())
    return Block(start, end, note.group(1) if note else None, m.start())


def operator_lines(text: str, block: Block, where: Path) -> str:
    """The lines inside the block that setup did not write (an operator's), in
    their order: all but the placer note, the first VM_MAD vector and the
    INHERIT/RESTRICT lines."""
    body_start = text.index("\n", block.start) + 1
    body = text[body_start:block.body_end]
    mads = [a for a in oned_defaults.parse(body, f"{where}: kvm-sriov block") if a.name == "VM_MAD"]
    mad = None
    if mads:
        mad = (body.rfind("\n", 0, mads[0].span.start) + 1, mads[0].span.end)
    kept, at, seen = [], 0, set()
    for line in body.splitlines(keepends=True):
        start, at = at, at + len(line)
        if mad and start < mad[1] and at > mad[0]:
            continue
        key = PLACER_NOTE if line.startswith(PLACER_NOTE) else line
        if key in (PLACER_NOTE, INHERIT, RESTRICT) and key not in seen:
            seen.add(key)
            continue
        kept.append(line)
    return "".join(kept)


def sched_arguments(text: str) -> Optional[oned_defaults.Span]:
    """Span of SCHED_MAD's ARGUMENTS value (with its quotes), of the first
    SCHED_MAD (the one oned reads)."""
    for attr in oned_defaults.parse(text, "oned.conf"):
        if attr.name == "SCHED_MAD" and isinstance(attr.value, dict):
            span = attr.subs.get("ARGUMENTS")
            if span and text[span.start] == '"':
                return span
            return None
    return None


class PlacerOption(NamedTuple):
    start: int   # offset of the option's word
    value: oned_defaults.Span  # its argument
    end: int     # past its last word


def placer_options(text: str, span: oned_defaults.Span, where: Path) -> list[PlacerOption]:
    """Every placer option in the ARGUMENTS at span, as one_sched's GetoptLong
    reads them (the last one is the placer it uses)."""
    def refuse(why: str) -> Refused:
        return Refused(f"{where}: SCHED_MAD's ARGUMENTS do not work with one_sched ({why}): "
                       "correct them, then run setup again")

    if "\\" in text[span.start + 1:span.end - 1]:
        raise Refused(f"{where}: SCHED_MAD's ARGUMENTS hold an escaped quote: select the placer by hand")
    words = [(m.start(), m.group()) for m in _WORD.finditer(text, span.start + 1, span.end - 1)]
    found, i = [], 0
    while i < len(words):
        at, word = words[i]
        i += 1
        if word == "--":
            break  # the rest are not options
        if not re.match(r"-.", word):
            continue  # a plain word: GetoptLong passes over it
        if word.startswith("--"):
            name, eq, _ = word.partition("=")
            names = [name] if name in SCHED_OPTIONS else [n for n in SCHED_OPTIONS if n.startswith(name)]
            if len(names) != 1:
                raise refuse(f"{'ambiguous' if names else 'unknown'} option {word}")
            option, inline = names[0], (at + len(name) + 1 if eq else None)
        else:
            option = SCHED_SHORT.get(word[:2])
            if option is None:
                raise refuse(f"unknown option {word[:2]}")
            inline = at + 2 if len(word) > 2 else None
        end = at + len(word)
        if inline is not None:
            value = oned_defaults.Span(inline, end)
        elif i < len(words) and (SCHED_OPTIONS[option] == "required" or not re.match(r"-.", words[i][1])):
            value = oned_defaults.Span(words[i][0], words[i][0] + len(words[i][1]))
            end = value.end
            i += 1
        elif SCHED_OPTIONS[option] == "required":
            raise refuse(f"{word} without its argument")
        else:
            value = oned_defaults.Span(end, end)
        if option == "--placer":
            if value.start == value.end:
                raise refuse(f"{word} names no placer")
            found.append(PlacerOption(at, value, end))
    return found


def current_placer(text: str, where: Path) -> Optional[str]:
    """The placer one_sched uses (NO_PLACER: its own default), None without a SCHED_MAD."""
    span = sched_arguments(text)
    if span is None:
        return None
    found = placer_options(text, span, where)
    return text[found[-1].value.start:found[-1].value.end] if found else NO_PLACER


def set_placer(text: str, new: str, where: Path) -> str:
    """text with the placer one_sched uses set to new, in the form it has
    (NO_PLACER: the `-p WORD` setup inserted removed again)."""
    span = sched_arguments(text)
    if span is None:
        raise Refused(f"{where} has no SCHED_MAD with a quoted ARGUMENTS: nothing changed "
                      "(give --no-placer to register the driver only)")
    found = placer_options(text, span, where)
    if new == NO_PLACER:
        if not found:
            return text
        last = found[-1]
        cut_end = last.end + (1 if text[last.end] == " " else 0)
        return text[:last.start] + text[cut_end:]
    if found:
        value = found[-1].value
        return text[:value.start] + new + text[value.end:]
    return text[:span.start + 1] + f"-p {new} " + text[span.start + 1:]


def foreign_vm_mad(text: str, name: str, block: Optional[Block]) -> bool:
    """A VM_MAD of that name outside our block (added by hand or by Puppet)."""
    outside = text if block is None else text[:block.start] + text[block.end:]
    return any(a.name == "VM_MAD" and isinstance(a.value, dict) and a.value.get("NAME") == name
               for a in oned_defaults.parse(outside, "oned.conf"))


def insert_at(text: str) -> int:
    """Right after the line that closes the last VM_MAD (else the end)."""
    last = [a for a in oned_defaults.parse(text, "oned.conf") if a.name == "VM_MAD"]
    if not last:
        return len(text)
    nl = text.find("\n", last[-1].span.end)
    return len(text) if nl < 0 else nl + 1


# A VM's NIC then carries its network's KVM_SRIOV_PKEY, so the placer can hold a VM
# whose network still waits for its automatic partition key (docs/scheduling.md).
INHERIT = 'INHERIT_VNET_ATTR = "KVM_SRIOV_PKEY"\n'
# A network's VLAN_ID is its IB partition key: only oneadmin's group (kvm-sriov's hook
# among them) may set, change or drop it, so no tenant can take another network's key.
# oned.conf repeats VNET_RESTRICTED_ATTR: this one adds to the stock list.
RESTRICT = 'VNET_RESTRICTED_ATTR = "VLAN_ID"\n'


def block_text(vm_mad: str, placer_before: Optional[str]) -> str:
    note = f"{PLACER_NOTE}{placer_before}\n" if placer_before else ""
    return f"{BEGIN}\n{note}{vm_mad}{INHERIT}{RESTRICT}{END}\n\n"


def without_old_puppet_block(text: str, where: Path) -> str:
    """text without the older Puppet module's block (and the blank line it put before it)."""
    m = re.search(r"(?m)^" + re.escape(PUPPET_BEGIN) + r"\n", text)
    if not m:
        return text
    end = re.compile(r"(?m)^" + re.escape(PUPPET_END) + r"\n").search(text, m.end())
    if not end:
        raise Refused(f"{where}: the Puppet block of kvm-sriov has no '{PUPPET_END}' line: remove it by hand")
    start = m.start() - 1 if text[max(0, m.start() - 2):m.start()] == "\n\n" else m.start()
    return text[:start] + text[end.end():]


def registered(text: str, vm_mad: str, where: Path) -> str:
    """oned.conf's text with kvm-sriov's VM_MAD block in it (as it should be)."""
    name = mad_name(vm_mad)
    text = without_old_puppet_block(text, where)
    block = find_block(text, where)
    if foreign_vm_mad(text, name, block):
        raise Refused(f"{where} already has a VM_MAD named \"{name}\" (added by hand?): remove it first, "
                      "then run setup again")
    if block:
        want = block_text(vm_mad, block.placer) + operator_lines(text, block, where)
        return text if text[block.start:block.end] == want else text[:block.start] + want + text[block.end:]
    at = insert_at(text)
    sep = "" if at == 0 or text[at - 1] == "\n" else "\n"
    return text[:at] + sep + block_text(vm_mad, None) + text[at:]


def with_placer_note(text: str, before: str, where: Path) -> str:
    block = find_block(text, where)
    line = f"{PLACER_NOTE}{before}\n"
    at = text.index("\n", block.start) + 1
    return text[:at] + line + text[at:]


def setup_text(text: str, vm_mad: str, placer: bool, where: Path) -> str:
    out = registered(text, vm_mad, where)
    block = find_block(out, where)
    if not placer:
        if block.placer is None:
            return out
        # the placer goes back to what it was before an earlier setup selected ours
        note = out.index(PLACER_NOTE, block.start)
        out = out[:note] + out[out.index("\n", note) + 1:]
        if block.placer != PLACER and current_placer(out, where) == PLACER:
            out = set_placer(out, block.placer, where)
        return out
    now = current_placer(out, where)
    if now is None:
        raise Refused(f"{where} has no SCHED_MAD with a quoted ARGUMENTS: nothing changed "
                      "(give --no-placer to register the driver only)")
    if block.placer is None:
        out = with_placer_note(out, now, where)
    return set_placer(out, PLACER, where) if now != PLACER else out


def undo_text(text: str, where: Path) -> str:
    """text without what setup added; an operator's lines inside the block stay where it was."""
    block = find_block(text, where)
    if block is None:
        return text
    out = text[:block.start] + operator_lines(text, block, where) + text[block.end:]
    if block.placer and block.placer != PLACER and current_placer(out, where) == PLACER:
        out = set_placer(out, block.placer, where)
    return out


def uses(text: str, where: Path) -> list[str]:
    """What in oned.conf needs kvm-sriov's remotes, as oned reads it: a VM_MAD
    named kvm-sriov or running its driver (written by setup or by hand), the
    kvm-sriov placer."""
    found = []
    for a in oned_defaults.parse(text, str(where)):
        if a.name == "VM_MAD" and isinstance(a.value, dict):
            name = a.value.get("NAME", "")
            if name == PLACER or PLACER in a.value.get("ARGUMENTS", "").split():
                found.append(f'VM_MAD "{name}"')
    if current_placer(text, where) == PLACER:
        found.append(f'SCHED_MAD placer "{PLACER}"')
    return found


# --- the driver's defaults file ----------------------------------------------

def defaults_text(stock: Path, templates: Path) -> str:
    return oned_defaults.generate(stock, templates / "oned" / DEFAULTS_NAME)


def ours(path: Path) -> bool:
    try:
        data, _ = read_file(path)
    except Refused:
        return False
    return data.decode("utf-8", "replace").startswith(oned_defaults.HEADER.split("{", 1)[0])


# --- the commands --------------------------------------------------------------

def setup(oned_conf: Path, templates: Path, placer: bool = True, stock: Optional[Path] = None,
          remotes: Optional[Path] = None, out=print, vm_mad_file: Optional[Path] = None,
          dry_run: bool = False) -> bool:
    """Returns True when something changed (dry_run: would change; nothing is written)."""
    data, st = read_file(oned_conf)
    text = decode(data, oned_conf)
    vm_mad = vm_mad_text(templates, vm_mad_file)
    new = setup_text(text, vm_mad, placer, oned_conf)
    stock = stock or oned_conf.parent / "vmm_exec" / "vmm_exec_kvm.conf"
    if not stock.is_file():
        raise Refused(f"OpenNebula's {stock} not found: the kvm-sriov defaults are made from it (--stock names it)")
    defaults = oned_conf.parent / "vmm_exec" / DEFAULTS_NAME
    want = defaults_text(stock, templates).encode()
    have = read_file(defaults)[0] if defaults.exists() or defaults.is_symlink() else None
    if dry_run:
        return have != want or new != text
    changed = False
    if have != want:
        if have is not None and not ours(defaults):
            backup = defaults.with_name(defaults.name + BACKUP_SUFFIX)
            if not backup.exists():
                write_like(backup, have, read_file(defaults)[1])
                out(f"kept {defaults} as it was in {backup}")
        write_like(defaults, want, read_file(stock)[1])
        out(f"wrote {defaults} (OpenNebula's {stock.name} with kvm-sriov's values)")
        changed = True
    if new != text:
        backup = oned_conf.with_name(oned_conf.name + BACKUP_SUFFIX)
        if find_block(text, oned_conf) is None and not backup.exists():
            write_like(backup, data, st)
            out(f"kept {oned_conf} as it was in {backup}")
        write_like(oned_conf, new.encode(), st)
        out(f"{oned_conf}: VM_MAD \"{mad_name(vm_mad)}\" registered"
            + (f", SCHED_MAD placer \"{PLACER}\"" if placer else ""))
        changed = True
    if changed:
        out("restart oned to load it (systemctl restart opennebula); then: onehost create HOST -i kvm -v "
            f"{mad_name(vm_mad)}")
    else:
        out(f"{oned_conf}: kvm-sriov already registered, nothing changed")
    if remotes is not None:
        note = versions.warning(remotes)
        if note:
            out(f"WARNING: {note}")
    return changed


def undo(oned_conf: Path, out=print) -> bool:
    data, st = read_file(oned_conf)
    text = decode(data, oned_conf)
    new = undo_text(text, oned_conf)
    changed = False
    backup = oned_conf.with_name(oned_conf.name + BACKUP_SUFFIX)
    if new != text:
        write_like(oned_conf, new.encode(), st)
        changed = True
        block = find_block(text, oned_conf)
        if operator_lines(text, block, oned_conf):
            out(f"{oned_conf}: the lines you added inside the kvm-sriov block stay where it was")
        if backup.is_file() and read_file(backup)[0] == new.encode():
            backup.unlink()
            out(f"{oned_conf}: back to its content before setup, byte for byte (backup removed)")
        elif backup.is_file():
            out(f"{oned_conf}: kvm-sriov's lines removed; it was edited since setup, so it differs from "
                f"{backup} (kept): your later edits stay")
        else:
            out(f"{oned_conf}: kvm-sriov's lines removed")
    else:
        out(f"{oned_conf}: no kvm-sriov registration in it, nothing changed")
    defaults = oned_conf.parent / "vmm_exec" / DEFAULTS_NAME
    kept = defaults.with_name(defaults.name + BACKUP_SUFFIX)
    if kept.is_file():
        os.replace(kept, defaults)
        out(f"{defaults}: put back as it was before setup")
        changed = True
    elif ours(defaults):
        defaults.unlink()
        out(f"removed {defaults}")
        changed = True
    if changed:
        out("restart oned to load it (systemctl restart opennebula)")
    return changed


def in_use(oned_conf: Path, out=print) -> bool:
    """True (and one line saying what) when oned.conf still uses kvm-sriov; no oned.conf uses nothing."""
    if not os.path.lexists(oned_conf):
        return False
    found = uses(decode(read_file(oned_conf)[0], oned_conf), oned_conf)
    if found:
        out(f"{oned_conf} still uses kvm-sriov: {', '.join(found)}")
    return bool(found)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvm-sriov setup-frontend",
                                description="register kvm-sriov's VM_MAD and placer in oned.conf (or undo it)")
    p.add_argument("action", choices=["setup", "check", "undo", "in-use"],
                   help="check: exit 0 when setup would change nothing, 3 when it would; "
                        "in-use: exit 3 when oned.conf still uses kvm-sriov, 0 when not")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options, for a CLI subcommand too."""
    p.add_argument("--oned-conf", type=Path, default=Path("/etc/one/oned.conf"), help="oned's configuration")
    p.add_argument("--stock", type=Path, default=None,
                   help="OpenNebula's vmm_exec_kvm.conf (default: vmm_exec/ beside oned.conf)")
    p.add_argument("--templates", type=Path, default=None, help="kvm-sriov's templates directory")
    p.add_argument("--remotes", type=Path, default=Path("/var/lib/one/remotes"),
                   help="OpenNebula's remotes (their VERSION is checked against the tested versions)")
    p.add_argument("--no-placer", action="store_true",
                   help="leave SCHED_MAD alone (a placer an earlier setup selected is put back)")
    p.add_argument("--vm-mad", type=Path, default=None,
                   help="a file holding the VM_MAD to register (default: the templates' oned.conf.vm_mad)")


def run(action: str, args: argparse.Namespace) -> int:
    try:
        if action == "undo":
            undo(args.oned_conf)
        elif action == "in-use":
            return 3 if in_use(args.oned_conf) else 0
        elif action == "check":
            return 3 if setup(args.oned_conf, find_templates(args.templates), placer=not args.no_placer,
                              stock=args.stock, vm_mad_file=args.vm_mad, dry_run=True) else 0
        else:
            setup(args.oned_conf, find_templates(args.templates), placer=not args.no_placer,
                  stock=args.stock, remotes=args.remotes, vm_mad_file=args.vm_mad)
    except (Refused, oned_defaults.ParseError) as exc:
        print(f"kvm-sriov: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kvm-sriov: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[list] = None) -> int:
    args = parser().parse_args(argv)
    return run(args.action, args)


if __name__ == "__main__":
    sys.exit(main())
