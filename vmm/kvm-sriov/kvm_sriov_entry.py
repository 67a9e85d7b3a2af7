"""Shared start of every action script: find the kvm_sriov library, run.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree. Only os
and sys here: start-up is paid by every action (see kvm_sriov/warmstart.py).
The scripts run python3 -S: handing a call to the warm-start server needs no
site packages (they cost ~10 ms); an action run in the script loads them.
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
REMOTES = os.path.dirname(os.path.dirname(HERE))  # remotes/vmm/kvm-sriov -> remotes/ (or the checkout)

for candidate in (os.path.join(HERE, "lib"), REMOTES):
    if os.path.isfile(os.path.join(candidate, "kvm_sriov", "__init__.py")):
        sys.path.insert(0, candidate)
        break


def run(action: str) -> None:
    from kvm_sriov import warmstart
    sys.exit(warmstart.run(action, sys.argv[1:], REMOTES))


def run_peer() -> None:
    from kvm_sriov import warmstart
    sys.exit(warmstart.run(warmstart.PEER, sys.argv[1:], REMOTES))
