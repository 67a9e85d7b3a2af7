"""kvm-sriov-opensm checked against opensm's own option parser (Debian's opensm)."""
import os
import shutil
import subprocess

import pytest

from guest_helpers import CTX

TOOL = CTX / "sm" / "kvm-sriov-opensm"
OPENSM = shutil.which("opensm", path="/usr/sbin:/usr/bin:/sbin:/bin")
needs_opensm = pytest.mark.skipif(OPENSM is None, reason="Debian package opensm not installed")


def run(tmp_path, *args, **env):
    e = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "IB_SM_DEFAULTS": "/dev/null",
         "IB_SM_CONF": str(tmp_path / "opensm" / "kvm-sriov-opensm.conf"),
         "IB_SM_PARTITIONS": str(tmp_path / "partitions.conf"),
         "IB_SM_LOG": str(tmp_path / "opensm.log")}
    e.update(env)
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, env=e, timeout=60)


def opensm_dump(tmp_path, conf):
    """What opensm understood: parse the file (-F) and dump the result (-c)."""
    dump = tmp_path / "dump.conf"
    r = subprocess.run([OPENSM, "--config", str(conf), "--create-config", str(dump)],
                       capture_output=True, text=True, timeout=60)
    opts = {}
    for line in dump.read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition(" ")
            opts[k] = v.strip()
    return r.stdout + r.stderr, opts


@needs_opensm
def test_config_is_understood_by_opensm(tmp_path):
    (tmp_path / "partitions.conf").write_text("Default=0x7fff, ipoib : ALL=full;\n")
    r = run(tmp_path, "config", IB_SM_PRIORITY="13", IB_SM_GUID="0x0002c90300a1b2c3")
    assert r.returncode == 0, r.stderr
    conf = tmp_path / "opensm" / "kvm-sriov-opensm.conf"
    out, opts = opensm_dump(tmp_path, conf)
    assert "Unrecognized token" not in out and "Invalid" not in out and "Parsing error" not in out, out
    assert opts["sm_priority"] == "13"
    assert opts["partition_config_file"] == str(tmp_path / "partitions.conf")
    assert opts["sminfo_polling_timeout"] == "10000"
    assert opts["polling_retry_number"] == "4"
    assert opts["guid"] == "0x0002c90300a1b2c3"
    # every key we wrote exists in opensm's own option table
    _, defaults = opensm_dump(tmp_path, "/dev/null")
    for line in conf.read_text().splitlines():
        if line and not line.startswith("#"):
            assert line.split()[0] in defaults
    # and our own check agrees
    r = run(tmp_path, "check")
    assert r.returncode == 0, r.stderr
    assert "accepted by opensm" in r.stdout


@needs_opensm
def test_virtualization_follows_what_opensm_supports(tmp_path):
    r = run(tmp_path, "config")
    conf = (tmp_path / "opensm" / "kvm-sriov-opensm.conf").read_text()
    _, defaults = opensm_dump(tmp_path, "/dev/null")
    if "virt_enabled" in defaults:  # MLNX OpenSM
        assert "virt_enabled 2" in conf
    else:  # upstream opensm (Debian 12: 3.3.23)
        assert "virt_enabled" not in conf
        assert "has no virt_enabled option" in r.stderr


def test_virt_enabled_written_for_an_opensm_that_has_it(tmp_path):
    fake = tmp_path / "bin" / "opensm"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = --create-config ] && printf "sm_priority 0\\nvirt_enabled 0\\n" > "$2"\nexit 0\n')
    fake.chmod(0o755)
    r = run(tmp_path, "config", OPENSM=str(fake))
    assert r.returncode == 0
    assert "virt_enabled 2" in (tmp_path / "opensm" / "kvm-sriov-opensm.conf").read_text()


@needs_opensm
def test_check_rejects_what_opensm_rejects(tmp_path):
    assert run(tmp_path, "config").returncode == 0
    conf = tmp_path / "opensm" / "kvm-sriov-opensm.conf"
    conf.write_text(conf.read_text() + "sm_prio 3\n")
    r = run(tmp_path, "check")
    assert r.returncode == 1
    assert 'Unrecognized token: "sm_prio"' in r.stderr


@pytest.mark.parametrize("prio", ["16", "-1", "high"])
def test_priority_range(tmp_path, prio):
    r = run(tmp_path, "config", IB_SM_PRIORITY=prio)
    assert r.returncode == 1
    assert "is not 0..15" in r.stderr


def test_config_is_idempotent(tmp_path):
    assert run(tmp_path, "config").returncode == 0
    conf = tmp_path / "opensm" / "kvm-sriov-opensm.conf"
    first = conf.read_text()
    r = run(tmp_path, "config")
    assert "unchanged" in r.stdout and conf.read_text() == first


@needs_opensm
def test_missing_partitions_file_is_reported(tmp_path):
    run(tmp_path, "config")
    r = run(tmp_path, "check")
    assert "partitions file" in r.stderr and "missing or empty" in r.stderr


@needs_opensm
def test_start_without_ib_mad_is_a_clear_error(tmp_path):
    if os.path.exists("/sys/class/infiniband_mad/abi_version"):
        pytest.skip("this machine has an InfiniBand MAD interface")
    r = run(tmp_path, "start")
    assert r.returncode == 1
    assert "no InfiniBand MAD interface" in r.stderr


def test_defaults_file_documents_failover(tmp_path):
    text = (CTX / "sm" / "kvm-sriov-opensm.default").read_text()
    assert "IB_SM_PRIORITY=14" in text and "13" in text
    env = {"IB_SM_DEFAULTS": str(CTX / "sm" / "kvm-sriov-opensm.default")}
    r = run(tmp_path, "config", **env)
    assert r.returncode == 0
    assert "sm_priority 14" in (tmp_path / "opensm" / "kvm-sriov-opensm.conf").read_text()
