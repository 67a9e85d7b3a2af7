"""The VM traffic probe (im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py) run as
monitord's client runs it: its own process, config from the environment.
Whatever the host, it exits 0 with nothing on stderr, and prints either
nothing or well-formed VM lines (a failing probe or a line monitord cannot
parse would cost every VM's monitoring of that run)."""

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvm_sriov.vf.pool import VfPool

REPO = Path(__file__).resolve().parents[4]
PROBE = REPO / "im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py"
SUPPORT = REPO / "tests/support"
PF = "0000:03:00.0"
VM_LINE = re.compile(r'VM = \[ ID = "(\d+)", MONITOR = "([A-Za-z0-9+/=]*)" \]')


@pytest.fixture
def probe_host(tmp_path, fake_host):
    net = fake_host["fs"].dev(PF) / "net" / "ib0"
    (net / "ifindex").write_text("5\n")
    (net / "iflink").write_text("5\n")
    ip = tmp_path / "fake-ip"
    ip.mkdir()
    shutil.copy(SUPPORT / "fake_ip", ip / "ip")
    conf = tmp_path / "probe.toml"
    conf.write_text(f'[sysfs]\nroot = "{fake_host["root"]}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[infiniband]\nip_command = "{ip / "ip"}"\n')
    return {"root": fake_host["root"], "ip": ip, "conf": conf, "state": tmp_path / "state"}


def run(h, config=None):
    done = subprocess.run([str(PROBE)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(config or h["conf"])))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def counters(h, rx):
    vf = {"vf": 0, "stats": {"rx": {"bytes": rx, "packets": 1}, "tx": {"tx_bytes": 2 * rx, "tx_packets": 2}}}
    (h["ip"] / "ip-s-j-link-show-ib0.json").write_text(json.dumps([{"ifname": "ib0", "vfinfo_list": [vf]}]))


def attach(h, vm):
    pool = VfPool(h["state"] / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add("0000:03:00.1", PF, vm, f"one-{vm}", "", "attached", "deploy")
    pool.close()


def test_a_host_without_vfs_in_use_prints_nothing(probe_host):
    assert run(probe_host) == ""                        # no pool at all
    VfPool(probe_host["state"] / "pool.sqlite3").close()
    assert run(probe_host) == ""                        # a pool, nothing attached
    assert not (probe_host["ip"] / "ip-calls.log").exists()


def test_the_vm_line_is_what_monitord_reads(probe_host):
    counters(probe_host, 1000)
    attach(probe_host, 42)
    run(probe_host)
    counters(probe_host, 1500)
    out = run(probe_host)
    (vm, monitor), = VM_LINE.findall(out)
    assert out == f'VM = [ ID = "42", MONITOR = "{monitor}" ]\n' and vm == "42"
    assert base64.b64decode(monitor).decode() == (
        'IB_RX_BYTES = "500"\nIB_TX_BYTES = "1000"\nIB_RX_PACKETS = "0"\nIB_TX_PACKETS = "0"\n')


@pytest.mark.parametrize("trouble", ["no ip", "malformed", "huge", "bad config"])
def test_trouble_prints_nothing_and_exits_0(probe_host, trouble):
    attach(probe_host, 42)
    config = None
    if trouble == "no ip":
        (probe_host["ip"] / "ip").unlink()
    elif trouble == "malformed":
        (probe_host["ip"] / "ip-s-j-link-show-ib0.json").write_text('[{"vfinfo_list": [{"vf": 0, "stats": 7}]}')
    elif trouble == "huge":
        (probe_host["ip"] / "ip-s-j-link-show-ib0.json").write_text("[" * (5 * 1024 * 1024))
    else:
        config = probe_host["conf"].with_name("bad.toml")
        config.write_text("[pool\n")
    assert run(probe_host, config) == ""


def installed(tmp_path) -> Path:
    """The probe as rake install lays it out: remotes/im/kvm-probes.d/vm/monitor,
    the bootstrap beside the action scripts, the library in their lib/."""
    remotes = tmp_path / "remotes"
    drv = remotes / "vmm" / "kvm-sriov"
    shutil.copytree(REPO / "kvm_sriov", drv / "lib" / "kvm_sriov", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "kvm_sriov_bootstrap.py", drv)
    probe = remotes / "im" / "kvm-probes.d" / "vm" / "monitor" / PROBE.name
    probe.parent.mkdir(parents=True)
    shutil.copy(PROBE, probe)
    tmp_path.chmod(0o755)
    return probe


def test_the_installed_probe_uses_the_remotes_library(tmp_path, probe_host):
    probe = installed(tmp_path)
    marker = tmp_path / "ran-from-remotes"
    traffic = probe.parents[4] / "vmm" / "kvm-sriov" / "lib" / "kvm_sriov" / "node" / "traffic.py"
    traffic.write_text(traffic.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    counters(probe_host, 10)
    attach(probe_host, 42)
    done = subprocess.run([str(probe)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(probe_host["conf"])))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert VM_LINE.fullmatch(done.stdout.strip()) and marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the loose folder must not be the running user's alone")
def test_a_library_another_user_could_change_is_not_run(tmp_path, probe_host):
    """The bootstrap's refusal: not one line of that library runs, nothing is
    printed (monitord goes on with the stock probes), exit 0."""
    probe = installed(tmp_path)
    marker = tmp_path / "ran"
    lib = probe.parents[4] / "vmm" / "kvm-sriov" / "lib"
    traffic = lib / "kvm_sriov" / "node" / "traffic.py"
    traffic.write_text(traffic.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    lib.chmod(0o777)
    attach(probe_host, 42)
    done = subprocess.run([str(probe)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(probe_host["conf"])))
    assert not marker.exists(), "the probe ran a library another user could have changed"
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
