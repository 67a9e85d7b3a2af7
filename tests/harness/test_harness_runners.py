import os
import shutil
import sys

import pytest

from kvm_sriov_bench import runners
from kvm_sriov_bench.errors import HarnessError
from kvm_sriov_bench.parsers import parse_file


def test_mpirun_command_two_hosts_one_rank_each():
    l = runners.Launcher(hosts=["n1", "n2"], ranks_per_node=4, allow_root=True, env={"UCX_TLS": "rc"})
    job = runners.osu_job("osu_latency", binary="/opt/osu/osu_latency", max_size=4096, percentiles=True,
                          launcher=l)
    assert l.command(job.argv, ranks=job.ranks, ranks_per_node=job.ranks_per_node) == [
        "mpirun", "-np", "2", "--host", "n1:1,n2:1", "--map-by", "ppr:1:node", "--bind-to", "core",
        "--allow-run-as-root", "-x", "UCX_TLS=rc", "/opt/osu/osu_latency", "-m", "4096", "-z"]


def test_mpirun_collective_uses_every_rank_and_hostfile():
    l = runners.Launcher(hostfile="/tmp/hf", hosts=["a", "b"], ranks_per_node=7, bind="none" and None,
                         allow_root=False)
    job = runners.osu_job("osu_allreduce", binary="osu_allreduce", min_size=4, max_size=64, full=True,
                          percentiles=[95, 99], iterations=200, warmup=10)
    assert l.command(job.argv) == ["mpirun", "-np", "14", "--hostfile", "/tmp/hf", "--map-by",
                                   "ppr:7:node", "osu_allreduce", "-m", "4:64", "-i", "200", "-x",
                                   "10", "-f", "-z95,99"]


def test_srun_command():
    l = runners.Launcher(kind="srun", hosts=["n1", "n2"], ranks_per_node=2)
    assert l.command(["xhpl"]) == ["srun", "-n", "4", "-N", "2", "--ntasks-per-node=2",
                                   "--nodelist=n1,n2", "--cpu-bind=cores", "xhpl"]


def test_full_flag_refused_for_point_to_point():
    with pytest.raises(HarnessError, match="no -f"):
        runners.osu_job("osu_latency", binary="x", full=True)


def test_find_binary_in_an_osu_tree(tmp_path):
    d = tmp_path / "libexec" / "osu-micro-benchmarks" / "mpi" / "collective" / "blocking"
    d.mkdir(parents=True)
    exe = d / "osu_bcast"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert runners.find_binary("osu_bcast", [str(tmp_path)]) == str(exe)
    with pytest.raises(HarnessError):
        runners.find_binary("osu_nonexistent_xyz", [str(tmp_path)])


def test_perftest_pair_commands():
    srv, cli = runners.perftest_commands("ib_write_lat", "hostA", "hostB", json_file="/tmp/o.json",
                                         device="mlx5_0", iterations=1000)
    assert srv == ["ssh", "hostA", "ib_write_lat", "-a", "-n", "1000", "-d", "mlx5_0", "-F"]
    assert cli == ["ssh", "hostB", "ib_write_lat", "-a", "-n", "1000", "-d", "mlx5_0", "-F",
                   "--out_json", "--out_json_file=/tmp/o.json", "hostA"]


def test_paper_configurations_and_sweep():
    assert runners.paper_configs() == [(2, 1), (2, 2), (2, 4), (2, 7), (8, 1), (8, 2), (8, 4), (8, 7)]
    assert runners.size_sweep(1, 64) == [1, 2, 4, 8, 16, 32, 64]


def test_hpl_job_sizes_from_memory():
    job = runners.hpl_job(xhpl="/opt/hpl/xhpl", ranks=8, nb=192, mem_bytes_per_node=48 * 2 ** 30, nodes=2)
    assert job.ranks == 8 and "101376" in job.files["HPL.dat"]
    assert "2            Ps" in job.files["HPL.dat"] and "4            Qs" in job.files["HPL.dat"]


def test_real_mpi_pingpong_two_ranks(tmp_path, mpi_env):
    """A real 2-rank MPI ping-pong on this machine, parsed by the OSU parser."""
    l = runners.Launcher(ranks_per_node=2, bind=None, oversubscribe=True)
    job = runners.pingpong_job(max_size=256, iterations=200, warmup=20, python=sys.executable)
    rows, errors = runners.run_trials([job], l, 2, str(tmp_path), {"env": "native", "hosts": 1},
                                      progress=False)
    assert not errors
    sizes = sorted({r["size"] for r in rows})
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert {r["trial"] for r in rows} == {0, 1}
    assert {r["reported"] for r in rows} == {"avg", "p50", "p90", "p99"}
    assert all(r["value"] >= 0 for r in rows) and all(r["value"] > 0 for r in rows if r["reported"] == "avg")
    raw = tmp_path / "raw" / "native-h1" / "mpi_pingpong.t0.txt"
    assert parse_file(str(raw)).benchmark == "mpi_pingpong"


def test_real_hpcc_two_ranks(tmp_path, mpi_env):
    """Debian's hpcc for real (HPL 2.0 + PingPong + STREAM), 2 ranks, small N."""
    if not shutil.which("hpcc"):
        pytest.fail("hpcc not installed (rake test:harness installs it)")
    l = runners.Launcher(ranks_per_node=2, bind=None, oversubscribe=True)
    job = runners.hpcc_job(ns=[800], nb=64, ranks=2)
    rows, _ = runners.run_trials([job], l, 1, str(tmp_path), {"env": "native", "hosts": 1}, progress=False)
    hpl = [r for r in rows if r["benchmark"] == "hpl"][0]
    assert hpl["size"] == 800 and hpl["value"] > 0.01
    assert any(r["benchmark"] == "hpcc_pingpong" and r["metric"] == "latency" for r in rows)
    assert os.path.exists(tmp_path / "work" / "native-h1" / "hpcc" / "hpccinf.txt")
