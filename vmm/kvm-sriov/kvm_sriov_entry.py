"""Shared start of every action script: find the kvm_sriov library, run.

The library travels with OpenNebula's remotes (installed next to this file
in lib/), and in a source checkout it is at the top of the tree. The scripts
start with python3 -S, so nothing outside the standard library is imported
(and no .pth file run) before the check below; the site packages
(python3-libvirt) are added once it has passed.

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
    import site
    site.main()
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
