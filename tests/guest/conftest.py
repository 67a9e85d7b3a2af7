"""pytest fixtures of the guest suite (helpers live in guest_helpers.py)."""
import os
from pathlib import Path

import pytest

from guest_helpers import Guest

# The scripts honour their test overrides (IB_SYSFS_ROOT, IB_IP, OPENSM, ...)
# only where root made this file; the suite runs as root and makes it.
TEST_MARKER = Path("/etc/kvm-sriov-ib.test-overrides")


@pytest.fixture(scope="session", autouse=True)
def test_overrides_allowed():
    if os.geteuid() != 0:
        pytest.fail("the guest suite runs as root (network namespaces, the test-override marker)")
    made = not TEST_MARKER.exists()
    TEST_MARKER.write_text("kvm-sriov guest tests: IB_* overrides honoured on this machine\n")
    yield TEST_MARKER
    if made:
        TEST_MARKER.unlink(missing_ok=True)


@pytest.fixture
def guest(tmp_path):
    """A fake guest: sysfs tree + its own network namespace, removed afterwards."""
    g = Guest(tmp_path)
    try:
        yield g
    finally:
        g.close()
