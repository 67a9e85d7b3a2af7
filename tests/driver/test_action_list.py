"""Every action OpenNebula's kvm driver has, kvm-sriov has: a host switched
from -v kvm to -v kvm-sriov must not lose one (`onevm exec` did)."""

import os
import subprocess

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
        assert lines == [f'case $0 in /*) exec "${{0%/*/*}}/kvm/{name}" "$@";; esac  # as OpenNebula calls it: '
                         f'no realpath process', f'exec "$(realpath -m "$0/../../kvm/{name}")" "$@"'], name


def test_the_stock_script_runs_by_its_plain_path(tmp_path):
    """Called by its absolute path (OpenNebula's way) or a relative one, the
    script runs OpenNebula's kvm script of the same name, which sees its own
    path as under -v kvm, and the arguments as given."""
    vmm = tmp_path / "var" / "tmp" / "one" / "vmm"
    (vmm / "kvm").mkdir(parents=True)
    (vmm / "kvm-sriov").mkdir()
    (vmm / "kvm-sriov" / "reboot").write_text((OURS / "reboot").read_text())
    (vmm / "kvm" / "reboot").write_text('#!/bin/sh\nprintf "%s|" "$0" "$@"\n')
    for p in (vmm / "kvm-sriov" / "reboot", vmm / "kvm" / "reboot"):
        p.chmod(0o755)
    expected = f"{vmm}/kvm/reboot|one-42|a b|host1|"
    for how, cwd in (((str(vmm / "kvm-sriov" / "reboot")), "/"), ("./reboot", vmm / "kvm-sriov")):
        out = subprocess.run([how, "one-42", "a b", "host1"], cwd=cwd, capture_output=True, text=True, check=True)
        assert out.stdout == expected, how
