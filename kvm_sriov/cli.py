"""``kvm-sriov``: the administrator's view of a host's VF pool.

    kvm-sriov status [--json]          who holds which VF, its GUID, since when
    kvm-sriov reconcile [--dry-run]    make the pool agree with libvirt (and restore stale GUIDs)
    kvm-sriov doctor                   is this host ready? says exactly what to fix
    kvm-sriov qualify [--json P]       may tenants land here? read-only checks, a report to attach
                                       (--vm: a throwaway VM gets a VF and gives it back)
    kvm-sriov guids [--json]           programmed GUIDs, checked against sysfs
    kvm-sriov partitions [...]         print opensm's partitions.conf (--write, --validate FILE,
                                       --check, --repair: the SM's truth against oned's)
    kvm-sriov network-hook             (front-end, run by oned's hooks) keys and partitions follow the networks
    kvm-sriov setup-hooks              (front-end, oned up) register the network hooks
    kvm-sriov metrics --textfile-dir D Prometheus metrics into D/kvm_sriov.prom (node exporter's textfile collector)

Exit codes: 0 fine, 1 a check or an action failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import pwd
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from . import __version__, config as config_mod, files
from .errors import DriverError
from .fabric import drift, manager
from .frontend import network_hook, oned_conf
from .frontend.network_hook import Oned
from .ib import guid, opensm_check, partitions, pkey
from .metrics import write_textfile
from .node import qualify_vm
from .node.doctor import gpudirect_as_root, run_checks
from .node.host import Host
from .vf import availability
from .vf.pool import VfPool

REMOTES_CANDIDATES = (Path("/var/tmp/one"), Path("/var/lib/one/remotes"))


def _age(since: float, now: float) -> str:
    s = max(0, int(now - since))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _since(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*map(str, r)).rstrip() for r in [header] + rows)


def _host(cfg):
    return Host(cfg)


# -- status -------------------------------------------------------------------------
def cmd_status(cfg, args) -> int:
    pool = VfPool(cfg.pool_db, cfg.lock_seconds)
    now = time.time()
    assignments, whole, records = [], [], {}
    if cfg.pool_db.exists():
        with pool.transaction() as txn:
            assignments = txn.assignments()
            whole = txn.pf_assignments()
            records = {r.vf: r for r in guid.records(txn.db)}
    pool.close()
    host = availability.scan(cfg)
    if host.error:
        raise config_mod.ConfigError(host.error)
    held = {a.vf for a in assignments}
    summary = []
    for entry in host.pfs:
        pf, n = entry.pf, availability.counts(entry.vfs, held)
        summary.append({"pf": pf.address, "ib": ",".join(pf.ib_devices), "netdev": ",".join(pf.netdevs),
                        "numa": pf.numa_node, "vfs": len(entry.vfs), "eligible": n.total, "free": n.free})
    rows = [{"vf": a.vf, "pf": a.pf, "vm": a.vm_id, "domain": a.domain, "mac": a.mac, "state": a.state,
             "since": a.since, "op": a.op,
             "port_guid": records[a.vf].port_guid if a.vf in records else ""} for a in assignments]
    # a PF passed through whole has its VFs switched off: without these rows its 0 VFs would be unexplained
    pf_rows = [{"pf": w.pf, "vm": w.vm_id, "domain": w.domain, "mac": w.mac, "state": w.state,
                "since": w.since, "op": w.op, "vfs_after": w.num_vfs} for w in whole]
    if args.json:
        json.dump({"pfs": summary, "assignments": rows, "whole_pfs": pf_rows}, sys.stdout, indent=2)
        print()
        return 0
    print(_table([[s["pf"], s["ib"] or "-", s["netdev"] or "-", "-" if s["numa"] is None else s["numa"],
                   s["vfs"], s["eligible"], s["free"]] for s in summary],
                 ["PF", "IB", "NETDEV", "NUMA", "VFS", "USABLE", "FREE"]))
    print()
    if pf_rows:
        print(_table([[r["pf"], r["vm"], r["domain"], r["mac"] or "-", r["state"], _since(r["since"]),
                       _age(r["since"], now), r["vfs_after"]] for r in pf_rows],
                     ["WHOLE PF", "VM", "DOMAIN", "MAC", "STATE", "SINCE", "AGE", "VFS AFTER"]))
        print()
    if not rows:
        print("no VF is assigned")
        return 0
    print(_table([[r["vf"], r["vm"], r["domain"], r["mac"] or "-", r["port_guid"] or "-", r["state"],
                   _since(r["since"]), _age(r["since"], now)] for r in rows],
                 ["VF", "VM", "DOMAIN", "MAC", "PORT GUID", "STATE", "SINCE", "AGE"]))
    return 0


# -- reconcile ------------------------------------------------------------------------
def cmd_reconcile(cfg, args) -> int:
    host = _host(cfg)
    try:
        changes = host.reconcile(dry_run=args.dry_run)
        with host.pool.transaction() as txn:
            if args.dry_run:  # what the frees above would orphan, plus what is orphaned already
                moved = {c.vf for c in changes if c.kind in ("free", "reassign")}
                stale = [r for r in guid.records(txn.db)
                         if r.vf in moved or r in guid.orphans(txn.db)]
                strays = guid.strays(txn.db, host.sysfs, host.inventory)
            else:
                stale = guid.restore_orphans(txn.db, host.sysfs, host.inventory, cfg.ip_command)
                strays = guid.reset_strays(txn.db, host.sysfs, host.inventory, cfg.ip_command)
    finally:
        host.close()
    verb = "would" if args.dry_run else "did"
    for c in changes:
        print(f"{verb} {c}")
    for r in stale:
        print(f"{verb} restore GUID {r.port_guid} of VF {r.vf} (VM {r.vm_id} no longer holds it)")
    for vf, g in strays:
        print(f"{verb} reset GUID {g} of free VF {vf.address} (a VM's GUID, no record)")
    if not changes and not stale and not strays:
        print("pool, libvirt and GUIDs agree: nothing to do")
    return 0


# -- guids ----------------------------------------------------------------------------
def cmd_guids(cfg, args) -> int:
    host = _host(cfg)
    try:
        records = host.guid_records() if cfg.pool_db.exists() else []
        rows = []
        for r in records:
            pf, vf = host.inventory.pf(r.pf), host.inventory.vf(r.vf)
            backend = guid.backend_for(host.sysfs, pf, vf.index, cfg.ip_command) if pf and vf else None
            live = backend.read().port if backend else None
            check = "ok" if live in (None, r.port_guid) else f"MISMATCH (sysfs: {live})"
            rows.append({"vf": r.vf, "vm": r.vm_id, "mac": r.mac, "port_guid": r.port_guid,
                         "node_guid": r.node_guid, "original": r.orig_port, "backend": r.backend,
                         "since": r.since, "check": check if backend else "VF gone"})
    finally:
        host.close()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    elif not rows:
        print("no GUID is programmed")
    else:
        print(_table([[r["vf"], r["vm"], r["mac"], r["port_guid"], r["node_guid"] or "-",
                       r["original"] or "?", r["backend"], r["check"]] for r in rows],
                     ["VF", "VM", "MAC", "PORT GUID", "NODE GUID", "WAS", "VIA", "CHECK"]))
    return 1 if any(r["check"] != "ok" for r in rows) else 0


# -- partitions -----------------------------------------------------------------------
MAX_INPUT_BYTES = 256 * 1024 * 1024  # far above any `onevnet list -x`; /dev/zero must not fill memory


def read_input(path: str, what: str) -> str:
    """A file the administrator named, as text; DriverError (one line) when
    it cannot be read. Pipes (/dev/stdin) are fine; the size is bounded."""
    data = files.read_bounded(path, MAX_INPUT_BYTES, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DriverError(f"{what} {path} is not UTF-8 text") from None


def cmd_partitions(cfg, args) -> int:
    """Prints the file (the only output on stdout, what Puppet's exec takes);
    --validate asks opensm about a file; --write puts it in place itself."""
    if args.validate:
        verdict = opensm_check.check_text(read_input(args.validate, "partitions file"))
        for line in verdict.errors:
            print(line, file=sys.stderr)
        if not verdict.accepted:
            print(f"kvm-sriov partitions: opensm rejects {args.validate}", file=sys.stderr)
        return 0 if verdict.accepted else 1
    if args.install:  # a file made by the front-end's network hook
        text = read_input("/dev/stdin" if args.install == "-" else args.install, "partitions file")
        return _install(cfg, args, text, [])
    if args.json and not ((args.check or args.repair) and not args.output):
        raise DriverError("--json goes with --check or --repair (and without --output)")
    if args.repair:
        return _repair(cfg, args)
    if args.check and not args.output:   # with --output: that file, byte for byte (_install)
        return _check(cfg, args)
    if args.from_xml:
        networks = partitions.networks_from_xml(read_input(args.from_xml, "network list"), cfg.bridge)
    else:
        oned = Oned.from_environment(args.endpoint, args.session)
        networks = partitions.networks_from_xml(oned.pool_xml(), cfg.bridge)
    left_out: list = []
    text = partitions.render(networks, cfg.default_partition_members, cfg.bridge, left_out,
                             mac_only=not args.no_mac_only_guids)
    for x in left_out:  # the others' partitions are still written
        print(f"kvm-sriov partitions: {x}", file=sys.stderr)
    if args.enforce:
        return _enforce(cfg, text)
    if not (args.write or args.output or args.reload or args.force_reload or args.check):
        sys.stdout.write(text)
        return 0
    return _install(cfg, args, text, networks)


def _install(cfg, args, text: str, networks: list) -> int:
    target = Path(args.output) if args.output else cfg.partitions_file
    if args.check:
        current = read_input(str(target), "partitions file") if target.exists() else ""
        print(f"{target} is {'up to date' if current == text else 'OUT OF DATE'}")
        return 0 if current == text else 1
    changed = partitions.install(target, text)
    print(f"{target}: " + (f"{len(networks)} network(s), {sum(ar.size for n in networks for ar in n.ranges)} "
                           f"port GUID(s), " if not args.install else "")
          + ("written" if changed else "unchanged"), file=sys.stderr)
    if args.reload and (changed or args.force_reload):
        partitions.reload_sm(cfg.sm_reload_command)
        print(f"asked opensm to reload: {' '.join(cfg.sm_reload_command)}", file=sys.stderr)
    return 0


def _check(cfg, args) -> int:
    """What each place enforces against what oned's networks need, as the network hook
    renders it (fabric/drift.py): one line per finding with its fix, or JSON. Reads only.
    Exit 0 no drift, 1 drift, 2 a place (or oned) could not be read."""
    try:
        pool = (read_input(args.from_xml, "network list") if args.from_xml
                else Oned.from_environment(args.endpoint, args.session).pool_xml())
        _, text = network_hook.desired(cfg, pool)
    except DriverError as exc:
        result = drift.unread(args.from_xml or "oned", f"the networks cannot be read: {exc}")
    else:
        result = drift.check(manager.for_config(cfg), text)
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        for line in result.lines():
            print(line)
    return result.exit_code


def _repair(cfg, args) -> int:
    """--check, then each place with drift kvm-sriov may repair made to enforce what oned's
    networks need (fabric/repair.py), under the network hook's lock; then checked again.
    What was changed and what is left, one line each, or JSON; exit 0 only when no drift
    is left and every change worked."""
    if args.check or args.output or args.from_xml or args.write or args.reload or args.enforce:
        raise DriverError("--repair goes alone (with --json): it checks by itself, sends through the partition "
                          "manager, and reads oned's networks itself (a --from-xml file may be older than oned)")
    if os.geteuid() == 0 and not cfg.state_dir.exists():   # root would make the hook's state root's
        raise DriverError(f"{cfg.state_dir} does not exist: run --repair as the network hook's user (oneadmin), "
                          f"whose first run creates it")
    fabric = manager.for_config(cfg)
    lacking = fabric.missing()
    if lacking:
        raise DriverError(lacking)
    done = network_hook.repair(cfg, fabric, Oned.from_environment(args.endpoint, args.session))
    if args.json:
        print(json.dumps(done.as_json(), indent=1))
    else:
        for line in done.lines():
            print(line)
    return done.exit_code


def _enforce(cfg, text: str) -> int:
    """The configured partition manager (fabric.manager) enforces the file: one line per
    place it went to, exit 1 when one of them failed (the others still have it)."""
    reports = manager.for_config(cfg).enforce(text)
    for r in reports:
        print(f"kvm-sriov partitions: {r.where or 'the SM node'}: {'' if r.ok else 'FAILED: '}{r.message}",
              file=sys.stderr)
    return 0 if all(r.ok for r in reports) else 1


# -- the front-end's network hooks ------------------------------------------------------
MAX_HOOK_STDIN = 8 * 1024 * 1024 + 1024


def cmd_network_hook(cfg, args) -> int:
    """Arguments on stdin (ARGUMENTS_STDIN): '<call> <base64 CALL_INFO>'."""
    call = None
    if not args.resync:
        call = pkey.parse_stdin(sys.stdin.buffer.read(MAX_HOOK_STDIN))
    outcome = network_hook.run(cfg, call, network_hook.Oned.from_environment(args.endpoint, args.session))
    print(f"kvm-sriov network-hook: {outcome.message}", file=sys.stdout if outcome.ok else sys.stderr)
    return 0 if outcome.ok else 1


def cmd_setup_hooks(cfg, args) -> int:
    command = args.command_line or shlex.join([str(Path(sys.argv[0]).resolve()), "network-hook"])
    for line in network_hook.register(network_hook.Oned.from_environment(args.endpoint, args.session), command):
        print(line)
    return 0


# -- metrics --------------------------------------------------------------------------
def cmd_metrics(cfg, args) -> int:
    """Read-only figures (kvm_sriov/metrics/), written whole for node exporter; silent
    when it worked (a timer runs it every 30 s)."""
    write_textfile(cfg, args.textfile_dir)
    return 0


# -- doctor ---------------------------------------------------------------------------
def cmd_doctor(cfg, args) -> int:
    results = run_checks(cfg, libvirt_check=not args.no_libvirt, gpudirect=getattr(args, "gpudirect", None))
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"[{r.level:4}] {r.name:<{width}}  {r.message}")
        if r.fix:
            print(f"{'':6} {'':<{width}}  fix: {r.fix}")
    failed = sum(r.level == "FAIL" for r in results)
    warned = sum(r.level == "WARN" for r in results)
    print(f"\n{len(results)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0


def cmd_qualify(cfg, args) -> int:
    return qualify_vm.run_command(cfg, args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvm-sriov", description="InfiniBand SR-IOV VFs for OpenNebula KVM hosts")
    p.add_argument("--version", action="version", version=f"kvm-sriov {__version__}")
    p.add_argument("--config", help="extra config file (like $KVM_SRIOV_CONFIG)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", help="VFs per PF and who holds which VF")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("reconcile", help="make the pool agree with libvirt")
    s.add_argument("--dry-run", action="store_true", help="only say what would change")
    s = sub.add_parser("doctor", help="check this host's readiness and say what to fix")
    s.add_argument("--no-libvirt", action="store_true", help="skip the libvirt connection check")
    s = sub.add_parser("qualify", help="read-only checks that this host is ready for tenants' ConnectX VFs "
                                       "(--json/--text reports; --vm: a throwaway VM with one VF)")
    qualify_vm.add_arguments(s)
    s = sub.add_parser("guids", help="programmed GUIDs, checked against sysfs")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("partitions", help="print opensm's partitions.conf made from OpenNebula networks",
                       description="Prints partitions.conf on stdout (nothing else). --write puts it in "
                                   "place itself, after opensm accepted it; --validate FILE only asks opensm.")
    s.add_argument("--endpoint", help="oned XML-RPC endpoint (default $ONE_XMLRPC or localhost)")
    s.add_argument("--session", help="user:password (default: $ONE_AUTH or ~/.one/one_auth)")
    s.add_argument("--from-xml", metavar="FILE", help="networks from `onevnet list -x` instead of oned")
    s.add_argument("--stdout", action="store_true", help=argparse.SUPPRESS)  # what it does anyway
    s.add_argument("--validate", metavar="FILE", help="exit 1 unless opensm's parser accepts FILE")
    s.add_argument("--write", action="store_true", help="write the file (after opensm accepted it)")
    s.add_argument("--output", help="write (or --check) this file (default infiniband.partitions_file)")
    s.add_argument("--check", action="store_true",
                   help="read only: compare what each place (SM node, UFM) enforces with oned's networks, one "
                        "line per drift with its fix; exit 0 none, 1 drift, 2 a place cannot be read (with "
                        "--output: exit 1 when that file is not the one made here, byte for byte)")
    s.add_argument("--repair", action="store_true",
                   help="--check, then make each place with drift enforce what oned's networks need (only "
                        "what kvm-sriov made: a PKey or GUID of others is never changed), then check again: "
                        "what changed and what is left; exit 0 only when no drift is left")
    s.add_argument("--json", action="store_true", help="with --check or --repair: the findings as JSON")
    s.add_argument("--reload", action="store_true", help="write, and tell opensm to reload when it changed")
    s.add_argument("--force-reload", action="store_true", help="with --reload: even when unchanged")
    s.add_argument("--no-mac-only-guids", action="store_true",
                   help="list only GUIDs with the network's ID (once no VM deployed before that rule runs)")
    s.add_argument("--enforce", action="store_true",
                   help="have the partition manager (fabric.manager) enforce it, as the network hook "
                        "does: each place's result on stderr, exit 1 when one failed")
    s.add_argument("--install", metavar="FILE",
                   help="validate, write and (with --reload) reload this ready file ('-': stdin) instead of "
                        "one made here (what the front-end's network hook sends)")
    s = sub.add_parser("network-hook", help="(oned's network hooks) PKeys and partitions follow the networks",
                       description="Reads '<call> <base64 CALL_INFO>' on stdin (ARGUMENTS_STDIN); gives "
                                   "KVM_SRIOV_PKEY=AUTO networks a PKey and brings the SM node's "
                                   "partitions file up to date.")
    s.add_argument("--endpoint", help="oned XML-RPC endpoint (default $ONE_XMLRPC or localhost)")
    s.add_argument("--session", help="user:password (default: $ONE_AUTH or ~/.one/one_auth)")
    s.add_argument("--resync", action="store_true", help="no call on stdin: bring everything up to date")
    s = sub.add_parser("setup-hooks", help="register the network hooks in oned (idempotent; oned must run)")
    s.add_argument("--endpoint", help="oned XML-RPC endpoint (default $ONE_XMLRPC or localhost)")
    s.add_argument("--session", help="user:password (default: $ONE_AUTH or ~/.one/one_auth)")
    s.add_argument("--command", dest="command_line",
                   help="the hooks' COMMAND (default: this kvm-sriov's absolute path, network-hook)")
    s = sub.add_parser("metrics", help="write Prometheus metrics (kvm_sriov.prom) for node exporter's "
                                       "textfile collector: VF pools, the network hook (docs/metrics.md)")
    s.add_argument("--textfile-dir", required=True, metavar="DIR",
                   help="where node exporter's textfile collector reads *.prom files "
                        "(Debian: /var/lib/prometheus/node-exporter)")
    s = sub.add_parser("setup-frontend", help="register kvm-sriov's VM_MAD and placer in oned.conf "
                                              "(--undo takes back exactly that)")
    s.add_argument("--undo", action="store_true", help="remove exactly what setup-frontend added")
    oned_conf.add_arguments(s)
    return p


COMMANDS = {"status": cmd_status, "reconcile": cmd_reconcile, "doctor": cmd_doctor, "qualify": cmd_qualify,
            "guids": cmd_guids, "partitions": cmd_partitions, "network-hook": cmd_network_hook,
            "setup-hooks": cmd_setup_hooks, "metrics": cmd_metrics}


POOL_COMMANDS = ("status", "reconcile", "doctor", "guids", "metrics")  # the host's state, as its driver sees it


def _load_config(args, remotes_dir: Optional[Path]):
    """Config files nobody but root and this user can have changed: the
    loader refuses any other (--config and $KVM_SRIOV_CONFIG included); run
    as root, a remotes tree that oneadmin owns is passed over, and read only
    after the switch below (its commands would run as root)."""
    from kvm_sriov_bootstrap import untrusted  # the one trust rule, beside the library
    if remotes_dir is None:
        remotes_dir = next((r for r in REMOTES_CANDIDATES
                            if (r / config_mod.REMOTES_CONFIG).is_file()
                            and not untrusted(os.path.realpath(r / config_mod.REMOTES_CONFIG))), None)
    files = config_mod.config_files(remotes_dir)
    if args.config:
        files.append(Path(args.config))
    return config_mod.load(files=files)


def _load_pool_modules() -> None:
    """Import, while still root, every module of the library: the pool
    commands reach most of them lazily, and a list here would drift."""
    package = sys.modules[__package__]
    for info in pkgutil.walk_packages(package.__path__, f"{__package__}."):
        importlib.import_module(info.name)


def _as_state_owner(cfg, command: str) -> bool:
    """Run as root, become the user that owns the pool's state directory
    (the driver's user, oneadmin): files root made there would lock that
    user's next action out. True when it switched."""
    d = cfg.state_dir
    try:
        st = os.stat(d)  # the folder may be a link the administrator made (state_folder allows it)
    except FileNotFoundError:
        if command == "reconcile":
            raise DriverError(f"the pool's state directory {d} does not exist: run kvm-sriov as the "
                              f"driver's user (oneadmin), whose first action creates it") from None
        return False
    if st.st_uid == 0:
        return False
    stray = sorted(str(f) for f in d.iterdir() if f.lstat().st_uid != st.st_uid)
    if stray:
        raise DriverError(f"{', '.join(stray)} in {d} belong to another user than {d} itself "
                          f"(uid {st.st_uid}): the driver cannot use them; "
                          f"chown {st.st_uid}:{st.st_gid} them or remove them")
    try:
        name = pwd.getpwuid(st.st_uid).pw_name
        groups = os.getgrouplist(name, st.st_gid)
    except KeyError:
        name, groups = f"uid {st.st_uid}", [st.st_gid]
    _load_pool_modules()  # this tree may be readable by root only (a 0700 checkout)
    os.setgroups(groups)
    os.setgid(st.st_gid)
    os.setuid(st.st_uid)
    print(f"kvm-sriov {command}: running as {name}, the owner of {d}", file=sys.stderr)
    return True


def main(argv: Optional[Sequence[str]] = None, remotes_dir: Optional[Path] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "setup-frontend":  # the front-end's oned.conf: no host config involved
        return oned_conf.run("undo" if args.undo else "setup", args)
    try:
        cfg = _load_config(args, remotes_dir)
        # partitions --check and --repair reach the SM nodes and UFM as the network hook does: its ssh keys,
        # UFM credentials, and its state (UFM's record of the PKeys kvm-sriov made, the hook's lock)
        as_hook = args.command == "partitions" and (args.check and not args.output or args.repair)
        if args.command == "doctor" and os.geteuid() == 0:  # the kernel shows PCIe config space to root only
            args.gpudirect = gpudirect_as_root(cfg)
        if (args.command in POOL_COMMANDS or as_hook) and os.geteuid() == 0 and _as_state_owner(cfg, args.command):
            cfg = _load_config(args, remotes_dir)  # what that user may read
        return COMMANDS[args.command](cfg, args)
    except DriverError as exc:
        print(f"kvm-sriov {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file or command the administrator named: one line, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvm-sriov {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
