import os

import pytest

from kvm_sriov_bench import paper


def test_reproduce_table_one_and_figures(tmp_path):
    rows, checks, paths = paper.reproduce(str(tmp_path))
    got = {c["size"]: c for c in checks}
    assert got[128]["computed_pct"] == pytest.approx(75.6152, abs=1e-4)   # published 75.61 %
    assert got[256]["computed_pct"] == pytest.approx(100.2024, abs=1e-4)  # published 100.2 %
    assert all(c["ok"] for c in checks)
    hpl = {(r["hosts"], r["vms_per_host"]): r["efficiency"] for r in rows
           if r["benchmark"] == "hpl" and r["reported"] == "stated"}
    assert hpl[(2, 4)] == pytest.approx(0.90) and hpl[(8, 7)] == pytest.approx(0.70)
    for f in paths["figures"]:
        assert os.path.getsize(f) > 1000
    md = open(paths["markdown"]).read()
    assert "75.62 %" in md and "100.20 %" in md and "published 75.61 %" in md
    assert os.path.exists(tmp_path / "paper002_efficiency.csv")


def test_paper_data_matches_the_reference_text():
    ref = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                        "reference", "002_c4adcbec240523b5.txt"))
    if not os.path.exists(ref):
        pytest.skip("shared/reference not beside the repository")
    text = open(ref).read()
    for r in paper.load()["table1"]["rows"]:
        assert f"{r['size']} {r['hosts_us']} {r['vms_us']}" in text
    for s in paper.load()["stated"]:
        assert " ".join(s["quote"].split()[:4]) in " ".join(text.split())
