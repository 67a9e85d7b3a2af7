"""A small MPI ping-pong (mpi4py) that prints osu_latency's 7.x format.

Used where OSU is not installed (CI, laptops) to exercise the whole
pipeline — launcher, parser, statistics — on a real MPI run:

    mpirun -np 2 python3 -m kvm_sriov_bench.pingpong -m 1:4096 -i 1000 -x 100 -z

The per-iteration round trips give the P50/P90/P99 columns like ``-z``.
"""
from __future__ import annotations

import argparse
import sys


def _sizes(spec):
    lo, _, hi = spec.partition(":") if ":" in spec else ("1", None, spec)
    lo, hi = int(lo or 1), int(hi)
    s = max(lo, 1)
    out = [0] if lo == 0 else []
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kvm_sriov_bench.pingpong")
    ap.add_argument("-m", default="1:4096", help="[MIN:]MAX message size")
    ap.add_argument("-i", type=int, default=1000, help="timed iterations")
    ap.add_argument("-x", type=int, default=100, help="warm-up iterations")
    ap.add_argument("-z", action="store_true", help="print P50/P90/P99 columns")
    a = ap.parse_args(argv)
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        if rank == 0:
            print("This test requires exactly two processes", file=sys.stderr)
        return 1
    peer = 1 - rank
    if rank == 0:
        print("\n# kvm-sriov-bench MPI ping-pong (mpi4py), osu_latency format")
        print("# Datatype: MPI_CHAR.")
        cols = "# Size       Avg Latency(us)"
        if a.z:
            cols += "  P50 Tail Lat(us)  P90 Tail Lat(us)  P99 Tail Lat(us)"
        print(cols, flush=True)
    for size in _sizes(a.m):
        buf = bytearray(size)
        times = np.empty(a.i)
        comm.Barrier()
        for it in range(a.x + a.i):
            t0 = MPI.Wtime()
            if rank == 0:
                comm.Send([buf, MPI.BYTE], dest=peer, tag=1)
                comm.Recv([buf, MPI.BYTE], source=peer, tag=1)
            else:
                comm.Recv([buf, MPI.BYTE], source=peer, tag=1)
                comm.Send([buf, MPI.BYTE], dest=peer, tag=1)
            if it >= a.x:
                times[it - a.x] = MPI.Wtime() - t0
        if rank == 0:
            one_way = times * 1e6 / 2.0
            line = f"{size:<10d}{one_way.mean():>18.2f}"
            if a.z:
                for q in (50, 90, 99):
                    line += f"{np.percentile(one_way, q):>18.2f}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
