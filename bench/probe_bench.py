#!/usr/bin/python3
"""Probe and `kvm-sriov status` wall time on a fake 4-PF x 127-VF host.

Whole processes are timed (interpreter start, imports, sysfs walk, pool
query, output), as OpenNebula and an administrator run them. 100 of the
508 VFs are held by VMs (with GUID records), so the pool query is real.
The probe and the library run from a copy laid out as installed remotes,
precompiled as `rake install` does (hash-checked bytecode): what a host
runs, whatever PYTHONDONTWRITEBYTECODE says (without bytecode every run
compiles the library first: a third more instructions, ~8 ms here).

Prints min / median / max per command and the time per VF, then where the
probe's time goes: interpreter start, the probe on the same PFs without VFs
(imports, config, pool, PF reads), and what each VF adds. The gate is the
probe's best-of-N wall time <= --limit-ms (default 150): the minimum is the
figure least disturbed by other load on a shared machine; the median is
printed next to it.

Why 150 ms: the probe runs inside monitord's system-probe run (every 600 s,
and after each pool change at most every 4 s: node/monitor.py), which takes
4-5 s on an idle host (OpenNebula's own probes; docs/scheduling.md), and what
a pool change costs until oned sees it is judged by bench-sched-refresh
(< 5 s). 150 ms is 3 % of that run: nobody sees the difference below it. The old 30 ms goal had the probe read a copy
of the pool kept beside it and spare every import (28.4 ms, floor 17.0 ms);
it reads the SQLite pool itself now, the one record, and is written as the
rest of the library: 62.7 ms, floor 18.8 ms (shared 2-core machine, load 4).
The read is 0.6 ms of that; loading sqlite3, pathlib and typing the rest.
"""

import argparse
import compileall
import contextlib
import io
import os
import py_compile
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvm_sriov import config  # noqa: E402
from kvm_sriov.node.host import Allocation, Host  # noqa: E402
from kvm_sriov.vf.policy import VfRequest  # noqa: E402
from tests.support.fake_sysfs import big_host  # noqa: E402
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)

PROBE = Path("im/kvm-probes.d/host/system/kvm_sriov.py")  # relative to the remotes
# The floor: an interpreter that starts as the probe's does and makes the
# sysfs calls the scan cannot do without (every IOMMU group's and driver's
# directory listed once, each PF's SR-IOV and port files read), nothing else.
FLOOR = """
import os, sys
sys_ = sys.argv[1] + "/sys"
g = sys_ + "/kernel/iommu_groups"
for x in os.listdir(g):
    os.listdir(g + "/" + x + "/devices")
d = sys_ + "/bus/pci/drivers"
for x in os.listdir(d):
    os.listdir(d + "/" + x)
for pf in sys.argv[2:]:
    for a in ("sriov_numvfs", "sriov_totalvfs", "sriov_offset", "sriov_stride", "numa_node", "vendor", "device"):
        try:
            with open(sys_ + "/bus/pci/devices/" + pf + "/" + a) as f:
                f.read()
        except OSError:
            pass
"""
CLI = REPO / "bin/kvm-sriov"


def installed_remotes(remotes: Path) -> Path:
    """The probe and the library where a host has them, with bytecode as
    rake install precompiles it (hash-checked). Returns the library dir."""
    (remotes / PROBE).parent.mkdir(parents=True)
    shutil.copy2(REPO / PROBE, remotes / PROBE)
    lib = remotes / "vmm/kvm-sriov/lib"
    shutil.copytree(REPO / "kvm_sriov", lib / "kvm_sriov", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "kvm_sriov_bootstrap.py", lib.parent)   # beside the action scripts, as rake install puts it
    if not compileall.compile_dir(str(lib), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH):
        sys.exit("cannot precompile the library copy")
    return lib


def timed(cmd, env, runs):
    """Wall times and CPU times (user+sys of the child) per run."""
    times, cpu = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        if done.returncode != 0:
            sys.exit(f"{cmd[0]} failed: {done.stderr}")
    timed.cpu = cpu
    return times, done.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--pfs", type=int, default=4)
    ap.add_argument("--vfs", type=int, default=127)
    ap.add_argument("--limit-ms", type=float, default=150.0)
    add_strict(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big_host(tmp / "root", args.pfs, args.vfs)
        conf = tmp / "kvm-sriov.toml"
        conf.write_text(f'[sysfs]\nroot = "{tmp / "root"}"\n[pool]\nstate_dir = "{tmp / "state"}"\n')
        host = Host(config.load(files=[conf]))
        vfs = host.inventory.vfs[:100]
        with host.pool.transaction() as txn:
            for n, vf in enumerate(vfs):
                txn.add(vf.address, vf.pf, 1000 + n, f"one-{1000 + n}", f"02:00:0a:64:{n >> 8:02x}:{n & 255:02x}",
                        "attached", "deploy")
        with contextlib.redirect_stderr(io.StringIO()):  # the per-VF INFO lines
            for n, vf in enumerate(vfs):
                host.program_guids(1000 + n, [Allocation(VfRequest(f"02:00:0a:64:{n >> 8:02x}:{n & 255:02x}"), vf)])
        host.close()
        lib = installed_remotes(tmp / "remotes")
        env = dict(os.environ, KVM_SRIOV_CONFIG=str(conf), KVM_SRIOV_LIB=str(lib))
        total = args.pfs * args.vfs
        results = {}
        for name, cmd in (("probe", [str(tmp / "remotes" / PROBE)]), ("status", [str(CLI), "status"])):
            timed(cmd, env, 2)  # warm the page cache
            times, out = timed(cmd, env, args.runs)
            results[name] = times
            lo, med, hi = min(times) * 1e3, statistics.median(times) * 1e3, max(times) * 1e3
            print(f"{name:7} {args.pfs} PFs x {args.vfs} VFs ({total} VFs, 100 held), {args.runs} runs: "
                  f"min {lo:.1f} ms, median {med:.1f} ms, max {hi:.1f} ms; "
                  f"{lo * 1e3 / total:.1f} us/VF (min), {med * 1e3 / total:.1f} us/VF (median); "
                  f"CPU median {statistics.median(timed.cpu) * 1e3:.1f} ms")
            if name == "probe":
                assert "KVM_SRIOV_WARNING" not in out, out
                assert f"KVM_SRIOV_TOTAL_VFS = {total}" in out and f"KVM_SRIOV_FREE_VFS = {total - 100}" in out
        # where the time goes: interpreter start, then the same probe on the
        # same PFs without VFs (imports, config, pool, PF reads), then the VFs
        empty = tmp / "empty"
        big_host(empty / "root", args.pfs, 0)
        shutil.copytree(tmp / "state", empty / "state")  # the same pool query
        (empty / "kvm-sriov.toml").write_text(f'[sysfs]\nroot = "{empty / "root"}"\n'
                                              f'[pool]\nstate_dir = "{empty / "state"}"\n')
        pfs = [a for a in os.listdir(tmp / "root/sys/bus/pci/devices")
               if (tmp / "root/sys/bus/pci/devices" / a / "sriov_totalvfs").exists()]
        floor = [sys.executable, "-S", "-c", FLOOR, str(tmp / "root")] + pfs
        parts = {"start": ([sys.executable, "-S", "-c", "pass"], env),
                 "floor": (floor, env),
                 "no VFs": ([str(tmp / "remotes" / PROBE)], dict(env, KVM_SRIOV_CONFIG=str(empty / "kvm-sriov.toml"))),
                 "probe": ([str(tmp / "remotes" / PROBE)], env)}
        best_of = {name: float("inf") for name in parts}
        for _ in range(args.runs):
            for name, (cmd, e) in parts.items():
                best_of[name] = min(best_of[name], timed(cmd, e, 1)[0][0] * 1e3)
        print(f"where it goes (best of {args.runs}, interleaved): python3 -S start {best_of['start']:.1f} ms; "
              f"the probe on {args.pfs} PFs without VFs {best_of['no VFs']:.1f} ms (start, imports, config, pool, "
              f"PFs); with {total} VFs {best_of['probe']:.1f} ms: "
              f"{(best_of['probe'] - best_of['no VFs']) * 1e3 / total:.1f} us per VF")
        print(f"against the floor (python3 -S start + the bare sysfs listing and reads, best of {args.runs}, "
              f"interleaved): floor {best_of['floor']:.1f} ms, probe {best_of['probe']:.1f} ms = "
              f"{best_of['probe'] / best_of['floor']:.2f}x the floor, "
              f"{best_of['probe'] - best_of['floor']:.1f} ms above it")
    # judged on the interleaved series: a busy moment slows the floor beside it
    # too, where the first series alone would just read slow
    best = best_of["probe"]
    print(f"probe target <= {args.limit_ms:.0f} ms (best of {args.runs}, interleaved with the floor): "
          f"{best:.1f} ms (first series alone: {min(results['probe']) * 1e3:.1f} ms)")
    misses = [] if best <= args.limit_ms else [f"probe {best:.1f} ms > {args.limit_ms:.0f} ms"]
    return finish("bench-probe", misses, args.strict)


if __name__ == "__main__":
    sys.exit(main())
