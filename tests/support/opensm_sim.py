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
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

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


def _start_ibsim(workdir: Path, socket_name: str) -> subprocess.Popen:
    """ibsim serving workdir/net, once it listens (its control socket is bound): no
    sleep that a busy machine outlasts."""
    sim = subprocess.Popen(["ibsim", "-n", "-s", "net"], cwd=workdir, env=dict(os.environ, IBSIM_SOCKNAME=socket_name),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
