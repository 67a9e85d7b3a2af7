"""``kvm-sriov qualify --vm``: one throwaway VM with one VF, as tenants get them.

The VM is deployed and ended through the installed action scripts
(``<remotes>/vmm/kvm-sriov/deploy``, then ``cancel``), called with the
arguments, stdin and user OpenNebula uses (the pool's state folder's owner,
oneadmin, when qualify runs as root), so the VF goes through the pool,
its GUID, the stock kvm deploy and libvirt exactly as for a tenant's VM.
Its guest kernel and initramfs are the operator's (``--image``,
``--initrd``); what the guest sees is read from its serial console (a file
in the VM's folder): the kernel's PCI scan shows the VF (its vendor:device),
and the guest report (``GUEST_REPORT``, run by the image's init) shows each
InfiniBand port's state, GUID and PKey table.

Whatever fails, and on Ctrl-C, SIGTERM or SIGHUP, the VM is ended and its
VF checked back in the pool (try/finally); a VM an earlier run left (a
``kill -9``) is ended before a new one starts. The VM is OpenNebula VM
``MAX_ID``, in datastore folder ``<datastores>/<MAX_ID>/<MAX_ID>``: oned
gives IDs upwards from 0 and has no such datastore.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import config as config_mod, opennebula
from ..config import ENV_CONFIG
from ..domain.hypervisor import Hypervisor   # here, not in the VM test: that may run as another user
from ..errors import DriverError
from ..ib import guid
from ..vf import pool
from ..vf.sysfs import Sysfs
from . import qualify
from .qualify import FAIL, NOT_IB, PASS, SKIP, WARN, Check, SM_VIRT_FIX, _short

VM_ID = opennebula.MAX_ID           # oned counts VM IDs up from 0: never a tenant's
DOMAIN = f"one-{VM_ID}"
DATASTORE = VM_ID                   # the folder <datastores>/<DATASTORE>/<VM_ID>: no datastore of oned's
DEFAULT_DATASTORES = Path("/var/lib/one/datastores")  # oned.conf's DATASTORE_LOCATION default
MAC = "02:6b:73:71:00:02"           # outside OpenNebula's default MAC prefix (02:00); --write-test uses :01
MEMORY_MIB = 512
CONSOLE = "console.log"
ACTION_SECONDS = 300                # one action script's whole run (kvmrc's own timeouts are inside it)
GUEST_SECONDS = 300                 # default --vm-seconds: the guest's boot and report
MAX_CONSOLE_BYTES = 16 << 20        # what is read of the guest's console, at most
MAX_LINE = 2048
POLL_SECONDS = 1.0
ARCH_CONSOLE = {"x86_64": "ttyS0", "aarch64": "ttyAMA0"}

REPORT = "kvm-sriov-qualify:"
# What the guest's init runs (busybox sh is enough; reads use the shell's own
# `read`, no process per file): every PCI function and every InfiniBand port
# it sees, on the console, every 2 s (a port goes ACTIVE some seconds after
# the link: the SM's sweep). `kvm-sriov qualify --guest-report` prints it.
GUEST_REPORT = r"""#!/bin/sh
# kvm-sriov qualify's guest report (docs/qualify.md): run it from the image's init, with
# the console on the first serial port; it prints what this guest sees every 2 s
# ("once [ROOT]": one report, of ROOT/sys and ROOT/proc/cmdline, and its perftest runs).
root=${2:-}
say() { echo "kvm-sriov-qualify: $*"; }
report() {
    for d in "$root"/sys/bus/pci/devices/*; do
        [ -r "$d/vendor" ] && read -r v < "$d/vendor" && read -r i < "$d/device" || continue
        say "pci ${d##*/} $v $i"
    done
    for p in "$root"/sys/class/infiniband/*/ports/*; do
        [ -r "$p/state" ] && read -r s < "$p/state" || continue
        dev=${p%/ports/*}
        g=none; [ -r "$p/gids/0" ] && read -r g < "$p/gids/0"
        keys=
        for k in "$p"/pkeys/*; do
            [ -r "$k" ] && read -r x < "$k" || continue
            [ "$x" = 0x0000 ] || keys="$keys${keys:+,}$x"
        done
        say "ib ${dev##*/} ${p##*/} state ${s#*: } gid $g pkeys ${keys:-none}"
        [ "${s#*: }" = ACTIVE ] && active=yes
    done
    say "end"
}
# --peer: kvm_sriov_qualify.perf=server|client, .ip=<IPoIB address/len>, .server=<address>;
# once a port is ACTIVE, IPoIB up, then each tool (perftest) as server or client, its output said
perf= ip= server= active= cmdline=
[ -r "$root/proc/cmdline" ] && read -r cmdline < "$root/proc/cmdline"
for a in $cmdline; do
    case $a in
        kvm_sriov_qualify.perf=*) perf=${a#*=} ;;
        kvm_sriov_qualify.ip=*) ip=${a#*=} ;;
        kvm_sriov_qualify.server=*) server=${a#*=} ;;
    esac
done
measure() {
    [ -n "$perf" ] && [ -n "$active" ] || return 0
    if ! { ip addr add "$ip" dev ib0 && ip link set ib0 up; }; then
        say "perf failed: no IPoIB interface ib0 (load ib_ipoib)"; perf=; return 0
    fi
    for t in ib_write_bw ib_send_lat; do
        case $t in ib_write_bw) set -- -D 5 -F -p 18515 ;; *) set -- -F -p 18516 ;; esac
        if [ "$perf" = server ]; then
            $t "$@" > /tmp/$t.out 2>&1
        else
            n=0
            until $t "$@" "$server" > /tmp/$t.out 2>&1; do
                n=$((n + 1)); [ $n -lt 60 ] || break; sleep 2
            done
        fi
        while read -r line; do say "perf $t: $line"; done < /tmp/$t.out
        say "perf $t end"
    done
    say "perf done"; perf=
}
if [ "$1" = once ]; then report; measure; else while :; do report; measure; sleep 2; done; fi
"""

# The kernel's PCI scan on the console: "pci 0000:01:00.0: [15b3:101e] type 00 class 0x020700"
KERNEL_PCI = re.compile(r"\bpci [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]: \[([0-9a-f]{4}):([0-9a-f]{4})\]")
REPORT_PCI = re.compile(r"kvm-sriov-qualify: pci (\S{1,32}) 0x([0-9a-f]{4}) 0x([0-9a-f]{4})")
REPORT_PERF = re.compile(r"kvm-sriov-qualify: perf (?:(ib_write_bw|ib_send_lat)(?:: (.*)| end)|(done)|failed: (.*))")
REPORT_IB = re.compile(r"kvm-sriov-qualify: ib ([\w.-]{1,32}) (\d{1,3}) state ([A-Z_]{1,16}) gid ([0-9a-f:]{1,39}|none) "
                       r"pkeys ((?:0x[0-9a-f]{4},){0,127}0x[0-9a-f]{4}|none)")


@dataclass
class VmOptions:
    """What --vm was given (command line)."""
    image: Path
    initrd: Optional[Path] = None
    append: str = ""
    seconds: float = GUEST_SECONDS
    remotes: Path = Path("/var/tmp/one")
    pkey: Optional[int] = None
    config: Optional[Path] = None      # --config: the actions read it too ($KVM_SRIOV_CONFIG)
    peer: Optional[str] = None
    perf_serve: bool = False           # the --peer host's side: its guest runs the perftest servers

    def cmdline(self) -> str:
        """What the guest kernel gets after the console: --append, and the
        guest report's perftest role with --peer (its IPoIB address)."""
        role = (f"kvm_sriov_qualify.perf=server kvm_sriov_qualify.ip={PERF_IP['server']}/16" if self.perf_serve
                else f"kvm_sriov_qualify.perf=client kvm_sriov_qualify.ip={PERF_IP['client']}/16 "
                     f"kvm_sriov_qualify.server={PERF_IP['server']}" if self.peer else "")
        return " ".join(w for w in (self.append, role) if w)


class Interrupted(BaseException):
    """SIGTERM or SIGHUP during the VM test: unwinds to its clean-up."""


# -- the command line ------------------------------------------------------------------
def pkey(text: str) -> int:
    """A partition key as --pkey gives it (0x8001, 32769): its 15-bit key."""
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"--pkey {text!r} is not a number (e.g. 0x8001)") from None
    if not 0 < value <= 0xFFFF or not value & 0x7FFF:
        raise ValueError(f"--pkey {text!r} is not a partition key (0x0001-0x7fff, with or without 0x8000)")
    return value & 0x7FFF


def options(args) -> Optional[VmOptions]:
    """The VM test's options; None without --vm. ValueError: one line saying
    what is wrong (nothing has run yet)."""
    if not getattr(args, "vm", False):
        for name in ("image", "initrd", "peer", "pkey", "perf_serve"):
            if getattr(args, name, None):
                raise ValueError(f"--{name.replace('_', '-')} goes with --vm")
        return None
    if args.peer:
        try:
            opennebula.host_name(args.peer, "--peer")
        except DriverError as exc:
            raise ValueError(str(exc)) from None
        if args.perf_serve:
            raise ValueError("--peer and --perf-serve: one host measures, the other serves")
        for name, path in (("--image", args.image), ("--initrd", args.initrd)):
            if path and not SAFE_WORD.fullmatch(os.path.abspath(path)):
                raise ValueError(f"{name} {path!r}: the peer is given the same path over ssh, which takes "
                                 f"letters, digits and ._:/=,+- only")
    if not args.image:
        raise ValueError("--vm needs --image KERNEL: the guest kernel the throwaway VM boots (with --initrd "
                         "its initramfs; docs/qualify.md says what the guest must print)")
    files = [("--image", args.image)] + ([("--initrd", args.initrd)] if args.initrd else [])
    for name, path in files:
        if not os.path.isfile(path):
            raise ValueError(f"{name} {path}: no such file")
    if not 0 < args.vm_seconds <= 3600:
        raise ValueError(f"--vm-seconds {args.vm_seconds:g} is not from 1 to 3600")
    return VmOptions(image=Path(args.image).absolute(),
                     initrd=Path(args.initrd).absolute() if args.initrd else None,
                     append=args.append or "", seconds=args.vm_seconds,
                     remotes=Path(args.remotes or "/var/tmp/one"),
                     pkey=pkey(args.pkey) if args.pkey else None,
                     config=Path(args.config).absolute() if getattr(args, "config", None) else None,
                     peer=args.peer, perf_serve=args.perf_serve)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """qualify's options and the VM test's, for the kvm-sriov subcommand too."""
    qualify.add_arguments(p)
    vm = p.add_argument_group("VM test (changes the host: one VM, one VF, for a few minutes)")
    vm.add_argument("--vm", action="store_true",
                    help="also deploy a throwaway VM with one VF through the installed action scripts, check "
                         "from its console that the guest sees the VF (on InfiniBand: its port ACTIVE, the PKey "
                         "in its table), end it and check the VF is back in the pool")
    vm.add_argument("--image", metavar="KERNEL", help="with --vm: the guest kernel the VM boots")
    vm.add_argument("--initrd", metavar="FILE", help="with --vm: the guest's initramfs")
    vm.add_argument("--append", metavar="ARGS", help="with --vm: more of the guest kernel's command line")
    vm.add_argument("--vm-seconds", type=float, default=GUEST_SECONDS, metavar="S",
                    help=f"with --vm: how long the guest may take to show the VF (default {GUEST_SECONDS})")
    vm.add_argument("--pkey", metavar="PKEY",
                    help="with --vm on InfiniBand: the partition key the VM's port must hold (default: any)")
    vm.add_argument("--peer", metavar="HOST",
                    help="with --vm: a second qualified host; ib_write_bw and ib_send_lat (perftest) host to "
                         "host and VM to VM, and their ratio")
    vm.add_argument("--perf-serve", action="store_true",
                    help="with --vm: this is the --peer of another host's qualify (run there over ssh): the "
                         "guest serves its perftest runs, and the VM stays until they are done")
    vm.add_argument("--guest-report", action="store_true",
                    help="print the script the guest's init runs for --vm (sh) and exit")


def run_command(cfg, args: argparse.Namespace) -> int:
    """kvm-sriov qualify: the read-only checks, and the VM test with --vm."""
    if args.guest_report:
        sys.stdout.write(GUEST_REPORT)
        return 0
    try:
        opts = options(args)
    except ValueError as exc:
        print(f"kvm-sriov qualify: {exc}", file=sys.stderr)
        return 1
    return qualify.run_command(cfg, args, vm=functools.partial(run, opts) if opts else None)


def main(argv=None) -> int:
    """python3 -m kvm_sriov.node.qualify_vm: kvm-sriov qualify, --vm included."""
    p = argparse.ArgumentParser(prog="kvm-sriov qualify",
                                description="checks that a KVM host is ready for ConnectX VFs")
    p.add_argument("--config", help="extra config file (like $KVM_SRIOV_CONFIG)")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        files = config_mod.config_files(None) + ([Path(args.config)] if args.config else [])
        return run_command(config_mod.load(files=files), args)
    except DriverError as exc:
        print(f"kvm-sriov qualify: {exc}", file=sys.stderr)
        return 1


# -- what the deployment holds -----------------------------------------------------------
def deployment(uuid: str, opts: VmOptions, console: Path, bridge: str) -> str:
    """The libvirt domain oned would write for a VM with one NIC on the
    driver's networks, booting the operator's kernel, its console a file."""
    arch = os.uname().machine
    kind = "kvm" if os.path.exists("/dev/kvm") else "qemu"   # no KVM (a nested test host): TCG
    dom = ET.Element("domain", type=kind)
    for tag, text in (("name", DOMAIN), ("title", "kvm-sriov qualify"), ("uuid", uuid)):
        ET.SubElement(dom, tag).text = text
    ET.SubElement(dom, "memory", unit="MiB").text = str(MEMORY_MIB)
    ET.SubElement(dom, "vcpu").text = "1"
    os_el = ET.SubElement(dom, "os")
    ET.SubElement(os_el, "type", dict(arch=arch, **({"machine": "q35"} if arch == "x86_64" else {}))).text = "hvm"
    ET.SubElement(os_el, "kernel").text = str(opts.image)
    if opts.initrd:
        ET.SubElement(os_el, "initrd").text = str(opts.initrd)
    ET.SubElement(os_el, "cmdline").text = " ".join(
        [f"console={ARCH_CONSOLE.get(arch, 'ttyS0')}", "panic=-1", opts.cmdline()]).strip()
    ET.SubElement(ET.SubElement(dom, "features"), "acpi")
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        ET.SubElement(dom, event).text = "destroy"
    devices = ET.SubElement(dom, "devices")
    nic = ET.SubElement(devices, "interface", type="bridge")
    ET.SubElement(nic, "source", bridge=bridge)
    ET.SubElement(nic, "mac", address=MAC)
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=str(console))
    ET.SubElement(serial, "target", port="0")
    ET.SubElement(devices, "memballoon", model="none")
    return ET.tostring(dom, encoding="unicode")


# -- the action scripts, as OpenNebula runs them --------------------------------------------
@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        """What OpenNebula shows as the failure: stderr but its log lines."""
        kept = [line for line in self.stderr.splitlines()
                if not re.match(r"(ERROR|INFO|WARN|DEBUG):", line)] or self.stderr.splitlines()[-2:]
        return _short(" ".join(kept), 300) or f"exit {self.code}"


def host_name() -> str:
    """This host as an action's <host> argument (OpenNebula's name for it)."""
    name = socket.gethostname()
    try:
        return opennebula.host_name(name)
    except DriverError:
        return "localhost"


def call_action(opts: VmOptions, action: str, args: list, stdin: str = "",
                seconds: float = ACTION_SECONDS) -> Ran:
    """<remotes>/vmm/kvm-sriov/<action> <args> <vmid> <host>, stdin and a
    newline as OpenNebula's here-document gives them; it and what it started
    are killed after ``seconds``."""
    script = opts.remotes / "vmm" / "kvm-sriov" / action
    env = dict(os.environ, **({ENV_CONFIG: str(opts.config)} if opts.config else {}))
    me = host_name()
    began = time.monotonic()
    with _deferred():
        try:
            proc = subprocess.Popen([str(script), *map(str, args), str(VM_ID), me], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env=env,
                                    start_new_session=True)   # Ctrl-C is qualify's to handle, not the action's
        except OSError as exc:
            return Ran(126, "", f"{script}: {exc.strerror}")
        timed_out = False
        try:
            out, err = proc.communicate((stdin + "\n").encode() if stdin else b"", timeout=seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_session(proc.pid)
            out, err = proc.communicate()
    return Ran(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out,
               time.monotonic() - began)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:   # already gone
        pass


# -- this host as the VM test sees it ------------------------------------------------------
class Here:
    """The pool (read-only) and libvirt: who holds the VM's VF, does the VM run."""

    def __init__(self, cfg):
        self.cfg = cfg

    def assignments(self) -> list:
        path = self.cfg.pool_db
        if not os.path.lexists(path):
            return []
        db = pool.read_only(path, self.cfg.lock_seconds)
        if db is None:   # not in WAL mode yet: the pool's own transaction
            p = pool.VfPool(path, self.cfg.lock_seconds)
            try:
                return p.assignments()
            finally:
                p.close()
        try:
            return pool.Transaction(db).assignments()
        finally:
            db.close()

    def vm_vfs(self) -> list[tuple[str, str]]:
        """(VF, PF) the pool gives the VM."""
        return [(a.vf, a.pf) for a in self.assignments() if a.vm_id == VM_ID]

    def held(self) -> set[str]:
        return {a.vf for a in self.assignments()}

    def live(self):
        """(the VM runs?, PCI address -> the domain holding it)"""
        hv = Hypervisor(self.cfg.libvirt_uri)
        try:
            state = hv.live_state()
        finally:
            hv.close()
        return DOMAIN in state.domains, {a: r.name for a, r in state.hostdevs.items()}

    def running(self) -> bool:
        """Does libvirt run the VM? (asked every second while the guest boots:
        one lookup, not every domain's XML)"""
        hv = Hypervisor(self.cfg.libvirt_uri)
        try:
            dom = hv.lookup(DOMAIN)
            return dom is not None and hv.is_active(dom)
        finally:
            hv.close()


# -- the guest's console -------------------------------------------------------------------
class Console:
    """The guest's serial console file, read as it grows: never through a
    link, never blocking, at most MAX_CONSOLE_BYTES in all."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial, self.too_much = path, 0, b"", False

    def new_lines(self) -> list[str]:
        if self.too_much:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []   # not made yet (the domain is starting)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.too_much = True
                return []
            data = os.pread(fd, MAX_CONSOLE_BYTES - self.offset + 1, self.offset)
        finally:
            os.close(fd)
        self.offset += len(data)
        if self.offset > MAX_CONSOLE_BYTES:
            self.too_much = True
        *lines, self.partial = (self.partial + data).split(b"\n")
        self.partial = self.partial[-MAX_LINE:]
        return [line[:MAX_LINE].decode("utf-8", "replace").strip("\r\x00 ") for line in lines]


@dataclass
class Port:
    state: str
    port_guid: Optional[str]     # 16 hex digits, the low half of GID 0
    pkeys: list[int]


@dataclass
class GuestView:
    """What the guest has shown of the VF so far."""
    vendor: str
    device: str
    seen_by: Optional[str] = None
    seen_after: float = 0.0                     # seconds from the watch's start
    reported: bool = False
    ports: dict = field(default_factory=dict)   # (device, port) -> Port, the latest report
    last: str = ""
    perf: dict = field(default_factory=dict)    # perftest tool -> the lines of its output the guest said
    perf_end: Optional[str] = None              # "done", or why the guest measured nothing

    def read(self, line: str) -> None:
        if line:
            self.last = line
        kernel = KERNEL_PCI.search(line)
        if kernel and kernel.groups() == (self.vendor, self.device) and not self.seen_by:
            self.seen_by = "the kernel's PCI scan"
        found = REPORT_PCI.search(line)
        if found:
            self.reported = True
            if found.group(2, 3) == (self.vendor, self.device) and not self.seen_by:
                self.seen_by = "the guest report"
        found = REPORT_PERF.search(line)
        if found:
            tool, said, done, failed = found.groups()
            if tool and said is not None and len(self.perf.get(tool, ())) < MAX_PERF_LINES:
                self.perf.setdefault(tool, []).append(said)
            elif done or failed:
                self.perf_end = done or failed
        found = REPORT_IB.search(line)
        if found:
            self.reported = True
            dev, port, state, gid, keys = found.groups()
            digits = gid.replace(":", "")
            self.ports[(dev, int(port))] = Port(state, digits[16:] if len(digits) == 32 else None,
                                                [] if keys == "none" else [int(k, 16) for k in keys.split(",")])

    def active(self) -> list:
        return [(k, p) for k, p in sorted(self.ports.items()) if p.state == "ACTIVE"]


def _has_key(port: Port, want: Optional[int]) -> bool:
    keys = [k for k in port.pkeys if k & 0x7FFF]
    return bool(keys) if want is None else any(k & 0x7FFF == want for k in keys)


def watch_guest(console: Console, view: GuestView, infiniband: bool, want_pkey: Optional[int],
                seconds: float, running: Callable[[], bool], until=None) -> str:
    """Read the console until the guest has shown what it must (the VF; on
    InfiniBand an ACTIVE port with the PKey; ``until(view)`` when given),
    the VM stops, or ``seconds`` pass: "seen", "stopped" or "timeout"."""
    began = time.monotonic()
    deadline = began + seconds
    while True:
        for line in console.new_lines():
            view.read(line)
        if view.seen_by and not view.seen_after:
            view.seen_after = time.monotonic() - began
        if until is not None and until(view) or until is None and view.seen_by and (
                not infiniband or any(_has_key(p, want_pkey) for _, p in view.active())):
            return "seen"
        if time.monotonic() >= deadline:
            return "timeout"
        if not running():
            for line in console.new_lines():   # its last words
                view.read(line)
            return "stopped"
        time.sleep(POLL_SECONDS)


def guest_checks(view: GuestView, outcome: str, vf: str, infiniband: bool, want_pkey: Optional[int],
                 seconds: float, policy: str, console: Console) -> list[Check]:
    ident = f"{view.vendor}:{view.device}"
    last = f"; its console's last line: {_short(view.last, 120)!r}" if view.last else "; its console is empty"
    if console.too_much:
        last += f"; the console said more than {MAX_CONSOLE_BYTES >> 20} MiB, the rest was not read"
    why = {"stopped": "the VM stopped", "timeout": f"not within {seconds:.0f} s"}.get(outcome, "")
    if view.seen_by:
        out = [Check("VM VF in the guest", PASS, f"the guest sees VF {vf} ({ident}): {view.seen_by}, "
                                                 f"{view.seen_after:.0f} s after the deploy")]
    else:
        out = [Check("VM VF in the guest", FAIL, f"the guest did not show VF {vf} ({ident}): {why}{last}",
                     "boot the image with its console on the first serial port and without 'quiet' (the "
                     "kernel's PCI scan), or have its init run the guest report (kvm-sriov qualify "
                     "--guest-report); a guest that stops: its kernel or initramfs (--append)")]
    if not infiniband:
        return out + [Check("VM IB port", SKIP, f"{NOT_IB}: VF {vf} ({ident}) has no InfiniBand port"),
                      Check("VM PKey", SKIP, f"{NOT_IB}: no partition to check")]
    if not view.ports:
        return out + [Check("VM IB port", WARN if view.seen_by else FAIL,
                            "the guest reported no InfiniBand port "
                            + ("(its image does not run the guest report, or has no mlx5_ib)" if view.reported
                               else "(no guest report on the console)") + f": {why or 'not proven'}",
                            "an image whose init loads mlx5_ib and runs the guest report "
                            "(kvm-sriov qualify --guest-report prints it)"),
                      Check("VM PKey", SKIP, "no InfiniBand port reported")]
    active = view.active()
    if not active:
        (dev, num), port = next(iter(sorted(view.ports.items())))
        out.append(Check("VM IB port", FAIL, f"{dev}/{num} in the guest is {port.state} ({why}): the SM does not "
                                             f"bring VF ports up", SM_VIRT_FIX))
        return out + [Check("VM PKey", SKIP, "no ACTIVE port")]
    (dev, num), port = active[0]
    expected = guid.port_guid(MAC).replace(":", "")
    if policy != "none" and port.port_guid != expected:
        out.append(Check("VM IB port", FAIL, f"{dev}/{num} is ACTIVE with GUID {port.port_guid}, not the "
                                             f"{expected} the driver set for MAC {MAC}: the SM's partitions "
                                             f"name GUIDs, so this VM would sit in none of its networks",
                         "the VF's GUID files (kvm-sriov guids), or a kernel with VF GUIDs through netlink"))
    else:
        out.append(Check("VM IB port", PASS, f"{dev}/{num} in the guest is ACTIVE, GUID {port.port_guid}"))
    keys = ", ".join(f"0x{k:04x}" for k in port.pkeys[:8]) or "none"
    if _has_key(port, want_pkey):
        out.append(Check("VM PKey", PASS, f"{dev}/{num}'s table holds "
                         + (f"0x{want_pkey:04x}" if want_pkey is not None else "a PKey") + f" ({keys})"))
    else:
        wanted = f"0x{want_pkey:04x}" if want_pkey is not None else "any PKey"
        out.append(Check("VM PKey", FAIL, f"{dev}/{num}'s table ({keys}) holds not {wanted}: the SM gives "
                                          f"GUID {expected} no such partition",
                         f"a partition with the qualify VM's GUID 0x{expected} as a member (or --pkey of one "
                         f"it has); kvm-sriov partitions --check on the front-end"))
    return out


# -- --peer: perftest host to host and VM to VM ----------------------------------------------
PERF_TOOLS = ("ib_write_bw", "ib_send_lat")
PERF_ARGS = {"ib_write_bw": ["-D", "5", "-F", "-p", "18515"],   # 5 s of RDMA writes; the guests' ports
             "ib_send_lat": ["-F", "-p", "18516"]}               # 1000 sends, perftest's default
PERF_FIGURE = {"ib_write_bw": ("BW average[MB/sec]", "MB/s"), "ib_send_lat": ("t_typical[usec]", "us")}
PERF_SECONDS = 120            # one tool's run, host to host (server and client)
PERF_IP = {"server": "169.254.77.1", "client": "169.254.77.2"}   # the guests' IPoIB (link-local)
MAX_PERF_LINES = 200
MAX_PERF_BYTES = 64 * 1024
INSTALL_PERFTEST = "apt-get install perftest (dnf install perftest on RHEL)"
# what crosses ssh to the peer unquoted (fullmatch)
SAFE_WORD = re.compile(r"[A-Za-z0-9._:/=,+-]{1,1024}")
# perftest's column names: "#bytes", "BW average[MB/sec]", "t_typical[usec]", "99.9% percentile[usec]"
PERF_COLUMN = re.compile(r"#bytes|#iterations|[\w.%]{1,32}(?: [\w.%]{1,32})?\[[^\]]{1,16}\]")


def perf_possible(pfs) -> Optional[Check]:
    """None when perftest can run here, else the one line that says why not."""
    if not any(pf.vendor == "15b3" and pf.ib_ports for pf in pfs):
        return Check("perftest", SKIP, f"{NOT_IB}: nothing to measure")
    missing = [t for t in PERF_TOOLS if shutil.which(t) is None]
    if missing:
        return Check("perftest", WARN, f"{' and '.join(missing)} not installed here: nothing measured",
                     INSTALL_PERFTEST)
    return None


def parse_perftest(tool: str, text: str) -> Optional[float]:
    """The figure qualify reports from a perftest client's table: ib_write_bw's
    average bandwidth (MB/s as perftest says it), ib_send_lat's typical
    latency (us). None: no such table."""
    want = PERF_FIGURE[tool][0]
    columns: list = []
    for line in text.splitlines()[:MAX_PERF_LINES]:
        words = line.strip()
        if words.startswith("#bytes"):
            columns = PERF_COLUMN.findall(words)
        elif columns and words[:1].isdigit() and want in columns:
            values = words.split()
            try:
                return float(values[columns.index(want)]) if len(values) == len(columns) else None
            except ValueError:
                return None
    return None


def peer_command(cfg, peer: str, args: list) -> list:
    """migration.peer_command to the peer (ssh in production) and args, each
    a word ssh passes on unquoted."""
    for a in args:
        if not SAFE_WORD.fullmatch(a):
            raise DriverError(f"refusing to pass {a!r} to {peer}")
    return [a.replace("{host}", peer) for a in cfg.peer_command] + args


def start_peer(cfg, opts: VmOptions) -> subprocess.Popen:
    """kvm-sriov qualify --vm --perf-serve on the peer: its VM's guest serves
    perftest to this one's; it ends its VM itself (and when ssh goes)."""
    args = ["kvm-sriov", "qualify", "--vm", "--perf-serve", "--image", str(opts.image),
            "--vm-seconds", f"{opts.seconds:g}"] + (["--initrd", str(opts.initrd)] if opts.initrd else [])
    return subprocess.Popen(peer_command(cfg, opts.peer, args), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _read_until(proc: subprocess.Popen, seconds: float, marker: Optional[bytes] = None) -> tuple[bytes, bool]:
    """What proc says (at most MAX_PERF_BYTES) until it ends, says marker, or
    ``seconds`` pass: (its output, ended or said marker)."""
    got, deadline = b"", time.monotonic() + seconds
    while len(got) <= MAX_PERF_BYTES and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            return got, True
        got += chunk
        if marker is not None and marker in got:
            return got, True
    return got, False


def host_pair(cfg, peer: str, tool: str, device: str, port: int) -> tuple[Optional[float], str]:
    """tool's server on the peer (its first RDMA device), its client here on
    the VM's PF port, bounded: (the figure, "") or (None, why)."""
    server = subprocess.Popen(peer_command(cfg, peer, ["stdbuf", "-oL", tool, *PERF_ARGS[tool]]),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        said, ready = _read_until(server, PERF_SECONDS, b"Waiting for client")
        if not ready or server.poll() is not None:
            return None, f"its server on {peer} did not start: {_short(said.decode('utf-8', 'replace'), 160)!r}"
        client = subprocess.Popen([tool, "-d", device, "-i", str(port), *PERF_ARGS[tool], peer],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            out, ended = _read_until(client, PERF_SECONDS)
        finally:
            _kill_session(client.pid)
            client.wait()
        text = out.decode("utf-8", "replace")
        figure = parse_perftest(tool, text)
        if figure is None:
            return None, f"{tool} said no result{'' if ended else f' in {PERF_SECONDS} s'}: {_short(text, 160)!r}"
        return figure, ""
    finally:
        _kill_session(server.pid)
        server.wait()


def perf_checks(cfg, opts: VmOptions, pfs, vf: str, pf: str, infiniband: bool, console: Console,
                view: GuestView, here: Here, peer: Optional[subprocess.Popen]) -> list[Check]:
    """VM to VM (the guests' perftest, said on their consoles), then host to
    host (this PF's port, the peer's first device), and their ratio."""
    why = perf_possible([p for p in pfs if p.address == pf] if infiniband else [])
    if why is not None:
        return [why]
    out = []
    if view.active():
        watch_guest(console, view, True, None, opts.seconds, here.running, until=lambda v: v.perf_end)
    said, ended = _read_until(peer, PERF_SECONDS) if peer is not None else (b"", True)
    tail = [line for line in said.decode("utf-8", "replace").splitlines() if line.strip()][-1:]
    try:
        peer_ok = peer is not None and ended and peer.wait(timeout=PERF_SECONDS) == 0
    except subprocess.TimeoutExpired:   # said all and did not end: the clean-up ends it
        peer_ok, ended = False, False
    out.append(Check("perftest peer VM", PASS if peer_ok else WARN,
                     f"kvm-sriov qualify --vm --perf-serve on {opts.peer}: "
                     + (f"exit {peer.returncode}" if ended and peer is not None else "no end in time")
                     + (f", {_short(tail[0], 160)!r}" if tail else ""),
                     None if peer_ok else f"run kvm-sriov qualify --vm on {opts.peer} alone; its ssh from here "
                                          f"(migration.peer_command) and the tools package there"))
    port = next(p for p_ in pfs if p_.address == pf for p in p_.ib_ports)
    for tool in PERF_TOOLS:
        name, unit = f"perftest {tool}", PERF_FIGURE[tool][1]
        in_vms = parse_perftest(tool, "\n".join(view.perf.get(tool, [])))
        on_hosts, problem = host_pair(cfg, opts.peer, tool, port.device, port.port)
        if in_vms is None or on_hosts is None:
            vm_why = "" if in_vms is not None else (
                f"VM to VM: {view.perf_end or 'the guests said no result'}; ")
            out.append(Check(name, WARN, vm_why + (f"host to host: {problem}" if problem else
                                                   f"host to host {on_hosts:g} {unit}"),
                             "perftest in the guest image (with ib_ipoib) and on both hosts; " + INSTALL_PERFTEST))
            continue
        out.append(Check(name, PASS, f"VM to VM {in_vms:g} {unit}, host to host {on_hosts:g} {unit}: VM/host "
                                     f"{in_vms / on_hosts:.2f}" if on_hosts else f"host to host 0 {unit}"))
    return out


# -- the VM's folder ------------------------------------------------------------------------
def vm_folder(cfg) -> Path:
    datastores = Path(cfg.datastore_location) if cfg.datastore_location else DEFAULT_DATASTORES
    return datastores / str(DATASTORE) / str(VM_ID)


def make_folder(folder: Path) -> None:
    """<datastores>/<DATASTORE>/<VM_ID>, as oned makes a VM's folder: its
    datastores directory must exist; an earlier run's folder is emptied."""
    if not folder.parent.parent.is_dir():
        raise DriverError(f"the datastores directory {folder.parent.parent} does not exist: set "
                          f"opennebula.datastore_location to oned's DATASTORE_LOCATION")
    remove_folder(folder)
    folder.parent.mkdir(mode=0o755)
    folder.mkdir(mode=0o755)


def remove_folder(folder: Path) -> None:
    top = folder.parent   # <datastores>/<DATASTORE>: qualify's own
    if os.path.lexists(top):
        if os.path.islink(top):
            raise DriverError(f"{top} is a symbolic link: not qualify's folder, remove it")
        shutil.rmtree(top)   # never follows a link inside


# -- the run --------------------------------------------------------------------------------
@contextmanager
def _signals(handler, sigint: bool = True):
    """SIGTERM, SIGHUP and (unless not sigint) SIGINT handled by ``handler``
    meanwhile, then as before."""
    names = [signal.SIGTERM, signal.SIGHUP] + ([signal.SIGINT] if sigint else [])
    before = {s: signal.signal(s, handler) for s in names}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


@contextmanager
def _deferred():
    """A signal that comes while an action script runs is acted on once the
    script has ended: its own undo runs whole (bounded by ACTION_SECONDS)."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:   # the clean-up's: they stay ignored
        yield
        return
    got: list[int] = []
    with _signals(lambda signum, _frame: got.append(signum)):
        yield
    if signal.SIGINT in got:
        raise KeyboardInterrupt
    if got:
        raise Interrupted(signal.Signals(got[0]).name)


def run(opts: VmOptions, cfg, pfs, here: Optional[Here] = None) -> list[Check]:
    """The VM test, as the pool's owner when that is not who runs qualify."""
    owner = driver_user(cfg)
    if owner is not None:
        return as_user(owner, lambda: vm_test(cfg, opts, pfs, here or Here(cfg)))
    return vm_test(cfg, opts, pfs, here or Here(cfg))


def vm_test(cfg, opts: VmOptions, pfs, here: Here) -> list[Check]:
    out: list[Check] = []
    folder = vm_folder(cfg)
    deploy_id = DOMAIN
    vfs: list[tuple[str, str]] = []
    peer: Optional[subprocess.Popen] = None
    started = False   # from the deploy on, the clean-up cancels
    with _signals(_interrupted, sigint=False):   # Ctrl-C: KeyboardInterrupt, as always
        try:
            missing = [p for p in (opts.remotes / "vmm/kvm-sriov/deploy", opts.remotes / "vmm/kvm-sriov/cancel",
                                   opts.remotes / "vmm/kvm/deploy") if not os.access(p, os.X_OK)]
            if missing:
                out.append(Check("VM deploy", FAIL, f"{missing[0]} is missing: the driver is not installed in "
                                                    f"{opts.remotes}", "onehost sync --force on the front-end "
                                                                       "(or --remotes DIR)"))
                return out
            left = here.vm_vfs() or here.running()
            if left:   # a run killed before its clean-up
                ended = end_vm(opts, DOMAIN, here, [v for v, _ in here.vm_vfs()], "earlier VM")
                out += ended
                if any(c.status == FAIL for c in ended):
                    return out
            make_folder(folder)
            if opts.peer and perf_possible(pfs) is None:   # its VM boots while this one does
                peer = start_peer(cfg, opts)
            uuid = str(uuidlib.uuid4())
            xml = deployment(uuid, opts, folder / CONSOLE, cfg.bridge)
            started = True
            ran = call_action(opts, "deploy", [folder / "deployment.0", host_name()], stdin=xml)
            vfs = here.vm_vfs()
            if ran.code != 0 or ran.timed_out:
                why = f"no answer in {ACTION_SECONDS} s" if ran.timed_out else ran.reason
                out.append(Check("VM deploy", FAIL, f"deploy exited {ran.code}: {why}",
                                 "see the reason; kvm-sriov doctor"))
                return out
            printed = (ran.stdout.split() or [""])[0]
            deploy_id = printed if re.fullmatch(r"[0-9a-fA-F-]{36}|one-\d{1,10}", printed) else DOMAIN
            if len(vfs) != 1:
                out.append(Check("VM deploy", FAIL, f"deploy printed {_short(deploy_id, 60)}, but the pool gives "
                                                    f"VM {VM_ID} {len(vfs)} VFs, not 1", "kvm-sriov status"))
                return out
            vf, pf = vfs[0]
            out.append(Check("VM deploy", PASS, f"{DOMAIN} ({_short(printed, 60)}) runs with VF {vf} of PF {pf} "
                                                f"(deploy: {ran.seconds:.0f} s)"))
            sysfs = Sysfs(cfg.sysfs_root)
            ident = [(sysfs.read(sysfs.pci(vf) / n) or "").removeprefix("0x") for n in ("vendor", "device")]
            view = GuestView(*ident)
            infiniband = any(p.address == pf and p.vendor == "15b3" and p.ib_ports for p in pfs)
            console = Console(folder / CONSOLE)
            outcome = watch_guest(console, view, infiniband, opts.pkey, opts.seconds, here.running)
            out += guest_checks(view, outcome, vf, infiniband, opts.pkey, opts.seconds, cfg.guid_policy, console)
            if opts.perf_serve and infiniband and view.active():   # the other host's client measures
                watch_guest(console, view, True, None, opts.seconds, here.running, until=lambda v: v.perf_end)
                out.append(Check("VM perftest server", PASS if view.perf_end == "done" else WARN,
                                 f"the guest served {', '.join(view.perf) or 'no run'}"
                                 + ("" if view.perf_end == "done" else f": {view.perf_end or 'not done in time'}")))
            if opts.peer:
                out += perf_checks(cfg, opts, pfs, vf, pf, infiniband, console, view, here, peer)
        except (DriverError, OSError) as exc:
            out.append(Check("VM test", FAIL, _short(str(exc), 300), "see the line (kvm-sriov doctor)"))
        except (KeyboardInterrupt, Interrupted) as exc:
            out.append(Check("VM test", FAIL, f"interrupted ({type(exc).__name__} {exc}): the VM is ended",
                             "run it again"))
        finally:
            with _signals(signal.SIG_IGN):   # the clean-up runs to its end
                if peer is not None and peer.poll() is None:   # ssh's end: the peer's qualify ends its VM
                    _kill_session(peer.pid)
                    peer.wait()
                if started:
                    out += end_vm(opts, deploy_id, here, [v for v, _ in vfs] or [v for v, _ in _safe(here.vm_vfs)])
                try:
                    if not os.path.islink(folder.parent):   # a link: not qualify's (said above), left alone
                        remove_folder(folder)
                except OSError as exc:
                    out.append(Check("VM folder", WARN, f"{folder.parent} not removed: {exc.strerror or exc}",
                                     f"rm -r {folder.parent}"))
    return out


def _safe(fn):
    try:
        return fn()
    except Exception:  # the clean-up's own look: what it cannot read it does not free
        return []


def end_vm(opts: VmOptions, deploy_id: str, here: Here, vfs: list[str], what: str = "VM") -> list[Check]:
    """cancel, as OpenNebula's CANCEL calls it; then: does libvirt still run
    the VM, does the pool still give it (or anyone) its VF?"""
    ran = call_action(opts, "cancel", [deploy_id, host_name()])
    try:
        running, hostdevs = here.live()
        held = here.held()
        mine = here.vm_vfs()
    except Exception as exc:  # libvirt or the pool cannot be read: nothing proven
        return [Check(f"{what} end", FAIL, f"cancel exited {ran.code}; then: {_short(str(exc), 200)}",
                      f"virsh destroy {DOMAIN}; kvm-sriov reconcile (as oneadmin)")]
    if ran.code != 0 or ran.timed_out or running:
        why = f"no answer in {ACTION_SECONDS} s" if ran.timed_out else ran.reason if ran.code else "still running"
        return [Check(f"{what} end", FAIL, f"cancel {deploy_id}: {why}; {DOMAIN} "
                                           + ("still runs" if running else "is gone"),
                      f"virsh destroy {DOMAIN}; kvm-sriov reconcile (as oneadmin) frees its VF")]
    out = [Check(f"{what} end", PASS, f"cancel: {DOMAIN} no longer runs ({ran.seconds:.0f} s)")]
    stuck = [v for v in vfs if v in held or v in hostdevs] + [v for v, _ in mine if v not in vfs]
    if stuck:
        out.append(Check(f"{what} VF back in the pool", FAIL,
                         f"VF {stuck[0]} is still " + (f"held by {hostdevs[stuck[0]]}" if stuck[0] in hostdevs
                                                       else "assigned in the pool"),
                         "kvm-sriov reconcile (as oneadmin) gives back what libvirt does not run"))
    elif vfs:
        out.append(Check(f"{what} VF back in the pool", PASS, f"VF {', '.join(vfs)} free again"))
    return out


# -- running as the pool's owner ------------------------------------------------------------
@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    groups: tuple
    name: str


def driver_user(cfg) -> Optional[Owner]:
    """Run as root, the actions (and the VM test) run as the owner of the
    pool's state folder, as OpenNebula runs them (oneadmin): files root made
    there would lock that user out. None: run as we are."""
    if os.geteuid() != 0:
        return None
    try:
        st = os.stat(cfg.state_dir)
    except FileNotFoundError:
        return None
    if st.st_uid == 0:
        return None
    try:
        name = pwd.getpwuid(st.st_uid).pw_name
        groups = os.getgrouplist(name, st.st_gid)
    except KeyError:
        name, groups = f"uid {st.st_uid}", [st.st_gid]
    return Owner(st.st_uid, st.st_gid, tuple(groups), name)


MAX_REPORT_BYTES = 1 << 20


def as_user(owner: Owner, work: Callable[[], list[Check]]) -> list[Check]:
    """work() in a child process that is ``owner``; its checks come back as
    JSON. The parent waits (Ctrl-C is the child's to handle)."""
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        code = 1
        try:
            os.close(read_end)
            os.setgroups(list(owner.groups))
            os.setgid(owner.gid)
            os.setuid(owner.uid)
            checks = work()
            code = 0
        except BaseException as exc:  # noqa: B036 - whatever it is, the parent gets one line
            checks = [Check("VM test", FAIL, f"as {owner.name}: {_short(str(exc) or type(exc).__name__, 300)}")]
        try:
            with os.fdopen(write_end, "wb") as f:
                f.write(json.dumps([c.as_dict() for c in checks]).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with _signals(signal.SIG_IGN), os.fdopen(read_end, "rb") as f:   # the child ends the VM
        data = f.read(MAX_REPORT_BYTES + 1)
        _, status = os.waitpid(pid, 0)
    try:
        if len(data) > MAX_REPORT_BYTES:
            raise ValueError("too long")
        return [Check(**c) for c in json.loads(data)]
    except (ValueError, TypeError):
        return [Check("VM test", FAIL, f"the VM test (as {owner.name}) ended without a report "
                                       f"(wait status {status})",
                      f"virsh destroy {DOMAIN}; kvm-sriov reconcile (as {owner.name}); run it again")]


if __name__ == "__main__":
    sys.exit(main())
