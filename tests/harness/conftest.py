import os
import shutil

import pytest

from harness_paths import ROOT  # noqa: E402  (also puts the repo on sys.path)


@pytest.fixture
def mpi_env(monkeypatch):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun not installed (rake test:harness installs openmpi-bin)")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "lo")
    monkeypatch.setenv("OMPI_MCA_oob_tcp_if_include", "lo")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
