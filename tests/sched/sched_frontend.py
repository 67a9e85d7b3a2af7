"""A rung-4 front-end (simhost.frontend) with the kvm-sriov placer selected,
as docs/scheduling.md tells an operator, and helpers to change a host's VF
pool the way the driver does (its library, on that host, over ssh)."""

import re
import shlex
import time
import xmlrpc.client
from contextlib import contextmanager
from typing import NamedTuple, Optional
from xml.etree import ElementTree as ET

import pytest

from simhost.frontend import FrontEnd, OpenNebulaMissing
from tests.support.fake_sysfs import FakeSysfs

SCHED_ARGS = "-t 15 -p kvm-sriov -o one_drs"
HOST_DRIVER = "/var/tmp/one/vmm/kvm-sriov"   # where `onehost sync` puts the action scripts and the bootstrap
HOST_LIB = f"{HOST_DRIVER}/lib"                # and the library
# sys.path as an action script has it: its own folder (kvm_sriov_bootstrap, whose trust
# rule config.load applies to every config file) and the library
HOST_PATH = f"import sys; sys.path[:0] = [{HOST_LIB!r}, {HOST_DRIVER!r}]"


class SchedFrontEnd(FrontEnd):
    """max_host: rank.conf's MAX_HOST (VMs per host per window; stock: 1);
    retry_time: SCHED_RETRY_TIME (how soon pending VMs are tried again; stock 60 s)."""

    def __init__(self, *args, max_host: int = 1, retry_time: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_host, self.retry_time = max_host, retry_time

    def _wait_oned(self, timeout: float = 240) -> None:
        super()._wait_oned(timeout)   # oned's start takes minutes on a loaded 2-core machine

    def _make_location(self) -> None:
        super()._make_location()
        for part in ("lock", "run", "vms"):   # oned needs them; the install has them
            (self.one_location / "var" / part).mkdir(parents=True, exist_ok=True)

    def _configure(self) -> None:
        super()._configure()
        etc = self.one_location / "etc"
        oned = (etc / "oned.conf").read_text()
        oned, n = re.subn(r'ARGUMENTS\s*=\s*"-t 15 -p rank -o one_drs"', f'ARGUMENTS  = "{SCHED_ARGS}"', oned)
        if n != 1:
            raise RuntimeError("oned.conf: the stock SCHED_MAD arguments were not found")
        if self.retry_time is not None:
            oned, n = re.subn(r"(?m)^SCHED_RETRY_TIME\s*=.*$", f"SCHED_RETRY_TIME = {self.retry_time}", oned)
            if n != 1:
                raise RuntimeError("oned.conf: SCHED_RETRY_TIME not found")
        (etc / "oned.conf").write_text(oned)
        rank = etc / "schedulers" / "rank.conf"
        rank.write_text(re.sub(r"(?m)^MAX_HOST\s*=.*$", f"MAX_HOST = {self.max_host}", rank.read_text()))


def fake_host(root, pfs):
    """pfs: (address, netdev, ibdev, NUMA node, VFs) per PF."""
    fs = FakeSysfs(root)
    fs.add_numa_node(0, "0-1")
    fs.add_numa_node(1, "2-3")
    for address, netdev, ibdev, node, vfs in pfs:
        fs.add_pf(address, numa=node, num_vfs=vfs, total_vfs=8, netdev=netdev, ibdev=ibdev)
    return root


def free_vfs(fe, host: str) -> int:
    """KVM_SRIOV_FREE_VFS of the host in oned, over XML-RPC (what `onehost show`
    asks, without the CLI's second of Ruby start-up per look)."""
    ok, body, *_ = xmlrpc.client.ServerProxy(fe.endpoint).one.host.info(fe.session, fe.host(host).id, False)
    if not ok:
        raise RuntimeError(f"one.host.info {host}: {body}")
    text = ET.fromstring(body).findtext("TEMPLATE/KVM_SRIOV_FREE_VFS")
    return int(text) if text is not None else -1


class Change(NamedTuple):
    """A pool change made on a host: when it started and when its Host.close()
    began to tell monitoring (wall clock; the hosts share the front-end's), how
    (monitor.refresh: "signalled" or None) and what that cost."""
    start: float
    refresh_start: float
    way: Optional[str]
    refresh_seconds: float


# Run on the host: time the change from its start and report Host.close()'s refresh.
_TRACE = (f"{HOST_PATH}\nimport time; start = time.time()\n"
          "from kvm_sriov.node import monitor\n"
          "real = monitor.refresh\n"
          "def refresh(*a, **k):\n"
          "    t = time.time(); way = real(*a, **k)\n"
          "    print('CHANGE', start, t, way, time.time() - t, flush=True); return way\n"
          "monitor.refresh = refresh\n")


def _change(fe, host: str, code: str) -> Change:
    out = fe.host(host).ssh(f"/usr/bin/python3 -c {shlex.quote(_TRACE + code)}").stdout
    line = next((x.split() for x in out.splitlines() if x.startswith("CHANGE ")), None)
    if line is None:
        raise RuntimeError(f"{host}: the pool change did not end in monitor.refresh: {out!r}")
    return Change(float(line[1]), float(line[2]), None if line[3] == "None" else line[3], float(line[4]))


def wait_free_vfs(fe, host: str, want: int, timeout: float = 30.0, since: Optional[float] = None) -> float:
    """Seconds until oned shows `want` free VFs on the host (raises after
    timeout), counted from `since` (wall clock, e.g. Change.start) or now."""
    start = time.time() if since is None else since
    while True:
        if free_vfs(fe, host) == want:
            return time.time() - start
        if time.time() - start > timeout:
            raise TimeoutError(f"{host}: KVM_SRIOV_FREE_VFS stayed {free_vfs(fe, host)}, expected {want}")
        time.sleep(0.02)


def settle(fe, host: str, timeout: float = 300) -> float:
    """Seconds until the host's monitord client runs no system probe (its
    start-up runs are over: a change during one waits for it)."""
    start = time.time()
    check = (f"{HOST_PATH}; from kvm_sriov.node import monitor; "
             "pid = monitor.client_pid(); "
             "sys.exit(pid is None or monitor.system_probes_running(pid))")
    while fe.host(host).ssh(f"/usr/bin/python3 -c {shlex.quote(check)}", check=False).returncode != 0:
        if time.time() - start > timeout:
            raise TimeoutError(f"{host}: the monitord client still runs system probes after {timeout} s")
        time.sleep(0.5)
    return time.time() - start


def take_vf(fe, host: str, vm_id: int) -> Change:
    """Give one free VF to VM vm_id in the host's pool, through the driver's Host
    (the path every action takes; its close() refreshes monitoring)."""
    return _change(fe, host, (
        "from kvm_sriov import config\nfrom kvm_sriov.node.host import Host\n"
        "h = Host(config.load())\n"
        "vf = next(v for v in h.inventory.eligible_vfs() if v.address not in {a.vf for a in h.assignments()})\n"
        f"with h.pool.transaction() as t: t.add(vf.address, vf.pf, {vm_id}, 'one-{vm_id}', '', 'attached', 'bench')\n"
        "h.close()\n"))


def reconcile(fe, host: str) -> Change:
    """`kvm-sriov reconcile` on the host: VFs of domains that do not run go back."""
    return _change(fe, host, "from kvm_sriov.cli import main\nsys.exit(main(['reconcile']))\n")


@contextmanager
def running(fe: FrontEnd, log_dir, failed=lambda: False):
    """Start fe for a pytest fixture: no OpenNebula is a one-line failure, logs
    are kept in log_dir when the start or (failed()) a test failed."""
    try:
        fe.start()
    except OpenNebulaMissing as e:
        fe.stop()
        pytest.fail(str(e), pytrace=False)
    except BaseException:
        if fe.port is not None:
            fe.collect_logs(log_dir)
        fe.stop()
        raise
    try:
        yield fe
    finally:
        if failed():
            fe.collect_logs(log_dir)
        fe.stop()
