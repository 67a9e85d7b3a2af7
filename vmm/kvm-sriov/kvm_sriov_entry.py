"""Shared start of every action script: find the kvm_sriov library, run.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REMOTES = HERE.parent.parent  # remotes/vmm/kvm-sriov -> remotes/ (or the checkout)

for candidate in (HERE / "lib", REMOTES):
    if (candidate / "kvm_sriov" / "__init__.py").is_file():
        sys.path.insert(0, str(candidate))
        break


def run(action: str) -> None:
    from kvm_sriov.actions import main
    sys.exit(main(action, sys.argv[1:], remotes_dir=REMOTES))


def run_peer() -> None:
    from kvm_sriov.peer import main
    sys.exit(main(sys.argv[1:], remotes_dir=REMOTES))
