"""Every OSU 7.4 output the harness reads, from real runs: OSU 7.4 built
against Debian 12's Open MPI and run on one machine (shared memory, TCP
over lo); see data/README.md for the commands."""
import os
import re

import pytest

from harness_paths import DATA
from kvm_sriov_bench import osu
from kvm_sriov_bench.errors import ParseError
from kvm_sriov_bench.parsers import parse_file, parse_text

OSU74 = os.path.join(DATA, "osu74")
# real outputs that must be refused, and the reason
REFUSED = {
    "osu_allreduce_np4_c.txt": (9, "validation"),               # -c found wrong data at 16 B
    "osu_latency_f.txt": (1, "rejected its options"),            # -f: Invalid option [-f]
    "osu_latency_invalid_f.txt": (1, "rejected its options"),
    "osu_mbw_mr_np4_invalid_r.txt": (1, "rejected its options"),
    "osu_latency_mt.txt": (19, "MPI aborted the run after"),    # rows, then a rank exited improperly
    "osu_latency_np3.txt": (None, "MPI aborted the run before"),  # "requires exactly two processes"
    "osu_bw_fan_in_np4.txt": (None, "MPI aborted"),             # needs more than one node
    "osu_bw_fan_out_np4.txt": (None, "MPI aborted"),
    "osu_hello_np4.txt": (1, "prints no measurement"),
}


def fixtures():
    return sorted(f for f in os.listdir(OSU74) if f.endswith(".txt"))


def stem_name(f):
    """osu_bw_z_tcp.txt -> osu_bw (the longest catalogue name the file starts with)."""
    return max((n for n in osu.BENCHMARKS if f == n + ".txt" or f.startswith(n + "_")), key=len)


@pytest.mark.parametrize("f", [f for f in fixtures() if f not in REFUSED])
def test_every_real_output_parses_as_its_benchmark(f):
    p = parse_file(os.path.join(OSU74, f))
    assert p.benchmark == stem_name(f) and p.version == "7.4"
    assert p.rows and all(r["value"] >= 0 for r in p.rows)


@pytest.mark.parametrize("f", sorted(REFUSED))
def test_real_failed_outputs_are_refused_with_the_line(f):
    line, why = REFUSED[f]
    with pytest.raises(ParseError, match=why) as e:
        parse_file(os.path.join(OSU74, f))
    if line is not None:
        assert e.value.line == line


def test_fixtures_cover_every_family():
    names = {stem_name(f) for f in fixtures()}
    for fam in (osu.PAIR, osu.MULTI_PAIR, osu.COLLECTIVE, osu.NBC, osu.STARTUP):
        assert any(osu.family(n) == fam for n in names), fam
    one_sided = {n for n in names if re.match(r"osu_(put|get|acc|cas|fop)_", n)}
    assert len(one_sided) == 9
    # persistent collectives need MPI 4 (Debian 12's Open MPI 4.1 is MPI 3.1): titles only
    missing = {n for n in osu.RUNNABLE if n not in names}
    assert missing == {n for n in osu.BENCHMARKS if n.endswith("_persistent") and
                       osu.family(n) == osu.COLLECTIVE}


def _rows(f, size=None):
    p = parse_file(os.path.join(OSU74, f))
    return [r for r in p.rows if size is None or r["size"] == size], p


def test_bandwidth_z_tail_columns_single_space_apart():
    # "Bandwidth (MB/s) P50 Tail BW(MB/s) P90 Tail BW(MB/s) P99 Tail BW(MB/s)"
    rows, _ = _rows("osu_bw_z.txt", 512)
    assert [(r["metric"], r["reported"], r["unit"], r["value"]) for r in rows] == [
        ("bandwidth", "avg", "MB/s", 1101.11), ("bandwidth", "p50", "MB/s", 3722.37),
        ("bandwidth", "p90", "MB/s", 3928.07), ("bandwidth", "p99", "MB/s", 4009.79)]
    rows, _ = _rows("osu_bw_z_tcp.txt")
    assert {r["reported"] for r in rows} == {"avg", "p50", "p90", "p99"}


def test_latency_z_with_chosen_percentiles_and_validation():
    rows, _ = _rows("osu_latency_z95_shm.txt")
    assert sorted({r["reported"] for r in rows}) == ["avg", "p50", "p95", "p99"]
    rows, _ = _rows("osu_latency_c.txt", 1)
    assert [(r["reported"], r["value"]) for r in rows] == [("avg", 0.19)]     # Pass is no value
    rows, _ = _rows("osu_alltoall_np4_fzc.txt", 4)
    assert [(r["reported"], r["value"]) for r in rows] == [
        ("avg", 47.49), ("min", 28.58), ("max", 77.01), ("p50", 4.83), ("p90", 5.34), ("p99", 910.97)]


def test_message_rate_and_window_options():
    rows, p = _rows("osu_mbw_mr_np4_z.txt", 512)
    assert [(r["metric"], r["reported"]) for r in rows] == [
        ("bandwidth", "avg"), ("message_rate", "avg"), ("bandwidth", "p50"), ("bandwidth", "p90"),
        ("bandwidth", "p99")]
    assert (p.meta["pairs"], p.meta["window"]) == (2, 64)
    rows, _ = _rows("osu_mbw_mr_np4_R0.txt")
    assert {r["metric"] for r in rows} == {"bandwidth"}                       # -R 0: no Messages/s
    assert _rows("osu_bw_W16.txt")[1].benchmark == "osu_bw"


def test_non_blocking_collective_columns():
    rows, _ = _rows("osu_iallreduce_np4_fz.txt", 1)
    got = {r["reported"]: (r["metric"], r["unit"]) for r in rows}
    assert list(got) == ["overall", "compute", "coll_init", "mpi_test", "mpi_wait", "pure_comm",
                         "min_comm", "max_comm", "avg", "p50", "p90", "p99"]
    assert got["avg"] == ("overlap", "%") and got["overall"] == ("latency", "us")
    rows, _ = _rows("osu_ibarrier_np4.txt")
    assert {r["size"] for r in rows} == {0}


def test_one_sided_meta_barrier_and_startup():
    _, p = _rows("osu_put_bibw.txt")
    assert p.meta["synchronization"] == "MPI_Win_post/start/complete/wait"
    rows, _ = _rows("osu_barrier_np4_fz.txt")
    assert [r["reported"] for r in rows] == ["avg", "min", "max", "p50", "p90", "p99"]
    rows, p = _rows("osu_init_np4.txt")
    assert [(r["metric"], r["reported"], r["unit"]) for r in rows] == [
        ("init_time", "min", "ms"), ("init_time", "max", "ms"), ("init_time", "avg", "ms")]
    assert p.meta["nprocs"] == 4


def test_every_catalogued_title_maps_back():
    for name, (title, _) in osu.BENCHMARKS.items():
        text = f"# OSU {title} Test v7.4\n# Size       Avg Latency(us)\n1     1.0\n"
        if name in ("osu_hello",):
            continue
        p = parse_text(text, source=f"/x/{name}.txt")
        assert p.benchmark == name
    # CUDA/ROCm builds print the accelerator in the title
    p = parse_text("# OSU MPI-CUDA All-to-All Personalized Exchange Latency Test v7.4\n"
                   "# Size       Avg Latency(us)\n1     2.0\n", "out.txt")
    assert p.benchmark == "osu_alltoall"


def test_unknown_or_mismatched_title_is_refused_with_its_line():
    with pytest.raises(ParseError, match="unknown OSU benchmark title") as e:
        parse_text("\n# OSU MPI Reduce-Everything Latency Test v7.4\n# Size  Avg Latency(us)\n1  1.0\n",
                   "x.txt")
    assert e.value.line == 2 and "Reduce-Everything" in str(e.value)
    with pytest.raises(ParseError, match="unknown OSU benchmark title"):
        parse_text("# OSU OpenSHMEM Put Test v7.4\n# Size  Latency (us)\n1  1.0\n", "x.txt")
    # the runner ran osu_latency but got a collective's output
    with pytest.raises(ParseError, match="osu_latency was run"):
        parse_text("# OSU MPI All-to-All Personalized Exchange Latency Test v7.4\n"
                   "# Size  Avg Latency(us)\n1  1.0\n", "x.txt", kind="osu", benchmark="osu_latency")
    with pytest.raises(ParseError, match="unknown OSU column 'Jitter"):
        parse_text("# OSU MPI Latency Test v7.4\n# Size   Avg Latency(us)   Jitter(us)\n1 1 1\n", "x.txt")


def test_option_acceptance_matches_the_real_build():
    """osu.accepts agrees with what the 7.4 binaries accepted or refused."""
    seen = 0
    with open(os.path.join(OSU74, "options_accepted.tsv")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            name, opt, verdict = line.split()
            assert osu.accepts(name, opt) == (verdict == "accepted"), (name, opt)
            seen += 1
    assert seen > 100
