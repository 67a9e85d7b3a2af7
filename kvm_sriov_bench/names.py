"""What the command line offers before anything runs: kept apart from
runners (subprocess, threading, dataclasses, the parsers), which
``analyze``, ``report`` and ``parse`` do not need to import."""

# Where the two ranks of a pair benchmark go (osu_latency, osu_bw, one-sided...):
#   inter-host: the first node (VM) of the first host and of the second host
#   same-host:  the first two nodes (VMs) of the first host (bare metal: 2 ranks on it)
PLACEMENTS = ("inter-host", "same-host")
PERFTEST = ("ib_write_lat", "ib_read_lat", "ib_send_lat", "ib_atomic_lat",
            "ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw")
