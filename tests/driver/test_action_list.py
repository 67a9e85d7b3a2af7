"""Every action OpenNebula's kvm driver has, kvm-sriov has: a host switched
from -v kvm to -v kvm-sriov must not lose one (`onevm exec` did)."""

import os

import pytest

from simhost import stock_kvm
from tests.conftest import REPO

OURS = REPO / "vmm" / "kvm-sriov"


def test_every_stock_kvm_action_is_here():
    try:
        stock = stock_kvm.kvm_actions()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    assert "deploy" in stock and "exec" in stock  # the list was read, not guessed
    ours = sorted(p.name for p in OURS.iterdir() if os.access(p, os.X_OK) and "." not in p.name
                  and p.name != "kvm-sriov-peer")
    assert ours == stock


def test_the_installed_stock_driver_has_every_action(tmp_path):
    remotes = tmp_path / "var" / "tmp" / "one"
    stock_kvm.install(remotes)
    installed = {p.name for p in (remotes / "vmm" / "kvm").iterdir() if os.access(p, os.X_OK)}
    assert set(stock_kvm.kvm_actions()) <= installed
    assert (remotes / "etc" / "vmm" / "kvm" / "kvmrc").is_file()


def test_python_only_where_vfs_may_be_involved():
    """The actions kvm-sriov has steps in run its library; every other one is
    an exec of the stock script of the same name (no Python start-up)."""
    from kvm_sriov.actions import ACTIONS
    python, passed = set(), {}
    for p in OURS.iterdir():
        if not os.access(p, os.X_OK) or "." in p.name or p.name == "kvm-sriov-peer":
            continue
        text = p.read_text()
        if text.startswith("#!/usr/bin/python3"):
            python.add(p.name)
        else:
            passed[p.name] = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert python == set(ACTIONS)
    for name, lines in passed.items():
        assert lines == [f'exec "$(realpath -m "$0/../../kvm/{name}")" "$@"'], name
