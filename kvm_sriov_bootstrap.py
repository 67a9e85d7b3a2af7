"""The one start of every kvm-sriov program, and its one trust rule.

Each entry point (the action scripts' vmm/kvm-sriov/kvm_sriov_entry.py, the
admin CLI bin/kvm-sriov, the placer sched/kvm-sriov/place, the monitoring
probes im/kvm-probes.d/host/system/kvm_sriov.py and
im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py) imports this module before
anything else and calls load_library(): only then is the kvm_sriov library
on sys.path. The library uses the same untrusted() for every config file.

Where it lives: beside the kvm_sriov package in a source checkout and in the
tools package (/usr/lib/kvm-sriov), and beside the action scripts in
OpenNebula's remotes (<remotes>/vmm/kvm-sriov/). Each entry point finds it at
the top of its own tree (the checkout, /usr/lib/kvm-sriov), else, in the
remotes, in the action scripts' folder: never in the library directory it is
about to check, so a library another user could change is refused before any
of its code runs. Whoever can change the top of the entry's tree could replace
the entry itself; the placer and the probe run as the user the actions run as,
so the actions' folder is theirs as much as their own.

Standard library only; while it is imported, the folders it was looked up in
are still first on sys.path, so nothing is imported at module level (the
action scripts, the placer and the probe start with python3 -S: only builtin
modules are loaded).
"""

import sys


def untrusted(path: str, below: bool = False) -> str:
    """Why another user could have changed `path`, or with below=True anything
    under it ('' if nobody could).

    Every directory from / down to `path`, and `path` itself, must be owned by
    root or the running user and writable by nobody else (group root counts
    as administrators). A sticky directory (/tmp, /var/tmp) is fine above
    `path`: others cannot replace what a trusted user made in it; not as
    `path` or under it: others could add to it. `path` is checked as given,
    so resolve it first (os.path.realpath) and then use what was checked; a
    symbolic link on the way is refused (where it leads was not checked).
    """
    import os
    import stat
    names = path.rstrip("/").split("/")
    chain = ["/".join(names[:i]) or "/" for i in range(1, len(names) + 1)]
    if below:
        chain += [os.path.join(top, name) for top, dirs, files in os.walk(path) for name in dirs + files]
    me = os.geteuid()
    for n, here in enumerate(chain):
        try:
            st = os.lstat(here)
        except OSError as exc:
            return f"{here}: {exc.strerror}"
        if st.st_uid not in (0, me):
            return f"{here} is owned by uid {st.st_uid}"
        if stat.S_ISLNK(st.st_mode):
            return f"{here} is a symbolic link"
        writers = 0o002 if st.st_gid == 0 else 0o022
        above = n < len(names) - 1
        if st.st_mode & writers and not (above and st.st_mode & stat.S_ISVTX):
            return f"{here} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def load_library(folder: str, libraries) -> str:
    """Put the first of `libraries` (directories holding the kvm_sriov
    package) that passes untrusted() first on sys.path: '' once it is there,
    else why not, in one line. The entry point's own `folder` and this
    module must pass first. The caller has taken the folders it found this
    module in off sys.path: os and stat come from the standard library."""
    import os
    mine = os.path.realpath(__file__)
    cached = [c for c in (globals().get("__cached__"),) if c and os.path.exists(c)]  # its bytecode
    for path in (os.path.realpath(folder), os.path.dirname(mine), mine, *map(os.path.realpath, cached)):
        why = untrusted(path)
        if why:
            return why
    problems = []
    for library in libraries:
        real = os.path.realpath(library)  # what is checked is what goes on sys.path
        if not os.path.isfile(os.path.join(real, "kvm_sriov", "__init__.py")):
            problems.append(f"{library}: no kvm_sriov library")
            continue
        why = untrusted(real) or untrusted(os.path.join(real, "kvm_sriov"), below=True)
        if not why:
            sys.path.insert(0, real)
            return ""
        problems.append(why)
    return "no kvm_sriov library that only root or this user can change: " + "; ".join(problems)
