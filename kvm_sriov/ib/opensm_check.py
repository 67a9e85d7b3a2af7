"""Ask the real opensm whether it accepts a partitions file, before it is
put in place.

opensm has no parse-only mode and, on a file it cannot parse, logs ``PARSE
ERROR`` and falls back to its default partition (every port a full member of
0xffff: no tenant isolation). So the candidate is parsed by opensm itself,
sweeping a private one-switch fabric simulated by ibsim: umad2sim
(LD_PRELOAD) replaces the umad devices, so the node's real fabric is never
touched. Accepted means the sweep reached ``SUBNET UP`` with no parse error.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from ..errors import DriverError

UMAD2SIM = ("/usr/lib/*/umad2sim/libumad2sim.so", "/usr/lib64/umad2sim/libumad2sim.so",
            "/usr/lib/umad2sim/libumad2sim.so")
PACKAGES = "opensm, ibsim-utils and libumad2sim0 (RHEL: opensm, ibsim)"
REJECTED = ("PARSE ERROR", "retrying with default config")
NETFILE = 'Switch\t8 "sw"\n[1]\t"sm"[1]\n\nHca\t1 "sm"\n[1]\t"sw"[1]\n'


class Verdict(NamedTuple):
    accepted: bool
    errors: list[str]   # opensm's own lines about the file


def _umad2sim() -> str:
    return next((p for pattern in UMAD2SIM for p in sorted(glob.glob(pattern))), "")


def available() -> bool:
    return bool(shutil.which("opensm") and shutil.which("ibsim") and _umad2sim())


def check_text(text: str, timeout: float = 60) -> Verdict:
    if not available():
        raise DriverError(f"cannot check partitions.conf with opensm: install {PACKAGES}")
    with tempfile.TemporaryDirectory(prefix="kvm-sriov-opensm.") as tmp:
        work = Path(tmp)
        (work / "net").write_text(NETFILE)
        (work / "opensm.conf").write_text("")      # opensm's defaults, not this node's options
        conf = work / "partitions.conf"
        conf.write_text(text)
        log = work / "opensm.log"
        # a name nobody can guess: another user cannot attach to this fabric
        env = dict(os.environ, IBSIM_SOCKNAME=f"kvm-sriov-{os.getpid()}-{os.urandom(6).hex()}")
        sim = subprocess.Popen(["ibsim", "-n", "-s", "net"], cwd=work, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            if sim.poll() is not None:
                raise DriverError("cannot check partitions.conf: ibsim did not start")
            subprocess.run(["opensm", "-F", str(work / "opensm.conf"), "-P", str(conf), "-f", str(log),
                            "-s", "0", "-o"], cwd=work, capture_output=True, timeout=timeout, check=False,
                           env=dict(env, LD_PRELOAD=_umad2sim(), SIM_HOST="sm",
                                    OSM_TMP_DIR=tmp, OSM_CACHE_DIR=tmp))
        except subprocess.TimeoutExpired:
            raise DriverError(f"cannot check partitions.conf: opensm did not finish in {timeout:.0f} s") from None
        finally:
            sim.terminate()
            sim.wait(timeout=10)
        out = log.read_text(errors="replace") if log.exists() else ""
    errors = [line.strip() for line in out.splitlines() if any(r in line for r in REJECTED)]
    if not errors and "SUBNET UP" not in out:
        raise DriverError("cannot check partitions.conf: opensm's sweep of the simulated fabric "
                          "did not come up: " + " | ".join(out.strip().splitlines()[-3:]))
    return Verdict(not errors, errors)
