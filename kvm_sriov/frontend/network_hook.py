"""``kvm-sriov network-hook``: the subnet manager follows the IB networks.

Run by oned's hook manager (API hooks on the one.vn.* calls, arguments on
stdin) on the front-end. Under a lock it gives networks asking for one an
automatic PKey, renders the partitions file from oned's networks, and has
the configured partition manager enforce it (fabric/: e.g. opensm validating
and installing it on each SM node, here or through
``infiniband.sm_push_command``). A burst of calls ends with the
file of the last state: each run reads oned after taking the lock, and a
run that finds another one already waiting leaves the work to it.

Writing into a network is best effort: oned refuses it for a network its
owner locked (even to oneadmin) or one deleted meanwhile, and that network
alone goes without; the file always follows what oned has. Only what
differs is written, and an update that set nothing but what the hook writes
(and that the SM node's file already has) is not followed again: each write
is itself an update that runs the hook.

What happened last is kept in a status file next to the lock (for
``kvm-sriov doctor`` and for skipping an unchanged file). After a run that sent
the file, what each place enforces is read back and compared with it
(fabric/drift.py, as ``kvm-sriov partitions --check``): best effort, its result
goes into that status (``drift``, and a short note in the message doctor shows),
and a check that fails never fails the run.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import sys
import time
import xmlrpc.client
from http.client import HTTPException
from pathlib import Path
from typing import Callable, NamedTuple, Optional
from xml.parsers.expat import ExpatError

from .. import locks
from ..domain.domain_xml import parse
from ..errors import DriverError, InputError
from ..fabric import drift, manager, repair as fabric_repair
from ..files import atomic_write
from ..ib import partitions, pkey as pkey_mod
from ..ib.partitions import parse_pkey
from ..vf import state_folder

STATUS = "network-hook.json"
REJECTED = "partitions.conf.not-installed"
RUN_LOCK = "network-hook.lock"
WAIT_LOCK = "network-hook.wait"
HOOK_PREFIX = "kvm-sriov-network-"
MAX_MESSAGE = 400
MAX_STATUS_BYTES = 8 * 1024 * 1024    # the status of a cloud of 100,000 networks, with room
ONED_SECONDS = 30                       # one call to oned (the hooks' TIMEOUT is 60 s)
MAX_REPLY_BYTES = 256 * 1024 * 1024     # one.vnpool.info of a large cloud, with room
MAX_AUTH_BYTES = 4096                   # ONE_AUTH: one line, user:password


class Outcome(NamedTuple):
    ok: bool
    message: str


def _one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    return " ".join(str(text).split())[:limit]


# -- oned ---------------------------------------------------------------------------
class _Bounded:
    """oned's answer: within ONED_SECONDS of silence, MAX_REPLY_BYTES, and no DOCTYPE
    (entities)."""
    accept_gzip_encoding = False

    def make_connection(self, host):
        connection = super().make_connection(host)
        connection.timeout = ONED_SECONDS   # read when it connects: every read has it
        return connection

    def parse_response(self, response):
        body = response.read(MAX_REPLY_BYTES + 1)
        if len(body) > MAX_REPLY_BYTES:
            raise DriverError(f"OpenNebula's answer is larger than {MAX_REPLY_BYTES >> 20} MiB")
        if b"<!DOCTYPE" in body:
            raise DriverError("OpenNebula's answer has a DOCTYPE (entities): refused")
        parser, unmarshaller = self.getparser()
        parser.feed(body)
        parser.close()
        return unmarshaller.close()


class _Http(_Bounded, xmlrpc.client.Transport):
    pass


class _Https(_Bounded, xmlrpc.client.SafeTransport):
    pass


class Oned:
    """The few XML-RPC calls the hook makes (stdlib client: no pyone needed)."""

    def __init__(self, endpoint: str, session: str):
        self.endpoint, self.session = endpoint, session

    def call(self, method: str, *args):
        transport = _Https() if self.endpoint.lower().startswith("https:") else _Http()
        try:
            with xmlrpc.client.ServerProxy(self.endpoint, transport=transport, allow_none=True) as proxy:
                reply = getattr(proxy, method)(self.session, *args)
        except TimeoutError:
            raise DriverError(f"OpenNebula at {self.endpoint} did not answer {method} "
                              f"in {ONED_SECONDS} s") from None
        except (OSError, xmlrpc.client.Error, HTTPException, ExpatError, ValueError, TypeError,
                LookupError) as exc:   # the last three: a reply xmlrpc.client cannot unmarshal
            raise DriverError(f"cannot reach OpenNebula at {self.endpoint}: {_one_line(exc)}") from None
        if not (isinstance(reply, list) and len(reply) >= 2 and isinstance(reply[0], bool)):
            raise DriverError(f"OpenNebula at {self.endpoint} answered {method} with something that is "
                              f"not [success, result, ...]")
        if not reply[0]:
            raise DriverError(f"OpenNebula refused {method}: {_one_line(reply[1])}")
        return reply[1]

    def text(self, method: str, *args) -> str:
        """A call whose result is text (XML)."""
        result = self.call(method, *args)
        if not isinstance(result, str):
            raise DriverError(f"OpenNebula at {self.endpoint} answered {method} with a "
                              f"{type(result).__name__}, not text")
        return result

    @classmethod
    def from_environment(cls, endpoint: Optional[str] = None, session: Optional[str] = None) -> "Oned":
        """endpoint or $ONE_XMLRPC or localhost; session or the first line of $ONE_AUTH
        (default ~/.one/one_auth), as OpenNebula's own CLI finds them."""
        endpoint = endpoint or os.environ.get("ONE_XMLRPC") or "http://localhost:2633/RPC2"
        if not session:
            auth = Path(os.environ.get("ONE_AUTH") or Path.home() / ".one" / "one_auth")
            try:
                with open(auth, "rb") as fh:
                    data = fh.read(MAX_AUTH_BYTES + 1)
            except OSError:
                raise DriverError(f"no OpenNebula credentials: give --session user:password or "
                                  f"create {auth} (ONE_AUTH)") from None
            lines = data[:MAX_AUTH_BYTES].decode("utf-8", "replace").splitlines()
            session = lines[0].strip() if lines else ""
            if len(data) > MAX_AUTH_BYTES or not session:
                raise DriverError(f"{auth} (ONE_AUTH) must hold one line, user:password "
                                  f"(it is {'empty' if not session else f'larger than {MAX_AUTH_BYTES} bytes'})")
        return cls(endpoint, session)

    def pool_xml(self) -> str:
        return self.text("one.vnpool.info", -2, -1, -1)

    def merge(self, vnet: int, template: str) -> None:
        self.call("one.vn.update", vnet, template, 1)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- the SM node(s) -----------------------------------------------------------------
def push(cfg, text: str) -> str:
    """The configured partition manager enforces the file (e.g. opensm: validated,
    installed and reloaded on each SM node); what was done,
    or DriverError (one line) naming each place that failed, which keeps what
    it had."""
    return manager.enforce(cfg, text)


# -- state on the front-end ------------------------------------------------------------
def read_status(state_dir: Path) -> Optional[dict]:
    try:
        with os.fdopen(state_folder.open_file(state_dir / STATUS, os.O_RDONLY), "rb") as fh:
            data = json.loads(fh.read(MAX_STATUS_BYTES).decode())
    except (OSError, ValueError, DriverError):
        return None
    return data if isinstance(data, dict) else None


def _write_status(state_dir: Path, status: dict, before: dict) -> None:
    """Each recorded outcome counts one run, and a failed one a failure too, on
    top of ``before`` (the status read at the start): the metrics' counters."""
    status = dict(status, runs=_count(before, "runs") + 1,
                  failures=_count(before, "failures") + (status.get("ok") is not True))
    atomic_write(state_dir / STATUS, json.dumps(status), mode=0o600)


def _count(status: dict, key: str) -> int:
    value = status.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _members(text: str) -> dict[str, int]:
    """Port GUIDs per PKey ('0x1000') in a file partitions.render made: one
    '    0x<guid>' line each below its partition's 'Name=0x9000, ...' line
    (Default, whose members are the SM's own, aside). For the metrics."""
    out: dict[str, int] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("    0x"):
            if key is not None:
                out[key] += 1
        elif not line.startswith("#") and "=0x" in line:
            try:
                base = int(line.split("=0x", 1)[1][:4], 16) & 0x7FFF
            except ValueError:
                key = None
                continue
            key = f"0x{base:04x}" if base != 0x7FFF else None
            if key is not None:
                out[key] = 0
    return out


def _keep(path: Path, text: str) -> None:
    try:
        fd = state_folder.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except (OSError, DriverError):
        pass  # only a help for the operator


def _open_lock(path: Path) -> int:
    return state_folder.open_file(path, os.O_RDWR | os.O_CREAT, 0o600)


# -- the hook ------------------------------------------------------------------------------
def run(cfg, call: Optional[pkey_mod.Call], oned: Oned, pusher: Callable = push) -> Outcome:
    """One hook execution (call None: a full resync, whatever changed, and the file
    sent whatever the status file says)."""
    if call is not None and not call.success:
        return Outcome(True, f"{call.method} failed: nothing to do")
    own = call.hook_attributes if call is not None else None
    if own is not None and set(own) == {pkey_mod.ERROR_ATTRIBUTE}:
        return Outcome(True, f"{call.method} on network(s) {list(call.networks)} set only "
                             f"{pkey_mod.ERROR_ATTRIBUTE}, which no partition depends on: nothing to do")
    state = cfg.state_dir
    state_folder.make(state)   # the driver's user's alone
    if own is not None:
        # a key written, most likely by the run that holds the lock now: once it is
        # done the status file says whether the SM node's file has that key. Never the
        # waiter: a real change that finds this run waiting would be left to it.
        runner = _open_lock(state / RUN_LOCK)
        try:
            locks.acquire(runner)
            if _sent_already(read_status(state) or {}, call):
                return Outcome(True, f"{call.method} on network(s) {list(call.networks)} set only VLAN_ID "
                                     f"{own['VLAN_ID']}, which the SM node's file has: nothing to do")
            return _locked(cfg, call, oned, pusher)
        finally:
            os.close(runner)
    waiter = _open_lock(state / WAIT_LOCK)
    try:
        try:
            locks.acquire(waiter, 0)
        except locks.LockTimeout:  # another run waits and will read oned after this call
            return Outcome(True, "another run is waiting and will see this change")
        runner = _open_lock(state / RUN_LOCK)
        try:
            locks.acquire(runner)
            fcntl.flock(waiter, fcntl.LOCK_UN)  # from here on, a new call needs a new run
            return _locked(cfg, call, oned, pusher)
        finally:
            os.close(runner)
    finally:
        os.close(waiter)


def _sent_already(status: dict, call: pkey_mod.Call) -> bool:
    """The update's VLAN_ID is the key its network had in the file the SM node took
    last: the file does not change."""
    sent = status.get("pkeys")
    if not (status.get("sm_ok") and isinstance(sent, dict) and len(call.networks) == 1):
        return False
    try:
        key = parse_pkey(call.hook_attributes["VLAN_ID"], "VLAN_ID")
    except (KeyError, InputError):
        return False
    return sent.get(str(call.networks[0])) == key


def _locked(cfg, call, oned: Oned, pusher: Callable) -> Outcome:
    """Under the run lock. Whatever fails is recorded where doctor looks."""
    started = time.time()
    status = read_status(cfg.state_dir) or {}
    try:
        return _sync(cfg, call, oned, pusher, status, started)
    except DriverError as exc:   # oned unreachable, or what it or the renderer said refused
        message = _one_line(exc, MAX_MESSAGE * 2)
        _write_status(cfg.state_dir, dict(status, time=started, ok=False, message=message,
                                          call=call.method if call is not None else "resync"), status)
        return Outcome(False, message)


def _pool(oned: Oned, bridge: str):
    """oned's pool, parsed once (the keys and the file are read from the same tree), and
    its networks' keys."""
    root = parse(oned.pool_xml(), "virtual network pool")
    if root.tag != "VNET_POOL":
        raise InputError(f"one.vnpool.info answered <{root.tag[:40]}>, not a VNET_POOL")
    return root, pkey_mod.vnets(root, bridge)


def desired(cfg, pool) -> tuple[list[partitions.Network], str]:
    """oned's networks on the bridge and the partitions file the hook sends for them
    (``kvm-sriov partitions --check`` compares what the SM enforces with it); ``pool``:
    one.vnpool.info's text, or _pool's tree of it."""
    networks = (partitions.networks_from_xml(pool, cfg.bridge) if isinstance(pool, str)
                else partitions.networks_from_root(pool, cfg.bridge))
    return networks, partitions.render(networks, cfg.default_partition_members, cfg.bridge, [])


def _sync(cfg, call, oned: Oned, pusher: Callable, status: dict, started: float) -> Outcome:
    pool, nets = _pool(oned, cfg.bridge)
    ib_ids = {n.id for n in pkey_mod.on_bridge(nets)}
    named = set(call.networks) if call is not None else set()
    known = set(status.get("networks", []))
    # A call on other networks only: nothing to do if the file would not change. Never
    # judged by the call alone: the calls that found this run waiting left their
    # changes to it (a deleted IB network's removal once rode on a non-IB DONE event).
    if (call is not None and named and not (named & (ib_ids | known)) and status.get("sm_ok")
            and status.get("digest") == hashlib.sha256(desired(cfg, pool)[1].encode()).hexdigest()):
        return Outcome(True, f"{call.method} on network(s) {sorted(named)}: not InfiniBand, nothing to do")
    by_id = {n.id: n for n in nets}
    errors, refused, unwritten = [], [], {}
    choices = pkey_mod.choose(nets, cfg.pkey_range, cfg.pkeys_per_user, cfg.pkeys_per_group)
    keyed = False
    for choice in choices:
        had = by_id[choice.network].error
        if choice.pkey is None:
            (refused if choice.over_quota else errors).append(f"network {choice.network}: no PKey: {choice.error}")
            template = "" if had == choice.error else f"{pkey_mod.ERROR_ATTRIBUTE} = {_quote(choice.error)}"
        else:
            template = f'VLAN_ID = "0x{choice.pkey:04x}"' + (f'\n{pkey_mod.ERROR_ATTRIBUTE} = ""' if had else "")
        if not template:
            continue   # written by an earlier run: writing it again would only run the hook again
        try:
            oned.merge(choice.network, template)
            keyed = keyed or choice.pkey is not None
        except DriverError as exc:   # locked by its owner, deleted meanwhile: it alone goes without
            unwritten[choice.network] = f"network {choice.network}: not updated ({_one_line(exc)})"
    named_ib = [n for n in pkey_mod.on_bridge(nets) if n.id in named]
    if named_ib and all(n.creating for n in named_ib) and not errors and not unwritten:
        # the network driver is still creating them: the READY state hook sends the file
        return Outcome(True, f"network(s) {[n.id for n in named_ib]} being created: keys "
                             f"{[f'0x{c.pkey:04x}' for c in choices if c.pkey is not None]}; "
                             f"the file follows when READY")
    if keyed or unwritten:  # render what oned has now; a network gone meanwhile is no failure
        pool, nets = _pool(oned, cfg.bridge)
        there = {n.id for n in nets if not n.done}
        unwritten = {vid: why for vid, why in unwritten.items() if vid in there}
    networks, text = desired(cfg, pool)
    digest = hashlib.sha256(text.encode()).hexdigest()
    record = {"time": started, "networks": sorted({n.id for n in networks} | ib_ids),
              "call": call.method if call is not None else "resync", "not_updated": list(unwritten.values())}
    said = errors + list(unwritten.values()) + refused
    # the last push's, and the drift check after it, kept until the next
    sm = {k: status[k] for k in ("sm_seconds", "sm_time", "drift") if k in status}
    if call is not None and status.get("sm_ok") and status.get("digest") == digest:
        done = "partitions file unchanged, no reload"
    else:  # a resync sends it whatever the status says: the SM node's file may have been changed
        pushed = time.monotonic()
        try:
            done = pusher(cfg, text)
        except DriverError as exc:
            _keep(cfg.state_dir / REJECTED, text)
            message = f"{exc} (last good file kept; this one is in {cfg.state_dir / REJECTED})"
            _write_status(cfg.state_dir, dict(status, **record, ok=False, sm_ok=False,
                                              message="; ".join(said + [message])[:MAX_MESSAGE * 2]), status)
            return Outcome(False, "; ".join(said + [message]))
        sm = {"sm_seconds": round(time.monotonic() - pushed, 3), "sm_time": time.time()}
        if not (status.get("sm_ok") and status.get("digest") == digest):   # the partitions changed
            sm["drift"] = check_drift(cfg, text)
            if sm["drift"]["note"]:
                done = f"{done}; {sm['drift']['note']}"
    ok = not errors and not unwritten
    message = "; ".join(said + [f"{done} ({time.time() - started:.1f} s)"])
    _write_status(cfg.state_dir, dict(record, **sm, ok=ok, sm_ok=True, digest=digest,
                                      message=message[:MAX_MESSAGE * 2], members=_members(text),
                                      pkeys={str(n.id): n.pkey for n in networks
                                             if n.pkey and not (n.problem or n.counted_only)}), status)
    return Outcome(ok, message)


# -- drift: what the places enforce, against what was sent ---------------------------------------
def check_drift(cfg, text: str) -> dict:
    """What each place enforces now against ``text``, just sent (fabric/drift.py), for the
    status: {"time", "exit_code" (as --check's; None: not checked), "counts" (place -> kind
    -> n), "note" (one line for the run's message, "" when there is nothing to say)}. Best
    effort: whatever goes wrong is said in it, never raised."""
    record = {"time": time.time(), "exit_code": None, "counts": {}, "note": ""}
    try:
        fabric = manager.for_config(cfg)
        lacking = fabric.missing()
        if lacking:     # not set up to read back (e.g. no fabric.sm_read_command): nothing to check, not news
            return dict(record, why=_one_line(lacking))
        result = drift.check(fabric, text)
    except Exception as exc:   # whatever it is: a check after the run never fails the run
        return dict(record, note=_one_line(f"drift not checked: {exc}"))
    record.update(exit_code=result.exit_code, counts={p.place: p.counts for p in result.places})
    unread = [f"{p.place}: {p.error}" for p in result.places if p.error]
    found = [f"{p.place}: " + ", ".join(f"{k} {n}" for k, n in p.counts.items())
             for p in result.places if p.counts and not p.error]
    notes = (["drift not checked at " + "; ".join(unread)] if unread else []) + (
        ["drift after the run: " + "; ".join(found) + " (kvm-sriov partitions --check, --repair)"] if found else [])
    return dict(record, note=_one_line("; ".join(notes)))


def repair(cfg, fabric, oned: Oned) -> fabric_repair.Repaired:
    """``kvm-sriov partitions --repair`` under the hook's run lock: no run sends a file
    while a repair does, and the repair renders what oned has once the run before it is
    done. oned that cannot be read changes nothing."""
    state_folder.make(cfg.state_dir)
    runner = _open_lock(cfg.state_dir / RUN_LOCK)
    try:
        locks.acquire(runner, cfg.lock_seconds, "the network hook's run lock")
        try:
            text = desired(cfg, oned.pool_xml())[1]
        except DriverError as exc:
            unread = drift.unread("oned", f"the networks cannot be read: {exc}")
            return fabric_repair.Repaired([], unread, unread)
        return fabric_repair.repair(fabric, text)
    finally:
        os.close(runner)


# -- registration -----------------------------------------------------------------------------
UP_TO_DATE = "is up to date"


def hook_templates(command: str) -> dict[str, tuple[str, str]]:
    """One API hook per call, named kvm-sriov-network-<call>, and the state hooks of a
    network becoming READY and DONE: name -> (arguments, template)."""
    out = {}
    for method in pkey_mod.NETWORK_CALLS:
        name = HOOK_PREFIX + method.removeprefix("one.").replace(".", "-")
        arguments = f"{method} $API"
        out[name] = (arguments, f'NAME = "{name}"\nTYPE = "api"\nCALL = "{method}"\n'
                                f'COMMAND = {_quote(command)}\nARGUMENTS = "{arguments}"\n'
                                f'ARGUMENTS_STDIN = "YES"\nTIMEOUT = "60"\n')
    for method, state in pkey_mod.STATE_HOOKS.items():
        name, arguments = HOOK_PREFIX + state.lower(), f"{method} $TEMPLATE"
        out[name] = (arguments, f'NAME = "{name}"\nTYPE = "state"\nRESOURCE = "NET"\nSTATE = "{state}"\n'
                                f'COMMAND = {_quote(command)}\nARGUMENTS = "{arguments}"\n'
                                f'ARGUMENTS_STDIN = "YES"\nTIMEOUT = "60"\n')
    return out


def register(oned: Oned, command: str, dry_run: bool = False) -> list[str]:
    """Create the hooks, or update the ones that differ; what was done
    (dry_run: what would be, nothing is changed)."""
    existing = {}
    for h in parse(oned.text("one.hookpool.info", -2, -1, -1), "hook pool").findall("HOOK"):
        existing[(h.findtext("NAME") or "").strip()] = h
    done = []
    for name, (arguments, template) in hook_templates(command).items():
        h = existing.get(name)
        if h is None:
            if not dry_run:
                oned.call("one.hook.allocate", template)
            done.append(f"{'would create' if dry_run else 'created'} hook {name}")
            continue
        have = (h.findtext("TEMPLATE/COMMAND") or "", h.findtext("TEMPLATE/ARGUMENTS") or "",
                (h.findtext("TEMPLATE/ARGUMENTS_STDIN") or "").upper())
        if have != (command, arguments, "YES"):
            if not dry_run:
                oned.call("one.hook.update", int(h.findtext("ID")), template, 0)
            done.append(f"{'would update' if dry_run else 'updated'} hook {name}")
        else:
            done.append(f"hook {name} {UP_TO_DATE}")
    return done


def main(argv: Optional[list] = None) -> int:
    """``python3 -m kvm_sriov.frontend.network_hook setup|check --command CMD``: what Puppet
    and Ansible run as oneadmin (the library, not a CLI, is what they know the path of);
    check exits 0 when every hook is as setup would make it, 3 when not."""
    p = argparse.ArgumentParser(prog="python3 -m kvm_sriov.frontend.network_hook",
                                description="register kvm-sriov's network hooks in oned (kvm-sriov setup-hooks)")
    p.add_argument("action", choices=["setup", "check"])
    p.add_argument("--command", required=True, help="the hooks' COMMAND: a kvm-sriov CLI and network-hook")
    p.add_argument("--endpoint", help="oned XML-RPC endpoint (default $ONE_XMLRPC or localhost)")
    p.add_argument("--session", help="user:password (default: $ONE_AUTH or ~/.one/one_auth)")
    args = p.parse_args(argv)
    try:
        done = register(Oned.from_environment(args.endpoint, args.session), args.command, dry_run=args.action == "check")
    except DriverError as exc:
        print(f"kvm-sriov: {exc}", file=sys.stderr)
        return 1
    stale = [line for line in done if not line.endswith(UP_TO_DATE)]
    if args.action == "check":
        for line in stale:
            print(line)
        return 3 if stale else 0
    for line in done:
        print(line)
    print(f"{len(stale)} hook(s) created or updated" if stale else "every hook up to date, nothing changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
