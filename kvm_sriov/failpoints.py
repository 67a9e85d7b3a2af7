"""Named points inside multi-step actions where tests kill the process.

``KVM_SRIOV_KILL_AT=save:detached`` makes the action SIGKILL itself when it
reaches that point, exactly as a crash or `kill -9` would, so the tests can
prove that reconcile converges from every step. Unset, this is a no-op.
"""

import os
import signal

ENV = "KVM_SRIOV_KILL_AT"


def reached(action: str, point: str) -> None:
    if os.environ.get(ENV) == f"{action}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)
