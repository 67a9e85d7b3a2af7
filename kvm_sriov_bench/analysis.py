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

import numpy as np

from .errors import HarnessError

DIRECTION = {"latency": "lower", "time": "lower", "init_time": "lower", "bandwidth": "higher",
             "message_rate": "higher", "gflops": "higher", "gups": "higher", "overlap": "higher"}
STATISTICS = ("mean", "p50", "p90", "p95", "p99")
# placement: inter-host / same-host for 2-rank benchmarks, "all" otherwise;
# params: what else makes a run distinct (HPL: variant, NB, P, Q)
CAT_COLS = ("benchmark", "metric", "reported", "unit", "env", "placement", "params")
CAT_DEFAULTS = {"env": "native", "placement": "all"}
NUM_COLS = ("hosts", "vms_per_host", "ppn", "size", "trial")
GROUP_COLS = CAT_COLS + NUM_COLS[:-1]
TEST_NAME = "paired two-tailed t-test (as scipy.stats.ttest_rel), pairs = trials"
NA_TEST = "n/a: differences between paired trials have no variance"


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
    def from_rows(cls, rows):
        cats = {name: ([], {}) for name in CAT_COLS}
        nums = {name: [] for name in NUM_COLS}
        value = []
        for r in rows:
            for name in CAT_COLS:
                codes, index = cats[name]
                label = str(r.get(name) or CAT_DEFAULTS.get(name, ""))
                code = index.get(label)
                if code is None:
                    code = index[label] = len(index)
                codes.append(code)
            try:
                for name in NUM_COLS:
                    nums[name].append(int(r.get(name, 0) or 0))
                value.append(float(r["value"]))
            except (TypeError, ValueError) as e:
                raise HarnessError(f"samples: a row that is not numbers where they belong ({e}): "
                                   f"{str(r)[:200]}") from None
        return cls({k: (np.asarray(c, dtype=np.int32), list(idx)) for k, (c, idx) in cats.items()},
                   {k: np.asarray(v, dtype=np.int64) for k, v in nums.items()}, value)

    def rows(self):
        out = []
        for i in range(len(self)):
            r = {name: self.cats[name][1][self.cats[name][0][i]] for name in CAT_COLS}
            r.update({name: int(self.nums[name][i]) for name in NUM_COLS})
            r["value"] = float(self.value[i])
            out.append(r)
        return out


def _group_ids(s, cols):
    """Dense group id per sample for the combination of ``cols``, numbered
    in the order the samples first have each group (a file's order)."""
    key = np.zeros(len(s), dtype=np.int64)
    for name in cols:
        if name in s.cats:
            codes, labels = s.cats[name]
            card = max(1, len(labels))
        else:
            uniq, codes = np.unique(s.nums[name], return_inverse=True)
            card = max(1, len(uniq))
        key = key * card + codes
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    return len(uniq), rank[inverse]


def _order_within_groups(gid, ngroups, key):
    """Sample indices sorted by group, then by ``key`` inside each group (as
    np.lexsort((key, gid))), in two plain sorts: the key once, then a stable
    sort on the group id, which numpy does as a radix sort when the ids fit
    in 16 bits (a million samples: ~4x faster than lexsort)."""
    if np.issubdtype(key.dtype, np.integer) and len(key) and 0 <= key.min() and key.max() < 32767:
        first = np.argsort(key.astype(np.int16), kind="stable")
    else:
        first = np.argsort(key, kind="stable")
    g = gid[first]
    if ngroups < 32767:
        g = g.astype(np.int16)
    return first[np.argsort(g, kind="stable")]


def _sorted_within_groups(gid, ngroups, value):
    """(values sorted by group, then by value inside each group; the group
    of each; one sample index per group). With many samples per group the
    groups are sorted one by one after a radix sort on the group id: a few
    thousand values each instead of one sort of all (a million samples:
    ~90 -> ~35 ms). Both ways give the same values in the same order (ties
    keep sample order)."""
    if ngroups * 64 > len(value):
        order = _order_within_groups(gid, ngroups, value)
        return value[order], gid[order], order
    by_group = np.argsort(gid.astype(np.int16) if ngroups < 32767 else gid, kind="stable")
    v, g = value[by_group], gid[by_group]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(gid, minlength=ngroups)))).tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        v[a:b].sort(kind="stable")
    return v, g, by_group


def summarize(s, percentiles=(50, 90, 95, 99)):
    """Per group (all columns but trial): n, mean, std, min, percentiles, max.

    Returns a list of group dicts (wide) — see :func:`tidy_summary` for the
    long form with a ``statistic`` column. Percentiles use linear
    interpolation between order statistics (numpy's default).
    """
    if len(s) == 0:
        return []
    ngroups, gid = _group_ids(s, GROUP_COLS)
    v, g, order = _sorted_within_groups(gid, ngroups, s.value)
    counts = np.bincount(g, minlength=ngroups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sums = np.add.reduceat(v, starts)
    mean = sums / counts
    dev = v - mean[g]
    var = np.add.reduceat(dev * dev, starts) / np.maximum(counts - 1, 1)
    std = np.where(counts > 1, np.sqrt(var), np.nan)
    # half-width of the 95 % confidence interval of the mean (Student t)
    from scipy.special import stdtrit
    tq = stdtrit(np.maximum(counts - 1, 1), 0.975)
    ci95 = np.where(counts > 1, tq * std / np.sqrt(counts), np.nan)
    stats = {"n": counts, "mean": mean, "std": std, "ci95": ci95, "min": v[starts],
             "max": v[starts + counts - 1]}
    for q in percentiles:
        # the position inside the group, so that where the group sits in
        # the array (the file's order) cannot change the last bit
        pos = (q / 100.0) * (counts - 1)
        rel = np.floor(pos)
        frac = pos - rel
        lo = starts + rel.astype(np.int64)
        hi = np.minimum(lo + 1, starts + counts - 1)
        stats[f"p{q:g}"] = v[lo] + (v[hi] - v[lo]) * frac
    first = order[starts]       # a sample of each group (all share the group columns)
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


def _trial_index(s, gid, ngroups, order=None):
    """Per group: (trials array, values array) in trial order."""
    if order is None:
        order = np.lexsort((s.nums["trial"], gid))
    g = gid[order]
    counts = np.bincount(g, minlength=ngroups)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    trials = s.nums["trial"][order]
    values = s.value[order]
    return [(trials[bounds[k]:bounds[k + 1]], values[bounds[k]:bounds[k + 1]]) for k in range(ngroups)]


def check_unique_trials(s, gid, groups, order=None):
    """Two values for one trial of one group (a run appended twice without
    renumbering, or two result folders holding the same configuration)
    would pool or mis-pair trials: refuse, naming the group."""
    if order is None:
        order = np.lexsort((s.nums["trial"], gid))
    g, t = gid[order], s.nums["trial"][order]
    dup = np.flatnonzero((g[1:] == g[:-1]) & (t[1:] == t[:-1]))
    if len(dup):
        row = groups[int(g[dup[0]])]
        raise HarnessError(
            f"samples: trial {int(t[dup[0]])} appears twice for {row['benchmark']} {row['metric']} "
            f"({row['reported']}) {row['env']} hosts={row['hosts']} vms_per_host={row['vms_per_host']} "
            f"size={row['size']} {row['placement']} {row['params']}".rstrip()
            + f" ({len(dup)} duplicate(s) in all); renumber the trials or analyse the runs apart")


def paired_ttest(vm, native):
    """Two-tailed paired t-test of vm - native (as scipy.stats.ttest_rel).
    (nan, nan) when it is undefined: fewer than 2 pairs, or differences
    with no variance (identical or constant-offset trials)."""
    from scipy.special import stdtr
    d = np.asarray(vm, dtype=np.float64) - np.asarray(native, dtype=np.float64)
    n = len(d)
    if n < 2:
        return math.nan, math.nan
    sd = d.std(ddof=1)
    if not sd > 0 or sd <= 1e-14 * max(1e-300, float(np.abs(d).max())):
        return math.nan, math.nan
    t = float(d.mean() / (sd / math.sqrt(n)))
    return t, float(2.0 * stdtr(n - 1, -abs(t)))


def _native_for(row, natives):
    """The bare-metal group a VM group is compared with: same benchmark,
    metric, size, hosts, placement and parameters; same ranks per host when
    several exist. A same-host VM pair without a same-host bare-metal run is
    compared with the inter-host one (paper 002, Fig. 3)."""
    key = tuple(row[c] for c in MATCH_COLS)
    cands = natives.get(key)
    if not cands and row["placement"] == "same-host":
        cands = natives.get(key[:-2] + ("inter-host", key[-1]))
    if not cands:
        return None
    want = row["ppn"] * max(1, row["vms_per_host"])
    nat = cands.get(want) or (next(iter(cands.values())) if len(cands) == 1 else None)
    if nat is None:
        nat = cands[min(cands, key=lambda p: abs(p - want))]
    return nat


def p_text(e):
    """How a p-value is shown: 'p=0.0123', 'p<0.001', or 'p=n/a' with why."""
    p = e.get("p_value")
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "p=n/a (" + ("fewer than 2 paired trials" if int(e.get("n_pairs") or 0) < 2
                            else "paired differences have no variance") + ")"
    return "p<0.001" if p < 0.001 else f"p={p:.3g}"


MATCH_COLS = ("benchmark", "metric", "reported", "unit", "size", "hosts", "placement", "params")


def analyze(s, statistics=STATISTICS, alpha=0.05):
    """Summary + efficiency + paired t-test. Returns (summary, efficiency)
    as lists of tidy dicts (one row per statistic)."""
    if len(s) == 0:
        return [], []
    groups, gid = summarize(s)
    by_trial = _order_within_groups(gid, len(groups), s.nums["trial"])
    check_unique_trials(s, gid, groups, by_trial)
    per_group = _trial_index(s, gid, len(groups), by_trial)
    natives = {}
    for row in groups:
        if row["env"] == "native":
            natives.setdefault(tuple(row[c] for c in MATCH_COLS), {})[row["ppn"]] = row
    eff = []
    for row in groups:
        if row["env"] == "native":
            continue
        nat = _native_for(row, natives)
        if nat is None:
            continue
        d = direction(row["metric"])
        nt, nv = per_group[nat["_gid"]]
        vt, vv = per_group[row["_gid"]]
        common, ni, vi = np.intersect1d(nt, vt, assume_unique=True, return_indices=True)
        t_stat, p_val = paired_ttest(vv[vi], nv[ni])
        test = TEST_NAME if len(common) < 2 or not math.isnan(p_val) else NA_TEST
        base = {c: row[c] for c in ("benchmark", "metric", "reported", "unit", "size", "hosts",
                                    "vms_per_host", "ppn", "placement", "params")}
        base.update(native_ppn=nat["ppn"], native_placement=nat["placement"], direction=d,
                    n_native=nat["n"], n_vm=row["n"], n_pairs=int(len(common)),
                    t_statistic=t_stat, p_value=p_val,
                    significant=(p_val < alpha) if not math.isnan(p_val) else None, test=test)
        for st in statistics:
            e = dict(base)
            e.update(statistic=st, native=nat[st], vm=row[st],
                     efficiency=efficiency(nat[st], row[st], row["metric"]))
            for side, g in (("native", nat), ("vm", row)):
                e[f"{side}_std"] = g["std"]
                e[f"{side}_ci95"] = g["ci95"]
            eff.append(e)
    summary = tidy_summary(groups)
    return summary, eff


def tidy_summary(groups, names=("n", "mean", "std", "ci95", "min", "p50", "p90", "p95", "p99", "max")):
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
                     "ppn", "placement", "params", "native_ppn", "native_placement", "direction",
                     "statistic", "native", "vm", "efficiency", "native_std", "vm_std",
                     "native_ci95", "vm_ci95", "n_native", "n_vm", "n_pairs", "t_statistic",
                     "p_value", "significant", "test"]
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
    text = dumps_indent1(meta or {}, [{k: clean(v) for k, v in r.items()} for r in rows])
    with open(path, "w") as f:
        f.write(text)


_SCALARS = (str, int, float, bool, type(None))
_AT_DEPTH = {depth: json.JSONEncoder(separators=(",\n" + " " * (depth + 1), ": ")) for depth in (1, 2)}


def _flat(d, depth):
    """json.dumps(d, indent=1) of a dict of plain values nested ``depth``
    deep, by the C encoder (its item separator carries the indentation);
    None when d holds anything else."""
    if not d:
        return "{}"
    if not all(type(k) is str and type(v) in _SCALARS for k, v in d.items()):
        return None
    text = _AT_DEPTH[depth].encode(d)
    return "{\n" + " " * (depth + 1) + text[1:-1] + "\n" + " " * depth + "}"


def dumps_indent1(meta, rows):
    """The text of json.dumps({"meta": meta, "rows": rows}, indent=1).
    json leaves its C encoder for a slow pure-Python one whenever indent is
    set (~40 ms per 1,000 rows); rows of plain values go through the C
    encoder here, anything else through json itself."""
    parts = [_flat(meta, 1)] + [_flat(r, 2) for r in rows]
    if None in parts:
        return json.dumps({"meta": meta, "rows": rows}, indent=1)
    body = "[\n  " + ",\n  ".join(parts[1:]) + "\n ]" if rows else "[]"
    return '{\n "meta": ' + parts[0] + ',\n "rows": ' + body + "\n}"


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
            elif k in ("value", "native", "vm", "efficiency", "t_statistic", "p_value", "native_std",
                       "vm_std", "native_ci95", "vm_ci95"):
                r[k] = float(v) if v != "" else math.nan
    return rows
