"""pytest fixtures of the guest suite (helpers live in guest_helpers.py)."""
import pytest

from guest_helpers import Guest


@pytest.fixture
def guest(tmp_path):
    """A fake guest: sysfs tree + its own network namespace, removed afterwards."""
    g = Guest(tmp_path)
    try:
        yield g
    finally:
        g.close()
