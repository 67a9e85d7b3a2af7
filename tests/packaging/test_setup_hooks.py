"""`python3 -m kvm_sriov.oned.network_hook setup|check`: the network hooks'
registration as Puppet and Ansible run it (as oneadmin, with its ONE_AUTH),
against a stand-in for oned's hook calls: check says whether setup would
change anything, setup changes nothing a second time, and a wrong session or
an oned that does not answer is one line and exit 1."""

import os
import subprocess
import sys

from kvm_sriov.ib import pkey
from tests.conftest import REPO
from tests.packaging.hook_oned import HookOned

COMMAND = "/usr/lib/kvm-sriov/bin/kvm-sriov network-hook"


def module(action, oned_endpoint, one_auth, *extra, command=COMMAND):
    env = dict(os.environ, ONE_AUTH=str(one_auth), PYTHONPATH=str(REPO))
    env.pop("ONE_XMLRPC", None)
    return subprocess.run([sys.executable, "-m", "kvm_sriov.oned.network_hook", action, "--command", command,
                           "--endpoint", oned_endpoint, *extra], cwd="/", env=env, capture_output=True,
                          text=True, timeout=60)


def test_check_then_setup_then_nothing_to_do(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:secret\n")
    with HookOned() as oned:
        r = module("check", oned.endpoint, auth)
        assert r.returncode == 3 and not oned.writes, r.stderr
        assert r.stdout.count("would create hook kvm-sriov-network-") == len(pkey.NETWORK_CALLS) + 2
        r = module("setup", oned.endpoint, auth)
        assert r.returncode == 0, r.stderr
        assert len(oned.hooks) == len(pkey.NETWORK_CALLS) + 2
        assert {h["COMMAND"] for h in oned.hooks.values()} == {COMMAND}
        assert module("check", oned.endpoint, auth).returncode == 0
        writes = list(oned.writes)
        r = module("setup", oned.endpoint, auth)
        assert r.returncode == 0 and "nothing changed" in r.stdout and oned.writes == writes


def test_a_hook_with_another_command_is_updated(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:secret\n")
    with HookOned() as oned:
        assert module("setup", oned.endpoint, auth, command="/opt/old/bin/kvm-sriov network-hook").returncode == 0
        r = module("check", oned.endpoint, auth)
        assert r.returncode == 3 and "would update hook" in r.stdout
        assert module("setup", oned.endpoint, auth).returncode == 0
        assert {h["COMMAND"] for h in oned.hooks.values()} == {COMMAND}
        assert len(oned.hooks) == len(pkey.NETWORK_CALLS) + 2


def test_a_wrong_session_or_no_oned_is_one_line_and_exit_1(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:wrong\n")
    with HookOned() as oned:
        for action in ("check", "setup"):
            r = module(action, oned.endpoint, auth)
            assert r.returncode == 1 and "refused" in r.stderr and not oned.writes
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = module("check", "http://127.0.0.1:9/RPC2", auth)
    assert r.returncode == 1 and "cannot reach OpenNebula" in r.stderr and "Traceback" not in r.stderr
    r = module("setup", "http://127.0.0.1:9/RPC2", tmp_path / "missing")
    assert r.returncode == 1 and "no OpenNebula credentials" in r.stderr and "Traceback" not in r.stderr
