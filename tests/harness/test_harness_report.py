import os

from kvm_sriov_bench import report
from kvm_sriov_bench.analysis import Samples, analyze


def test_report_renders_figures_html_markdown(tmp_path):
    rows = []
    for t in range(4):
        for size in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            rows.append(dict(benchmark="osu_multi_lat", metric="latency", reported="avg", unit="us",
                             env="native", hosts=2, vms_per_host=0, ppn=1, size=size, trial=t,
                             value=1.5 + size / 100 + t * 0.01))
            for vph in (1, 2, 4, 7):
                rows.append(dict(benchmark="osu_multi_lat", metric="latency", reported="avg", unit="us",
                                 env="vm", hosts=2, vms_per_host=vph, ppn=1, size=size, trial=t,
                                 value=(1.5 + size / 100) * (1.1 + 0.02 * vph) + t * 0.013))
        rows.append(dict(benchmark="hpl", metric="gflops", reported="value", unit="Gflops", env="native",
                         hosts=2, vms_per_host=0, ppn=8, size=20000, trial=t, value=100 + t))
        for vph in (1, 2, 4, 7):
            rows.append(dict(benchmark="hpl", metric="gflops", reported="value", unit="Gflops", env="vm",
                             hosts=2, vms_per_host=vph, ppn=8 // vph if vph != 7 else 1, size=20000,
                             trial=t, value=90 - vph + t))
    summary, eff = analyze(Samples.from_rows(rows))
    paths = report.render(summary, eff, str(tmp_path))
    names = sorted(os.path.basename(f) for f in paths["figures"])
    assert names == ["eff_osu_multi_lat_latency_h2.png", "hpl_efficiency.png",
                     "latency_percentiles_osu_multi_lat_h2.png"]
    for f in paths["figures"]:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(f) > 5000
    html = open(paths["html"]).read()
    assert "<img src='hpl_efficiency.png'" in html and "ttest_rel" in html
    md = open(paths["markdown"]).read()
    assert "| osu_multi_lat | latency | avg | 128 | 2 | 7 |" in md
