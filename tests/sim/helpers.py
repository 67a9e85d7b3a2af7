"""Shared by the sim tests."""
import time

import pytest


def wait_for(predicate, timeout, what):
    """Poll `predicate` until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f'timed out after {timeout} s waiting for {what}')
