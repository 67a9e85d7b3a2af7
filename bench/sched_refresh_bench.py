#!/usr/bin/python3
"""Fresh counts: time from a change of a host's VF pool to the new
KVM_SRIOV_FREE_VFS in oned (`onehost show`), on a real OpenNebula 7.4
front-end with one simulated host (simhost.frontend; fake sysfs, 4 VFs).

Each round takes a VF through the driver's Host (the path every action
takes) and gives it back with `kvm-sriov reconcile`; both end in
Host.close(), which signals the host's monitord client (kvm_sriov/monitor.py).
Without that signal the count would wait for the next system probe
(PROBES_PERIOD/SYSTEM_HOST, 600 s by default). Verdict: the slowest of all
changes <= --limit seconds (5).
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simhost.frontend import OpenNebulaMissing  # noqa: E402
from tests.sched.sched_frontend import SchedFrontEnd, fake_host, reconcile, take_vf, wait_free_vfs  # noqa: E402
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)

VFS = 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--limit", type=float, default=5.0)
    add_strict(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-refresh-") as tmp:
        work = Path(tmp)
        root = fake_host(work / "sysfs", [("0000:03:00.0", "ib0", "mlx5_0", 0, VFS)])
        fe = SchedFrontEnd(work / "fe", ["host1"], host_config={"host1": {"sysfs": {"root": str(root)}}})
        try:
            fe.start()
        except OpenNebulaMissing as exc:
            print(f"bench-sched-refresh: cannot run without OpenNebula: {exc}")
            return 1
        try:
            wait_free_vfs(fe, "host1", VFS, timeout=120)
            taken, given = [], []
            for r in range(args.rounds):
                take_vf(fe, "host1", 900 + r)
                taken.append(wait_free_vfs(fe, "host1", VFS - 1, timeout=60))
                reconcile(fe, "host1")
                given.append(wait_free_vfs(fe, "host1", VFS, timeout=60))
                print(f"round {r + 1}: VF taken -> oned {taken[-1]:.2f} s, VF freed -> oned {given[-1]:.2f} s")
        finally:
            fe.stop()
    both = taken + given
    print(f"pool change -> KVM_SRIOV_FREE_VFS in oned: median {statistics.median(both):.2f} s, "
          f"max {max(both):.2f} s (limit {args.limit} s; without the refresh: up to 600 s)")
    misses = [] if max(both) <= args.limit else [f"slowest {max(both):.2f} s > {args.limit} s"]
    return finish("bench-sched-refresh", misses, args.strict)


if __name__ == "__main__":
    sys.exit(main())
