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
                          placement="inter-host")
    assert l.command(job.argv, placement=l.pair(job.placement)) == [
        "mpirun", "-np", "2", "--host", "n1:1,n2:1", "--map-by", "slot", "--bind-to", "core",
        "--allow-run-as-root", "-x", "UCX_TLS=rc", "/opt/osu/osu_latency", "-m", "4096", "-z"]
    # bare metal same-host: both ranks on the first host
    assert l.command(["a"], placement=l.pair("same-host"))[:6] == ["mpirun", "-np", "2", "--host", "n1:2",
                                                                  "--map-by"]


def test_pair_placement_in_vms_ordered_host_by_host():
    """4 VMs on 2 hosts, listed host by host (as the hostfile is): a host-to-host
    pair is never the first two VMs (both on node1)."""
    vms = ["10.10.0.3", "10.10.0.5", "10.10.0.4", "10.10.0.6"]
    l = runners.Launcher(hosts=vms, host_of={"10.10.0.3": "node1", "10.10.0.5": "node1",
                                             "10.10.0.4": "node2", "10.10.0.6": "node2"},
                         hostfile="/tmp/hf", allow_root=False, bind=None)
    assert l.pair("inter-host") == [("10.10.0.3", 1), ("10.10.0.4", 1)]
    assert l.pair("same-host") == [("10.10.0.3", 1), ("10.10.0.5", 1)]
    cmd = l.command(["osu_bw"], placement=l.pair("inter-host"))
    assert "--hostfile" not in cmd and cmd[:5] == ["mpirun", "-np", "2", "--host", "10.10.0.3:1,10.10.0.4:1"]
    # one VM per host: no same-host pair; one host: no inter-host pair
    one = runners.Launcher(hosts=["a", "b"], host_of={"a": "n1", "b": "n2"})
    assert one.pair("same-host") is None and one.pair("inter-host") == [("a", 1), ("b", 1)]
    assert runners.Launcher(hosts=["x"], host_of={"x": "n1"}).pair("inter-host") is None
    assert runners.Launcher().pair("same-host") == [] and runners.Launcher().pair("inter-host") is None
    srun = runners.Launcher(kind="srun", hosts=vms, host_of=l.host_of, bind=None)
    assert srun.command(["osu_bw"], placement=srun.pair("inter-host")) == [
        "srun", "-n", "2", "-N", "2", "--nodelist=10.10.0.3,10.10.0.4", "--distribution=block", "osu_bw"]


def test_pair_benchmarks_need_a_placement():
    with pytest.raises(HarnessError, match="placement"):
        runners.osu_job("osu_put_latency", binary="x")
    assert runners.osu_job("osu_allreduce", binary="x").placement == "all"


def test_mpirun_collective_uses_every_rank_and_hostfile():
    l = runners.Launcher(hostfile="/tmp/hf", hosts=["a", "b"], ranks_per_node=7, bind="none" and None,
                         allow_root=False)
    job = runners.osu_job("osu_allreduce", binary="osu_allreduce", min_size=4, max_size=64, full=True,
                          percentiles=[95, 99], iterations=200, warmup=10)
    assert job.ranks is None
    assert l.command(job.argv) == ["mpirun", "-np", "14", "--hostfile", "/tmp/hf", "--map-by",
                                   "ppr:7:node", "osu_allreduce", "-m", "4:64", "-i", "200", "-x",
                                   "10", "-f", "-z95,99"]


def test_srun_command():
    l = runners.Launcher(kind="srun", hosts=["n1", "n2"], ranks_per_node=2)
    assert l.command(["xhpl"]) == ["srun", "-n", "4", "-N", "2", "--ntasks-per-node=2",
                                   "--nodelist=n1,n2", "--cpu-bind=cores", "xhpl"]


def test_full_flag_refused_for_point_to_point():
    with pytest.raises(HarnessError, match="no -f"):
        runners.osu_job("osu_latency", binary="x", full=True, placement="same-host")
    with pytest.raises(HarnessError, match="no -c"):
        runners.osu_job("osu_barrier", binary="x", validate=True)
    with pytest.raises(HarnessError, match="osu_hello: not run"):
        runners.osu_job("osu_hello", binary="x")


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
    assert {r["placement"] for r in rows} == {"same-host"}
    raw = tmp_path / "raw" / "native-h1" / "mpi_pingpong.same-host.t0.txt"
    assert parse_file(str(raw)).benchmark == "mpi_pingpong"


def test_real_hpcc_two_ranks(tmp_path, mpi_env):
    """Debian's hpcc for real (HPL 2.0 + PingPong + STREAM), 2 ranks, small N."""
    if not shutil.which("hpcc"):
        pytest.fail("hpcc not installed (rake test:harness installs it)")
    l = runners.Launcher(ranks_per_node=2, bind=None, oversubscribe=True)
    job = runners.hpcc_job(ns=[800], nb=64, ranks=2)
    rows, _ = runners.run_trials([job], l, 1, str(tmp_path), {"env": "native", "hosts": 1}, progress=False)
    hpl = [r for r in rows if r["benchmark"] == "hpcc_hpl" and r["metric"] == "gflops"][0]
    assert hpl["params"] == "WR11C2R4 NB=64 P=1 Q=2"
    assert hpl["size"] == 800 and hpl["value"] > 0.01
    assert any(r["benchmark"] == "hpcc_pingpong" and r["metric"] == "latency" for r in rows)
    assert os.path.exists(tmp_path / "work" / "native-h1" / "hpcc" / "hpccinf.txt")
