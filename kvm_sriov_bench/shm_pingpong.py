"""Inter-VM ping-pong through an ivshmem region vs over the network.

``shm_pingpong.c`` (next to this file) is one static binary doing the same
8-byte round trip either through the shared region (the guest's sysfs
``resource2`` of the ivshmem-plain device, mmap'd) or over TCP; role 0
prints ``shm-pingpong: <shm|tcp> iterations N avg_rtt_us X``. The rung-2
test (tests/ivshmem/test_ivshmem_pingpong.py) runs both between two
co-resident VMs and reports the ratio next to the paper's (003: 64 B
latency 0.20 µs via IVShmem vs 0.96 µs over the SR-IOV VF).

    python3 -m kvm_sriov_bench.shm_pingpong build DEST     # compile (gcc -static)
    python3 -m kvm_sriov_bench.shm_pingpong report LOG...  # the ratio from guests' output
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("shm_pingpong.c")
# the C program's printf("... iterations %ld avg_rtt_us %.3f"); read from a guest's console, so bounded
LINE = re.compile(r"shm-pingpong: (shm|tcp) iterations (\d{1,18}) avg_rtt_us (\d{1,12}\.\d{3})\b")
# ../shared/reference/003: one-way 64 B latency, perftest IB send over the VF vs IVShmem
PAPER_US = {"shm": 0.20, "network": 0.96}


def build(dest_dir: Path) -> Path:
    """The static binary, compiled once per source version."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = Path(dest_dir) / f"shm-pingpong-{digest}"
    if out.exists():
        return out
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc is needed to build the ping-pong (apt-get install gcc libc6-dev)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(tmp), str(SOURCE)], check=True,
                   capture_output=True)
    tmp.replace(out)
    return out


def parse(text: str) -> dict:
    """kind -> (iterations, average round trip in µs); the last line of each kind wins
    (a round trip of 0 µs is no measurement and left out)."""
    return {m.group(1): (int(m.group(2)), float(m.group(3))) for m in LINE.finditer(text)
            if float(m.group(3)) > 0}


def report(results: dict) -> str:
    shm, tcp = results["shm"][1], results["tcp"][1]
    paper = PAPER_US["network"] / PAPER_US["shm"]
    return "\n".join([
        "inter-VM ping-pong, 8 B round trip, two co-resident VMs (rung 2: QEMU TCG, 2 shared cores)",
        f"  {'path':<34}{'avg RTT (us)':>14}",
        f"  {'ivshmem region (BAR2 mmap)':<34}{shm:>14.2f}",
        f"  {'network (virtio-net over udp, TCP)':<34}{tcp:>14.2f}",
        f"  network / shared memory = {tcp / shm:.1f}x   (paper 003, 64 B one-way on real "
        f"hardware: IB VF {PAPER_US['network']} us / IVShmem {PAPER_US['shm']} us = {paper:.1f}x)",
    ])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "build":
        print(build(Path(argv[1])))
        return 0
    if len(argv) >= 2 and argv[0] == "report":
        results = {}
        for path in argv[1:]:
            results.update(parse(Path(path).read_text(errors="replace")))
        if set(results) != {"shm", "tcp"}:
            print(f"need both a shm and a tcp result, got {sorted(results)}", file=sys.stderr)
            return 1
        print(report(results))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
