"""Start a simulated host's daemons under a prompt zombie reaper.

libvirtd and virtlogd daemonize, and QEMU is daemonized by libvirtd, so on
exit they are re-parented to init. On a real host that is systemd, which
reaps at once; the sandbox init this repository's tests may run under reaps
orphans only every 1-2 s. libvirt's destroy, save and migrate wait until the
QEMU process is really gone, so that lag added 1-2 s (in 0.2 s steps) to
each of them: slower tests and noise in bench/actions_bench.py that has
nothing to do with the driver. A child subreaper (prctl
PR_SET_CHILD_SUBREAPER) adopts those orphans instead and reaps them at once.

    python3 simhost/reaper.py CMD ...

runs CMD (which starts daemons and exits), prints one JSON line
{"rc", "stdout", "stderr"} and closes stdout, then reaps until no
descendant is left.
"""

import ctypes
import json
import os
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(cmd: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(json.dumps({"rc": 127, "stdout": "", "stderr": "prctl(PR_SET_CHILD_SUBREAPER) failed: "
                          + os.strerror(ctypes.get_errno())}), flush=True)
        return 1
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    print(json.dumps({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}), flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # let go of the caller's pipes
        os.dup2(devnull, fd)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
