#!/usr/bin/python3
"""The subnet manager's partitions at scale: 1,000 InfiniBand networks and
20,000 held leases (VF GUIDs) in a real OpenNebula 7.4 oned (rung 4,
simhost.frontend), populated through XML-RPC: each network allocated with
its PKey (VLAN_ID) and one address range of 20 MACs, each MAC held with
one.vn.hold (batched with system.multicall), so oned reports every lease in
the network's AR. Two SM nodes are local folders (as
tests/unit/kvm_sriov/fabric/test_opensm.py has them): each is pushed the
file through the real `kvm-sriov partitions --install - --reload` with its
own config, so the real opensm validates the file there before it is
installed, and its reload command notes when it ran and which file it took.

Two figures, the median of --rounds rounds:

 1. a network change reaching the SM, from the API call (and, split, from
    oned's hook firing: the hook's COMMAND is a few lines of sh noting when
    onehem started it) until both SM nodes have installed the file with the
    change and reloaded opensm: a new network asking for an automatic PKey
    (one.vn.allocate: the allocate hook writes its key, the next run, on
    READY or on the key's update, sends the file), and a change of an existing network's leases
    (one.vn.update_ar growing its range by one MAC: one more GUID in its
    partition). Holding or releasing a lease changes no file: every MAC a
    range can lease is in its partition from the start, and the hooks do
    not follow one.vn.hold. Target: at most 10 s each.
 2. `kvm-sriov partitions --check` over that fabric (oned's networks
    rendered, both nodes read back and compared). Target: under 10 s.

The same steps are measured at rung 1 first, without oned: the hook's own
work (network_hook.run in this process, oned's pool answered from a
generated VNET_POOL of the same 1,000 networks and 20,000 held leases, the
same two SM nodes) and `partitions --check --from-xml` on that pool; split
into reading and rendering the networks, the push to both nodes, and the
read-back check the hook does after a push. oned's own part is printed
apart (the call until its hook fired, one.vnpool.info's answer), and what
rung 4 costs beyond rung 1 (the hook processes' start, oned's answers read).

Population (allocations, holds, the hooks registered, the first file sent)
is timed and printed, not judged. Beside each wall time the CPU it took is
printed (this process and the children it waited for; a hook run's through
sh's `times` in its wrapper): on a loaded 2-core machine the wall times
grow with the load, the CPU much less, and rung 1 and rung 4 run minutes
apart, so their difference is given in CPU. --profile prints cProfile's top
functions of the rung-1 change and check. The hook and the CLI run from
this checkout (bin/kvm-sriov), so a change to kvm_sriov/ is measured
without building packages.

    python3 bench/partitions_scale_bench.py [--rounds 3] [--rung1-only] [--profile] [--strict]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import xmlrpc.client
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvm_sriov import config  # noqa: E402
from kvm_sriov.fabric import drift, manager  # noqa: E402
from kvm_sriov.frontend import network_hook  # noqa: E402
from kvm_sriov.ib import guid, opensm_check, pkey  # noqa: E402
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)

NAME = "bench-partitions-scale"
TARGET_SM = 10.0        # seconds: a network change until every SM node reloaded with it
TARGET_CHECK = 10.0     # seconds: kvm-sriov partitions --check
NETWORKS = 1000
LEASES = 20000
FIRST_PKEY = 0x1000     # the populated networks' keys: 0x1000, 0x1001, ...
AUTO_RANGE = "0x2000-0x2fff"   # the new networks' automatic keys
CLI = REPO / "bin" / "kvm-sriov"
NODES = ("sm1", "sm2")
PUSH_SECONDS = 60       # per node; the default 8 would turn a slow push on this loaded machine into no figure
POLL = 0.05
QUIET = 2.0             # no hook run for this long: the steps of a change are over
HOLD_BATCH = 200        # one.vn.hold calls per system.multicall
# oned's ALLOCATED entry of a held lease (AddressRange::hold_by_mac): the VM object type, ID -1
HELD = 0x0000001000000000 | 0xFFFFFFFF


# -- the networks ------------------------------------------------------------------------
class Net:
    """One populated network as the bench sees it: ID, its one range, held leases, key."""

    def __init__(self, vid: int, index: int, size: int, held: int, vlan: str = "", auto: bool = False):
        self.id, self.index, self.size, self.held, self.vlan, self.auto = vid, index, size, held, vlan, auto

    @property
    def mac(self) -> str:
        """A range of its own (index < 2**24): 02:00:<index>:00, up to 256 MACs."""
        i = self.index
        return f"02:00:{(i >> 16) & 0xff:02x}:{(i >> 8) & 0xff:02x}:{i & 0xff:02x}:00"

    def nth_mac(self, n: int) -> str:
        return self.mac[:-2] + f"{n:02x}"

    def last_guid(self) -> str:
        """The port GUID of its range's last MAC as the partitions file lists it."""
        return "0x" + guid.port_guid(self.nth_mac(self.size - 1), self.id).replace(":", "")


def population(networks: int = NETWORKS, leases: int = LEASES) -> list[Net]:
    """networks networks, leases held leases spread evenly; each range exactly its leases."""
    per, extra = divmod(leases, networks)
    return [Net(i, i, per + (i < extra), per + (i < extra), vlan=f"0x{FIRST_PKEY + i:04x}")
            for i in range(networks)]


def vnet_xml(n: Net) -> str:
    """One VNET as one.vnpool.info gives it (oned's VirtualNetwork::to_xml: the AR's own
    attributes, ALLOCATED holding one ' <index> <owner>' pair per lease)."""
    allocated = "".join(f" {k} {HELD}" for k in range(n.held))
    vlan = f"<VLAN_ID>{n.vlan}</VLAN_ID>" if n.vlan else "<VLAN_ID/>"
    tvlan = f"<VLAN_ID><![CDATA[{n.vlan}]]></VLAN_ID>" if n.vlan else ""
    auto = "<KVM_SRIOV_PKEY><![CDATA[AUTO]]></KVM_SRIOV_PKEY>" if n.auto else ""
    perms = "".join(f"<{w}_{p}>{int(w == 'OWNER' and p != 'A')}</{w}_{p}>"
                    for w in ("OWNER", "GROUP", "OTHER") for p in "UMA")
    return (f"<VNET><ID>{n.id}</ID><UID>0</UID><GID>0</GID><UNAME>oneadmin</UNAME><GNAME>oneadmin</GNAME>"
            f"<NAME>scale-{n.index}</NAME><PERMISSIONS>{perms}</PERMISSIONS><CLUSTERS><ID>0</ID></CLUSTERS>"
            f"<BRIDGE>ib-sriov</BRIDGE><BRIDGE_TYPE>none</BRIDGE_TYPE><STATE>1</STATE><PREV_STATE>1</PREV_STATE>"
            f"<PARENT_NETWORK_ID/><TEMPLATE_ID/><VN_MAD>dummy</VN_MAD><PHYDEV/>{vlan}<OUTER_VLAN_ID/>"
            f"<VLAN_ID_AUTOMATIC>0</VLAN_ID_AUTOMATIC><OUTER_VLAN_ID_AUTOMATIC>0</OUTER_VLAN_ID_AUTOMATIC>"
            f"<USED_LEASES>{n.held}</USED_LEASES><VROUTERS/><UPDATED_VMS/><OUTDATED_VMS/><UPDATING_VMS/>"
            f"<ERROR_VMS/><TEMPLATE><BRIDGE><![CDATA[ib-sriov]]></BRIDGE><BRIDGE_TYPE><![CDATA[none]]>"
            f"</BRIDGE_TYPE>{auto}<OUTER_VLAN_ID><![CDATA[]]></OUTER_VLAN_ID><PHYDEV><![CDATA[]]></PHYDEV>"
            f"<SECURITY_GROUPS><![CDATA[0]]></SECURITY_GROUPS>{tvlan}<VN_MAD><![CDATA[dummy]]></VN_MAD>"
            f"</TEMPLATE><AR_POOL><AR><ALLOCATED><![CDATA[{allocated}]]></ALLOCATED><AR_ID><![CDATA[0]]>"
            f"</AR_ID><MAC><![CDATA[{n.mac}]]></MAC><NEXT_INDEX><![CDATA[{n.held}]]></NEXT_INDEX>"
            f"<SIZE><![CDATA[{n.size}]]></SIZE><TYPE><![CDATA[ETHER]]></TYPE></AR></AR_POOL></VNET>")


def pool_xml(nets: list[Net]) -> str:
    return "<VNET_POOL>" + "".join(vnet_xml(n) for n in nets) + "</VNET_POOL>"


class GeneratedOned:
    """network_hook.Oned over generated networks: one.vnpool.info, and one.vn.update
    (merge) of the key the hook writes."""

    def __init__(self, nets: list[Net]):
        self.nets = nets

    def pool_xml(self) -> str:
        return pool_xml(self.nets)

    def merge(self, vid: int, template: str) -> None:
        net = next(n for n in self.nets if n.id == vid)
        for line in template.splitlines():
            key, _, value = line.partition(" = ")
            if key == "VLAN_ID":
                net.vlan = value.strip('"')


# -- two SM nodes as local folders ---------------------------------------------------------
class Fabric:
    """sm1 and sm2, each a folder with its own config: its partitions file and a reload
    command noting '<time> <sha256 of the file>'; the front-end's config pushes to them
    with the real CLI and reads them back with cat."""

    def __init__(self, work: Path):
        self.work = work
        for node in NODES:
            d = work / node
            d.mkdir(parents=True)
            reload = ["sh", "-c", 'echo "$(date +%s.%N) $(sha256sum < "$0" | cut -c1-64)" >> "$1"',
                      str(d / "partitions.conf"), str(d / "reloads")]
            (d / "node.toml").write_text(f'[pool]\nstate_dir = "{d / "state"}"\n[infiniband]\n'
                                         f'partitions_file = "{d / "partitions.conf"}"\n'
                                         f'sm_reload_command = {json.dumps(reload)}\n')
        push = [sys.executable, str(CLI), "--config", str(work / "{node}" / "node.toml"),
                "partitions", "--install", "-", "--reload"]
        self.conf = work / "front-end.toml"
        self.conf.write_text(f'[pool]\nstate_dir = "{work / "state"}"\n[infiniband]\n'
                             f'pkey_range = "{AUTO_RANGE}"\nsm_push_command = {json.dumps(push)}\n'
                             f'sm_push_seconds = {PUSH_SECONDS}\n[fabric]\nsm_nodes = {json.dumps(list(NODES))}\n'
                             f'sm_read_command = {json.dumps(["cat", str(work / "{node}" / "partitions.conf")])}\n')
        self.cfg = config.load(files=[self.conf])

    def reloads(self, node: str) -> list[tuple[float, str]]:
        path = self.work / node / "reloads"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(float(t), digest) for t, digest in (line.split() for line in lines)]

    def reloaded(self, since: float, marker: str) -> Optional[float]:
        """When the last node reloaded a file with marker in it (since `since`); None: not yet."""
        last = 0.0
        for node in NODES:
            records = [r for r in self.reloads(node) if r[0] >= since]
            if not records:
                return None
            text = (self.work / node / "partitions.conf").read_text()
            digest = hashlib.sha256(text.encode()).hexdigest()
            took = [t for t, d in records if d == digest]
            if not took or marker not in text:
                return None
            last = max(last, took[0])
        return last

    def wait_reloaded(self, since: float, marker: str, timeout: float = 300) -> float:
        """Seconds from since until both nodes reloaded with marker; polls the small
        reload notes and reads a file only when a node noted a new reload."""
        deadline, seen = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            sizes = tuple((self.work / n / "reloads").stat().st_size if (self.work / n / "reloads").exists()
                          else 0 for n in NODES)
            if sizes != seen:
                seen = sizes
                at = self.reloaded(since, marker)
                if at is not None:
                    return at - since
            time.sleep(POLL)
        status = (self.work / "state" / network_hook.STATUS)
        raise RuntimeError(f"no reload with {marker} on both SM nodes after {timeout} s; the hook's status: "
                           f"{status.read_text()[:600] if status.exists() else 'none'}")

    def partitions(self, node: str = NODES[0]) -> str:
        return (self.work / node / "partitions.conf").read_text()


def cpu_seconds() -> float:
    """CPU used by this process and its children waited for (the pushes, opensm, a CLI)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(fn: Callable, *args, **kwargs):
    """(wall seconds, CPU seconds, what fn gave)."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, cpu_seconds() - c0, out


def profiled(fn: Callable, *args, top: int = 14) -> str:
    prof = cProfile.Profile()
    prof.runcall(fn, *args)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def cli_check(conf: Path, *extra, env: Optional[dict] = None) -> tuple[float, float, subprocess.CompletedProcess]:
    return timed(lambda: subprocess.run([sys.executable, str(CLI), "--config", str(conf), "partitions", "--check",
                                         *extra], capture_output=True, text=True, timeout=300, env=env))


def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    return f"{med(values):6.2f} s ({min(values):.2f}-{max(values):.2f})" if values else "  n/a"


# -- rung 1: the hook's and the check's own work, no oned ------------------------------------
def rung1(work: Path, rounds: int, profile: bool, broken: list) -> dict:
    fabric = Fabric(work)
    cfg = fabric.cfg
    nets = population()
    oned = GeneratedOned(nets)
    text = oned.pool_xml()
    print(f"rung 1: generated pool: {len(nets)} networks, {sum(n.held for n in nets)} held leases, "
          f"{len(text) / 1e6:.2f} MB of XML", flush=True)
    took, _, out = timed(network_hook.run, cfg, None, oned)
    if not out.ok:
        broken.append(f"rung 1 resync: {out.message}")
        return {}
    print(f"rung 1: first file (resync) to both SM nodes: {took:.2f} s; "
          f"{len(fabric.partitions().encode()) / 1e6:.2f} MB, {fabric.partitions().count('    0x')} members",
          flush=True)
    figures = {k: [] for k in ("change", "change_reloaded", "change_cpu", "new", "new_reloaded", "new_cpu", "push",
                               "check", "check_cpu")}
    for r in range(rounds):
        net = nets[(r * 97) % NETWORKS]
        net.size += 1
        t0 = time.time()
        took, cpu, out = timed(network_hook.run, cfg, pkey.Call("one.vn.update_ar", True, (net.id,)), oned)
        figures["change_cpu"].append(cpu)
        figures["change_reloaded"].append(fabric.wait_reloaded(t0, net.last_guid(), timeout=5))
        status = network_hook.read_status(cfg.state_dir) or {}
        figures["change"].append(took)
        figures["push"].append(status.get("sm_seconds", float("nan")))
        new = Net(max(n.id for n in nets) + 1, NETWORKS + r, 20, 0, auto=True)
        nets.append(new)
        t0 = time.time()
        took, cpu, out2 = timed(network_hook.run, cfg, pkey.Call("one.vn.allocate", True, (new.id,)), oned)
        figures["new_cpu"].append(cpu)
        figures["new_reloaded"].append(fabric.wait_reloaded(t0, f"one_vnet_{new.id}=", timeout=5))
        figures["new"].append(took)
        pool = work / "pool.xml"
        pool.write_text(oned.pool_xml())
        took, cpu, done = cli_check(fabric.conf, "--from-xml", str(pool))
        figures["check_cpu"].append(cpu)
        if done.returncode != 0:
            broken.append(f"rung 1 partitions --check exit {done.returncode}: "
                          f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        figures["check"].append(took)
        for o in (out, out2):
            if not o.ok:
                broken.append(f"rung 1 hook run: {o.message}")
        print(f"rung 1 round {r + 1}: lease change {figures['change_reloaded'][-1]:.2f} s to reloaded (push "
              f"{figures['push'][-1]:.2f} s), new network {figures['new_reloaded'][-1]:.2f} s, partitions --check "
              f"{took:.2f} s", flush=True)
    # where the hook's and the check's time goes, on the final pool (same work, measured apart)
    text = oned.pool_xml()
    _, figures["render"], (_, desired_text) = timed(network_hook.desired, cfg, text)
    _, figures["drift"], _ = timed(network_hook.check_drift, cfg, desired_text)
    _, figures["compare"], result = timed(drift.check, manager.for_config(cfg), desired_text)
    if result.exit_code != 0:
        broken.append(f"rung 1: drift after the rounds: {result.lines()[-1]}")
    _, figures["startup"], _ = timed(subprocess.run, [sys.executable, str(CLI), "--help"], capture_output=True,
                                  timeout=60)
    _, figures["validate"], _ = timed(opensm_check.check_text, desired_text)
    if profile:
        net = nets[0]
        net.size += 1
        print("\n--profile: the hook's run on a lease change (rung 1)\n"
              + profiled(network_hook.run, cfg, pkey.Call("one.vn.update_ar", True, (net.id,)), oned))
        print("\n--profile: partitions --check's work in this process (rung 1)\n"
              + profiled(lambda: drift.check(manager.for_config(cfg), network_hook.desired(cfg, oned.pool_xml())[1])))
    return figures


# -- rung 4: a real oned ------------------------------------------------------------------------
HOOK_WRAPPER = """#!/bin/sh
# bench/partitions_scale_bench.py: when onehem started the hook and when it ended
# (times: the CPU of its children, the hook and the pushes it ran)
echo "start $(date +%s.%N) $$" >> {log}
{command} "$@"
rc=$?
times > {log}.$$
{{ read -r _ _; read -r user system; }} < {log}.$$
rm -f {log}.$$
echo "end $(date +%s.%N) $$ $rc $user $system" >> {log}
exit $rc
"""
IB_NET = ('NAME = "{name}"\nVN_MAD = "dummy"\nBRIDGE = "ib-sriov"\n{key}\n'
          'AR = [ TYPE = "ETHER", MAC = "{mac}", SIZE = "{size}" ]\n')


class Oned:
    """The real oned: populated by XML-RPC, the hooks' runs noted."""

    def __init__(self, fe, work: Path):
        self.fe, self.work = fe, work
        self.hook_log = work / "hook-runs"

    def rpc(self, method: str, *args):
        ok, body = self.fe.rpc(method, *args)
        if not ok:
            raise RuntimeError(f"{method}{args[:1]}: {body}")
        return body

    def allocate(self, net: Net) -> int:
        key = f'VLAN_ID = "{net.vlan}"' if net.vlan else 'KVM_SRIOV_PKEY = "AUTO"'
        return self.rpc("one.vn.allocate", IB_NET.format(name=f"scale-{net.index}", key=key, mac=net.mac,
                                                         size=net.size), -1)

    def pool(self) -> str:
        return self.rpc("one.vnpool.info", -2, -1, -1)

    def wait_ready(self, ids: set, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {int(v.findtext("ID")): v.findtext("STATE") for v in ET.fromstring(self.pool()).iter("VNET")}
            if all(states.get(i) == "1" for i in ids):
                return
            time.sleep(1)
        raise RuntimeError(f"networks not READY after {timeout} s")

    def hold_all(self, nets: list[Net]) -> None:
        """Every lease of every network held: one.vn.hold per MAC, HOLD_BATCH to a
        system.multicall, two connections at once."""
        calls = [(n.id, f'LEASES = [ MAC = "{n.nth_mac(k)}" ]') for n in nets for k in range(n.held)]
        batches = [calls[i:i + HOLD_BATCH] for i in range(0, len(calls), HOLD_BATCH)]

        def send(batch):
            with xmlrpc.client.ServerProxy(self.fe.endpoint) as proxy:
                multi = xmlrpc.client.MultiCall(proxy)
                for vid, lease in batch:
                    multi.one.vn.hold(self.fe.session, vid, lease)
                for (vid, lease), answer in zip(batch, multi()):
                    if not answer[0]:
                        raise RuntimeError(f"one.vn.hold {vid} {lease}: {answer[1]}")

        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(send, batches))

    def hook_runs(self) -> list[tuple[str, float, str, int, float]]:
        """(start|end, time, pid, exit code or -1, CPU seconds or 0) of every hook run, oldest first."""
        lines = self.hook_log.read_text().splitlines() if self.hook_log.exists() else []
        out = []
        for line in lines:
            kind, at, pid, *rest = line.split()
            cpu = sum(int(m) * 60 + float(sec) for m, sec in (t.rstrip("s").split("m") for t in rest[1:3]))
            out.append((kind, float(at), pid, int(rest[0]) if rest else -1, cpu))
        return out

    def first_start(self, since: float) -> float:
        """When the first hook run since `since` started (oned's hook firing)."""
        started = [t for kind, t, *_ in self.hook_runs() if kind == "start" and t >= since]
        if not started:
            raise RuntimeError("the SM nodes took the change but no hook run started after the call")
        return started[0]

    def wait_quiet(self, since: float, timeout: float = 300) -> tuple[list[int], float]:
        """Until no hook run is going on and none started for QUIET s: the exit codes and
        the CPU seconds of the runs that started since `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.hook_runs()
            starts = {pid for kind, at, pid, *_ in runs if kind == "start" and at >= since}
            ends = [(rc, cpu) for kind, _, pid, rc, cpu in runs if kind == "end" and pid in starts]
            last = max((t for _, t, *_ in runs), default=0.0)
            if len(starts) == len(ends) and time.time() - last >= QUIET:
                return [rc for rc, _ in ends], sum(cpu for _, cpu in ends)
            time.sleep(0.25)
        raise RuntimeError(f"the hooks still run after {timeout} s")


def rung4(work: Path, rounds: int, broken: list, r1: dict) -> Optional[dict]:
    from simhost.frontend import FrontEnd, OpenNebulaMissing
    fe = FrontEnd(work / "fe", [], driver=False)
    try:
        fe.start()
    except OpenNebulaMissing as exc:
        fe.stop()
        broken.append(f"cannot run without OpenNebula: {exc}")
        return None
    except BaseException:
        fe.stop()
        raise
    try:
        return _rung4(fe, work, rounds, broken, r1)
    except Exception as exc:
        broken.append(f"rung 4: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        print(f"rung 4 failed: {exc}", flush=True)
        fe.collect_logs(REPO / "build" / "test-logs" / f"{NAME}-fe")
        return None
    finally:
        fe.stop()


def _rung4(fe, work: Path, rounds: int, broken: list, r1: dict) -> dict:
    oned = Oned(fe, work)
    nets = population()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        ids = list(pool.map(oned.allocate, nets))
    for net, vid in zip(nets, ids):
        net.id = vid
    oned.wait_ready(set(ids))
    allocated = time.perf_counter() - t0
    t0 = time.perf_counter()
    oned.hold_all(nets)
    held = time.perf_counter() - t0
    text = oned.pool()
    used = sum(int(v.findtext("USED_LEASES") or 0) for v in ET.fromstring(text).iter("VNET"))
    leases = ET.fromstring(oned.rpc("one.vn.info", nets[0].id)).findall("AR_POOL/AR/LEASES/LEASE")
    print(f"rung 4: population: {len(ids)} networks allocated and READY {allocated:.1f} s, {used} leases held "
          f"{held:.1f} s (network {nets[0].id}'s AR lists {len(leases)} leases); one.vnpool.info "
          f"{len(text) / 1e6:.2f} MB", flush=True)
    if used != LEASES:
        raise RuntimeError(f"oned holds {used} leases, {LEASES} expected")
    pool_reads = [timed(oned.pool)[0] for _ in range(3)]   # wall: oned's work
    fabric = Fabric(work / "fabric")
    env = dict(fe.env)
    command = shlex.join([sys.executable, str(CLI), "--config", str(fabric.conf), "network-hook"])
    wrapper = work / "hook.sh"
    wrapper.write_text(HOOK_WRAPPER.format(log=shlex.quote(str(oned.hook_log)), command=(
        f"ONE_XMLRPC={shlex.quote(fe.endpoint)} ONE_AUTH={shlex.quote(str(fe.auth_file))} {command}")))
    wrapper.chmod(0o755)
    t0 = time.perf_counter()
    setup = subprocess.run([sys.executable, str(CLI), "setup-hooks", "--command", str(wrapper)], env=env,
                           capture_output=True, text=True, timeout=120)
    if setup.returncode != 0:
        raise RuntimeError(f"setup-hooks: {setup.stderr.strip()}")
    resync = subprocess.run([sys.executable, str(CLI), "--config", str(fabric.conf), "network-hook", "--resync"],
                            env=env, capture_output=True, text=True, timeout=600)
    first = time.perf_counter() - t0
    if resync.returncode != 0:
        raise RuntimeError(f"network-hook --resync: {(resync.stdout + resync.stderr).strip()}")
    print(f"rung 4: hooks registered and the first file sent to both SM nodes (--resync): {first:.1f} s", flush=True)
    figures = {k: [] for k in ("change", "change_hook", "change_fired", "change_cpu", "new", "new_hook", "new_fired",
                               "new_cpu", "check", "check_cpu")}
    figures.update(population=allocated + held + first, pool_read=med(pool_reads))
    for r in range(rounds):
        net = nets[(r * 97 + 13) % NETWORKS]
        net.size += 1
        t0 = time.time()
        oned.rpc("one.vn.update_ar", net.id, f'AR = [ AR_ID = "0", SIZE = "{net.size}" ]')
        took = fabric.wait_reloaded(t0, net.last_guid())
        fired = oned.first_start(t0)
        figures["change"].append(took)
        figures["change_fired"].append(fired - t0)
        figures["change_hook"].append(t0 + took - fired)
        codes, cpu = oned.wait_quiet(t0)
        figures["change_cpu"].append(cpu)
        new = Net(-1, NETWORKS + r, 20, 0, auto=True)
        t0 = time.time()
        new.id = oned.allocate(new)
        took = fabric.wait_reloaded(t0, f"one_vnet_{new.id}=")
        fired = oned.first_start(t0)
        figures["new"].append(took)
        figures["new_fired"].append(fired - t0)
        figures["new_hook"].append(t0 + took - fired)
        more, cpu = oned.wait_quiet(t0)
        codes += more
        figures["new_cpu"].append(cpu)
        if any(codes):
            status = network_hook.read_status(fabric.cfg.state_dir) or {}
            broken.append(f"rung 4 round {r + 1}: a hook run failed: {status.get('message', '')[:300]}")
        took, cpu, done = cli_check(fabric.conf, env=env)
        figures["check_cpu"].append(cpu)
        if done.returncode != 0:
            broken.append(f"rung 4 partitions --check exit {done.returncode}: "
                          f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        figures["check"].append(took)
        print(f"rung 4 round {r + 1}: lease change {figures['change'][-1]:.2f} s (hook fired after "
              f"{figures['change_fired'][-1]:.2f} s), new network {figures['new'][-1]:.2f} s (hook fired after "
              f"{figures['new_fired'][-1]:.2f} s), partitions --check {took:.2f} s", flush=True)
    return figures


# -- the report ---------------------------------------------------------------------------------
def report(r1: dict, r4: Optional[dict]) -> list[str]:
    print(f"\n{NETWORKS} IB networks, {LEASES} held leases (VF GUIDs); two SM nodes; seconds, median (min-max)")
    if r1:
        print("rung 1 (no oned: the hook's and the check's own work on a generated pool)")
        print(f"  lease change: run -> both SM nodes reloaded {spread(r1['change_reloaded'])}  (push to both "
              f"{med(r1['push']):.2f} s; the whole run {med(r1['change']):.2f} s, CPU {med(r1['change_cpu']):.2f} s)")
        print(f"  new network (key written): -> reloaded      {spread(r1['new_reloaded'])}  (the whole run "
              f"{med(r1['new']):.2f} s, CPU {med(r1['new_cpu']):.2f} s)")
        print(f"  partitions --check --from-xml               {spread(r1['check'])}  (CPU {med(r1['check_cpu']):.2f} s)")
        print(f"  CPU split: networks read and rendered {r1['render']:.2f} s; one opensm validation "
              f"{r1['validate']:.2f} s (each node's push runs one); read-back check after a push "
              f"{r1['drift']:.2f} s (in --check: {r1['compare']:.2f} s); a CLI start {r1['startup']:.2f} s")
    misses = []
    if r4:
        print(f"rung 4 (a real oned; population {r4['population']:.0f} s)")
        print(f"  lease change -> both SM nodes reloaded  {spread(r4['change'])}  (call -> hook fired "
              f"{med(r4['change_fired']):.2f} s, hook fired -> reloaded {med(r4['change_hook']):.2f} s; "
              f"the hook runs' CPU {med(r4['change_cpu']):.2f} s)")
        print(f"  new network -> both SM nodes reloaded   {spread(r4['new'])}  (call -> hook fired "
              f"{med(r4['new_fired']):.2f} s, hook fired -> reloaded {med(r4['new_hook']):.2f} s; "
              f"the hook runs' CPU {med(r4['new_cpu']):.2f} s)")
        print(f"  partitions --check                      {spread(r4['check'])}  (CPU {med(r4['check_cpu']):.2f} s)")
        print(f"  oned's part: the call until its hook fired (above); one.vnpool.info answered in "
              f"{r4['pool_read']:.2f} s (each hook run reads it once, twice when it writes a key)")
        if r1:
            # CPU, not wall: the two rungs run minutes apart, under whatever load the machine has then
            print(f"  beyond rung 1, CPU (the processes' start, oned's answers read): lease change "
                  f"{med(r4['change_cpu']) - med(r1['change_cpu']):+.2f} s, new network "
                  f"{med(r4['new_cpu']) - med(r1['new_cpu']):+.2f} s, --check "
                  f"{med(r4['check_cpu']) - med(r1['check_cpu']):+.2f} s")
        judged = (("lease change -> SM", med(r4["change"]) <= TARGET_SM, "<=", TARGET_SM, "change"),
                  ("new network -> SM", med(r4["new"]) <= TARGET_SM, "<=", TARGET_SM, "new"),
                  ("partitions --check", med(r4["check"]) < TARGET_CHECK, "<", TARGET_CHECK, "check"))
        misses = [f"{what}: median {med(r4[key]):.2f} s, target {sign} {target:.0f} s"
                  for what, met, sign, target, key in judged if not met]
        print(f"targets: a change reaching the SM <= {TARGET_SM:.0f} s, partitions --check < {TARGET_CHECK:.0f} s")
    return misses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each step (the figures are their medians)")
    ap.add_argument("--rung1-only", action="store_true", help="only the rung-1 part (no oned)")
    ap.add_argument("--profile", action="store_true", help="cProfile's top functions of the rung-1 steps")
    add_strict(ap)
    args = ap.parse_args()
    if not opensm_check.available():
        print(f"{NAME}: the SM nodes validate with opensm: install {opensm_check.PACKAGES}")
        return 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"{NAME}: {os.cpu_count()} CPUs, load average {load:.1f}", flush=True)
    broken: list = []
    (REPO / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-partitions-", dir=REPO / "build", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        r1 = rung1(work / "rung1", args.rounds, args.profile, broken)
        r4 = None if args.rung1_only or broken else rung4(work / "rung4", args.rounds, broken, r1)
    misses = report(r1, r4)
    if args.rung1_only and not broken:
        print(f"{NAME}: rung 1 only, no verdict on the targets (they are judged through oned)")
        return 0
    return finish(NAME, misses, args.strict, broken)


if __name__ == "__main__":
    sys.exit(main())
