"""Fixtures of the fabric tests: UFM's stand-in server (tests/support/ufm_standin.py)."""

import pytest

from kvm_sriov.fabric import ufm
from tests.support.ufm_standin import UFMStandin


@pytest.fixture
def standin():
    server = UFMStandin()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(ufm, "BACKOFF_SECONDS", 0.01)   # the sleeps between tries, not what is tested
