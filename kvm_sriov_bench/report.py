"""Report: figures and tables an HPC engineer can check.

Per benchmark/metric/hosts/placement: the absolute curves (us, MB/s ...,
mean over trials with its 95 % confidence interval) bare metal vs each VM
configuration, next to the efficiency with its propagated interval (paper
002's Figs. 4-7 plus the numbers behind them); OSU's own -z tail latencies
(P50/P90/P99 of the iterations inside each run, averaged over trials);
HPL Gflops by N and efficiency vs VMs per host (Figs. 8-9). Values paper
002 only states in words are drawn as hollow markers labelled "stated in
text", never as measured points. Every table has units and the run
metadata (command, versions, hosts, VMs per host, date).
"""
from __future__ import annotations

import html
import math
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# xhpl, the HPL inside hpcc, and paper 002's "hpl" (Linpack) figures
HPL_BENCHMARKS = ("xhpl", "hpcc_hpl", "hpl")
# what each benchmark prints as its main value for a metric
PRIMARY = ("avg", "overall", "value")
TAILS = ("p50", "p90", "p95", "p99", "p99.9")
UNIT_LABEL = {"us": "µs", "MB/s": "MB/s", "msg/s": "messages/s", "Gflops": "Gflops", "s": "s",
              "ms": "ms", "%": "%", "GUP/s": "GUP/s"}


def _nan(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def _fmt(v, pct=False):
    if _nan(v):
        return "—"
    return f"{v * 100:.2f} %" if pct else f"{v:.4g}"


def _slug(*parts):
    return "_".join(str(p).replace("/", "-").replace(" ", "-").replace("=", "") for p in parts if p != "")


def _config(vph):
    return "bare metal" if vph == 0 else f"{vph} VM{'s' if vph != 1 else ''}/host"


def eff_interval(e):
    """Half-width of the efficiency's 95 % interval, from the two means'
    intervals (first-order propagation of a ratio); nan when unknown."""
    try:
        a, b = float(e["native"]), float(e["vm"])
        ca, cb = float(e.get("native_ci95")), float(e.get("vm_ci95"))
    except (TypeError, ValueError):
        return math.nan
    if _nan(ca) or _nan(cb) or not a or not b:
        return math.nan
    return float(e["efficiency"]) * math.hypot(ca / a, cb / b)


def _bars(ys, half):
    """Error bars as [below, above], the lower one clipped at zero: a mean's
    interval reaching below 0 (few, noisy trials) is drawn down to the axis,
    not into negative latencies or off a log scale."""
    half = [0.0 if _nan(h) else h for h in half]
    below = [min(h, y * 0.999) if not _nan(y) and y > 0 else 0.0 for y, h in zip(ys, half)]
    return [below, half]


def _hosts(n):
    return f"{n} host{'s' if n != 1 else ''}"


def _save(fig, outdir, name):
    path = os.path.join(outdir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series(summary):
    """(bench, metric, reported, unit, hosts, placement, params) -> {vph: {size: {stat: value}}}."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in summary:
        key = (r["benchmark"], r["metric"], r["reported"], r["unit"], r["hosts"],
               r.get("placement", "all"), r.get("params", ""))
        vph = 0 if r["env"] == "native" else r["vms_per_host"]
        out[key][vph][r["size"]][r["statistic"]] = r["value"]
    return out


def plot_absolute_and_efficiency(summary, eff, outdir):
    """One PNG per (benchmark, metric, hosts, placement): absolute mean ± 95 % CI
    vs message size (left) and efficiency ± its interval (right)."""
    effs = defaultdict(lambda: defaultdict(list))
    for e in eff:
        if e["statistic"] == "mean" and e["reported"] != "stated":
            effs[(e["benchmark"], e["metric"], e["reported"], e["unit"], e["hosts"],
                  e.get("placement", "all"), e.get("params", ""))][e["vms_per_host"]].append(e)
    files = []
    for key, by_vph in sorted(_series(summary).items()):
        bench, metric, reported, unit, hosts, placement, params = key
        if bench in HPL_BENCHMARKS or reported not in PRIMARY:
            continue
        if all(len(sizes) < 2 for sizes in by_vph.values()):
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
        for vph, sizes in sorted(by_vph.items()):
            xs = sorted(sizes)
            ys = [sizes[x].get("mean", math.nan) for x in xs]
            ci = _bars(ys, [sizes[x].get("ci95") for x in xs])
            a1.errorbar(xs, ys, yerr=ci, marker="o" if vph == 0 else "s", ms=3, capsize=2,
                        lw=2 if vph == 0 else 1, color="black" if vph == 0 else None, label=_config(vph))
        a1.set_xscale("log", base=2)
        if all(v.get("mean", 0) > 0 for sizes in by_vph.values() for v in sizes.values()):
            a1.set_yscale("log")     # µs and MB/s span decades over the size sweep
        a1.set_xlabel("message size (bytes)")
        a1.set_ylabel(f"{metric} ({UNIT_LABEL.get(unit, unit)}), mean ± 95 % CI")
        a1.set_title(f"{bench} {metric} ({reported})")
        a1.grid(alpha=0.3, which="both")
        a1.legend(fontsize=8)
        for vph, rows in sorted(effs.get(key, {}).items()):
            rows = sorted(rows, key=lambda e: e["size"])
            ys = [e["efficiency"] * 100 for e in rows]
            a2.errorbar([e["size"] for e in rows], ys,
                        yerr=_bars(ys, [eff_interval(e) * 100 for e in rows]),
                        marker="s", ms=3, capsize=2, label=_config(vph))
        a2.axhline(100, color="grey", lw=0.8, ls="--")
        a2.set_xscale("log", base=2)
        a2.set_xlabel("message size (bytes)")
        direction = "bare metal / VM" if metric == "latency" else "VM / bare metal"
        a2.set_ylabel(f"efficiency (%), {direction}")
        a2.set_title("efficiency, mean over trials ± 95 % interval")
        a2.grid(alpha=0.3)
        if effs.get(key):
            a2.legend(fontsize=8)
        fig.suptitle(f"{bench}: {_hosts(hosts)}, {placement}" + (f", {params}" if params else ""),
                     fontsize=10)
        name = f"abs_eff_{_slug(bench, metric, reported, 'h' + str(hosts), placement, params)}.png"
        files.append((f"{bench} {metric}: absolute and efficiency, {_hosts(hosts)}, {placement}",
                      _save(fig, outdir, name)))
    return files


def plot_tail_latency(summary, outdir):
    """OSU's own -z percentiles (over the iterations of each run; mean over
    trials) vs message size: bare metal solid, VMs dashed."""
    files = []
    series = _series(summary)
    groups = defaultdict(dict)
    for key, by_vph in series.items():
        bench, metric, reported, unit, hosts, placement, params = key
        if metric == "latency" and reported in TAILS:
            groups[(bench, unit, hosts, placement, params)][reported] = by_vph
    for (bench, unit, hosts, placement, params), tails in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        colors = dict(zip(TAILS, ("C0", "C1", "C2", "C3", "C4")))
        markers = {0: "o", 1: "s", 2: "^", 4: "v", 7: "D"}
        for tail in TAILS:
            for vph, sizes in sorted(tails.get(tail, {}).items()):
                xs = sorted(sizes)
                ax.plot(xs, [sizes[x].get("mean", math.nan) for x in xs], color=colors[tail],
                        ls="-" if vph == 0 else "--", marker=markers.get(vph, "x"), ms=3,
                        label=f"{tail.upper()} {_config(vph)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"latency ({UNIT_LABEL.get(unit, unit)})")
        ax.set_title(f"{bench}: OSU -z tail latency (within each run, mean over trials), "
                     f"{_hosts(hosts)}, {placement}", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3, which="both")
        files.append((f"{bench} OSU -z tail latencies, {_hosts(hosts)}, {placement}",
                      _save(fig, outdir, f"tail_{_slug(bench, 'h' + str(hosts), placement)}.png")))
    return files


def plot_hpl(summary, eff, outdir):
    """HPL: Gflops vs N (mean ± 95 % CI, bare metal and VMs) and efficiency vs
    VMs per host per N; values the paper only states in words as hollow
    markers with their quote."""
    files = []
    series = _series(summary)
    for key, by_vph in sorted(series.items()):
        bench, metric, reported, unit, hosts, placement, params = key
        if bench not in HPL_BENCHMARKS or metric != "gflops":
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
        for vph, sizes in sorted(by_vph.items()):
            xs = sorted(sizes)
            ys = [sizes[x].get("mean", math.nan) for x in xs]
            a1.errorbar(xs, ys, yerr=_bars(ys, [sizes[x].get("ci95") for x in xs]),
                        marker="o", capsize=3, label=_config(vph))
        a1.set_xlabel("N (matrix order)")
        a1.set_ylabel("Gflops, mean ± 95 % CI")
        a1.set_title(f"{bench} by N")
        a1.grid(alpha=0.3)
        a1.legend(fontsize=8)
        by_n = defaultdict(list)
        for e in eff:
            if (e["benchmark"], e["hosts"], e.get("params", ""), e["metric"]) == (bench, hosts, params, "gflops") \
                    and e["statistic"] == "mean" and e["reported"] != "stated":
                by_n[e["size"]].append(e)
        top = 160.0
        for k, (n, rows) in enumerate(sorted(by_n.items())):
            rows.sort(key=lambda e: e["vms_per_host"])
            ys = [e["efficiency"] * 100 for e in rows]
            top = max([top] + [y * 1.1 for y in ys if not _nan(y)])
            # side by side per N, so the bars of several N at one VM count stay apart
            a2.errorbar([e["vms_per_host"] + 0.08 * (k - (len(by_n) - 1) / 2) for e in rows], ys,
                        yerr=_bars(ys, [eff_interval(e) * 100 for e in rows]),
                        marker="s", capsize=3, label=f"N={n}")
        _stated(a2, eff, hosts)
        a2.axhline(100, color="grey", lw=0.8, ls="--")
        a2.set_xlabel("VMs per host")
        a2.set_xticks([1, 2, 4, 7])
        a2.set_xlim(0.5, 7.5)
        a2.set_ylabel("HPL efficiency (%), VM / bare metal, mean ± interval")
        a2.set_ylim(0, top)
        a2.grid(alpha=0.3)
        a2.legend(fontsize=8)
        fig.suptitle(f"{bench}: {_hosts(hosts)}, {params}", fontsize=10)
        files.append((f"{bench} by N and efficiency vs VMs per host, {_hosts(hosts)}, {params}",
                      _save(fig, outdir, f"hpl_{_slug(bench, 'h' + str(hosts), params)}.png")))
    return files


def _stated(ax, eff, hosts=None):
    """Paper 002's values stated only in words: hollow markers, dotted, labelled."""
    drawn = False
    for e in eff:
        if e["reported"] != "stated" or e["benchmark"] not in HPL_BENCHMARKS:
            continue
        if hosts is not None and e["hosts"] != hosts:
            continue
        ax.plot([e["vms_per_host"]], [e["efficiency"] * 100], ls="none", marker="o", ms=9,
                mfc="none", mec="red", label=None if drawn else "paper 002, stated in text (approx.)")
        drawn = True
    return drawn


def plot_stated(eff, outdir):
    """Efficiencies the paper gives only in words (no measured points)."""
    rows = [e for e in eff if e["reported"] == "stated"]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = []
    for i, e in enumerate(rows):
        bound = "up to " if "up to" in str(e.get("test", "")) else "~"
        ax.plot([e["efficiency"] * 100], [i], ls="none", marker="o", ms=9, mfc="none", mec="red")
        ax.annotate(f"{bound}{e['efficiency'] * 100:.0f} %", (e["efficiency"] * 100, i),
                    textcoords="offset points", xytext=(8, -3), fontsize=8)
        labels.append(f"{e['benchmark']} {e['metric']}, "
                      f"{_hosts(e['hosts']) if e['hosts'] else '? hosts'} x {e['vms_per_host']} VM/host")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.axvline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlim(0, 170)
    ax.set_xlabel("efficiency (%) as stated in the text (approximate; hollow: not a measured point)")
    ax.set_title("Paper 002: efficiencies stated only in words")
    ax.grid(alpha=0.3, axis="x")
    return [("Paper 002: efficiencies stated only in words", _save(fig, outdir, "paper_stated.png"))]


def _eff_table(eff, statistic="mean"):
    head = ["benchmark", "metric", "reported", "unit", "size", "hosts", "VMs/host", "placement",
            "params", "statistic", "bare metal", "± 95 % CI", "VM", "± 95 % CI", "efficiency",
            "± interval", "p-value (paired t)", "n pairs"]
    rows = []
    for r in sorted(eff, key=lambda r: (r["benchmark"], r["metric"], r["reported"], r["hosts"],
                                        r.get("placement", ""), r.get("params", ""),
                                        r["vms_per_host"], r["size"])):
        if r["statistic"] != statistic:
            continue
        p = r.get("p_value")
        if r["reported"] == "stated":
            ptext = "stated in text"
        elif _nan(p):
            ptext = "n/a"
        else:
            ptext = "< 0.001" if p < 0.001 else f"{p:.3f}"
        rows.append([r["benchmark"], r["metric"], r["reported"], UNIT_LABEL.get(r["unit"], r["unit"]),
                     str(r["size"]), str(r["hosts"]), str(r["vms_per_host"]), r.get("placement", ""),
                     r.get("params", ""), r["statistic"], _fmt(r["native"]), _fmt(r.get("native_ci95")),
                     _fmt(r["vm"]), _fmt(r.get("vm_ci95")), _fmt(r["efficiency"], pct=True),
                     _fmt(eff_interval(r), pct=True), ptext, str(r.get("n_pairs", ""))])
    return head, rows


def _meta_table(runs):
    head = ["date (UTC)", "kind", "config", "hosts", "VMs/host", "ranks/node", "versions", "MPI",
            "command"]
    rows = []
    for m in runs:
        config = m.get("label", "") + (f" ({m['target']})" if m.get("target") else "")
        rows.append([m.get("date", ""), m.get("env", ""), config,
                     ",".join(m.get("hosts_list", [])) or str(m.get("hosts", "")),
                     str(m.get("vms_per_host", "")), str(m.get("ppn", "")),
                     "; ".join(f"{k} {v}" for k, v in sorted((m.get("versions") or {}).items())),
                     m.get("mpi", ""), m.get("command", "")])
    return head, rows


def render(summary, eff, outdir, title="VM / bare-metal efficiency", notes=(), runs=()):
    """Write figures, report.html and report.md into ``outdir``; returns paths."""
    os.makedirs(outdir, exist_ok=True)
    figs = (plot_absolute_and_efficiency(summary, eff, outdir) + plot_tail_latency(summary, outdir)
            + plot_hpl(summary, eff, outdir) + plot_stated(eff, outdir))
    head, rows = _eff_table(eff)
    mhead, mrows = _meta_table(runs)
    explain = ("Efficiency = VM / bare metal for higher-is-better metrics, bare metal / VM for "
               "latency and time; `statistic` is computed over trials (95 % CI: Student t); "
               "`reported` is what the benchmark printed (avg, OSU -z p50/p99 within a run...). "
               "Efficiency interval: first-order propagation of both means' intervals. p-value: "
               "paired two-tailed t-test per size (as scipy.stats.ttest_rel); n/a when the paired "
               "differences have no variance or fewer than 2 pairs.")
    md = [f"# {title}", ""] + [f"- {n}" for n in notes]
    md += ["", "## Runs", ""]
    if mrows:
        md += ["| " + " | ".join(mhead) + " |", "|" + "---|" * len(mhead)]
        md += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in mrows]
    else:
        md += ["(no run metadata: results written by an older harness, or paper data)"]
    md += ["", "## Efficiency", "", explain, ""]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += [""]
    for caption, path in figs:
        md += [f"## {caption}", "", f"![{caption}]({os.path.basename(path)})", ""]
    md_path = os.path.join(outdir, "report.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    h = ["<!doctype html><html><head><meta charset='utf-8'>",
         f"<title>{html.escape(title)}</title>",
         "<style>body{font-family:sans-serif;max-width:90em;margin:auto}"
         "table{border-collapse:collapse;font-size:85%}td,th{border:1px solid #ccc;padding:2px 6px}"
         "td{text-align:right}</style></head><body>",
         f"<h1>{html.escape(title)}</h1>"]
    if notes:
        h.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    h.append("<h2>Runs</h2>")
    if mrows:
        h.append(_html_table(mhead, mrows))
    else:
        h.append("<p>(no run metadata: results written by an older harness, or paper data)</p>")
    h.append(f"<h2>Efficiency</h2><p>{html.escape(explain)}</p>")
    h.append(_html_table(head, rows))
    for caption, path in figs:
        h.append(f"<h2>{html.escape(caption)}</h2><img src='{html.escape(os.path.basename(path))}' "
                 f"alt='{html.escape(caption)}'>")
    h.append("</body></html>")
    html_path = os.path.join(outdir, "report.html")
    with open(html_path, "w") as f:
        f.write("\n".join(h))
    return {"html": html_path, "markdown": md_path, "figures": [p for _, p in figs]}


def _html_table(head, rows):
    out = ["<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows]
    return "\n".join(out + ["</table>"])
