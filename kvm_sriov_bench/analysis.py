"""Statistics over trials, VM / bare-metal efficiency, paired t-tests.

Input: tidy samples, one value per (benchmark, metric, reported, unit,
env, hosts, vms_per_host, ppn, size, trial). ``reported`` is what the
benchmark printed (avg, p99, peak...); the statistics computed here over
trials are named in the ``statistic`` column (mean, p50, p90, p95, p99...).

Efficiency (paper 002): VM / native for higher-is-better metrics
(bandwidth, message rate, Gflops), native / VM for lower-is-better ones
(latency, time), computed per message size and per configuration, against
the bare-metal run on the same number of hosts (and, when several exist,
the same ranks per host). Paired two-tailed t-test per size as in paper
000: ``scipy.stats.ttest_rel`` on the per-trial values, paired by trial.
"""
from __future__ import annotations

import csv
import json
import math
import warnings

import numpy as np

from .errors import HarnessError

DIRECTION = {"latency": "lower", "time": "lower", "bandwidth": "higher",
             "message_rate": "higher", "gflops": "higher", "gups": "higher"}
STATISTICS = ("mean", "p50", "p90", "p95", "p99")
CAT_COLS = ("benchmark", "metric", "reported", "unit", "env")
NUM_COLS = ("hosts", "vms_per_host", "ppn", "size", "trial")
GROUP_COLS = CAT_COLS + NUM_COLS[:-1]
TEST_NAME = "paired two-tailed t-test (scipy.stats.ttest_rel), pairs = trials"


def direction(metric):
    try:
        return DIRECTION[metric]
    except KeyError:
        raise HarnessError(f"no known direction (higher/lower is better) for metric {metric!r}") from None


def efficiency(native, vm, metric):
    """One efficiency value: VM/native (higher is better) or native/VM."""
    if direction(metric) == "higher":
        return vm / native if native else math.nan
    return native / vm if vm else math.nan


class Samples:
    """Column store of tidy samples: categorical columns as codes."""

    def __init__(self, cats, nums, value):
        self.cats = cats            # name -> (codes int32 array, list of labels)
        self.nums = nums            # name -> int64 array
        self.value = np.asarray(value, dtype=np.float64)
        n = len(self.value)
        for name in CAT_COLS:
            if name not in cats or len(cats[name][0]) != n:
                raise HarnessError(f"samples: column {name!r} missing or of the wrong length")
        for name in NUM_COLS:
            if name not in nums or len(nums[name]) != n:
                raise HarnessError(f"samples: column {name!r} missing or of the wrong length")
        if n and not np.all(np.isfinite(self.value)):
            raise HarnessError("samples: non-finite values")

    def __len__(self):
        return len(self.value)

    @classmethod
    def from_columns(cls, value, **cols):
        """Columns as arrays or scalars (broadcast); strings are factorized."""
        value = np.asarray(value, dtype=np.float64)
        n = len(value)
        cats, nums = {}, {}
        for name in CAT_COLS:
            col = cols.get(name, "native" if name == "env" else "")
            if isinstance(col, str):
                cats[name] = (np.zeros(n, dtype=np.int32), [col])
            else:
                labels, codes = np.unique(np.asarray(col, dtype=str), return_inverse=True)
                cats[name] = (codes.astype(np.int32), [str(x) for x in labels])
        for name in NUM_COLS:
            col = cols.get(name, 0)
            nums[name] = np.broadcast_to(np.asarray(col, dtype=np.int64), (n,)).copy()
        return cls(cats, nums, value)

    @classmethod
    def from_rows(cls, rows):
        cats = {name: ([], {}) for name in CAT_COLS}
        nums = {name: [] for name in NUM_COLS}
        value = []
        for r in rows:
            for name in CAT_COLS:
                codes, index = cats[name]
                label = str(r.get(name, "native" if name == "env" else ""))
                code = index.get(label)
                if code is None:
                    code = index[label] = len(index)
                codes.append(code)
            for name in NUM_COLS:
                nums[name].append(int(r.get(name, 0) or 0))
            value.append(float(r["value"]))
        return cls({k: (np.asarray(c, dtype=np.int32), list(idx)) for k, (c, idx) in cats.items()},
                   {k: np.asarray(v, dtype=np.int64) for k, v in nums.items()}, value)

    @classmethod
    def read_csv(cls, path):
        with open(path, newline="") as f:
            return cls.from_rows(csv.DictReader(f))

    def rows(self):
        out = []
        for i in range(len(self)):
            r = {name: self.cats[name][1][self.cats[name][0][i]] for name in CAT_COLS}
            r.update({name: int(self.nums[name][i]) for name in NUM_COLS})
            r["value"] = float(self.value[i])
            out.append(r)
        return out

    def concat(self, other):
        return Samples.from_rows(self.rows() + other.rows())


def _group_ids(s, cols):
    """Dense group id per sample for the combination of ``cols``."""
    key = np.zeros(len(s), dtype=np.int64)
    for name in cols:
        if name in s.cats:
            codes, labels = s.cats[name]
            card = max(1, len(labels))
        else:
            uniq, codes = np.unique(s.nums[name], return_inverse=True)
            card = max(1, len(uniq))
        key = key * card + codes
    uniq, inverse = np.unique(key, return_inverse=True)
    return len(uniq), inverse


def summarize(s, percentiles=(50, 90, 95, 99)):
    """Per group (all columns but trial): n, mean, std, min, percentiles, max.

    Returns a list of group dicts (wide) — see :func:`tidy_summary` for the
    long form with a ``statistic`` column. Percentiles use linear
    interpolation between order statistics (numpy's default).
    """
    if len(s) == 0:
        return []
    ngroups, gid = _group_ids(s, GROUP_COLS)
    order = np.lexsort((s.value, gid))
    v = s.value[order]
    g = gid[order]
    counts = np.bincount(g, minlength=ngroups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sums = np.add.reduceat(v, starts)
    mean = sums / counts
    dev = v - mean[g]
    var = np.add.reduceat(dev * dev, starts) / np.maximum(counts - 1, 1)
    std = np.where(counts > 1, np.sqrt(var), np.nan)
    stats = {"n": counts, "mean": mean, "std": std, "min": v[starts],
             "max": v[starts + counts - 1]}
    for q in percentiles:
        pos = starts + (q / 100.0) * (counts - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, starts + counts - 1)
        frac = pos - lo
        stats[f"p{q:g}"] = v[lo] + (v[hi] - v[lo]) * frac
    first = order[starts]
    out = []
    for k in range(ngroups):
        i = first[k]
        row = {name: s.cats[name][1][s.cats[name][0][i]] for name in CAT_COLS}
        row.update({name: int(s.nums[name][i]) for name in GROUP_COLS if name in s.nums})
        for name, arr in stats.items():
            row[name] = int(arr[k]) if name == "n" else float(arr[k])
        row["_gid"] = k
        out.append(row)
    return out, gid


def _trial_index(s, gid, ngroups):
    """Per group: (trials array, values array) in trial order."""
    order = np.lexsort((s.nums["trial"], gid))
    g = gid[order]
    counts = np.bincount(g, minlength=ngroups)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    trials = s.nums["trial"][order]
    values = s.value[order]
    return [(trials[bounds[k]:bounds[k + 1]], values[bounds[k]:bounds[k + 1]]) for k in range(ngroups)]


def analyze(s, statistics=STATISTICS, alpha=0.05):
    """Summary + efficiency + paired t-test. Returns (summary, efficiency)
    as lists of tidy dicts (one row per statistic)."""
    from scipy import stats as sst

    if len(s) == 0:
        return [], []
    groups, gid = summarize(s)
    per_group = _trial_index(s, gid, len(groups))
    match_cols = ("benchmark", "metric", "reported", "unit", "size", "hosts")
    natives = {}
    for row in groups:
        if row["env"] == "native":
            natives.setdefault(tuple(row[c] for c in match_cols), {})[row["ppn"]] = row
    eff = []
    for row in groups:
        if row["env"] == "native":
            continue
        cands = natives.get(tuple(row[c] for c in match_cols))
        if not cands:
            continue
        want = row["ppn"] * max(1, row["vms_per_host"])
        nat = cands.get(want) or (next(iter(cands.values())) if len(cands) == 1 else None)
        if nat is None:
            nat = cands[min(cands, key=lambda p: abs(p - want))]
        d = direction(row["metric"])
        nt, nv = per_group[nat["_gid"]]
        vt, vv = per_group[row["_gid"]]
        common, ni, vi = np.intersect1d(nt, vt, assume_unique=False, return_indices=True)
        t_stat = p_val = math.nan
        if len(common) >= 2:
            a, b = nv[ni], vv[vi]
            if np.any(a != b):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = sst.ttest_rel(b, a)
                t_stat, p_val = float(res.statistic), float(res.pvalue)
            else:
                t_stat, p_val = 0.0, 1.0
        base = {c: row[c] for c in ("benchmark", "metric", "reported", "unit", "size", "hosts",
                                    "vms_per_host", "ppn")}
        base.update(native_ppn=nat["ppn"], direction=d, n_native=nat["n"], n_vm=row["n"],
                    n_pairs=int(len(common)), t_statistic=t_stat, p_value=p_val,
                    significant=(p_val < alpha) if not math.isnan(p_val) else None,
                    test=TEST_NAME)
        for st in statistics:
            e = dict(base)
            e.update(statistic=st, native=nat[st], vm=row[st],
                     efficiency=efficiency(nat[st], row[st], row["metric"]))
            eff.append(e)
    summary = tidy_summary(groups)
    return summary, eff


def tidy_summary(groups, names=("n", "mean", "std", "min", "p50", "p90", "p95", "p99", "max")):
    out = []
    for g in groups:
        base = {c: g[c] for c in GROUP_COLS}
        for st in names:
            if st in g:
                r = dict(base)
                r.update(statistic=st, value=g[st])
                out.append(r)
    return out


SUMMARY_FIELDS = list(GROUP_COLS) + ["statistic", "value"]
EFFICIENCY_FIELDS = ["benchmark", "metric", "reported", "unit", "size", "hosts", "vms_per_host",
                     "ppn", "native_ppn", "direction", "statistic", "native", "vm", "efficiency",
                     "n_native", "n_vm", "n_pairs", "t_statistic", "p_value", "significant", "test"]
SAMPLE_FIELDS = list(CAT_COLS) + list(NUM_COLS) + ["value", "label", "source"]


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})


def write_json(path, rows, meta=None):
    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, np.generic):
            return v.item()
        return v
    with open(path, "w") as f:
        json.dump({"meta": meta or {}, "rows": [{k: clean(v) for k, v in r.items()} for r in rows]},
                  f, indent=1)


def read_rows(path):
    """Rows of a CSV or JSON written by the harness (numbers converted)."""
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)["rows"]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if v is None:
                continue
            if k in NUM_COLS or k in ("native_ppn", "n", "n_native", "n_vm", "n_pairs"):
                r[k] = int(v) if v != "" else 0
            elif k in ("value", "native", "vm", "efficiency", "t_statistic", "p_value"):
                r[k] = float(v) if v != "" else math.nan
    return rows
