"""``kvm-sriov network-hook``: the subnet manager follows the IB networks.

Run by oned's hook manager (API hooks on the one.vn.* calls, arguments on
stdin) on the front-end. Under a lock it gives networks asking for one an
automatic PKey, renders the partitions file from oned's networks, and has
it validated by opensm, installed and opensm reloaded on the SM node (here,
or through ``infiniband.sm_push_command``). A burst of calls ends with the
file of the last state: each run reads oned after taking the lock, and a
run that finds another one already waiting leaves the work to it.

What happened last is kept in a status file next to the lock (for
``kvm-sriov doctor`` and for skipping an unchanged file).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
import xmlrpc.client
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from ..errors import DriverError
from ..ib import pkey as pkey_mod

STATUS = "network-hook.json"
REJECTED = "partitions.conf.not-installed"
RUN_LOCK = "network-hook.lock"
WAIT_LOCK = "network-hook.wait"
HOOK_PREFIX = "kvm-sriov-network-"
MAX_MESSAGE = 400


class Outcome(NamedTuple):
    ok: bool
    message: str


# -- oned ---------------------------------------------------------------------------
class Oned:
    """The few XML-RPC calls the hook makes (stdlib client: no pyone needed)."""

    def __init__(self, endpoint: str, session: str):
        self.endpoint, self.session = endpoint, session

    def call(self, method: str, *args):
        try:
            with xmlrpc.client.ServerProxy(self.endpoint, allow_none=True) as proxy:
                reply = getattr(proxy, method)(self.session, *args)
        except (OSError, xmlrpc.client.Error) as exc:
            raise DriverError(f"cannot reach OpenNebula at {self.endpoint}: {exc}") from None
        if not reply[0]:
            raise DriverError(f"OpenNebula refused {method}: {reply[1]}")
        return reply[1]

    @classmethod
    def from_environment(cls, endpoint: Optional[str] = None, session: Optional[str] = None) -> "Oned":
        """endpoint or $ONE_XMLRPC or localhost; session or the first line of $ONE_AUTH
        (default ~/.one/one_auth), as OpenNebula's own CLI finds them."""
        endpoint = endpoint or os.environ.get("ONE_XMLRPC") or "http://localhost:2633/RPC2"
        if not session:
            auth = Path(os.environ.get("ONE_AUTH") or Path.home() / ".one" / "one_auth")
            try:
                session = auth.read_text().strip()
            except OSError:
                raise DriverError(f"no OpenNebula credentials: give --session user:password or "
                                  f"create {auth} (ONE_AUTH)") from None
        return cls(endpoint, session)

    def pool_xml(self) -> str:
        return self.call("one.vnpool.info", -2, -1, -1)

    def merge(self, vnet: int, template: str) -> None:
        self.call("one.vn.update", vnet, template, 1)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- the SM node -----------------------------------------------------------------------
def push(cfg, text: str) -> str:
    """Validate, install and (when changed) reload on the SM node; what was
    done, or DriverError (one line) with the SM's file left as it was."""
    from ..ib import partitions
    if cfg.sm_push_command:
        try:
            done = subprocess.run(list(cfg.sm_push_command), input=text, capture_output=True, text=True,
                                  timeout=cfg.sm_push_seconds)
        except subprocess.TimeoutExpired:
            raise DriverError(f"the SM node did not answer in {cfg.sm_push_seconds:.0f} s "
                              f"({' '.join(cfg.sm_push_command)}): its partitions file is unchanged") from None
        except OSError as exc:
            raise DriverError(f"{cfg.sm_push_command[0]}: {exc.strerror}") from None
        if done.returncode != 0:
            why = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
            raise DriverError(f"the SM node refused or could not be reached ({' '.join(cfg.sm_push_command)}, "
                              f"exit {done.returncode}): {why}")
        return (done.stderr or done.stdout).strip().splitlines()[-1:][0] if (done.stderr or done.stdout).strip() \
            else "sent to the SM node"
    target = cfg.partitions_file   # the SM node is here
    try:
        changed = partitions.install(target, text)
    except DriverError as exc:
        raise DriverError(str(exc)[:MAX_MESSAGE]) from None
    if not changed:
        return f"{target} unchanged, no reload"
    partitions.reload_sm(cfg.sm_reload_command)
    return f"{target} written, opensm reloaded"


# -- state on the front-end ------------------------------------------------------------
def read_status(state_dir: Path) -> Optional[dict]:
    try:
        with open(state_dir / STATUS, "rb") as fh:
            data = json.loads(fh.read(65536).decode())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_status(state_dir: Path, status: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".network-hook.", dir=state_dir)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(status, fh)
        os.replace(tmp, state_dir / STATUS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _keep(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except OSError:
        pass  # only a help for the operator


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


# -- the hook ------------------------------------------------------------------------------
def run(cfg, call: Optional[pkey_mod.Call], oned: Oned, pusher: Callable = push) -> Outcome:
    """One hook execution (call None: a full resync, whatever changed)."""
    if call is not None and not call.success:
        return Outcome(True, f"{call.method} failed: nothing to do")
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    waiter = _open_lock(state / WAIT_LOCK)
    try:
        try:
            fcntl.flock(waiter, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run waits and will read oned after this call
            return Outcome(True, "another run is waiting and will see this change")
        runner = _open_lock(state / RUN_LOCK)
        try:
            fcntl.flock(runner, fcntl.LOCK_EX)
            fcntl.flock(waiter, fcntl.LOCK_UN)  # from here on, a new call needs a new run
            return _locked(cfg, call, oned, pusher)
        finally:
            os.close(runner)
    finally:
        os.close(waiter)


def _locked(cfg, call, oned: Oned, pusher: Callable) -> Outcome:
    from ..domain.domain_xml import parse
    from ..ib import partitions
    started = time.time()
    status = read_status(cfg.state_dir) or {}
    pool_text = oned.pool_xml()
    nets = pkey_mod.vnets(parse(pool_text, "virtual network pool"), cfg.bridge)
    ib_ids = {n.id for n in pkey_mod.on_bridge(nets)}
    named = set(call.networks) if call is not None else set()
    known = set(status.get("networks", []))
    if call is not None and named and not (named & (ib_ids | known)) and status.get("ok"):
        return Outcome(True, f"{call.method} on network(s) {sorted(named)}: not InfiniBand, nothing to do")
    errors = []
    choices = pkey_mod.choose(nets, cfg.pkey_range)
    for choice in choices:
        if choice.pkey is None:
            oned.merge(choice.network, f"{pkey_mod.ERROR_ATTRIBUTE} = {_quote(choice.error)}")
            errors.append(f"network {choice.network}: no PKey: {choice.error}")
            continue
        extra = f"\n{pkey_mod.ERROR_ATTRIBUTE} = \"\"" if any(
            n.id == choice.network and n.error for n in nets) else ""
        oned.merge(choice.network, f"VLAN_ID = \"0x{choice.pkey:04x}\"{extra}")
    named_ib = [n for n in pkey_mod.on_bridge(nets) if n.id in named]
    if named_ib and all(n.creating for n in named_ib) and not errors:
        # the network driver is still creating them: the READY state hook sends the file
        return Outcome(True, f"network(s) {[n.id for n in named_ib]} being created: keys "
                             f"{[f'0x{c.pkey:04x}' for c in choices]}; the file follows when READY")
    if choices:  # keys were written: render what oned has now
        pool_text = oned.pool_xml()
    networks = partitions.networks_from_xml(pool_text, cfg.bridge)
    text = partitions.render(networks, cfg.default_partition_members, cfg.bridge, [])
    digest = hashlib.sha256(text.encode()).hexdigest()
    record = {"time": started, "networks": sorted({n.id for n in networks} | ib_ids),
              "call": call.method if call is not None else "resync"}
    if status.get("ok") and status.get("digest") == digest:
        done = "partitions file unchanged, no reload"
    else:
        try:
            done = pusher(cfg, text)
        except DriverError as exc:
            _keep(cfg.state_dir / REJECTED, text)
            message = f"{exc} (last good file kept; this one is in {cfg.state_dir / REJECTED})"
            _write_status(cfg.state_dir, dict(status, **record, ok=False, message=message[:MAX_MESSAGE * 2]))
            return Outcome(False, "; ".join(errors + [message]))
    message = "; ".join(errors + [f"{done} ({time.time() - started:.1f} s)"])
    _write_status(cfg.state_dir, dict(record, ok=not errors, digest=digest, message=message[:MAX_MESSAGE * 2]))
    return Outcome(not errors, message)


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
    from ..domain.domain_xml import parse
    existing = {}
    for h in parse(oned.call("one.hookpool.info", -2, -1, -1), "hook pool").findall("HOOK"):
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
    """``python3 -m kvm_sriov.oned.network_hook setup|check --command CMD``: what Puppet
    and Ansible run as oneadmin (the library, not a CLI, is what they know the path of);
    check exits 0 when every hook is as setup would make it, 3 when not."""
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="python3 -m kvm_sriov.oned.network_hook",
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
