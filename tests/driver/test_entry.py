"""The action scripts (vmm/kvm-sriov/kvm_sriov_entry.py), called the way
OpenNebula calls them: the action runs in the script's own process and
leaves nothing running behind it; a call handed to the stock script becomes
that script in the same process, with OpenNebula's environment; a kill point
kills the script. libvirt is its test driver here."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.driver_env import DriverOnHost, install_remotes, write_config

KILLED = 128 + signal.SIGKILL


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    return install_remotes(tmp_path_factory.mktemp("host"))


@pytest.fixture
def driver(remotes, fake_host, tmp_path):
    config = write_config(tmp_path / "host.toml", {
        "pool": {"state_dir": str(tmp_path / "state")}, "sysfs": {"root": str(fake_host["root"])},
        "libvirt": {"uri": "test:///default"}})
    return DriverOnHost(remotes, config, "host1")


def give_vm_a_vf(driver, vm_id: int = 42) -> None:
    """A pool row for the VM, so its actions are kvm-sriov's own, not handed over."""
    from kvm_sriov import config
    from kvm_sriov.node.host import Host
    host = Host(config.load(files=[driver.config]))
    with host.pool.transaction() as txn:
        txn.add("0000:03:00.1", "0000:03:00.0", vm_id, f"one-{vm_id}", "02:00:0a:64:00:2a", "attached", "deploy")
    host.close()


def running_from(path: Path) -> list:
    """Processes whose command line names path (the installed library)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass  # gone
    return found


def test_an_action_leaves_no_process_behind(driver):
    for args in (["no-such-domain", "host1"], ["one-42", "host1"]):
        assert driver("cancel", args).code == 0
    time.sleep(0.5)
    assert running_from(driver.remotes) == []


def test_stdin_reaches_the_action_and_stdout_comes_back(driver):
    runs = driver.remotes / "shutdown.runs"
    script = driver.remotes / "vmm" / "kvm" / "shutdown"
    script.write_text(f'#!/bin/sh\necho "$*" >> {runs}\ncat\n')
    script.chmod(0o755)
    xml = "<VMM_DRIVER_ACTION_DATA><VM><ID>42</ID></VM></VMM_DRIVER_ACTION_DATA>"
    r = driver("shutdown", ["one-42", "host1"], stdin=xml)
    assert r.code == 0 and xml in r.stdout, r.stderr
    assert len(runs.read_text().splitlines()) == 1


def test_a_call_handed_over_runs_in_the_scripts_own_process(driver):
    """A VM without VFs: OpenNebula's kvm script runs as the action script's
    own process (its pid, as under the kvm driver), with the whole stdin,
    SIGPIPE at its default and no fd of ours open."""
    script = driver.remotes / "vmm" / "kvm" / "shutdown"
    # ls into a file, not a pipe: bash holds a pipeline's fds itself until it has
    # forked both sides, so `ls /proc/$$/fd | tr` can list one (seen under load)
    fds = driver.remotes / "fds"
    script.write_text(f'#!/bin/bash\necho "pid $$"; grep SigIgn /proc/$$/status; ls /proc/$$/fd > {fds}; '
                      f'tr "\\n" " " < {fds}; echo; cat\n')
    script.chmod(0o755)
    xml = "<VMM_DRIVER_ACTION_DATA>" + "x" * 200_000 + "</VMM_DRIVER_ACTION_DATA>"  # more than a pipe holds
    p = subprocess.Popen([str(driver.remotes / "vmm" / "kvm-sriov" / "shutdown"), "one-42", "host1", "42", "host1"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, KVM_SRIOV_CONFIG=str(driver.config)))
    out, _ = p.communicate(xml)
    lines = out.splitlines()
    assert p.returncode == 0 and lines[0] == f"pid {p.pid}", lines[:3]
    assert int(lines[1].split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0, lines[1]
    fds = lines[2].split()
    assert sorted(fds) == ["0", "1", "2", "255"] or sorted(fds) == ["0", "1", "2"], fds  # 255: bash's own
    assert lines[3] == xml


@pytest.mark.parametrize("with_vf", [False, True], ids=["handed-over", "vf-owned"])
def test_the_stock_script_gets_the_environment_opennebula_gave(driver, with_vf):
    """Under a C locale Python adds LC_CTYPE=C.UTF-8 to its own environment
    at start-up; the stock script must not inherit it, whether the call is
    handed over or kvm-sriov's own (a VM with a VF)."""
    seen = driver.remotes / "environ"
    script = driver.remotes / "vmm" / "kvm" / "shutdown"
    script.write_text(f'#!/bin/sh\ncat /proc/$$/environ > {seen}\ncat > /dev/null\n')
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHON"))}
    env.update(KVM_SRIOV_CONFIG=str(driver.config), ODD="a=b\tc")
    if with_vf:
        give_vm_a_vf(driver)
    seen.unlink(missing_ok=True)
    p = subprocess.run([str(driver.remotes / "vmm" / "kvm-sriov" / "shutdown"), "one-42", "host1", "42", "host1"],
                       input=b"<VMM_DRIVER_ACTION_DATA/>", capture_output=True, env=env)
    assert p.returncode == 0, p.stderr
    got = dict(item.split("=", 1) for item in seen.read_text().split("\0") if item)
    assert got == env, set(got.items()) ^ set(env.items())


def test_a_kill_point_kills_the_script(driver):
    give_vm_a_vf(driver)  # so cancel is kvm-sriov's own and reaches cancel:begin
    assert driver("cancel", ["one-42", "host1"], extra_env={"KVM_SRIOV_KILL_AT": "cancel:begin"}).code == KILLED


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
@pytest.mark.parametrize("how", ["owned by another user", "writable by everybody"])
def test_an_installed_action_runs_no_module_another_user_could_change(tmp_path, fake_host, how):
    """rake install puts the one bootstrap beside the action scripts, and it
    checks every file of the library before the action imports any: a module
    another user could have changed never runs (one line, exit 1)."""
    remotes = install_remotes(tmp_path / "host")
    drv = remotes / "vmm" / "kvm-sriov"
    assert (drv / "kvm_sriov_bootstrap.py").is_file()
    config = write_config(tmp_path / "host.toml", {
        "pool": {"state_dir": str(tmp_path / "state")}, "sysfs": {"root": str(fake_host["root"])},
        "libvirt": {"uri": "test:///default"}})
    driver = DriverOnHost(remotes, config, "host1")
    assert driver("cancel", ["no-such-domain", "host1"]).code == 0   # as installed, it runs
    module = drv / "lib" / "kvm_sriov" / "actions" / "__init__.py"
    marker = tmp_path / "ran"
    module.write_text(module.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    if how == "owned by another user":
        os.chown(module, 65534, 65534)
    else:
        module.chmod(0o666)
    r = driver("cancel", ["no-such-domain", "host1"])
    assert not marker.exists(), "an action ran a module another user could have changed"
    assert r.code == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"ERROR: kvm-sriov: no kvm_sriov library that only root or this user can change: {module}" in r.stderr
