"""HPL.dat (and hpcc's hpccinf.txt) generation from N/NB/P/Q.

HPL.dat has a fixed 31-line layout; hpccinf.txt is the same 31 lines plus
a separator and the PTRANS sizes. When N is not given it is sized from
memory: the N x N double matrix takes ``fraction`` of the total memory of
the nodes, rounded down to a multiple of NB. P x Q is the most square grid
with P <= Q for the rank count.
"""
from __future__ import annotations

import math
import re

from .errors import HarnessError


def grid(ranks):
    """Most square P x Q with P <= Q and P*Q == ranks."""
    if ranks < 1:
        raise HarnessError("HPL needs at least one rank")
    p = int(math.isqrt(ranks))
    while ranks % p:
        p -= 1
    return p, ranks // p


def mem_total_bytes(meminfo="/proc/meminfo"):
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise HarnessError(f"no MemTotal in {meminfo}")


def size_from_memory(mem_bytes_per_node, nodes=1, nb=192, fraction=0.8):
    """Largest N (multiple of NB) whose matrix fits ``fraction`` of the memory."""
    if not 0 < fraction <= 0.95:
        raise HarnessError("memory fraction must be in (0, 0.95]")
    total = mem_bytes_per_node * nodes * fraction
    n = int(math.sqrt(total / 8.0))
    n -= n % nb
    if n < nb:
        raise HarnessError(f"not enough memory for one {nb}x{nb} block")
    return n


def _field(values, label):
    v = " ".join(str(x) for x in values)
    if len(values) > 1 or len(v) >= 13:
        return v + "  " + label
    return v.ljust(13) + label


def hpl_dat(ns, nbs, p, q, output="HPL.out", device=6, threshold=16.0,
            pfact=2, nbmin=4, ndiv=2, rfact=1, bcast=1, depth=1, swap=2,
            swap_threshold=64, pmap=0):
    ns = [int(n) for n in (ns if isinstance(ns, (list, tuple)) else [ns])]
    nbs = [int(nb) for nb in (nbs if isinstance(nbs, (list, tuple)) else [nbs])]
    if not ns or not nbs or min(ns) < 1 or min(nbs) < 1 or p < 1 or q < 1:
        raise HarnessError("HPL.dat needs N >= 1, NB >= 1, P >= 1, Q >= 1")
    lines = [
        "HPLinpack benchmark input file",
        "Innovative Computing Laboratory, University of Tennessee",
        _field([output], "output file name (if any)"),
        _field([device], "device out (6=stdout,7=stderr,file)"),
        _field([len(ns)], "# of problems sizes (N)"),
        _field(ns, "Ns"),
        _field([len(nbs)], "# of NBs"),
        _field(nbs, "NBs"),
        _field([pmap], "PMAP process mapping (0=Row-,1=Column-major)"),
        _field([1], "# of process grids (P x Q)"),
        _field([p], "Ps"),
        _field([q], "Qs"),
        _field([threshold], "threshold"),
        _field([1], "# of panel fact"),
        _field([pfact], "PFACTs (0=left, 1=Crout, 2=Right)"),
        _field([1], "# of recursive stopping criterium"),
        _field([nbmin], "NBMINs (>= 1)"),
        _field([1], "# of panels in recursion"),
        _field([ndiv], "NDIVs"),
        _field([1], "# of recursive panel fact."),
        _field([rfact], "RFACTs (0=left, 1=Crout, 2=Right)"),
        _field([1], "# of broadcast"),
        _field([bcast], "BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)"),
        _field([1], "# of lookahead depth"),
        _field([depth], "DEPTHs (>=0)"),
        _field([swap], "SWAP (0=bin-exch,1=long,2=mix)"),
        _field([swap_threshold], "swapping threshold"),
        _field([0], "L1 in (0=transposed,1=no-transposed) form"),
        _field([0], "U  in (0=transposed,1=no-transposed) form"),
        _field([1], "Equilibration (0=no,1=yes)"),
        _field([8], "memory alignment in double (> 0)"),
    ]
    return "\n".join(lines) + "\n"


def hpcc_inf(ns, nbs, p, q, **kw):
    """hpccinf.txt: HPL.dat (device 8 = hpcc's own output) + PTRANS lines."""
    kw.setdefault("device", 8)
    body = hpl_dat(ns, nbs, p, q, **kw)
    return body + (
        "##### This line (no. 32) is ignored (it serves as a separator). ######\n"
        "0                      \t\tNumber of additional problem sizes for PTRANS\n"
        "1200 10000 30000        \tvalues of N\n"
        "0                       \tnumber of additional blocking sizes for PTRANS\n"
        "40 9 8 13 13 20 16 32 64       \tvalues of NB\n")


def read_hpl_dat(text):
    """The main fields of an HPL.dat: {'Ns': [...], 'NBs': [...], 'Ps': [...], 'Qs': [...]}."""
    lines = text.splitlines()
    if len(lines) < 31 or not lines[0].startswith("HPLinpack benchmark input file"):
        raise HarnessError("not an HPL.dat (31-line layout)")

    def ints(i, count):
        vals = re.findall(r"-?\d+", lines[i])[:count]
        if len(vals) != count:
            raise HarnessError(f"HPL.dat line {i + 1}: expected {count} values")
        return [int(v) for v in vals]

    nn = ints(4, 1)[0]
    nnb = ints(6, 1)[0]
    ngrid = ints(9, 1)[0]
    return {"Ns": ints(5, nn), "NBs": ints(7, nnb), "Ps": ints(10, ngrid), "Qs": ints(11, ngrid),
            "device": ints(3, 1)[0]}
