"""What the harness knows about OSU micro-benchmarks 7.4 (MPI part): every
benchmark's title line, its family, how many ranks it takes and which
options it accepts.

Titles are OSU's "# OSU MPI<accel> <what> Test v<version>" with the
accelerator suffix (-CUDA, -ROCM, ...) removed. A few titles are printed by
two programs (osu_alltoallw and osu_neighbor_alltoallw; osu_bw and the
congestion tests); the first name is the default, the runner and the file
name pick another.
"""
from __future__ import annotations

import re

# family -> how ranks are placed
#   pair:       exactly 2 ranks (osu_latency, one-sided ...): placed explicitly
#   multi-pair: rank i talks to rank i + n/2 (osu_multi_lat, osu_mbw_mr)
#   collective: every rank (blocking, non-blocking, persistent, neighbourhood)
#   startup:    every rank, no message sizes
PAIR, MULTI_PAIR, COLLECTIVE, NBC, STARTUP = "pair", "multi-pair", "collective", "nbc", "startup"

# name -> (title without accelerator/version, family)
BENCHMARKS = {
    # point-to-point
    "osu_latency": ("MPI Latency", PAIR),
    "osu_bw": ("MPI Bandwidth", PAIR),
    "osu_bibw": ("MPI Bi-Directional Bandwidth", PAIR),
    "osu_latency_mt": ("MPI Multi-threaded Latency", PAIR),
    "osu_latency_mp": ("MPI Multi-process Latency", PAIR),
    "osu_latency_persistent": ("MPI Latency Persistent", PAIR),
    "osu_bw_persistent": ("MPI Bandwidth Persistent", PAIR),
    "osu_bibw_persistent": ("MPI Bi-Directional Bandwidth Persistent", PAIR),
    "osu_multi_lat": ("MPI Multi Latency", MULTI_PAIR),
    "osu_mbw_mr": ("MPI Multiple Bandwidth / Message Rate", MULTI_PAIR),
    # congestion tests: need ranks on more than one node; same title as osu_bw
    "osu_bw_fan_in": ("MPI Bandwidth", COLLECTIVE),
    "osu_bw_fan_out": ("MPI Bandwidth", COLLECTIVE),
    # one-sided (exactly 2 ranks)
    "osu_put_latency": ("MPI_Put Latency", PAIR),
    "osu_get_latency": ("MPI_Get latency", PAIR),
    "osu_put_bw": ("MPI_Put Bandwidth", PAIR),
    "osu_get_bw": ("MPI_Get Bandwidth", PAIR),
    "osu_put_bibw": ("MPI_Put Bi-directional Bandwidth", PAIR),
    "osu_acc_latency": ("MPI_Accumulate latency", PAIR),
    "osu_cas_latency": ("MPI_Compare_and_swap latency", PAIR),
    "osu_fop_latency": ("MPI_Fetch_and_op latency", PAIR),
    "osu_get_acc_latency": ("MPI_Get_accumulate latency", PAIR),
    # blocking collectives
    "osu_allgather": ("MPI Allgather Latency", COLLECTIVE),
    "osu_allgatherv": ("MPI Allgatherv Latency", COLLECTIVE),
    "osu_allreduce": ("MPI Allreduce Latency", COLLECTIVE),
    "osu_alltoall": ("MPI All-to-All Personalized Exchange Latency", COLLECTIVE),
    "osu_alltoallv": ("MPI All-to-Allv Personalized Exchange Latency", COLLECTIVE),
    "osu_alltoallw": ("MPI All-to-Allw Personalized Exchange Latency", COLLECTIVE),
    "osu_barrier": ("MPI Barrier Latency", COLLECTIVE),
    "osu_bcast": ("MPI Broadcast Latency", COLLECTIVE),
    "osu_gather": ("MPI Gather Latency", COLLECTIVE),
    "osu_gatherv": ("MPI Gatherv Latency", COLLECTIVE),
    "osu_reduce": ("MPI Reduce Latency", COLLECTIVE),
    "osu_reduce_scatter": ("MPI Reduce_scatter Latency", COLLECTIVE),
    "osu_reduce_scatter_block": ("MPI Reduce_scatter_block Latency", COLLECTIVE),
    "osu_scatter": ("MPI Scatter Latency", COLLECTIVE),
    "osu_scatterv": ("MPI Scatterv Latency", COLLECTIVE),
    "osu_neighbor_allgather": ("MPI Neighborhood Allgather Latency", COLLECTIVE),
    "osu_neighbor_allgatherv": ("MPI Neighborhood Allgatherv Latency", COLLECTIVE),
    "osu_neighbor_alltoall": ("MPI Neighborhood Alltoall Latency", COLLECTIVE),
    "osu_neighbor_alltoallv": ("MPI Neighborhood All-to-Allv Latency", COLLECTIVE),
    # OSU 7.4 prints osu_alltoallw's title for this one
    "osu_neighbor_alltoallw": ("MPI All-to-Allw Personalized Exchange Latency", COLLECTIVE),
    # persistent collectives
    "osu_allgather_persistent": ("MPI Allgather Persistent Latency", COLLECTIVE),
    "osu_allgatherv_persistent": ("MPI Allgatherv Persistent Latency", COLLECTIVE),
    "osu_allreduce_persistent": ("MPI Allreduce Persistent Latency", COLLECTIVE),
    "osu_alltoall_persistent": ("MPI All-to-All Personalized Exchange Persistent Latency", COLLECTIVE),
    "osu_alltoallv_persistent": ("MPI All-to-Allv Personalized Exchange Persistent Latency", COLLECTIVE),
    "osu_alltoallw_persistent": ("MPI All-to-Allw Personalized Exchange Persistent Latency", COLLECTIVE),
    "osu_barrier_persistent": ("MPI Barrier Persistent Latency", COLLECTIVE),
    "osu_bcast_persistent": ("MPI Broadcast Persistent Latency", COLLECTIVE),
    "osu_gather_persistent": ("MPI Gather Persistent Latency", COLLECTIVE),
    "osu_gatherv_persistent": ("MPI Gatherv Persistent Latency", COLLECTIVE),
    "osu_reduce_persistent": ("MPI Reduce Persistent Latency", COLLECTIVE),
    "osu_reduce_scatter_persistent": ("MPI Reduce_scatter Persistent Latency", COLLECTIVE),
    "osu_scatter_persistent": ("MPI Scatter Persistent Latency", COLLECTIVE),
    "osu_scatterv_persistent": ("MPI Scatterv Persistent Latency", COLLECTIVE),
    # non-blocking collectives
    "osu_iallgather": ("MPI Non-blocking Allgather Latency", NBC),
    "osu_iallgatherv": ("MPI Non-blocking Allgatherv Latency", NBC),
    "osu_iallreduce": ("MPI Non-blocking Allreduce Latency", NBC),
    "osu_ialltoall": ("MPI Non-blocking All-to-All Latency", NBC),
    "osu_ialltoallv": ("MPI Non-blocking All-to-Allv Personalized Exchange Latency", NBC),
    "osu_ialltoallw": ("MPI Non-blocking All-to-Allw Personalized Exchange Latency", NBC),
    "osu_ibarrier": ("MPI Non-blocking Barrier Latency", NBC),
    "osu_ibcast": ("MPI Non-Blocking Broadcast Latency", NBC),
    "osu_igather": ("MPI Non-blocking Gather Latency", NBC),
    "osu_igatherv": ("MPI Non-blocking Gatherv Latency", NBC),
    "osu_ireduce": ("MPI Non-blocking Reduce Latency", NBC),
    "osu_ireduce_scatter": ("MPI Non-blocking Reduce_scatter Latency", NBC),
    "osu_ireduce_scatter_block": ("MPI Non-blocking Reduce_scatter_block Latency", NBC),
    "osu_iscatter": ("MPI Non-blocking Scatter Latency", NBC),
    "osu_iscatterv": ("MPI Non-blocking Scatterv Latency", NBC),
    "osu_ineighbor_allgather": ("MPI Non-blocking Neighborhood Allgather Latency", NBC),
    "osu_ineighbor_allgatherv": ("MPI Non-blocking Neighborhood Allgatherv Latency", NBC),
    "osu_ineighbor_alltoall": ("MPI Non-blocking Neighborhood Alltoall Latency", NBC),
    "osu_ineighbor_alltoallv": ("MPI Non-blocking Neighborhood Alltoallv Latency", NBC),
    "osu_ineighbor_alltoallw": ("MPI Non-blocking Neighborhood Alltoallw Latency", NBC),
    # start-up
    "osu_init": ("MPI Init", STARTUP),
    "osu_hello": ("MPI Hello World", STARTUP),
}

# Programs the harness does not run (their title is still recognised):
# osu_hello measures nothing; the congestion tests need ranks on > 1 node
# and were never run here.
NOT_RUN = {"osu_hello": "prints no measurement (osu_init times start-up)",
           "osu_bw_fan_in": "congestion test, needs several nodes per side (not validated)",
           "osu_bw_fan_out": "congestion test, needs several nodes per side (not validated)"}
RUNNABLE = tuple(n for n in BENCHMARKS if n not in NOT_RUN)

_TITLE = re.compile(r"OSU (MPI(?:_[A-Za-z_]{1,32}?)?)(?:-[A-Z]{1,16})? (.{1,128}?) Test(?: v(\S{1,32}))?$")
_BY_TITLE: dict = {}
for _name, (_title, _family) in BENCHMARKS.items():
    _BY_TITLE.setdefault(_title.lower(), []).append(_name)


def parse_title(body):
    """A title line body ("OSU MPI-CUDA Latency Test v7.4") -> (title key,
    version), or None when it is not an OSU title line at all."""
    m = _TITLE.match(body.strip())
    if not m:
        return None
    return f"{m.group(1)} {m.group(2)}", m.group(3)


def names_for_title(title):
    """Benchmarks that print this title ([] when OSU 7.4 has no such title)."""
    return list(_BY_TITLE.get(title.lower(), []))


def family(name):
    return BENCHMARKS[name][1]


# Options as OSU 7.4's option parser accepts them, measured on the 7.4 build
# (anything else prints "Invalid option" and the usage): -f only for
# collectives; -W only where there is a window; -c not for barriers nor most
# one-sided tests; osu_init takes none.
_WINDOW = {"osu_bw", "osu_bibw", "osu_mbw_mr", "osu_bw_persistent", "osu_bibw_persistent",
           "osu_put_bw", "osu_get_bw", "osu_put_bibw"}
_NO_VALIDATE = {"osu_barrier", "osu_ibarrier", "osu_barrier_persistent", "osu_put_latency",
                "osu_get_latency", "osu_put_bw", "osu_get_bw", "osu_put_bibw", "osu_get_acc_latency"}
_NO_SIZE = {"osu_barrier", "osu_ibarrier", "osu_barrier_persistent"}   # -m accepted, ignored


def has_sizes(name):
    return family(name) != STARTUP and name not in _NO_SIZE


def accepts(name, option):
    fam = family(name)
    if fam == STARTUP:
        return False
    if option == "-f":
        return fam in (COLLECTIVE, NBC)
    if option == "-W":
        return name in _WINDOW
    if option == "-c":
        return name not in _NO_VALIDATE
    return option in ("-m", "-i", "-x", "-z")
