"""Orchestration through the real pyone client against the stand-in oned."""
import subprocess
import sys

import pytest

pyone = pytest.importorskip("pyone", reason="pyone lives in the project venv (rake test:harness)")

from harness_paths import ROOT  # noqa: E402
from kvm_sriov_bench.errors import OrchestrationError  # noqa: E402
from kvm_sriov_bench.opennebula import OneCluster, hostfile, ipoib_address  # noqa: E402
from tests.support.standin_oned import StandinOned  # noqa: E402


@pytest.fixture
def oned():
    with StandinOned(hosts=["node1", "node2", "node3"]) as s:
        yield s


def test_n_vms_per_host_running_ib_up_hostfile_terminate(oned):
    one = OneCluster.connect(oned.endpoint, "oneadmin:password")
    with OneCluster(one, 0, ["node1", "node3"], 2, poll=0.01) as c:
        assert [vm.host for vm in c.vms] == ["node1", "node1", "node3", "node3"]
        assert all(vm.ipoib.startswith("10.10.") for vm in c.vms)     # the ib-sriov NIC, not br0
        hf = hostfile(c.vms, slots=1)
        assert hf.splitlines() == [f"{vm.ipoib} slots=1" for vm in c.vms]
        assert {v.host_id for v in oned.vms.values()} == {0, 2}
        assert all(v.state == 3 and v.lcm == 3 for v in oned.vms.values())
    assert all(v.state == 6 for v in oned.vms.values())                # DONE after the block
    assert oned.calls.count("template.instantiate") == 4 and oned.calls.count("vm.deploy") == 4
    assert "vm.action" in oned.calls


def test_unknown_host_and_bad_session(oned):
    one = OneCluster.connect(oned.endpoint, "oneadmin:password")
    with pytest.raises(OrchestrationError, match="nodeX"):
        OneCluster(one, 0, ["nodeX"], 1).deploy()
    bad = OneCluster.connect(oned.endpoint, "oneadmin:wrong")
    with pytest.raises(pyone.OneAuthenticationException):
        OneCluster(bad, 0, ["node1"], 1).deploy()


def test_ib_never_up_times_out_and_terminates(oned):
    oned.fail_ib.add("kvm-sriov-bench-node2-0")
    one = OneCluster.connect(oned.endpoint, "oneadmin:password")
    with pytest.raises(OrchestrationError, match="IB_STATE=ACTIVE"):
        with OneCluster(one, 0, ["node1", "node2"], 1, poll=0.01, timeout=0.5):
            pass
    assert oned.calls.count("vm.action") == 2 and all(v.state == 6 for v in oned.vms.values())


def test_ipoib_address_uses_the_marker():
    t = {"NIC": [{"BRIDGE": "br0", "IP": "192.168.1.2"}, {"BRIDGE": "ib-sriov:mlx5_0", "IP": "10.1.0.7"}]}
    assert ipoib_address(t) == "10.1.0.7"
    assert ipoib_address({"NIC": {"BRIDGE": "br0", "IP": "1.2.3.4"}}) is None


def test_cli_opennebula_end_to_end(oned, tmp_path, mpi_env):
    """The CLI: 1 and 2 VMs on 1 host via pyone, the MPI ping-pong run (locally), VMs terminated."""
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "-m", "kvm_sriov_bench", "opennebula", "--endpoint", oned.endpoint,
                        "--session", "oneadmin:password", "--template", "0", "--hosts", "node1",
                        "--vms-per-host", "1,2", "--pingpong", "--max-size", "64", "--iterations", "100",
                        "--warmup", "10", "--trials", "1", "--launch-locally", "--oversubscribe",
                        "--bind", "none", "--no-progress", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "hostfiles" / "vm-h1-v2.txt").read_text().count("slots=1") == 2
    text = (out / "samples.csv").read_text()
    assert ",vm,same-host,,1,1,1," in text and ",vm,same-host,,1,2,1," in text
    assert all(v.state == 6 for v in oned.vms.values()) and len(oned.vms) == 3


def test_standin_refuses_terminate_where_oned_does(oned):
    """As OpenNebula 7.4: terminate-hard in PROLOG/BOOT is "wrong state";
    the clean-up then uses recover --delete and every VM reaches DONE."""
    one = OneCluster.connect(oned.endpoint, "oneadmin:password")
    c = OneCluster(one, 0, ["node1"], 1, poll=0.01)
    c.deploy()                                                       # ACTIVE/PROLOG
    with pytest.raises(pyone.OneActionException, match="wrong state PROLOG"):
        one.vm.action("terminate-hard", c.vms[0].id)
    c.terminate()
    assert all(v.state == 6 for v in oned.vms.values())
    assert "vm.recover" in oned.calls
