#!/usr/bin/env python3
"""Benchmark: analysis of 1,000,000 OSU samples (trials x sizes) in <= 2 s.

Samples: osu_latency, 25 message sizes (1 B .. 16 MiB), bare metal plus
VMs at 1, 2, 4 and 7 VMs per host on 2 hosts (5 series), 8,000 trials each
= 1,000,000 values. Timed: grouping, mean/std/min/max, P50/P90/P95/P99
over trials, efficiency per size and configuration, and a paired t-test
per size and configuration (scipy). Prints the time and the rate; exits 1
when it took longer than the budget.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from kvm_sriov_bench.analysis import Samples, analyze  # noqa: E402


def make_samples(trials=8000, sizes=25, seed=7):
    rng = np.random.default_rng(seed)
    size = 2 ** np.arange(sizes)
    series = [("native", 0), ("vm", 1), ("vm", 2), ("vm", 4), ("vm", 7)]
    per = trials * sizes
    n = per * len(series)
    env = np.empty(n, dtype="<U6")
    vph = np.empty(n, dtype=np.int64)
    sz = np.tile(np.repeat(size, trials), len(series))
    trial = np.tile(np.tile(np.arange(trials), sizes), len(series))
    base = 1.5 + size * 2.5e-4                      # us: a latency-vs-size curve
    value = np.empty(n)
    for k, (e, v) in enumerate(series):
        sl = slice(k * per, (k + 1) * per)
        env[sl] = e
        vph[sl] = v
        slow = 1.0 if e == "native" else 1.05 + 0.03 * v
        b = np.repeat(base, trials)
        value[sl] = b * slow * (1 + 0.05 * rng.standard_normal(per)) + 0.01
    return Samples.from_columns(value, benchmark="osu_latency", metric="latency", reported="avg",
                                unit="us", env=env, hosts=2, vms_per_host=vph, ppn=1, size=sz,
                                trial=trial)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=2.0, help="seconds allowed (default 2)")
    ap.add_argument("--trials", type=int, default=8000)
    a = ap.parse_args()
    s = make_samples(trials=a.trials)
    n = len(s)
    analyze(s)  # warm-up: imports scipy, first-call overheads
    t0 = time.perf_counter()
    summary, eff = analyze(s)
    dt = time.perf_counter() - t0
    groups = len({(r["env"], r["vms_per_host"], r["size"]) for r in summary})
    print(f"harness-analysis: {n:,} samples, {groups} groups, {len(eff)} efficiency rows "
          f"in {dt:.3f} s = {n / dt / 1e6:.2f} M samples/s (budget {a.budget:.1f} s)")
    one = next(r for r in eff if r["size"] == 128 and r["vms_per_host"] == 1 and r["statistic"] == "mean")
    print(f"  e.g. 128 B, 1 VM/host: latency efficiency {one['efficiency'] * 100:.2f} %, "
          f"p = {one['p_value']:.3g} over {one['n_pairs']} paired trials")
    if dt > a.budget:
        print(f"harness-analysis: FAILED, {dt:.3f} s > {a.budget:.1f} s")
        print("0 passed, 1 failed")
        return 1
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
