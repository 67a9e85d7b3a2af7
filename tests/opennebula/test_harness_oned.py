"""kvm-sriov-bench's OpenNebula orchestration (kvm_sriov_bench/opennebula.py)
against a real oned 7.4: clean-up reaches DONE from every state a
benchmark run can leave a VM in, and the first error is the one raised.

The front-end here is oned alone with OpenNebula's own dummy drivers (IM,
VMM and TM "dummy", shipped with OpenNebula for testing): the VM state
machine, the request checks ("wrong state") and the recover operations
are oned's; only the hypervisor is absent. The dummy VMM's answers are
steered through /tmp/opennebula_dummy_actions (its fixed folder):
"failure" fails an action, "-" never answers (a VM held in BOOT, a
shutdown that hangs).
"""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pyone = pytest.importorskip("pyone", reason="pyone lives in the project venv (rake test:opennebula)")

from kvm_sriov_bench.errors import OrchestrationError  # noqa: E402
from kvm_sriov_bench.opennebula import OneCluster, hostfile  # noqa: E402
from simhost.frontend import OpenNebulaMissing, drivers_at_usual_priority, _free_port_block, locate_install  # noqa: E402

DUMMY_ACTIONS = Path("/tmp/opennebula_dummy_actions")
SHARED_PARTS = ("bin", "lib", "share", "include", "sbin")
TEMPLATE = ('NAME = "bench"\nCPU = "0.1"\nMEMORY = "64"\n'
            'NIC = [ BRIDGE = "ib-sriov:mlx5_0", IP = "10.10.0.9", NETWORK_MODE = "manual" ]\n')


class DummyOned:
    """A private oned (own ONE_LOCATION, DB and ports) with the dummy drivers."""

    def __init__(self, work: Path, prefix: Path):
        self.loc = work / "one"
        self.loc.mkdir(parents=True)
        for part in SHARED_PARTS:
            os.symlink(prefix / part, self.loc / part)
        for part in ("etc", "var"):
            shutil.copytree(prefix / part, self.loc / part, symlinks=True)
        drivers_at_usual_priority(self.loc / "etc")
        self.port = _free_port_block(6, start=2800)
        conf = (self.loc / "etc" / "oned.conf").read_text()
        for key, value in (("PORT", self.port), ("GRPC_PORT", self.port + 1)):
            conf, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", conf, count=1)
            assert n == 1, key
        conf, n = re.subn(r"-p 2101 -l 2102", f"-p {self.port + 2} -l {self.port + 3}", conf)
        assert n == 1
        conf += '\nVM_MAD = [ NAME = "dummy", EXECUTABLE = "one_vmm_dummy", TYPE = "xml" ]\n'
        (self.loc / "etc" / "oned.conf").write_text(conf)
        mon = (self.loc / "etc" / "monitord.conf").read_text()
        mon, n = re.subn(r"(\n\s*PORT\s*=\s*)4124", rf"\g<1>{self.port + 4}", mon)
        assert n == 1
        (self.loc / "etc" / "monitord.conf").write_text(mon)
        (self.loc / "var" / ".one").mkdir(exist_ok=True)
        (self.loc / "var" / ".one" / "one_auth").write_text("oneadmin:password\n")
        self.endpoint = f"http://127.0.0.1:{self.port}/RPC2"
        # RUBYLIB: oned's Ruby drivers (one_hm first) load OpenNebula's Ruby from the
        # install itself; without it they found it only through the link a FrontEnd
        # makes in /usr/local/lib/site_ruby, so on a machine where no FrontEnd had run
        # yet one_hm died at once and oned said "expected INIT SUCCESS message"
        self.env = dict(os.environ, ONE_LOCATION=str(self.loc), ONE_XMLRPC=self.endpoint,
                        ONE_AUTH=str(self.loc / "var" / ".one" / "one_auth"),
                        RUBYLIB=str(self.loc / "lib" / "ruby"))
        self.proc = None

    def start(self, timeout=90):
        self.proc = subprocess.Popen([str(self.loc / "bin" / "oned"), "-f"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        one = pyone.OneServer(self.endpoint, session="oneadmin:password")
        deadline = time.monotonic() + timeout
        while True:
            try:
                one.hostpool.info()
                return one
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.loc / "var" / "oned.log"
                    errors = [l for l in log.read_text(errors="replace").splitlines() if "][E]:" in l] \
                        if log.exists() else []
                    raise RuntimeError(f"oned did not start: {errors[-1] if errors else 'no error logged'} "
                                       f"(log: {log})")
                time.sleep(0.5)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)    # oned and the drivers it started
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_drivers_find_opennebulas_ruby_without_a_front_end_run_before(tmp_path):
    """What oned's Ruby drivers load first, from the dummy oned's own environment
    alone: not from site_ruby, where simhost.frontend links it on first use."""
    try:
        prefix = locate_install()
    except OpenNebulaMissing as e:
        pytest.fail(str(e), pytrace=False)
    d = DummyOned(tmp_path, prefix)
    p = subprocess.run(["ruby", "-e", '$LOAD_PATH.reject! { |p| p.include?("site_ruby") }; '
                        'require "load_opennebula_paths"'], env=d.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def steer(action, *answers):
    """The dummy VMM's next answers to ``action`` (cycled); none = success."""
    DUMMY_ACTIONS.mkdir(exist_ok=True)
    path = DUMMY_ACTIONS / action
    if answers:
        path.write_text("\n".join(answers) + "\n")
    elif path.exists():
        path.unlink()


@pytest.fixture(scope="module")
def oned(tmp_path_factory):
    try:
        prefix = locate_install()
    except OpenNebulaMissing as e:
        pytest.fail(str(e), pytrace=False)
    if (DUMMY_ACTIONS).exists() and any(DUMMY_ACTIONS.iterdir()):
        pytest.fail(f"{DUMMY_ACTIONS} is not empty: another dummy-driver test is steering it",
                    pytrace=False)
    d = DummyOned(tmp_path_factory.mktemp("oned"), prefix)
    try:
        one = d.start()
        for host in ("node1", "node2"):
            one.host.allocate(host, "dummy", "dummy", -1)
        for ds in (0, 1):
            one.datastore.update(ds, 'TM_MAD = "dummy"', 1)
        template = one.template.allocate(TEMPLATE)
        yield d, one, template
    finally:
        for action in ("deploy", "cancel", "shutdown"):
            steer(action)
        d.stop()


@pytest.fixture(autouse=True)
def dummy_succeeds():
    for action in ("deploy", "cancel", "shutdown"):
        steer(action)
    yield
    for action in ("deploy", "cancel", "shutdown"):
        steer(action)


def states(one, vms):
    return {vm.id: (int(one.vm.info(vm.id).STATE), int(one.vm.info(vm.id).LCM_STATE)) for vm in vms}


def report_ib_up(one, vms):
    """What the guest scripts publish through OneGate once the IB port is up."""
    for vm in vms:
        one.vm.update(vm.id, 'IB_STATE = "ACTIVE"', 1)


def test_vms_per_host_run_and_reach_done(oned):
    _, one, template = oned
    c = OneCluster(one, template, ["node1", "node2"], 2, poll=0.2, timeout=60)
    try:
        c.deploy()
        assert [vm.host for vm in c.vms] == ["node1", "node1", "node2", "node2"]
        report_ib_up(one, c.vms)
        c.wait_ready()
        assert hostfile(c.vms) == "10.10.0.9 slots=1\n" * 4
        assert set(states(one, c.vms).values()) == {(3, 3)}      # ACTIVE/RUNNING
    finally:
        c.terminate()
    assert set(states(one, c.vms).values()) == {(6, 0)}          # DONE


def test_time_out_in_boot_is_raised_and_every_vm_reaches_done(oned):
    """oned refuses terminate-hard in BOOT ("wrong state"): clean-up uses
    recover --delete; the time-out stays the error raised."""
    _, one, template = oned
    steer("deploy", "success", "-")      # the second VM's deploy never answers: held in BOOT
    c = OneCluster(one, template, ["node1"], 2, poll=0.2, timeout=4)
    with pytest.raises(OrchestrationError, match="timed out") as e:
        with c:
            pass
    assert "clean-up" not in str(e.value)
    assert set(states(one, c.vms).values()) == {(6, 0)}


def test_boot_failure_is_seen_at_once_and_cleaned_up(oned):
    _, one, template = oned
    steer("deploy", "failure")
    c = OneCluster(one, template, ["node2"], 1, poll=0.2, timeout=60)
    with pytest.raises(OrchestrationError, match="failed: ACTIVE/BOOT_FAILURE") as e:   # the failure's, not the time-out's
        with c:
            pass
    assert "timed out" not in str(e.value)
    assert set(states(one, c.vms).values()) == {(6, 0)}


def test_clean_up_from_hold_pending_boot_and_running(oned):
    _, one, template = oned
    c = OneCluster(one, template, ["node1"], 1, poll=0.2, timeout=60)
    c.deploy()                                               # RUNNING
    deadline = time.monotonic() + 30
    while states(one, c.vms) != {c.vms[0].id: (3, 3)} and time.monotonic() < deadline:
        time.sleep(0.2)
    steer("deploy", "-")
    c.deploy()                                               # held in BOOT
    held = one.template.instantiate(template, "held", True, "", False)           # HOLD
    pending = one.template.instantiate(template, "pending", False, "", False)    # PENDING
    from kvm_sriov_bench.opennebula import BenchVM
    c.vms += [BenchVM(held, "held", "-"), BenchVM(pending, "pending", "-")]
    time.sleep(1)
    got = states(one, c.vms)
    assert sorted(got.values()) == [(1, 0), (2, 0), (3, 2), (3, 3)]
    c.terminate()
    assert set(states(one, c.vms).values()) == {(6, 0)}


def test_hung_shutdown_is_asked_again_and_first_error_kept(oned):
    """terminate-hard is accepted but the driver never answers (SHUTDOWN):
    without a retry the clean-up reports the VM and its state while the
    run's own error stays the one raised; asked again, recover --delete
    finishes it."""
    _, one, template = oned
    c = OneCluster(one, template, ["node1"], 1, poll=0.2, timeout=60, retry=1000)
    c.deploy()
    report_ib_up(one, c.vms)
    c.wait_ready()
    steer("cancel", "-")
    c.timeout = 3
    try:
        raise RuntimeError("the benchmark broke")
    except RuntimeError as err:
        assert c.__exit__(RuntimeError, err, err.__traceback__) is False   # not swallowed
        notes = " ".join(getattr(err, "__notes__", []))
    assert "clean-up" in notes and "not DONE" in notes and f"{c.vms[0].id} (ACTIVE/" in notes
    assert states(one, c.vms)[c.vms[0].id][0] == 3
    c.retry, c.timeout = 0.5, 30
    c.terminate()
    assert set(states(one, c.vms).values()) == {(6, 0)}
