"""Run the real opensm (Debian package) against an ibsim-simulated fabric.

One switch, the SM's own CA on port 1 and one single-port CA per port GUID
on the next ports. opensm sweeps once (-o), parses the partitions file and
programs every port's PKey table, which smpquery then reads back. ibsim
(ibsim-utils) and its LD_PRELOAD library (libumad2sim0) replace the kernel's
umad devices, so no InfiniBand hardware or kernel module is needed.

ibsim and its clients (every process with umad2sim preloaded) meet on
abstract unix sockets named from ``IBSIM_SOCKNAME`` ("sim" when unset:
ibsim/ibsim.c, umad2sim/sim_client.c): each fabric here has its own name, so
two tests side by side never share a fabric.

``Fabric`` runs opensm daemons on one such fabric, a master and standbys by
priority, each on its own node (two opensm on one node would both be the SM of
one port, and ibsim hands that port's SM requests to one of them only).
What umad2sim lacks shapes it: no MAD ever times out there. The kernel ends a
request nobody answers with a timeout; umad2sim (ibsim 0.10) never does, and
ibsim answers "timed out" (status 110) only for a request it cannot deliver.
A request delivered to an SM that never answers it therefore stays
outstanding for ever, and opensm starts every sweep by waiting for its
outstanding MADs (osm_state_mgr.c, wait_for_pending_transactions, no time
limit): that SM never sweeps again. Two ways that happens, both seen in
opensm's debug log (TID sent, never retired, "1 QP0 MADs outstanding"):

- an SM that has just set IsSM ignores SMInfo(Get) until its own first sweep
  has found its own port (osm_sminfo_rcv.c: no port for sm_port_guid, no
  answer). The master sweeps on the trap 144 ibsim sends for the new IsSM and
  asks the newcomer's SMInfo; on a busy machine it asks first. So the SMs here
  do not sweep on traps or on a timer (``sweep_on_trap FALSE``,
  ``sweep_interval 0``): a master sweeps when it starts and when it is
  reloaded (SIGHUP), and nothing reloads it before its standbys are STANDBY.
- a standby polls its master with SMInfo(Get); one the master has been given
  and not answered when it is killed is lost. So a standby polls its master
  once, when it becomes standby (``standby_ready`` waits for that answer), and
  not again while the master lives (``sminfo_polling_timeout`` an hour);
  ``poll_master_often`` shortens that once the master is dead. Every poll then
  reaches the dead master's socket or no one, and ibsim answers it "timed
  out" at once, as the kernel would after a while.

(A third: a standby of higher priority than its master sends it a trap 144 and
waits for a TrapRepress, which ibsim drops. Give the master the highest priority.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

UMAD2SIM = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"
HANG = 120   # seconds: only a hang takes this long, however busy the machine


def available() -> bool:
    return all(shutil.which(t) for t in ("ibsim", "opensm", "smpquery")) and Path(UMAD2SIM).exists()


def _netfile(port_guids: list[int]) -> str:
    ports = len(port_guids) + 1
    lines = [f'Switch\t{max(ports, 8)} "sw"', '[1]\t"sm"[1]']
    lines += [f'[{i + 2}]\t"ca{i}"[1]' for i in range(len(port_guids))]
    lines += ["", 'Hca\t1 "sm"', '[1]\t"sw"[1]', ""]
    for i, g in enumerate(port_guids):
        # ibsim numbers a CA's port GUIDs from its node GUID + port number
        lines += [f"caguid=0x{g - 1:016x}", f'Hca\t1 "ca{i}"', f'[1]\t"sw"[{i + 2}]', ""]
    return "\n".join(lines) + "\n"


def _socket_name() -> str:
    """ibsim's socket name for one fabric: nobody else's fabric has it."""
    return f"kvm-sriov-test-{os.getpid()}-{os.urandom(6).hex()}"


def _start_ibsim(workdir: Path, socket_name: str, log: Optional[Path] = None) -> subprocess.Popen:
    """ibsim serving workdir/net, once it listens (its control socket is bound): no
    sleep that a busy machine outlasts. Its warnings (a client found dead, ...) go to log."""
    with open(log or os.devnull, "wb") as out:
        sim = subprocess.Popen(["ibsim", "-n", "-s", "net"], cwd=workdir,
                               env=dict(os.environ, IBSIM_SOCKNAME=socket_name),
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HANG
    while sim.poll() is None and f"@{socket_name}:ctl" not in Path("/proc/net/unix").read_text():
        if time.monotonic() > deadline:
            _end(sim)
            raise AssertionError(f"ibsim did not listen in {HANG} s")
        time.sleep(0.05)
    if sim.poll() is not None:
        raise AssertionError(f"ibsim exited ({sim.returncode}) instead of serving {workdir / 'net'}")
    return sim


def _end(proc: subprocess.Popen) -> None:
    """proc and anything it started are gone (waited for)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run(workdir: Path, partitions_conf: str, port_guids: list[int]) -> dict:
    """-> {"pkeys": {port GUID: [pkey, ...]}, "sm_pkeys": [...], "log": opensm log text}"""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "net").write_text(_netfile(port_guids))
    conf = workdir / "partitions.conf"
    conf.write_text(partitions_conf)
    socket_name = _socket_name()
    sim = _start_ibsim(workdir, socket_name)
    env = dict(os.environ, LD_PRELOAD=UMAD2SIM, SIM_HOST="sm", IBSIM_SOCKNAME=socket_name,
               OSM_TMP_DIR=str(workdir), OSM_CACHE_DIR=str(workdir))
    try:
        log = workdir / "osm.log"
        subprocess.run(["opensm", "-P", str(conf), "-f", str(log), "-s", "0", "-o"],
                       cwd=workdir, env=env, capture_output=True, timeout=60, check=False)

        def pkeys(route: str) -> list[int]:
            out = subprocess.run(["smpquery", "-D", "pkeys", route, "1"], env=env,
                                 capture_output=True, text=True, timeout=30).stdout
            return [int(x, 16) for x in re.findall(r"0x[0-9a-f]{4}", out) if int(x, 16) & 0x7fff]

        result = {"log": log.read_text() if log.exists() else "",
                  "sm_pkeys": pkeys("0"),
                  "pkeys": {g: pkeys(f"0,1,{i + 2}") for i, g in enumerate(port_guids)}}
    finally:
        _end(sim)
    return result


def wait_for(condition: Callable[[], object], what: str, describe: Callable[[], object] = lambda: "",
             seconds: float = HANG):
    """condition()'s first true value, asked every 0.1 s; after ``seconds`` (a hang, not a
    slow machine) AssertionError naming what was awaited and what describe() says then."""
    deadline = time.monotonic() + seconds
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds:.0f} s: {describe()}")
        time.sleep(0.1)


# -- several opensm daemons on one fabric: a master and standbys ------------------------------
SM_CONF = """\
sweep_interval 0
sweep_on_trap FALSE
sminfo_polling_timeout 3600000
polling_retry_number 1
force_log_flush TRUE
log_flags 0x07
"""
POLL_OFTEN_MS = 200
MASTER_ANSWERED = "in state 3 (MASTER)"     # a standby's log line when its master's SMInfo came


class Fabric:
    """ibsim with one switch: the SM nodes ``sms`` on its first ports, one single-port CA per
    port GUID on the next, and the node "diag" last, where the diagnostic tools attach (their
    requests come from a port no SM is on). Each SM node has its folder ``workdir/<name>``:
    opensm.conf (``SM_CONF``), partitions.conf, opensm.log and opensm's cache files. A context
    manager: every process it started is killed and waited for on the way out."""

    def __init__(self, workdir: Path, sms: list[str], port_guids: list[int]):
        self.workdir, self.sms, self.port_guids = workdir, list(sms), list(port_guids)
        self.socket_name = _socket_name()
        self.opensm: dict[str, subprocess.Popen] = {}
        self.sim: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Fabric":
        self.workdir.mkdir(parents=True, exist_ok=True)
        first_ca, diag = len(self.sms) + 1, len(self.sms) + len(self.port_guids) + 1
        lines = [f'Switch\t{max(diag, 8)} "sw"']
        lines += [f'[{i + 1}]\t"{sm}"[1]' for i, sm in enumerate(self.sms)]
        lines += [f'[{first_ca + i}]\t"ca{i}"[1]' for i in range(len(self.port_guids))]
        lines += [f'[{diag}]\t"diag"[1]', ""]
        for i, sm in enumerate(self.sms):
            lines += [f'Hca\t1 "{sm}"', f'[1]\t"sw"[{i + 1}]', ""]
            self.folder(sm).mkdir()
            (self.folder(sm) / "opensm.conf").write_text(SM_CONF)
        for i, g in enumerate(self.port_guids):
            # ibsim numbers a CA's port GUIDs from its node GUID + port number
            lines += [f"caguid=0x{g - 1:016x}", f'Hca\t1 "ca{i}"', f'[1]\t"sw"[{first_ca + i}]', ""]
        lines += ['Hca\t1 "diag"', f'[1]\t"sw"[{diag}]', ""]
        (self.workdir / "net").write_text("\n".join(lines))
        self.sim = _start_ibsim(self.workdir, self.socket_name, self.workdir / "ibsim.log")
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.opensm.values():
            _end(proc)
        if self.sim is not None:
            _end(self.sim)

    def folder(self, sm: str) -> Path:
        return self.workdir / sm

    def _env(self, node: str) -> dict:
        return dict(os.environ, LD_PRELOAD=UMAD2SIM, SIM_HOST=node, IBSIM_SOCKNAME=self.socket_name)

    def start_sm(self, sm: str, priority: int) -> None:
        """opensm on SM node sm, with its folder's files, as a daemon (it runs until killed)."""
        d = self.folder(sm)
        self.opensm[sm] = subprocess.Popen(
            ["opensm", "-F", str(d / "opensm.conf"), "-P", str(d / "partitions.conf"), "-f", str(d / "opensm.log"),
             "-p", str(priority)],
            cwd=d, env=dict(self._env(sm), OSM_TMP_DIR=str(d), OSM_CACHE_DIR=str(d)),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def reload_command(self, sm: str) -> list[str]:
        """What reloads sm's opensm: SIGHUP (it reads its files again; a master sweeps)."""
        return [sys.executable, "-c", f"import os, signal; os.kill({self.opensm[sm].pid}, signal.SIGHUP)"]

    def kill_sm(self, sm: str) -> None:
        """SM node sm dies: SIGKILL, no goodbye to the fabric."""
        _end(self.opensm[sm])

    def standby_ready(self, sm: str) -> bool:
        """sm is STANDBY and its master has answered its first poll (opensm's log says so
        after it became standby): no request of sm's is left unanswered at its master."""
        log = self.log(sm)
        became = log.find("Entering STANDBY state")
        return became >= 0 and MASTER_ANSWERED in log[became:] and self.sm_state(sm) == "STANDBY"

    def poll_master_often(self, sm: str) -> None:
        """Standby sm polls its master every POLL_OFTEN_MS from now on (opensm reads the
        option again on SIGHUP and restarts its poll timer)."""
        conf = self.folder(sm) / "opensm.conf"
        conf.write_text(conf.read_text().replace("sminfo_polling_timeout 3600000",
                                                 f"sminfo_polling_timeout {POLL_OFTEN_MS}"))
        self.opensm[sm].send_signal(signal.SIGHUP)

    def log(self, sm: str) -> str:
        path = self.folder(sm) / "opensm.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _diag(self, *args: str) -> str:
        """An infiniband-diags tool at node "diag", by directed route (no LIDs needed);
        each try awaited 2 s (an SM that ignores it costs a few seconds, then it is asked again)."""
        done = subprocess.run([args[0], "-t", "2000", *args[1:]], cwd=self.workdir, env=self._env("diag"),
                              capture_output=True, text=True, timeout=HANG)
        return done.stdout

    def _route(self, switch_port: int) -> str:
        return f"0,1,{switch_port}"

    def sm_state(self, sm: str) -> str:
        """What sm's opensm answers to SMInfo (sminfo): MASTER, STANDBY, DISCOVERING, ...;
        "" without an answer."""
        found = re.search(r"SMINFO_(\w+)", self._diag("sminfo", "-D", self._route(self.sms.index(sm) + 1)))
        return found.group(1) if found else ""

    def _port_info(self, switch_port: int, field: str) -> Optional[int]:
        out = self._diag("smpquery", "-D", "portinfo", self._route(switch_port), "1")
        found = re.search(rf"^{field}:\.+(\d+)$", out, re.MULTILINE)
        return int(found.group(1)) if found else None

    def sm_lid(self, sm: str) -> Optional[int]:
        return self._port_info(self.sms.index(sm) + 1, "Lid")

    def sm_lids(self) -> dict[int, Optional[int]]:
        """port GUID -> the SM LID its port has (smpquery portinfo): the master that last
        configured it."""
        return {g: self._port_info(len(self.sms) + 1 + i, "SMLid") for i, g in enumerate(self.port_guids)}

    def pkeys(self) -> dict[int, list[int]]:
        """port GUID -> its port's PKey table as the fabric has it (smpquery pkeys), empty
        entries left out."""
        def table(switch_port: int) -> list[int]:
            out = self._diag("smpquery", "-D", "pkeys", self._route(switch_port), "1")
            return sorted(int(x, 16) for x in re.findall(r"0x[0-9a-f]{4}", out) if int(x, 16) & 0x7FFF)
        return {g: table(len(self.sms) + 1 + i) for i, g in enumerate(self.port_guids)}
