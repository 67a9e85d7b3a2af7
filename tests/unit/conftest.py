"""Fixtures of the rung-1 tests under tests/unit (those the other folders share too: tests/conftest.py)."""

import shutil

import pytest

from tests.conftest import REPO

SUPPORT = REPO / "tests" / "support"


@pytest.fixture
def fake_ip(tmp_path):
    """A copy of tests/support/fake_ip (a real executable) with its own state."""
    d = tmp_path / "fake-ip"
    d.mkdir()
    shutil.copy(SUPPORT / "fake_ip", d / "ip")
    return d
