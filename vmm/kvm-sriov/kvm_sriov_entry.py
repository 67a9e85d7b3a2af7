"""Shared start of every action script: find the kvm_sriov library, run.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree. Only
modules built into the interpreter here (posix, not os): start-up is paid by
every action (see kvm_sriov/warmstart_client.py). The scripts run python3
-S: handing a call to the warm-start server needs no site packages (they
cost ~10 ms); an action run in the script loads them.
"""

import posix
import sys

# Python found this file in the script's directory with symlinks resolved
# (sys.path[0]), so this is where it really is.
HERE = __file__.rpartition("/")[0]
REMOTES = HERE.rpartition("/")[0].rpartition("/")[0]  # remotes/vmm/kvm-sriov -> remotes/ (or the checkout)

for candidate in (HERE + "/lib", REMOTES):
    try:
        posix.stat(candidate + "/kvm_sriov/__init__.py")
    except OSError:
        continue
    sys.path.insert(0, candidate)
    break


def run(action: str) -> None:
    from kvm_sriov import warmstart_client
    sys.exit(warmstart_client.run(action, sys.argv[1:], REMOTES))


def run_peer() -> None:
    from kvm_sriov import warmstart_client
    sys.exit(warmstart_client.run(warmstart_client.PEER, sys.argv[1:], REMOTES))
