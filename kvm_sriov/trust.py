"""Could another user have changed this path?

Root (Puppet, an administrator) runs the admin CLI, so anything it reads
code or commands from must be out of other users' reach: owned by root or
the running user all the way from ``/``, and writable by nobody else (group
root counts as administrators; a sticky directory like /var/tmp is fine
*above* the path: others cannot replace what a trusted user made in it).
bin/kvm-sriov applies the same rule to the library before it can import this.
"""

from __future__ import annotations

import os
import stat


def untrusted(path: os.PathLike | str) -> str:
    """Why another user could have changed ``path`` ('' if nobody could)."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    trusted_uids = {0, os.geteuid()}
    for i in range(1, len(parts) + 1):
        here = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.lstat(here)
        except OSError as exc:
            return f"{here}: {exc.strerror}"
        if st.st_uid not in trusted_uids:
            return f"{here} is owned by uid {st.st_uid}"
        writers = 0o002 if st.st_gid == 0 else 0o022
        sticky_above = i < len(parts) and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & writers and not sticky_above:
            return f"{here} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""
