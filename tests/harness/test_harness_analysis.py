import math

import pytest

from kvm_sriov_bench.analysis import Samples, analyze, direction, efficiency, summarize
from kvm_sriov_bench.errors import HarnessError


def row(env, value, trial=0, size=128, metric="latency", vph=1, hosts=2, ppn=1, bench="ib_send_lat"):
    return dict(benchmark=bench, metric=metric, reported="avg", unit="us", env=env, hosts=hosts,
                vms_per_host=0 if env == "native" else vph, ppn=ppn, size=size, trial=trial, value=value)


def test_direction_per_metric():
    assert efficiency(1.69, 2.235, "latency") == pytest.approx(0.756152125)   # native / VM
    assert efficiency(2.475, 2.47, "latency") == pytest.approx(1.0020243)
    assert efficiency(100.0, 90.0, "gflops") == pytest.approx(0.9)            # VM / native
    assert efficiency(1000.0, 1000.0, "bandwidth") == 1.0
    assert direction("message_rate") == "higher"
    with pytest.raises(HarnessError):
        direction("temperature")


def test_percentiles_over_trials_hand_computed():
    s = Samples.from_rows([row("native", float(v), trial=v) for v in range(1, 11)])
    groups, _ = summarize(s)
    g = groups[0]
    assert (g["n"], g["mean"], g["min"], g["max"]) == (10, 5.5, 1.0, 10.0)
    # linear interpolation: P90 at position 0.9*9 = 8.1 -> 9 + 0.1*(10-9)
    assert g["p50"] == pytest.approx(5.5) and g["p90"] == pytest.approx(9.1)
    assert g["p95"] == pytest.approx(9.55) and g["p99"] == pytest.approx(9.91)
    assert g["std"] == pytest.approx(math.sqrt(sum((v - 5.5) ** 2 for v in range(1, 11)) / 9))


def test_efficiency_and_paired_t_test_hand_computed():
    native = [1.69, 1.71, 1.65]
    vm = [2.235, 2.20, 2.30]
    s = Samples.from_rows([row("native", v, t) for t, v in enumerate(native)]
                          + [row("vm", v, t) for t, v in enumerate(vm)])
    _, eff = analyze(s)
    mean = next(e for e in eff if e["statistic"] == "mean")
    assert mean["efficiency"] == pytest.approx((sum(native) / 3) / (sum(vm) / 3))
    p50 = next(e for e in eff if e["statistic"] == "p50")
    assert p50["efficiency"] == pytest.approx(1.69 / 2.235)
    # by hand: d = (0.545, 0.49, 0.65), mean 0.561667, sd 0.0812917, t = mean/(sd/sqrt 3)
    d = [b - a for a, b in zip(native, vm)]
    md = sum(d) / 3
    sd = math.sqrt(sum((x - md) ** 2 for x in d) / 2)
    t = md / (sd / math.sqrt(3))
    assert t == pytest.approx(11.9672, abs=1e-4)
    assert mean["t_statistic"] == pytest.approx(t)
    # Student t with 2 degrees of freedom: two-tailed p = 1 - t / sqrt(2 + t^2)
    assert mean["p_value"] == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert mean["p_value"] == pytest.approx(0.00691, abs=1e-5)
    assert mean["significant"] is True and mean["n_pairs"] == 3
    assert mean["direction"] == "lower" and "ttest_rel" in mean["test"]


def test_pairs_only_common_trials_and_per_configuration():
    rows = [row("native", 10.0 + t, t, metric="bandwidth") for t in range(4)]
    rows += [row("vm", 9.0 + t, t, metric="bandwidth", vph=1) for t in range(3)]
    rows += [row("vm", 5.0 + t, t, metric="bandwidth", vph=7) for t in range(4)]
    _, eff = analyze(Samples.from_rows(rows))
    m = {e["vms_per_host"]: e for e in eff if e["statistic"] == "mean"}
    assert m[1]["n_pairs"] == 3 and m[7]["n_pairs"] == 4
    assert m[1]["efficiency"] == pytest.approx(10.0 / 11.5)      # VM mean 10 / native mean 11.5
    assert m[7]["efficiency"] == pytest.approx(6.5 / 11.5)
    # constant difference: no variance, t-test reports no evidence rather than crashing
    assert m[7]["p_value"] == 0.0 or math.isnan(m[7]["p_value"]) or m[7]["p_value"] < 1e-10


def test_native_baseline_with_same_ranks_per_host():
    rows = [row("native", 100.0, t, metric="gflops", ppn=1, bench="hpl", size=1000) for t in range(2)]
    rows += [row("native", 400.0, t, metric="gflops", ppn=4, bench="hpl", size=1000) for t in range(2)]
    rows += [row("vm", 360.0, t, metric="gflops", vph=4, ppn=1, bench="hpl", size=1000) for t in range(2)]
    _, eff = analyze(Samples.from_rows(rows))
    e = next(e for e in eff if e["statistic"] == "mean")
    assert e["native_ppn"] == 4 and e["efficiency"] == pytest.approx(0.9)
