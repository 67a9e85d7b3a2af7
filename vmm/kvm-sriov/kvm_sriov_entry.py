"""Shared start of every action script: find the kvm_sriov library, run.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree. Only
modules built into the interpreter here (posix, not os): start-up is paid by
every action (see kvm_sriov/warmstart_client.py). The scripts run python3
-S: handing a call to the warm-start server needs no site packages (they
cost ~10 ms); an action run in the script loads them.

Every directory on sys.path ahead of the standard library (this one, and
the library's) must be out of other users' reach, or one of them could add
a module there (an os.py, say) that oneadmin would run: owned by root or
this user, writable by nobody else (group root counts as administrators),
sticky or not; its parents may be sticky (/var/tmp): others cannot replace
what this user made in them.
"""

import posix
import sys

# Python found this file in the script's directory with symlinks resolved
# (sys.path[0]), so this is where it really is.
HERE = __file__.rpartition("/")[0]
REMOTES = HERE.rpartition("/")[0].rpartition("/")[0]  # remotes/vmm/kvm-sriov -> remotes/ (or the checkout)


def _untrusted(directory: str) -> str:
    """Why another user could add a module to `directory` ('' if nobody could)."""
    parts = directory.split("/")
    me = posix.geteuid()
    for i in range(1, len(parts) + 1):
        path = "/".join(parts[:i]) or "/"
        st = posix.lstat(path)
        if st.st_uid not in (0, me):
            return f"{path} is owned by uid {st.st_uid}"
        if st.st_mode & 0o170000 != 0o040000:  # a symlink: where it leads was never checked
            return f"{path} is not a directory"
        writers = 0o002 if st.st_gid == 0 else 0o022
        if st.st_mode & writers and not (i < len(parts) and st.st_mode & 0o1000):
            return f"{path} is writable by group or others (mode {st.st_mode & 0o7777:o})"
    return ""


def _refuse(why: str) -> None:
    sys.stderr.write(f"ERROR: kvm-sriov: {why}: refusing to run the driver from there "
                     f"(another user could change the code it runs)\n")
    sys.exit(1)


for candidate in (HERE + "/lib", REMOTES):
    try:
        posix.stat(candidate + "/kvm_sriov/__init__.py")
    except OSError:
        continue
    for directory in (HERE, candidate):  # what sys.path will hold ahead of the standard library
        try:
            problem = _untrusted(directory)
        except OSError as exc:
            problem = f"{directory}: {exc.strerror}"
        if problem:
            _refuse(problem)
    sys.path.insert(0, candidate)
    break


def run(action: str) -> None:
    from kvm_sriov import warmstart_client
    sys.exit(warmstart_client.run(action, sys.argv[1:], REMOTES))


def run_peer() -> None:
    from kvm_sriov import warmstart_client
    sys.exit(warmstart_client.run(warmstart_client.PEER, sys.argv[1:], REMOTES))
