import math

import pytest

from kvm_sriov_bench.analysis import Samples, analyze, direction, efficiency, p_text, summarize
from kvm_sriov_bench.errors import HarnessError


def row(env, value, trial=0, size=128, metric="latency", vph=1, hosts=2, ppn=1, bench="ib_send_lat",
        placement="all", params=""):
    return dict(benchmark=bench, metric=metric, reported="avg", unit="us", env=env, hosts=hosts,
                vms_per_host=0 if env == "native" else vph, ppn=ppn, size=size, trial=trial, value=value,
                placement=placement, params=params)


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
    # constant difference: no variance, the t-test is undefined (n/a), not p = 0 / t = inf
    assert math.isnan(m[7]["p_value"]) and math.isnan(m[7]["t_statistic"])
    assert m[7]["significant"] is None and m[7]["test"].startswith("n/a")
    assert p_text(m[7]) == "p=n/a (paired differences have no variance)"


def test_native_baseline_with_same_ranks_per_host():
    rows = [row("native", 100.0, t, metric="gflops", ppn=1, bench="hpl", size=1000) for t in range(2)]
    rows += [row("native", 400.0, t, metric="gflops", ppn=4, bench="hpl", size=1000) for t in range(2)]
    rows += [row("vm", 360.0, t, metric="gflops", vph=4, ppn=1, bench="hpl", size=1000) for t in range(2)]
    _, eff = analyze(Samples.from_rows(rows))
    e = next(e for e in eff if e["statistic"] == "mean")
    assert e["native_ppn"] == 4 and e["efficiency"] == pytest.approx(0.9)


def test_identical_trials_give_n_a_not_p_zero():
    rows = [row("native", 2.0, t) for t in range(3)] + [row("vm", 2.0, t) for t in range(3)]
    _, eff = analyze(Samples.from_rows(rows))
    e = eff[0]
    assert math.isnan(e["p_value"]) and e["significant"] is None and e["efficiency"] == 1.0
    one = analyze(Samples.from_rows([row("native", 2.0), row("vm", 3.0)]))[1][0]
    assert p_text(one) == "p=n/a (fewer than 2 paired trials)"


def test_t_test_agrees_with_scipy():
    from scipy import stats
    native = [1.69, 1.71, 1.65, 1.70, 1.66]
    vm = [2.235, 2.20, 2.30, 2.21, 2.26]
    rows = [row("native", v, t) for t, v in enumerate(native)] + [row("vm", v, t) for t, v in enumerate(vm)]
    e = analyze(Samples.from_rows(rows))[1][0]
    ref = stats.ttest_rel(vm, native)
    assert e["t_statistic"] == pytest.approx(ref.statistic, rel=1e-12)
    assert e["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    # 95 % CI half-width of the mean, Student t with n-1 = 4 degrees of freedom
    assert e["native_ci95"] == pytest.approx(stats.t.ppf(0.975, 4) * stats.tstd(native) / math.sqrt(5))


def test_duplicate_trials_are_refused():
    rows = [row("native", 1.0, 0), row("native", 1.1, 0), row("vm", 2.0, 0)]
    with pytest.raises(HarnessError, match="trial 0 appears twice"):
        analyze(Samples.from_rows(rows))


def test_hpl_params_and_placements_kept_apart():
    """Two NBs at one N, xhpl vs hpcc's HPL, inter-host vs same-host: never pooled."""
    rows = []
    for nb, g in ((128, 30.0), (192, 40.0)):
        for t in range(2):
            rows.append(row("native", g + t, t, metric="gflops", bench="xhpl", size=2000,
                            params=f"WR11C2R4 NB={nb} P=1 Q=2"))
            rows.append(row("vm", 0.9 * (g + t), t, metric="gflops", bench="xhpl", size=2000,
                            params=f"WR11C2R4 NB={nb} P=1 Q=2"))
    rows += [row("native", 8.8, t, metric="gflops", bench="hpcc_hpl", size=2000,
                 params="WR11C2R4 NB=128 P=1 Q=2") for t in range(2)]
    summary, eff = analyze(Samples.from_rows(rows))
    means = {(e["benchmark"], e["params"]): e["efficiency"] for e in eff if e["statistic"] == "mean"}
    assert means == {("xhpl", "WR11C2R4 NB=128 P=1 Q=2"): pytest.approx(0.9),
                     ("xhpl", "WR11C2R4 NB=192 P=1 Q=2"): pytest.approx(0.9)}
    # same-host VM pairs: against same-host bare metal when there is one, else inter-host
    rows = [row("native", 1.0, t, placement="inter-host") for t in range(2)]
    rows += [row("vm", 2.0 + t, t, placement="same-host", vph=2) for t in range(2)]
    e = analyze(Samples.from_rows(rows))[1][0]
    assert (e["placement"], e["native_placement"]) == ("same-host", "inter-host")
    rows += [row("native", 0.5, t, placement="same-host") for t in range(2)]
    e = [e for e in analyze(Samples.from_rows(rows))[1] if e["placement"] == "same-host"][0]
    assert e["native_placement"] == "same-host" and e["native"] == 0.5


def test_groups_sorted_one_by_one_as_all_at_once():
    """Percentiles read values sorted inside each group: sorting the groups
    one by one (many samples per group) gives the same values in the same
    order as the one sort of everything, ties and -0.0 included."""
    import numpy as np

    from kvm_sriov_bench import analysis

    rng = np.random.default_rng(3)
    gid = rng.integers(0, 7, 5000)
    value = np.round(rng.standard_normal(5000), 1) * rng.choice([-1.0, 1.0], 5000)   # ties, 0.0 and -0.0
    v, g, order = analysis._sorted_within_groups(gid, 7, value)
    every = analysis._order_within_groups(gid, 7, value)
    assert np.array_equal(g, gid[every]) and np.array_equal(np.signbit(v), np.signbit(value[every]))
    assert np.array_equal(v, value[every]) and np.array_equal(gid[order], g)


def test_json_text_is_json_dumps_indent_1(tmp_path):
    """summary.json/efficiency.json: the very text json.dump(indent=1) wrote,
    whatever the rows hold."""
    import json

    from kvm_sriov_bench.analysis import dumps_indent1, write_json

    plain = [{"a": 1, "b": 2.5, "c": "é\"\n", "d": None, "e": True, "f": float("inf"), "g": -0.0, "h": 10 ** 20}]
    for meta, rows in (({}, []), ({"a": 1}, [{}]), ({"samples": 3, "alpha": 0.05}, plain * 3),
                       ({"m": [1, 2]}, plain), ({}, [{"a": {"b": [1]}}]), ({1: 2}, plain)):
        assert dumps_indent1(meta, rows) == json.dumps({"meta": meta, "rows": rows}, indent=1)
    s = Samples.from_rows([row("native", 1.0 + t / 8, t) for t in range(4)] + [row("vm", 2.0 + t, t) for t in range(4)])
    summary, eff = analyze(s)
    write_json(str(tmp_path / "e.json"), eff, {"samples": len(s)})
    doc = json.loads((tmp_path / "e.json").read_text())
    assert (tmp_path / "e.json").read_text() == json.dumps(doc, indent=1) and len(doc["rows"]) == len(eff)
