"""Paths for the harness tests (a uniquely named module, so it never clashes
with other parts' test helpers)."""
import os
import sys

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
