"""Fixtures of the rung-3 modules (l1_*.py), which run inside the nested
SR-IOV host; rung-2 modules define their own `remotes` and `driver`."""

import pytest

from tests.support.driver_env import destroy_all, install_remotes, nested_host_driver

NESTED_URI = "qemu:///system"
NESTED_PF = "0000:03:00.0"  # QEMU's emulated SR-IOV NVMe PF in the nested host


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    return install_remotes(tmp_path_factory.mktemp("host"))


@pytest.fixture
def driver(remotes, tmp_path, request):
    """The installed driver on the nested host's system libvirtd; the test
    module's HOTPLUG_SECONDS bounds its unplug/plug waits."""
    yield nested_host_driver(remotes, tmp_path, NESTED_PF, request.module.HOTPLUG_SECONDS)
    destroy_all(NESTED_URI)
