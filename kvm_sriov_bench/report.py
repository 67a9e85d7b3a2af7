"""Report: figures like paper 002's (efficiency vs message size per
VMs-per-host, HPL efficiency vs VMs) and paper 000's (latency percentiles),
written as PNGs plus an HTML and a Markdown page."""
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


def _fmt(v, pct=False):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v * 100:.2f} %" if pct else f"{v:.4g}"


def _slug(*parts):
    return "_".join(str(p).replace("/", "-").replace(" ", "-") for p in parts)


def plot_efficiency_vs_size(eff, outdir, statistic="mean", reported="avg"):
    """One PNG per (benchmark, metric, hosts): a line per VMs-per-host."""
    series = defaultdict(lambda: defaultdict(list))
    for r in eff:
        if r["statistic"] != statistic or r["reported"] != reported or r["benchmark"] in HPL_BENCHMARKS:
            continue
        series[(r["benchmark"], r["metric"], r["hosts"])][r["vms_per_host"]].append(
            (r["size"], r["efficiency"]))
    files = []
    for (bench, metric, hosts), lines in sorted(series.items()):
        if all(len(pts) < 2 for pts in lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for vph, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o", ms=3,
                    label=f"{vph} VM{'s' if vph != 1 else ''}/host")
        ax.axhline(100, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"{metric} efficiency (%)")
        ax.set_title(f"{bench}: {metric} efficiency, {hosts} hosts ({statistic} of {reported})")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = os.path.join(outdir, f"eff_{_slug(bench, metric, 'h' + str(hosts))}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append((f"{bench} {metric} efficiency vs message size, {hosts} hosts", path))
    return files


def plot_hpl_efficiency(eff, outdir, statistic="mean"):
    pts = defaultdict(list)
    for r in eff:
        if r["benchmark"] in HPL_BENCHMARKS and r["metric"] == "gflops" and r["statistic"] == statistic:
            pts[r["hosts"]].append((r["vms_per_host"], r["efficiency"]))
    if not pts:
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    for hosts, p in sorted(pts.items()):
        p.sort()
        ax.plot([x[0] for x in p], [x[1] * 100 for x in p], marker="s",
                label=f"{hosts} hosts")
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("VMs per host")
    ax.set_ylabel("HPL efficiency (%)")
    ax.set_ylim(0, max(110, max(x[1] * 100 for p in pts.values() for x in p) + 10))
    ax.set_title(f"HPL efficiency vs VMs per host ({statistic} over trials)")
    ax.legend()
    ax.grid(alpha=0.3)
    path = os.path.join(outdir, "hpl_efficiency.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [("HPL efficiency vs VMs per host", path)]


def plot_latency_percentiles(summary, outdir, percentiles=("p50", "p90", "p95", "p99")):
    """Latency percentiles over trials vs size, bare metal (solid) vs VMs (dashed)."""
    data = defaultdict(lambda: defaultdict(list))
    for r in summary:
        if r["metric"] != "latency" or r["reported"] != "avg" or r["statistic"] not in percentiles:
            continue
        key = (r["benchmark"], r["hosts"])
        data[key][(r["env"], r["vms_per_host"], r["statistic"])].append((r["size"], r["value"]))
    files = []
    for (bench, hosts), lines in sorted(data.items()):
        if all(len(v) < 2 for v in lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        colors = dict(zip(percentiles, ("C0", "C1", "C2", "C3")))
        for (env, vph, st), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[st],
                    ls="-" if env == "native" else "--", marker="." if env == "native" else "x",
                    label=f"{st.upper()} {'bare metal' if env == 'native' else f'{vph} VM/host'}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("latency (us)")
        ax.set_title(f"{bench}: latency percentiles over trials, {hosts} hosts")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        path = os.path.join(outdir, f"latency_percentiles_{_slug(bench, 'h' + str(hosts))}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append((f"{bench} latency percentiles, {hosts} hosts", path))
    return files


def _eff_table(eff, statistic="mean"):
    head = ["benchmark", "metric", "reported", "size", "hosts", "VMs/host", "statistic",
            "bare metal", "VM", "efficiency", "p-value (paired t)", "n pairs"]
    rows = []
    for r in sorted(eff, key=lambda r: (r["benchmark"], r["metric"], r["reported"], r["hosts"],
                                        r["vms_per_host"], r["size"])):
        if r["statistic"] != statistic:
            continue
        p = r.get("p_value")
        rows.append([r["benchmark"], r["metric"], r["reported"], str(r["size"]), str(r["hosts"]),
                     str(r["vms_per_host"]), r["statistic"], _fmt(r["native"]), _fmt(r["vm"]),
                     _fmt(r["efficiency"], pct=True),
                     "—" if p is None or (isinstance(p, float) and math.isnan(p))
                     else ("< 0.001" if p < 0.001 else f"{p:.3f}"), str(r.get("n_pairs", ""))])
    return head, rows


def render(summary, eff, outdir, title="VM / bare-metal efficiency", notes=()):
    """Write figures, report.html and report.md into ``outdir``; returns paths."""
    os.makedirs(outdir, exist_ok=True)
    figs = (plot_efficiency_vs_size(eff, outdir) + plot_hpl_efficiency(eff, outdir)
            + plot_latency_percentiles(summary, outdir))
    head, rows = _eff_table(eff)
    md = [f"# {title}", ""]
    md += [f"- {n}" for n in notes]
    md += ["", "Efficiency = VM / bare metal for higher-is-better metrics, bare metal / VM for "
           "latency; `statistic` is computed over trials; `reported` is what the benchmark "
           "printed. p-value: paired two-tailed t-test per size (scipy.stats.ttest_rel).", ""]
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
         "<style>body{font-family:sans-serif;max-width:70em;margin:auto}"
         "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
         "td{text-align:right}</style></head><body>",
         f"<h1>{html.escape(title)}</h1>"]
    if notes:
        h.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    h.append("<p>Efficiency = VM / bare metal (higher is better), bare metal / VM (latency). "
             "Statistic over trials named per row; p-value from a paired two-tailed t-test "
             "(scipy.stats.ttest_rel).</p>")
    h.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>")
    for r in rows:
        h.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
    h.append("</table>")
    for caption, path in figs:
        h.append(f"<h2>{html.escape(caption)}</h2><img src='{html.escape(os.path.basename(path))}' "
                 f"alt='{html.escape(caption)}'>")
    h.append("</body></html>")
    html_path = os.path.join(outdir, "report.html")
    with open(html_path, "w") as f:
        f.write("\n".join(h))
    return {"html": html_path, "markdown": md_path, "figures": [p for _, p in figs]}
