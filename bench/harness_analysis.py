#!/usr/bin/env python3
"""Benchmark: `kvm-sriov-bench analyze` on a long campaign's samples.csv
(20,000 rows), the whole command as a user runs it (interpreter start,
imports, reading the CSV, statistics, t-tests, writing summary/efficiency
CSV and JSON), in <= 1 s and <= 300 MB peak memory.

Samples: osu_latency, 25 message sizes (1 B .. 16 MiB), bare metal plus
VMs at 1, 2, 4 and 7 VMs per host on 2 hosts (5 series), 160 trials each
= 20,000 rows (paper 002 took tens of trials per point), written in the
harness's own samples.csv layout. --trials 8000 makes a million rows.

Timings on a shared machine move with the load, so the command is timed
side by side with two baselines on the same file, alternating, best of
``--repeat``: `wc -l` (reading the bytes and nothing else) and a Python
that starts, imports numpy and reads the file raw. The ratios say what the
analysis costs on top of reading the file; the absolute budget is checked
on the best run. Above the budget: TARGET MISSED (exit 1 with --strict).
"""
import argparse
import compileall
import os
import py_compile
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from kvm_sriov_bench.analysis import SAMPLE_FIELDS  # noqa: E402
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)


def write_samples(path, trials=8000, sizes=25, seed=7):
    rng = np.random.default_rng(seed)
    size = 2 ** np.arange(sizes)
    series = [("native", 0), ("vm", 1), ("vm", 2), ("vm", 4), ("vm", 7)]
    base = 1.5 + size * 2.5e-4                      # us: a latency-vs-size curve
    with open(path, "w") as f:
        f.write(",".join(SAMPLE_FIELDS) + "\n")
        for env, vph in series:
            label = "native-h2" if env == "native" else f"vm-h2-v{vph}"
            slow = 1.0 if env == "native" else 1.05 + 0.03 * vph
            for k, sz in enumerate(size):
                v = base[k] * slow * (1 + 0.05 * rng.standard_normal(trials)) + 0.01
                prefix = f"osu_latency,latency,avg,us,{env},inter-host,,2,{vph},1,{sz},"
                suffix = f",{label},raw/{label}/osu_latency.inter-host.t"
                f.write("".join(f"{prefix}{t},{x:.4f}{suffix}{t}.txt\n" for t, x in enumerate(v)))
    return trials * sizes * len(series)


def installed(tmp):
    """A copy of the harness with its bytecode compiled, as a checkout has
    it from the second run on (or an install from the first): the rake
    suites set PYTHONDONTWRITEBYTECODE, and without bytecode every run
    would compile the harness first. Returns the directory for PYTHONPATH."""
    lib = os.path.join(tmp, "lib")
    shutil.copytree(os.path.join(ROOT, "kvm_sriov_bench"), os.path.join(lib, "kvm_sriov_bench"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    if not compileall.compile_dir(lib, quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH):
        sys.exit("cannot precompile the harness copy")
    return lib


def timed(cmd, env=None):
    """Wall seconds and peak RSS (MB) of one child command."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = r0.ru_maxrss
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = r1.ru_maxrss
    timed.cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    # ru_maxrss of children is the largest child so far: run the big one first
    return dt, max(peak, before) / 1024.0, r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="seconds allowed (default 1)")
    ap.add_argument("--memory", type=float, default=300.0, help="MB allowed (default 300)")
    ap.add_argument("--trials", type=int, default=160, help="trials per point (default 160: 20,000 rows)")
    ap.add_argument("--repeat", type=int, default=3)
    add_strict(ap)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "samples.csv")
        n = write_samples(path, trials=a.trials)
        mb = os.path.getsize(path) / 1e6
        env = dict(os.environ, PYTHONPATH=installed(tmp))
        analyze = [sys.executable, "-m", "kvm_sriov_bench", "analyze", tmp, "--out", tmp + "/o"]
        raw = [sys.executable, "-c", f"import numpy; open({path!r}, 'rb').read()"]
        wc = ["wc", "-l", path]
        # the analysis first: its peak RSS is then the children's maximum
        dt, peak, out = timed(analyze, env)
        best = {"analyze": dt, "raw": float("inf"), "wc": float("inf")}
        cpu = timed.cpu
        for _ in range(a.repeat):
            for name, cmd in (("raw", raw), ("wc", wc), ("analyze", analyze)):
                best[name] = min(best[name], timed(cmd, env)[0])
                if name == "analyze":
                    cpu = min(cpu, timed.cpu)
    print(f"harness-analysis: `kvm-sriov-bench analyze` on {n:,} rows ({mb:.0f} MB samples.csv), "
          f"best of {a.repeat + 1}: {best['analyze']:.3f} s (CPU {cpu:.3f} s, both cores), peak {peak:.0f} MB "
          f"(budget {a.budget:.1f} s, {a.memory:.0f} MB)")
    print(f"  side by side: wc -l {best['wc']:.3f} s, python+numpy reading the file raw "
          f"{best['raw']:.3f} s; analyze / raw read = {best['analyze'] / best['raw']:.2f}x, "
          f"analyze / wc -l = {best['analyze'] / best['wc']:.1f}x")
    print("  " + out.splitlines()[0])
    failed = []
    if best["analyze"] > a.budget:
        failed.append(f"{best['analyze']:.3f} s > {a.budget:.1f} s")
    if peak > a.memory:
        failed.append(f"{peak:.0f} MB > {a.memory:.0f} MB")
    return finish("harness-analysis", failed, a.strict)


if __name__ == "__main__":
    sys.exit(main())
