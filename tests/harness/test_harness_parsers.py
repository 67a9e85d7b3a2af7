import pytest

from harness_paths import data
from kvm_sriov_bench.errors import ParseError
from kvm_sriov_bench.parsers import parse_file, parse_text


def by(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def test_osu_latency_z_percentile_columns():
    p = parse_file(data("osu_latency_z.txt"))
    assert (p.benchmark, p.version, p.meta["datatype"]) == ("osu_latency", "7.4", "MPI_CHAR")
    assert [r["value"] for r in by(p.rows, size=256)] == [0.23, 0.17, 0.19, 0.22]
    assert [r["reported"] for r in by(p.rows, size=256)] == ["avg", "p50", "p90", "p99"]
    assert {r["size"] for r in p.rows} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert all(r["unit"] == "us" and r["metric"] == "latency" for r in p.rows)


def test_osu_allreduce_full_and_percentiles():
    p = parse_file(data("osu_allreduce_fz.txt"))
    assert p.benchmark == "osu_allreduce"
    row = {r["reported"]: r["value"] for r in by(p.rows, size=4)}
    assert row == {"avg": 0.88, "min": 0.88, "max": 0.88, "p50": 0.85, "p90": 0.93, "p99": 1.21}
    assert len(p.rows) == 5 * 6  # Iterations is not a metric


def test_osu_barrier_has_no_size_column():
    p = parse_file(data("osu_barrier_f.txt"))
    assert p.benchmark == "osu_barrier"
    assert [(r["size"], r["reported"], r["value"]) for r in p.rows] == [
        (0, "avg", 0.41), (0, "min", 0.41), (0, "max", 0.41)]


@pytest.mark.parametrize("name,bench,n,last", [
    ("osu_bw_shm.txt", "osu_bw", 23, (4194304, 6749.75)),
    ("osu_bw_tcp.txt", "osu_bw", 23, (4194304, 1683.85)),
    ("osu_bibw.txt", "osu_bibw", 17, (65536, 7379.00)),
])
def test_osu_bandwidth(name, bench, n, last):
    p = parse_file(data(name))
    assert p.benchmark == bench and len(p.rows) == n
    assert (p.rows[-1]["size"], p.rows[-1]["value"]) == last
    assert p.rows[-1]["unit"] == "MB/s" and p.rows[-1]["metric"] == "bandwidth"


def test_osu_mbw_mr_pairs_window_and_message_rate():
    p = parse_file(data("osu_mbw_mr_np4.txt"))
    assert p.benchmark == "osu_mbw_mr" and (p.meta["pairs"], p.meta["window"]) == (2, 64)
    assert by(p.rows, size=65536, metric="message_rate")[0]["value"] == 202733.67
    assert by(p.rows, size=65536, metric="bandwidth")[0]["value"] == 13286.35


def test_osu_5x_headers():
    p = parse_file(data("osu_latency_5x.txt"))
    assert (p.benchmark, p.version) == ("osu_latency", "5.6.3")
    assert [(r["size"], r["value"]) for r in p.rows][:2] == [(0, 1.10), (1, 1.12)]
    p = parse_file(data("osu_allreduce_5x_f.txt"))
    assert [r["reported"] for r in by(p.rows, size=8)] == ["avg", "min", "max"]


def test_osu_invalid_option_is_a_clear_error():
    with pytest.raises(ParseError) as e:
        parse_file(data("osu_latency_invalid_option.txt"))
    msg = str(e.value)
    assert "osu_latency_invalid_option.txt:1:" in msg and "Invalid option [-f]" in msg
    assert e.value.line == 1


def test_osu_tolerates_banners_and_warnings():
    text = ("--------------------------------------------------------------------------\n"
            "WARNING: There was an error initializing an OpenFabrics device.\n"
            "\n# OSU MPI Latency Test v7.4\n# Datatype: MPI_CHAR.\n"
            "# Size       Avg Latency(us)\n"
            "[node1:1234] mca_base_component_repository_open: unable to open mca_btl_openib\n"
            "1                       1.50\n2                       1.52\n")
    p = parse_text(text, "w.txt")
    assert [r["value"] for r in p.rows] == [1.50, 1.52]


@pytest.mark.parametrize("bad,why", [
    ("1    1.50   7\n", "expected 2 columns"),
    ("1    abc\n", "not a number"),
    ("1    nan\n", "non-finite"),
    ("1.5  1.50\n", "integer"),
])
def test_osu_strict_about_numbers(bad, why):
    text = "# OSU MPI Latency Test v7.4\n# Size       Avg Latency(us)\n" + bad
    with pytest.raises(ParseError, match=why) as e:
        parse_text(text, "bad.txt")
    assert str(e.value).startswith("bad.txt:3:")


def test_osu_cut_short():
    with pytest.raises(ParseError, match="no data rows"):
        parse_text("# OSU MPI Latency Test v7.4\n# Size       Avg Latency(us)\n", "short.txt")


def test_hpl_23():
    p = parse_file(data("hpl_2.3_xhpl.out"))
    assert (p.version, p.benchmark) == ("2.3", "xhpl")
    assert [(r["size"], r["metric"], r["value"], r["params"]) for r in p.rows] == [
        (2000, "gflops", 26.874, "WR11C2R4 NB=128 P=1 Q=2"), (2000, "time", 0.20, "WR11C2R4 NB=128 P=1 Q=2"),
        (4000, "gflops", 36.923, "WR11C2R4 NB=128 P=1 Q=2"), (4000, "time", 1.16, "WR11C2R4 NB=128 P=1 Q=2")]
    assert {r["benchmark"] for r in p.rows} == {"xhpl"} and by(p.rows, metric="time")[0]["unit"] == "s"
    res = p.meta["results"]
    assert (res[0]["NB"], res[0]["P"], res[0]["Q"], res[0]["time"]) == (128, 1, 2, 0.20)
    assert res[1]["residual"] == pytest.approx(2.74440985e-03)


def test_hpl_failed_residual_names_the_line():
    text = open(data("hpl_2.3_xhpl.out")).read().replace("2.74440985e-03 ...... PASSED",
                                                         "2.74440985e+03 ...... FAILED")
    with pytest.raises(ParseError, match="FAILED") as e:
        parse_text(text, "xhpl.out")
    assert e.value.line == 63


def test_hpl_without_residual_is_cut_short():
    text = open(data("hpl_2.3_xhpl.out")).read().split("HPL_pdgesv() start time")[0]
    with pytest.raises(ParseError, match="without a residual"):
        parse_text(text, "xhpl.out")


def test_hpl_dat_is_not_output():
    with pytest.raises(ParseError, match="input file"):
        parse_file(data("HPL.dat"))


def test_hpcc_summary():
    p = parse_file(data("hpcc_1.5.0_outf.txt"))
    assert p.kind == "hpcc" and p.version == "1.5.0" and p.meta["hpl_version"] == "2.0"
    assert not by(p.rows, benchmark="xhpl")          # hpcc's HPL is never pooled with xhpl
    hpl = by(p.rows, benchmark="hpcc_hpl", metric="gflops")[0]
    assert hpl["size"] == 2000 and hpl["value"] == 8.824 and hpl["params"] == "WR11C2R4 NB=128 P=1 Q=2"
    assert by(p.rows, benchmark="hpcc_hpl", metric="time")[0]["value"] == 0.61
    # the HPL section's result line agrees with the summary's HPL_Tflops
    assert float(p.meta["HPL_Tflops"]) * 1000 == pytest.approx(hpl["value"], rel=1e-3)
    lat = by(p.rows, benchmark="hpcc_pingpong", metric="latency", reported="avg")[0]
    assert (lat["value"], lat["size"]) == (0.342889, 8)
    bw = by(p.rows, benchmark="hpcc_pingpong", metric="bandwidth", reported="min")[0]
    assert bw["value"] == pytest.approx(13520.4) and bw["unit"] == "MB/s"


def test_hpcc_failure_and_truncation():
    text = open(data("hpcc_1.5.0_outf.txt")).read()
    with pytest.raises(ParseError, match="Success") as e:
        parse_text(text.replace("Success=1", "Success=0"), "hpccoutf.txt")
    assert e.value.line == 435
    with pytest.raises(ParseError, match="Summary"):
        parse_text(text.split("Begin of Summary")[0], "hpccoutf.txt")
    with pytest.raises(ParseError, match="FAILED"):
        parse_text(text.replace("0.0058305 ...... PASSED", "0.0058305 ...... FAILED"), "hpccoutf.txt")


def test_perftest_latency_text():
    p = parse_file(data("perftest_write_lat.txt"))
    assert p.benchmark == "ib_write_lat"
    row = {r["reported"]: r["value"] for r in by(p.rows, size=128)}
    assert row == {"min": 1.62, "max": 4.10, "typical": 1.69, "avg": 1.70, "stdev": 0.04,
                   "p99": 1.88, "p99.9": 4.10}


def test_perftest_bw_text_converts_mib():
    p = parse_file(data("perftest_send_bw.txt"))
    assert p.benchmark == "ib_send_bw"
    avg = by(p.rows, size=65536, reported="avg", metric="bandwidth")[0]
    assert avg["value"] == pytest.approx(1861.25 * 1.048576) and avg["unit"] == "MB/s"
    assert by(p.rows, size=65536, metric="message_rate")[0]["value"] == pytest.approx(29780)


def test_perftest_json():
    p = parse_file(data("perftest_write_bw.json"))
    assert p.benchmark == "ib_write_bw"
    peak = by(p.rows, reported="peak")[0]
    assert peak["size"] == 65536 and peak["value"] == pytest.approx(11102.05 * 1.048576)
    with pytest.raises(ParseError, match="invalid perftest JSON"):
        parse_text('{"results": {', "x.json", kind="perftest-json")
