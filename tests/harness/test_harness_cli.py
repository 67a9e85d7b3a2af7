import csv
import os
import subprocess
import sys

from harness_paths import ROOT, data


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvm_sriov_bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_parse_ok_and_error_exit_codes():
    r = cli("parse", data("osu_latency_z.txt"))
    assert r.returncode == 0 and r.stdout.count(",osu_latency,7.4,") == 36
    r = cli("parse", data("osu_latency_invalid_option.txt"))
    assert r.returncode == 2 and "osu_latency_invalid_option.txt:1:" in r.stderr


def test_bare_metal_and_vm_run_analyze_report(tmp_path, mpi_env):
    out = str(tmp_path)
    common = ["--pingpong", "--max-size", "128", "--iterations", "100", "--warmup", "10",
              "--trials", "3", "--oversubscribe", "--bind", "none", "--no-progress", "--out", out]
    assert cli("run", "--ppn", "2", *common).returncode == 0
    r = cli("run", "--kind", "vm", "--vms-per-host", "2", "--ppn", "1", *common)
    assert r.returncode == 0, r.stderr
    r = cli("analyze", out)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "efficiency.csv")) as f:
        eff = list(csv.DictReader(f))
    # VM run: 2 VMs x 1 rank per host compared with bare metal at 2 ranks per host
    assert {e["native_ppn"] for e in eff} == {"2"} and {e["n_pairs"] for e in eff} == {"3"}
    assert {e["statistic"] for e in eff} == {"mean", "p50", "p90", "p95", "p99"}
    r = cli("report", out)
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(os.path.join(out, "report", "report.html")) > 500


def test_real_hpcc_through_the_cli(tmp_path, mpi_env):
    r = cli("run", "--hpcc", "--hpl-n", "600", "--nb", "64", "--ppn", "2", "--trials", "1",
            "--oversubscribe", "--bind", "none", "--no-progress", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "hpcc_hpl,gflops,value,Gflops,native,all,WR11C2R4 NB=64 P=1 Q=2,1,0,2,600,0," in \
        (tmp_path / "samples.csv").read_text()


def test_reproduce_paper_cli(tmp_path):
    r = cli("reproduce-paper", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "75.615 %  published 75.61 %  OK" in r.stdout and "100.202 %" in r.stdout


def test_hpl_dat_cli():
    r = cli("hpl-dat", "--n", "2000,4000", "--nb", "128", "--p", "1", "--q", "2")
    assert r.stdout == open(data("HPL.dat")).read()


def test_benchmark_script_small():
    """The benchmark script runs the whole command (timing is the bench suite's job)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "harness_analysis.py"),
                        "--trials", "20", "--repeat", "1", "--budget", "60"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "analyze / raw read =" in r.stdout and "2,500 rows" in r.stdout


def test_perftest_pair_through_the_cli(tmp_path):
    """perftest needs an RDMA device, which this machine lacks: a stand-in
    ib_send_bw on PATH plays both ends (server: no host argument, waits;
    client: ends in the server's host, prints a real perftest output)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "ib_send_bw"
    fake.write_text("#!/bin/sh\n"
                    "echo \"$@\" >> \"$(dirname \"$0\")/calls\"\n"
                    "case \"$*\" in *localhost) cat " + data("perftest_send_bw.txt") + ";; *) sleep 0.2;; esac\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "kvm_sriov_bench", "run", "--perftest", "ib_send_bw",
                        "--rsh", "none", "--launcher", "none", "--trials", "2", "--ib-device", "mlx5_0",
                        "--no-progress", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with open(out / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    assert {row["benchmark"] for row in rows} == {"ib_send_bw"}
    assert sorted({int(row["size"]) for row in rows}) == [65536, 1048576]
    assert {row["trial"] for row in rows} == {"0", "1"}
    calls = (bindir / "calls").read_text().splitlines()
    assert "-a -d mlx5_0 -F" in calls and "-a -d mlx5_0 -F localhost" in calls


def test_finished_trials_survive_a_later_failure_and_appends_continue_numbering(tmp_path, mpi_env):
    """The ping-pong's trials are in samples.csv although the xhpl after it
    fails; a second run continues the trial numbers with a warning."""
    bad = tmp_path / "xhpl"
    bad.write_text("#!/bin/sh\necho 'HPLinpack 2.3'\nexit 1\n")
    bad.chmod(0o755)
    out = tmp_path / "out"
    common = ["--pingpong", "--max-size", "8", "--iterations", "50", "--warmup", "5", "--ppn", "2",
              "--oversubscribe", "--bind", "none", "--no-progress", "--out", str(out)]
    r = cli("run", *common, "--trials", "2", "--hpl", "--xhpl", str(bad), "--hpl-n", "100", "--nb", "32")
    # mpirun may or may not get to print its "non-zero status" line before xhpl's output ends
    assert r.returncode == 2, r.stderr
    assert "no result line" in r.stderr or "MPI aborted the run before any result" in r.stderr, r.stderr
    assert "values of the trials that finished are in" in r.stderr
    with open(out / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    assert {row["trial"] for row in rows} == {"0", "1"} and {row["placement"] for row in rows} == {"same-host"}
    r = cli("run", *common, "--trials", "1")
    assert r.returncode == 0, r.stderr
    assert "already has trials 0-1 of mpi_pingpong.same-host" in r.stderr and "numbered from 2" in r.stderr
    with open(out / "samples.csv") as f:
        assert {row["trial"] for row in csv.DictReader(f)} == {"0", "1", "2"}
    assert (out / "raw" / "native-h1" / "mpi_pingpong.same-host.t2.txt").exists()
    r = cli("analyze", str(out))
    assert r.returncode == 0, r.stderr


def test_old_samples_file_is_refused_untouched(tmp_path):
    old = tmp_path / "samples.csv"
    old.write_text("benchmark,metric,reported,unit,env,hosts,vms_per_host,ppn,size,trial,value,label,source\n")
    before = old.read_text()
    r = cli("run", "--pingpong", "--trials", "1", "--no-progress", "--out", str(tmp_path))
    assert r.returncode == 2 and "use a new --out" in r.stderr and old.read_text() == before


def test_option_no_named_benchmark_takes_is_refused(tmp_path):
    r = cli("run", "--osu", "osu_latency,osu_put_bw", "--osu-dir", str(tmp_path), "--validate",
            "--no-progress", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "-c: none of osu_latency, osu_put_bw" not in r.stderr
    r = cli("run", "--osu", "osu_latency", "--full", "--no-progress", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "-f: none of osu_latency takes it in OSU 7.4" in r.stderr
    assert not (tmp_path / "o").exists()


def test_analyze_leaves_the_runners_unimported():
    """analyze, report and parse start without what running benchmarks needs
    (subprocess, threading, dataclasses, the parsers): part of analyze's 1 s."""
    r = subprocess.run([sys.executable, "-c", "import sys; from kvm_sriov_bench import cli; "
                        "cli.build_parser(); print('kvm_sriov_bench.runners' in sys.modules)"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
