"""Progress inside a long run, with no third-party package."""
import io
import sys

from kvm_sriov_bench import runners
from kvm_sriov_bench.progress import Progress, bar


def test_lines_are_seen_while_the_benchmark_runs(tmp_path):
    """A stand-in xhpl prints a result line, then goes on only once the
    progress has seen it (the callback leaves a file): a line seen only when
    the run ends would leave it waiting until it gives up and says so."""
    mark = tmp_path / "seen"
    xhpl = tmp_path / "xhpl"
    xhpl.write_text("#!/bin/sh\necho 'WR11C2R4 2000 128 1 2 0.20 2.6874e+01'\n"
                    f"i=0; while [ ! -e {mark} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n"
                    f"if [ -e {mark} ]; then echo done; else echo 'not seen while running'; fi\n")
    xhpl.chmod(0o755)
    seen = []

    def on_line(line):
        seen.append(line.strip())
        mark.touch()
    job = runners.Job("xhpl", "hpl", [str(xhpl)])
    rc, _, text = runners.execute(job, runners.Launcher(kind="none"), str(tmp_path / "w"), on_line=on_line)
    assert rc == 0 and "done" in text, text
    assert seen[0].startswith("WR11C2R4")


def test_progress_line_says_where_the_run_is():
    out = io.StringIO()
    p = Progress(3, "native-h2", stream=out, every=0)
    p.start("xhpl trial 1")
    p.note("WR11C2R4 40000 192 2 4 812.3 5.25e+02")
    p.update(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "native-h2: 0/3 done, xhpl trial 1 0s"
    assert lines[1].endswith("| WR11C2R4 40000 192 2 4 812.3 5.25e+02")
    assert lines[2].startswith("native-h2: 1/3 done")
    # in a log (not a terminal) at most one line per `every` seconds
    quiet = io.StringIO()
    q = Progress(1, "x", stream=quiet, every=3600)
    q.start("run")
    for k in range(100):
        q.note(f"line {k}")
    assert len(quiet.getvalue().splitlines()) == 1


def test_no_tqdm_needed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)      # import tqdm would fail
    with bar(1, "x", stream=io.StringIO()) as pb:
        pb.update(1)
