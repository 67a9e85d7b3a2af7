#!/usr/bin/python3
"""Placement cost: the kvm-sriov placer next to OpenNebula's rank alone, on the
same scheduler input of 1,000 pending VMs and 100 hosts.

The input is a real window (tests/sched/fixtures/burst-1/input.xml, written by
OpenNebula 7.4) scaled up: its hosts and VMs are copied with new IDs (VMs with
one or two IB NICs, one in ten pinned to PF ib1, one in ten without IB; hosts
with 0 to 8 free VFs) and every VM may go to every host. Both programs run as
one_sched runs them (base64 document on stdin, plan on stdout), back to back,
alternating, several times; the verdict is the median ratio <= --limit (1.2).
The real rank placer comes from the OpenNebula build (simhost.frontend.locate_install).
"""

import argparse
import base64
import copy
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree as ET
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURE = REPO / "tests" / "sched" / "fixtures" / "burst-1" / "input.xml"
PLACE = REPO / "sched" / "kvm-sriov" / "place"


def scaled_input(vms: int, hosts: int) -> bytes:
    root = ET.fromstring(FIXTURE.read_bytes())
    host_pool, vm_pool, reqs = root.find("HOST_POOL"), root.find("VM_POOL"), root.find("REQUIREMENTS")
    host0, vm0, req0 = host_pool.find("HOST"), vm_pool.find("VM"), reqs.find("VM")
    ib_bridge = next(n.findtext("BRIDGE") for n in vm0.iterfind("TEMPLATE/NIC") if "ib-sriov" in (n.findtext("BRIDGE") or ""))
    for el in list(host_pool):
        host_pool.remove(el)
    for el in list(vm_pool):
        vm_pool.remove(el)
    for el in list(reqs):
        reqs.remove(el)
    for h in range(hosts):
        host = copy.deepcopy(host0)
        host.find("ID").text = str(h)
        host.find("NAME").text = f"node{h:03d}"
        free = h % 9                                   # 0..8 free VFs, split over two PFs
        tmpl = host.find("TEMPLATE")
        tmpl.find("KVM_SRIOV_FREE_VFS").text = str(free)
        for pf, n in zip(tmpl.iterfind("KVM_SRIOV_PF"), (free - free // 2, free // 2)):
            pf.find("FREE_VFS").text = str(n)
        host_pool.append(host)
    for v in range(vms):
        vm = copy.deepcopy(vm0)
        vm.find("ID").text = str(v)
        vm.find("NAME").text = f"vm{v}"
        tmpl = vm.find("TEMPLATE")
        nics = tmpl.findall("NIC")
        ib = [n for n in nics if "ib-sriov" in (n.findtext("BRIDGE") or "")]
        if v % 10 == 0:                                # no IB NIC at all
            for n in ib:
                n.find("BRIDGE").text = "br0"
        elif v % 10 == 1:                              # pinned to PF ib1
            for n in ib:
                n.find("BRIDGE").text = ib_bridge + ":ib1"
        elif v % 3 == 0:                               # a second IB NIC
            extra = copy.deepcopy(ib[0])
            extra.find("NIC_ID").text = str(len(nics))
            tmpl.append(extra)
        vm_pool.append(vm)
        req = copy.deepcopy(req0)
        req.find("ID").text = str(v)
        ids = req.find("HOSTS")
        for el in list(ids):
            ids.remove(el)
        for h in range(hosts):
            ET.SubElement(ids, "ID").text = str(h)
        reqs.append(req)
    return base64.b64encode(ET.tostring(root)) + b"\n"


def timed(cmd, stdin: bytes, env) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or b"<PLAN>" not in done.stdout:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return elapsed


def own_work(stdin: bytes) -> float:
    """What the placer adds before rank runs, best of 3."""
    from kvm_sriov.scheduler.placement import Ledger
    from kvm_sriov.scheduler.placement_program import Window
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        w = Window(base64.b64decode(stdin.strip()), Ledger(None))
        if w.narrow():
            base64.b64encode(w.document())
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vms", type=int, default=1000)
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)   # rank alone takes ~1-2 min here (debug build)
    ap.add_argument("--limit", type=float, default=1.2)
    add_strict(ap)
    args = ap.parse_args()
    from simhost.frontend import OpenNebulaMissing, locate_install
    try:
        prefix = locate_install()
    except OpenNebulaMissing as exc:
        print(f"bench-sched-place: cannot run without OpenNebula's rank placer: {exc}")
        return 1
    rank = str(prefix / "var" / "remotes" / "scheduler" / "rank" / "place")
    stdin = scaled_input(args.vms, args.hosts)
    with tempfile.TemporaryDirectory() as tmp:
        loc = Path(tmp) / "one"
        (loc / "etc" / "schedulers").mkdir(parents=True)
        (loc / "var").mkdir()
        conf = (prefix / "etc" / "schedulers" / "rank.conf").read_text()
        (loc / "etc" / "schedulers" / "rank.conf").write_text(re.sub(r"(?m)^(\s*DEBUG_LEVEL\s*=).*$", r"\1 0", conf))
        env = dict(os.environ, ONE_LOCATION=str(loc), KVM_SRIOV_RANK_PLACE=rank,
                   KVM_SRIOV_PLACEMENT_LEDGER=str(loc / "var" / "ledger.json"))
        print(f"input: {args.vms} pending VMs, {args.hosts} hosts, {len(stdin) / 1e6:.1f} MB base64")
        ranks, ours, ratios = [], [], []
        for r in range(args.rounds):
            (loc / "var" / "ledger.json").unlink(missing_ok=True)
            a = timed([rank], stdin, env)
            (loc / "var" / "ledger.json").unlink(missing_ok=True)
            b = timed([str(PLACE)], stdin, env)
            ranks.append(a)
            ours.append(b)
            ratios.append(b / a)
            print(f"round {r + 1}: rank {a:.3f} s, kvm-sriov {b:.3f} s, ratio {b / a:.3f}")
    own = own_work(stdin)
    print(f"kvm-sriov's own work (decode, parse, narrow, encode for rank), in-process: {own:.3f} s")
    ratio = statistics.median(ratios)
    print(f"median: rank {statistics.median(ranks):.3f} s, kvm-sriov {statistics.median(ours):.3f} s, "
          f"ratio {ratio:.3f} (limit {args.limit})")
    misses = [] if ratio <= args.limit else [f"ratio {ratio:.3f} > {args.limit}"]
    return finish("bench-sched-place", misses, args.strict)


if __name__ == "__main__":
    sys.exit(main())
