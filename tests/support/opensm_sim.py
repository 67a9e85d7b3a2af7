"""Run the real opensm (Debian package) against an ibsim-simulated fabric.

One switch, the SM's own CA on port 1 and one single-port CA per port GUID
on the next ports. opensm sweeps once (-o), parses the partitions file and
programs every port's PKey table, which smpquery then reads back. ibsim
(ibsim-utils) and its LD_PRELOAD library (libumad2sim0) replace the kernel's
umad devices, so no InfiniBand hardware or kernel module is needed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

UMAD2SIM = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"


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


def run(workdir: Path, partitions_conf: str, port_guids: list[int]) -> dict:
    """-> {"pkeys": {port GUID: [pkey, ...]}, "sm_pkeys": [...], "log": opensm log text}"""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "net").write_text(_netfile(port_guids))
    conf = workdir / "partitions.conf"
    conf.write_text(partitions_conf)
    sim = subprocess.Popen(["ibsim", "-n", "-s", "net"], cwd=workdir,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, LD_PRELOAD=UMAD2SIM, SIM_HOST="sm",
               OSM_TMP_DIR=str(workdir), OSM_CACHE_DIR=str(workdir))
    try:
        time.sleep(0.5)
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
        sim.terminate()
        sim.wait(timeout=10)
    return result
