#!/usr/bin/python3
"""Fresh counts: time from a change of a host's VF pool to the new
KVM_SRIOV_FREE_VFS in oned (`onehost show`), on a real OpenNebula 7.4
front-end with one simulated host (simhost.frontend; fake sysfs, 4 VFs).

Each round takes a VF through the driver's Host (the path every action
takes) and gives it back with `kvm-sriov reconcile`; both end in
Host.close(), which signals the host's monitord client to rerun every system
probe (kvm_sriov/node/monitor.py). Without it the count would wait for the next
system probe (PROBES_PERIOD/SYSTEM_HOST, 600 s by default). Each time is
counted from the start of the change on the host (before the driver's
library is even imported) to oned answering one.host.info with the new
count; the way each refresh went is printed with it. Verdict: the slowest of
all changes <= --limit seconds (5).
"""

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simhost.frontend import OpenNebulaMissing  # noqa: E402
from tests.sched.sched_frontend import SchedFrontEnd, fake_host, reconcile, settle, take_vf, wait_free_vfs  # noqa: E402
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
            print(f"monitoring settled {settle(fe, 'host1'):.1f} s after the first count "
                  "(the client's start-up system runs)")
            times, ways = [], Counter()
            for r in range(args.rounds):
                line = f"round {r + 1}:"
                for what, want in (("VF taken", VFS - 1), ("VF freed", VFS)):
                    c = take_vf(fe, "host1", 900 + r) if want < VFS else reconcile(fe, "host1")
                    times.append(wait_free_vfs(fe, "host1", want, timeout=60, since=c.start))
                    ways[c.way] += 1
                    told = c.refresh_start + c.refresh_seconds
                    line += (f" {what} -> oned {times[-1]:.2f} s = action {c.refresh_start - c.start:.2f} s"
                             f" + {c.way} {c.refresh_seconds * 1000:.0f} ms + oned {times[-1] - (told - c.start):.2f} s;")
                print(line)
        finally:
            fe.stop()
    print(f"pool change (start of the change on the host) -> KVM_SRIOV_FREE_VFS in oned: "
          f"median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} changes "
          f"({', '.join(f'{n} {w}' for w, n in ways.items())}; limit {args.limit} s; without the refresh: up to 600 s)")
    misses = [] if max(times) <= args.limit else [f"slowest {max(times):.2f} s > {args.limit} s"]
    return finish("bench-sched-refresh", misses, args.strict)


if __name__ == "__main__":
    sys.exit(main())
