"""Benchmark output is the VMs' (a tenant's guest prints what it likes), so
the parsers must finish on any input: a quadratic pattern spun on a 100 KB
perftest header for minutes, a deep JSON document raised RecursionError.
Each hostile input is parsed in a child process with a 60 s timeout, a hang
guard only (no speed is asserted): the parse must end with a clear
ParseError, or with the same rows as the real output alone when the hostile
lines come before a real run."""
import json
import re
import subprocess
import sys

import pytest

from harness_paths import ROOT, data
from kvm_sriov_bench import parsers
from kvm_sriov_bench.errors import ParseError
from kvm_sriov_bench.parsers import parse_file, parse_text

PARSE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from kvm_sriov_bench.errors import ParseError
from kvm_sriov_bench.parsers import parse_file
try:
    p = parse_file(sys.argv[2], kind=sys.argv[3])
    print(json.dumps({"benchmark": p.benchmark, "rows": p.rows}))
except ParseError as e:
    print(json.dumps({"error": str(e)}))
"""


def parse_apart(tmp_path, text, kind):
    """parse_file in a child process: {"error": ...} or {"benchmark", "rows"};
    any other exception (a traceback) fails the test."""
    out = tmp_path / "output.txt"
    out.write_text(text)
    try:
        r = subprocess.run([sys.executable, "-c", PARSE, ROOT, str(out), kind], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {kind} parse of {len(text)} hostile characters had not ended after 60 s (hang guard)")
    assert r.returncode == 0 and not r.stderr, r.stderr[-2000:]
    return json.loads(r.stdout)


def real(name):
    with open(data(name)) as f:
        return f.read()


def same_rows(a, b):
    key = ("benchmark", "metric", "unit", "size", "reported", "value")
    return [tuple(r[k] for k in key) for r in a] == [tuple(r[k] for k in key) for r in b]


# Lines within the line bound (4096) that the old patterns took quadratic time over, enough of
# them that the old code spent minutes; each is followed by a real run.
HOSTILE_BEFORE_REAL = {
    "perftest header": ("perftest", "perftest_write_lat.txt", "#bytes #iterations " + "a" * 4000),
    "perftest title": ("perftest", "perftest_write_lat.txt", "Atomic_" * 570),
    "HPL residual": ("hpl", "hpl_2.3_xhpl.out", "||Ax-b||" + "=." * 2000),
    "HPL residual dots": ("hpl", "hpl_2.3_xhpl.out", "||Ax-b||=" + "." * 4000 + "x"),
    "hpcc residual": ("hpcc", "hpcc_1.5.0_outf.txt", "||Ax-b||" + "=" * 4000),
    "OSU init": ("osu", "osu_latency_z.txt", "nprocs: 1, min: " + "a" * 4000),
}


@pytest.mark.parametrize("case", list(HOSTILE_BEFORE_REAL))
def test_hostile_lines_before_a_real_run_end_in_the_real_runs_rows(tmp_path, case):
    kind, name, line = HOSTILE_BEFORE_REAL[case]
    assert len(line) <= 4096
    text = real(name)
    if kind == "osu":   # the hostile lines inside the run: after its title, before its header
        head, rest = text.split("\n", 1)
        hostile = head + "\n" + (line + "\n") * 400 + rest
    else:
        hostile = (line + "\n") * 400 + text
    got = parse_apart(tmp_path, hostile, kind)
    want = parse_file(data(name), kind=kind)
    assert "error" not in got, got["error"][:300]
    assert got["benchmark"] == want.benchmark and same_rows(got["rows"], want.rows)


@pytest.mark.parametrize("kind, text", [
    ("perftest", "#bytes #iterations " + "a" * 100_000 + "\n"),          # the audit's 132 s header
    ("perftest", "Atomic_" * 20_000 + "\n #bytes #iterations t_min[usec]\n"),
    ("hpl", "HPLinpack 2.3\n||Ax-b||" + "=." * 50_000 + "\n"),
    ("hpcc", "Begin of Summary section.\n" + "a=" * 50_000 + "\nEnd of Summary section.\n"),
    ("osu", "# OSU MPI Latency Test v7.4\n# Size " + "P1" * 50_000 + "\n"),
], ids=["perftest header", "perftest title", "HPL residual", "hpcc summary", "OSU columns"])
def test_a_line_over_the_bound_is_one_clear_error(tmp_path, kind, text):
    got = parse_apart(tmp_path, text, kind)
    assert re.search(r"a line over \d+ characters", got.get("error", "")), got
    assert len(got["error"]) < 400     # the line is cut in the message, not repeated


def test_a_hostile_osu_title_is_one_clear_error(tmp_path):
    text = "# OSU MPI_" + "a_" * 1990 + " x Test\n" + real("osu_latency_z.txt")
    got = parse_apart(tmp_path, text, "osu")
    assert "unknown OSU benchmark title" in got.get("error", "") and len(got["error"]) < 400, got


@pytest.mark.parametrize("depth", [17, 100, 100_000], ids=["17", "100", "100000 (past Python's recursion limit)"])
def test_deep_json_is_one_clear_error(tmp_path, depth):
    text = '{"results": ' + "[" * depth + "]" * depth + "}"
    got = parse_apart(tmp_path, text, "perftest-json")
    assert "perftest JSON nested more than 16 deep" in got.get("error", ""), got


def test_real_json_is_not_too_deep():
    assert parse_file(data("perftest_write_bw.json")).rows


def test_output_over_the_bound_is_refused_without_reading_it_all(tmp_path):
    MAX_INPUT = parsers.MAX_INPUT
    big = tmp_path / "osu_latency.txt"
    with open(big, "w") as f:
        f.write(real("osu_latency_z.txt"))
        f.write(("# padding " + "x" * 100 + "\n") * (MAX_INPUT // 100))
    with pytest.raises(ParseError, match=f"over {MAX_INPUT} characters"):
        parse_file(str(big))
    with pytest.raises(ParseError, match=f"over {MAX_INPUT} characters"):
        parse_text("x" * (MAX_INPUT + 1), kind="perftest-json")


def test_the_shm_pingpong_lines_a_guest_prints_are_bounded():
    from kvm_sriov_bench import shm_pingpong
    good = "shm-pingpong: shm iterations 20000 avg_rtt_us 12.345\nshm-pingpong: tcp iterations 2000 avg_rtt_us 99.500\n"
    assert shm_pingpong.parse(good) == {"shm": (20000, 12.345), "tcp": (2000, 99.5)}
    hostile = ("shm-pingpong: shm iterations " + "9" * 5000 + " avg_rtt_us 1.000\n"   # past int()'s digit limit
               "shm-pingpong: tcp iterations 1 avg_rtt_us 1.2.3\n"                    # not a number
               "shm-pingpong: tcp iterations 1 avg_rtt_us 0.000\n")                   # a ratio's zero divisor
    assert shm_pingpong.parse(hostile) == {}


def test_the_runner_keeps_no_more_output_than_the_parsers_take(tmp_path):
    """A benchmark (a VM) printing past the bound, in one line without end: the
    runner drains it, keeps a bounded part, and the parse says it is too big."""
    from kvm_sriov_bench import runners
    bound = parsers.MAX_INPUT
    job = runners.Job("osu_latency", "osu", [sys.executable, "-c",
                                             f"import sys; sys.stdout.write('1' * {bound + (4 << 20)})"])
    rc, _, text = runners.execute(job, runners.Launcher(kind="none"), str(tmp_path), timeout=120)
    assert rc == 0 and bound < len(text) <= bound + (1 << 16)
    with pytest.raises(ParseError, match=f"over {bound} characters"):
        parse_text(text, kind="osu")
