"""Rung 4 of shared memory: a real OpenNebula 7.4 front-end of its own
(build/rung4-ivshmem: never tests/opennebula's folder, which another run may
be using) with two simulated hosts and the driver installed as an operator
does (simhost.frontend)."""

import shutil

import pytest

from simhost.frontend import FrontEnd
from tests.conftest import REPO
from tests.opennebula.conftest import KVMRC, fake_sysfs
from tests.sched.sched_frontend import running

WORK = REPO / "build" / "rung4-ivshmem"


@pytest.fixture(scope="session")
def frontend(request):
    shutil.rmtree(WORK, ignore_errors=True)
    config = {name: {"sysfs": {"root": str(fake_sysfs(WORK / "sysfs" / name, 1))}} for name in ("host1", "host2")}
    with running(FrontEnd(WORK / "fe", ["host1", "host2"], host_config=config, kvmrc=KVMRC),
                 REPO / "build" / "test-logs" / "ivshmem-oned", lambda: request.session.testsfailed) as fe:
        yield fe
