"""one-context exports every CONTEXT variable of the VM template: the
scripts' test overrides (IB_LIB_DIR, IB_IP, OPENSM, IB_SM_DEFAULTS, PATH...)
must count only where root made the test marker, or a template would choose
what root runs in the guest."""
import subprocess

import pytest

from conftest import TEST_MARKER
from guest_helpers import CTX

FUNCTIONS = CTX / "kvm-sriov-ib.d" / "functions.sh"
OPENSM_TOOL = CTX / "sm" / "kvm-sriov-opensm"


@pytest.fixture
def no_marker(test_overrides_allowed):
    saved = TEST_MARKER.read_text()
    TEST_MARKER.unlink()
    yield
    TEST_MARKER.write_text(saved)


def hostile_env(tmp_path):
    evil = tmp_path / "evil"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
    evil.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin", "IB_IP": str(evil), "IB_MODPROBE": str(evil),
            "IB_ETHTOOL": str(evil), "IB_SM_TOOL": str(evil), "IB_SYSFS_ROOT": str(tmp_path),
            "IB_LIB_DIR": str(tmp_path), "OPENSM": str(evil), "IB_SM_DEFAULTS": str(evil)}


def sourced(env):
    out = subprocess.run(["env", "-i", *[f"{k}={v}" for k, v in env.items()], "bash", "-c",
                          f'. {FUNCTIONS}; echo "$IB_IP|$IB_MODPROBE|$IB_ETHTOOL|$IB_SYSFS_ROOT|${{IB_SM_TOOL:-}}|$PATH"'],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_without_the_marker_the_library_ignores_the_overrides(tmp_path, no_marker):
    assert sourced(hostile_env(tmp_path)) == \
        "ip|modprobe|ethtool|/sys||/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_with_the_marker_the_tests_can_override(tmp_path):
    env = hostile_env(tmp_path)
    assert sourced(env).startswith(f"{env['IB_IP']}|{env['IB_MODPROBE']}|")


def test_without_the_marker_the_sm_tool_sources_and_runs_only_roots_files(tmp_path, no_marker):
    r = subprocess.run(["env", "-i", *[f"{k}={v}" for k, v in hostile_env(tmp_path).items()],
                        str(OPENSM_TOOL), "status"], capture_output=True, text=True, timeout=30)
    assert not (tmp_path / "ran").exists(), r.stdout + r.stderr


def test_the_hooks_find_their_library_next_to_themselves_only():
    for hook in ("loc-16-kvm-sriov-ib", "net-16-kvm-sriov-ib", "net-90-kvm-sriov-sm"):
        text = (CTX / hook).read_text()
        assert "${IB_LIB_DIR:-" not in text and 'IB_LIB_DIR=$(dirname "$(readlink -f "$0")")' in text


@pytest.mark.parametrize("var,value,said", [
    ("ETH1_VLAN_ID", "$(touch {ran})", "is not a PKey"),
    ("ETH1_VLAN_ID", "1;touch {ran}", "is not a PKey"),
    ("ETH1_MASK", "$(touch {ran})", "is not a netmask"),
    ("ETH1_MASK", "`touch {ran}`", "is not a netmask"),
])
def test_shell_in_vlan_id_or_mask_is_refused_not_run(guest, var, value, said):
    from test_guest_context_scripts import LOC, fixture_guest
    fixture_guest(guest)
    ran = guest.tmp / "ran"
    r = guest.run(LOC, env={var: value.format(ran=ran)})
    assert r.returncode == 1 and said in r.stdout, r.stdout + r.stderr
    assert not ran.exists()
