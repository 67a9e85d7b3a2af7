import shutil
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent.parent / "support"


@pytest.fixture
def fake_ip(tmp_path):
    """A copy of tests/support/fake_ip (a real executable) with its own state."""
    d = tmp_path / "fake-ip"
    d.mkdir()
    shutil.copy(SUPPORT / "fake_ip", d / "ip")
    return d
