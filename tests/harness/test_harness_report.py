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
        rows.append(dict(benchmark="xhpl", metric="gflops", reported="value", unit="Gflops", env="native",
                         hosts=2, vms_per_host=0, ppn=8, size=20000, trial=t, value=100 + t,
                         params="WR11C2R4 NB=192 P=2 Q=4"))
        for vph in (1, 2, 4, 7):
            rows.append(dict(benchmark="xhpl", metric="gflops", reported="value", unit="Gflops", env="vm",
                             hosts=2, vms_per_host=vph, ppn=8 // vph if vph != 7 else 1, size=20000,
                             trial=t, value=90 - vph + t, params="WR11C2R4 NB=192 P=2 Q=4"))
            for rep in ("p50", "p99"):
                rows.append(dict(benchmark="osu_multi_lat", metric="latency", reported=rep, unit="us",
                                 env="vm", hosts=2, vms_per_host=vph, ppn=1, size=8, trial=t,
                                 value=2.0 + (rep == "p99") + t * 0.01))
                if vph == 1:
                    rows.append(dict(benchmark="osu_multi_lat", metric="latency", reported=rep, unit="us",
                                     env="native", hosts=2, vms_per_host=0, ppn=1, size=16, trial=t,
                                     value=1.0 + (rep == "p99") + t * 0.01))
    summary, eff = analyze(Samples.from_rows(rows))
    runs = [{"date": "2026-11-23 17:00:00", "env": "native", "label": "native-h2", "hosts_list": ["n1", "n2"],
             "vms_per_host": 0, "ppn": 1, "versions": {"osu_multi_lat": "7.4"},
             "mpi": "mpirun (Open MPI) 4.1.4", "command": "kvm-sriov-bench run --osu osu_multi_lat"}]
    paths = report.render(summary, eff, str(tmp_path), runs=runs)
    names = sorted(os.path.basename(f) for f in paths["figures"])
    assert names == ["abs_eff_osu_multi_lat_latency_avg_h2_all.png",
                     "hpl_xhpl_h2_WR11C2R4-NB192-P2-Q4.png", "tail_osu_multi_lat_h2_all.png"]
    for f in paths["figures"]:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(f) > 5000
    html = open(paths["html"]).read()
    assert "<img src='hpl_xhpl_h2_WR11C2R4-NB192-P2-Q4.png'" in html and "ttest_rel" in html
    assert "mpirun (Open MPI) 4.1.4" in html and "osu_multi_lat 7.4" in html
    md = open(paths["markdown"]).read()
    # units and the 95 % intervals in every efficiency row
    assert "| osu_multi_lat | latency | avg | µs | 128 | 2 | 7 | all |  | mean |" in md
    assert "± 95 % CI" in md and "kvm-sriov-bench run --osu osu_multi_lat" in md


def test_paper_stated_values_drawn_apart(tmp_path):
    from kvm_sriov_bench import paper
    _, _, paths = paper.reproduce(str(tmp_path))
    names = sorted(os.path.basename(f) for f in paths["figures"])
    assert "paper_stated.png" in names and "paper002_table1.png" in names
    md = open(paths["markdown"]).read()
    assert "stated in text" in md
