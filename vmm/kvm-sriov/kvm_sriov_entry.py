"""Shared start of every action script: the one bootstrap, then the action.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree. The scripts
start with python3 -S, so nothing outside the standard library is imported
(and no .pth file run) before kvm_sriov_bootstrap.load_library() has checked
this folder, itself and the library (kvm_sriov_bootstrap.py says what it
checks and why); the site folders (python3-libvirt) are added afterwards.
"""

import sys

# Python found this file in the script's directory with symlinks resolved
# (sys.path[0]), so this is where it really is.
HERE = __file__.rpartition("/")[0]
REMOTES = HERE.rpartition("/")[0].rpartition("/")[0]  # remotes/vmm/kvm-sriov -> remotes/ (or the checkout)

# The bootstrap: at the top of a checkout, beside this file in the remotes.
sys.path[:1] = [REMOTES, HERE]
try:
    import kvm_sriov_bootstrap
except ImportError as exc:
    sys.exit(f"ERROR: kvm-sriov: {exc} in {REMOTES} or {HERE}: install the driver again")
del sys.path[:2]


def _refuse(why: str) -> None:
    sys.stderr.write(f"ERROR: kvm-sriov: {why}: refusing to run the driver from there "
                     f"(another user could change the code it runs)\n")
    sys.exit(1)


def environment_as_started() -> None:
    """os.environ as OpenNebula started the script. Python's start-up adds
    LC_CTYPE=C.UTF-8 to its own when the locale is C (PEP 538), and every
    child would inherit it: the stock kvm script must see OpenNebula's
    environment, not ours. /proc/self/environ still holds the original
    (setenv never writes there)."""
    import os
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return
    was = dict(os.fsdecode(item).split("=", 1) for item in raw.split(b"\0") if item.find(b"=") > 0)
    for key in [k for k in os.environ if k not in was]:
        del os.environ[key]
    for key, value in was.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _start() -> list:
    why = kvm_sriov_bootstrap.load_library(HERE, [HERE + "/lib", REMOTES])
    if why:
        _refuse(why)
    # Debian's site folders (python3-libvirt) on the path, without site.main():
    # no .pth file or sitecustomize is needed, and running them cost ~7 ms of
    # every action, a VM without VFs included.
    import site
    sys.path.extend(p for p in site.getsitepackages() if p not in sys.path)
    environment_as_started()
    return sys.argv[1:]


def run(action: str) -> None:
    """The action in this process, which a call handed to the stock script becomes."""
    argv = _start()
    from pathlib import Path
    from kvm_sriov.actions import main
    sys.exit(main(action, argv, remotes_dir=Path(REMOTES), replace_process=True))


def run_peer() -> None:
    argv = _start()
    from pathlib import Path
    from kvm_sriov.actions.peer import main
    sys.exit(main(argv, remotes_dir=Path(REMOTES)))
