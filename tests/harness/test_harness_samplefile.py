"""samples.csv as samplefile.py reads it: every value as float() reads it,
quoted fields, older layouts, groups in file order; non-numbers, non-finite
values, foreign or unreadable files refused with one clear error."""
import csv

import pytest

from kvm_sriov_bench import samplefile
from kvm_sriov_bench.analysis import SAMPLE_FIELDS, Samples, analyze
from kvm_sriov_bench.errors import HarnessError

VALUES = ["1.5", "0.1", "-2.25", "123456789.012345", "1e-05", "3", "7.000000000000001",
          "1234567890123456789", "0.30000000000000004", "inf"]


def write(path, rows, header=SAMPLE_FIELDS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def row(trial, value, env="native", vph=0, size=8, params="", placement="inter-host"):
    return dict(benchmark="osu_latency", metric="latency", reported="avg", unit="us", env=env,
                placement=placement, params=params, hosts=2, vms_per_host=vph, ppn=1, size=size,
                trial=trial, value=value, label="x", source=f"raw/x/osu_latency.t{trial}.txt")


def reference(path):
    with open(path, newline="") as f:
        return Samples.from_rows(list(csv.DictReader(f)))


def same(a, b):
    ra = sorted(tuple(sorted(r.items())) for r in a.rows())
    rb = sorted(tuple(sorted(r.items())) for r in b.rows())
    return ra == rb


def test_values_read_exactly_as_float_does(tmp_path):
    p = tmp_path / "samples.csv"
    finite = [v for v in VALUES if v != "inf"]
    write(p, [row(t, v, size=2 ** (t % 3)) for t, v in enumerate(finite)])
    got = samplefile.read([str(p)])
    assert sorted(got.value.tolist()) == sorted(float(v) for v in finite)
    assert same(got, reference(p))


def test_quoted_fields_agree_with_the_csv_module(tmp_path):
    p = tmp_path / "samples.csv"
    rows = [row(t, f"{1 + t / 7:.6f}", env=e, vph=v, size=s) for t in range(30)
            for e, v in (("native", 0), ("vm", 2)) for s in (1, 64)]
    rows[5]["params"] = 'NB=192, "P=2"'                  # a quoted field
    write(p, rows)
    assert same(samplefile.read([str(p)]), reference(p))
    summary, eff = analyze(samplefile.read([str(p)]))
    assert {e["n_pairs"] for e in eff if e["params"] == ""} == {30, 29}


def test_other_layouts_read_and_non_numbers_refused(tmp_path):
    old = tmp_path / "old.csv"
    header = ["benchmark", "metric", "reported", "unit", "env", "hosts", "vms_per_host", "ppn", "size",
              "trial", "value", "label", "source"]
    write(old, [row(0, "1.5"), row(1, "2.5")], header=header)
    s = samplefile.read([str(old)])
    assert sorted(s.value.tolist()) == [1.5, 2.5] and set(s.cats["placement"][1]) == {"all"}
    bad = tmp_path / "bad.csv"
    write(bad, [row(0, "1.5"), row(1, "fast")])
    with pytest.raises(HarnessError, match="'fast'"):
        samplefile.read([str(bad)])
    inf = tmp_path / "inf.csv"
    write(inf, [row(0, "inf")])
    with pytest.raises(HarnessError, match="non-finite"):
        samplefile.read([str(inf)])


def test_groups_in_file_order(tmp_path):
    """The groups come out in the order the file has them, and reading the
    file again gives the same bits."""
    p = tmp_path / "samples.csv"
    plan = [("vm", 4, 64, ""), ("native", 0, 1, "NB=192-P=2-Q=4-a-long-variant-name"), ("vm", 1, 8, ""),
            ("native", 0, 64, ""), ("vm", 4, 1, "NB=192-P=2-Q=4-a-long-variant-name"), ("native", 0, 8, "")]
    write(p, [row(t, f"{1.5 + (t * 7919 % 97) / 997 + k / 3:.5f}", env=e, vph=v, size=s, params=prm)
              for k, (e, v, s, prm) in enumerate(plan) for t in range(37)])
    summary, eff = analyze(samplefile.read([str(p)]))
    firsts = [r for r in summary if r["statistic"] == "n"]
    assert [(r["env"], r["vms_per_host"], r["size"], r["params"]) for r in firsts] == \
        [(e, v, s, prm) for e, v, s, prm in plan]
    assert (summary, eff) == analyze(samplefile.read([str(p)]))


def test_foreign_or_unreadable_files_are_one_error(tmp_path):
    """A file that is not a samples.csv, bytes that are not UTF-8, a field
    past csv's 128 KiB bound, a missing file: one HarnessError naming the
    file, never a traceback."""
    cases = {"foreign.csv": b"a,b,c\n1,2,3\n",
             "binary.csv": ",".join(SAMPLE_FIELDS).encode() + b"\n\xff\xfe,x\n",
             "huge.csv": ",".join(SAMPLE_FIELDS).encode() + b"\n" + b"x" * (1 << 18) + b"\n"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(HarnessError, match=name):
            samplefile.read([str(tmp_path / name)])
    with pytest.raises(HarnessError, match="missing.csv"):
        samplefile.read([str(tmp_path / "missing.csv")])


def test_empty_file_is_no_samples(tmp_path):
    (tmp_path / "samples.csv").write_text("")
    summary, eff = analyze(samplefile.read([str(tmp_path / "samples.csv")]))
    assert len(samplefile.read([str(tmp_path / "samples.csv")])) == 0 and summary == eff == []
