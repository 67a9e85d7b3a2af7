import os
import shutil
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
DATA = os.path.join(os.path.dirname(__file__), "data")
# The shared fixtures sit beside the repository (../shared) in CI.
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "fixtures", "bench"))


def data(name):
    """A fixture: from ../shared/fixtures/bench when present, else our copy."""
    shared = os.path.join(SHARED, name)
    return shared if os.path.exists(shared) else os.path.join(DATA, name)


@pytest.fixture
def mpi_env(monkeypatch):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun not installed (rake test:harness installs openmpi-bin)")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "lo")
    monkeypatch.setenv("OMPI_MCA_oob_tcp_if_include", "lo")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
