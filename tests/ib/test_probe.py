"""The monitoring probe: run as OpenNebula runs it (its own process), output
parsed back with a parser of OpenNebula's template syntax, counts checked
against kvm_sriov.vf.discovery, and a bad device never failing the run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvm_sriov.vf import discovery
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.vf.sysfs import Sysfs
from tests.support.fake_sysfs import big_host

PROBE = Path(__file__).resolve().parents[2] / "im/kvm-probes.d/host/system/kvm_sriov.py"
PAIR = re.compile(r'\s*([A-Z0-9_]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse(text):
    """OpenNebula template text -> {KEY: value or [dict, ...]} (vectors repeat)."""
    out, lines, i = {}, text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        key, _, rest = (p.strip() for p in line.partition("="))
        if rest.startswith("["):
            body = rest[1:]
            while not body.rstrip().endswith("]"):
                i += 1
                body += "\n" + lines[i]
            fields = dict(PAIR.findall(body.rstrip()[:-1]))
            out.setdefault(key, []).append(fields)
        else:
            assert key and re.fullmatch(r'"(?:[^"\\]|\\.)*"|-?\d+', rest), line
            out[key] = rest[1:-1] if rest.startswith('"') else rest
        i += 1
    return out


def run_probe(tmp_path, root, **extra):
    conf = tmp_path / "probe.toml"
    body = f'[sysfs]\nroot = "{root}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
    conf.write_text(body + "".join(f"{k}\n" for k in extra.get("lines", [])))
    done = subprocess.run([str(PROBE)], capture_output=True, text=True,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return parse(done.stdout)


def test_standard_host(tmp_path, fake_host):
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add("0000:81:00.1", "0000:81:00.0", 3, "one-3", "", "attached", "deploy")
    pool.close()
    data = run_probe(tmp_path, fake_host["root"])
    inv = discovery.discover(Sysfs(fake_host["root"]))
    assert int(data["KVM_SRIOV_TOTAL_VFS"]) == len(inv.eligible_vfs()) == 6
    assert int(data["KVM_SRIOV_FREE_VFS"]) == 5
    assert (data["KVM_SRIOV_FREE_VFS_NUMA0"], data["KVM_SRIOV_FREE_VFS_NUMA1"]) == ("3", "2")
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert pfs["0000:81:00.0"] == {
        "ADDRESS": "0000:81:00.0", "NETDEV": "ib1", "IB_DEVICES": "mlx4_0", "VENDOR": "15b3",
        "DEVICE": "1003", "NUMA_NODE": "1", "TOTAL_VFS": "3", "FREE_VFS": "2",
        "ENABLED_VFS": "4", "MAX_VFS": "8", "IB_DEVICE": "mlx4_0", "IB_PORT": "1", "IB_STATE": "ACTIVE",
        "IB_PHYS_STATE": "LinkUp", "IB_RATE": "100 Gb/sec (4X EDR)", "LINK_LAYER": "InfiniBand"}
    assert pfs["0000:04:00.0"]["ENABLED_VFS"] == "0"
    assert "0000:05:00.0" not in pfs                           # Ethernet PF: not in the pool
    assert {n["NODE"]: n["FREE_VFS"] for n in data["KVM_SRIOV_NUMA"]} == {"0": "3", "1": "2"}


def test_same_counts_as_discovery_on_a_big_host(tmp_path):
    fs = big_host(tmp_path / "big", pfs=2, vfs=20)
    fs.bind("0000:10:00.3", "mlx5_core")
    fs.add_netdev("0000:10:00.3", "ib9", up=True)
    fs.set_group("0000:11:00.2", fs.groups["0000:11:00.3"])
    data = run_probe(tmp_path, tmp_path / "big")
    inv = discovery.discover(Sysfs(tmp_path / "big"))
    assert int(data["KVM_SRIOV_TOTAL_VFS"]) == len(inv.eligible_vfs()) == 37


def test_a_bad_pf_does_not_fail_the_run(tmp_path, fake_host):
    pf = fake_host["fs"].dev("0000:81:00.0")
    # a VF link that loops, and a PF whose IB port files are garbage
    (pf / "virtfn0").unlink()
    (pf / "virtfn0").symlink_to("virtfn0")
    (fake_host["root"] / "sys/class/infiniband/mlx4_0/ports/1/state").write_bytes(b"\xff\xfe")
    data = run_probe(tmp_path, fake_host["root"])
    assert int(data["KVM_SRIOV_PFS"]) == 3
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert "UnicodeDecodeError" in pfs["0000:81:00.0"]["ERROR"]    # reported on that PF only
    assert pfs["0000:03:00.0"]["FREE_VFS"] == "3"
    assert int(data["KVM_SRIOV_FREE_VFS"]) >= 3


def test_bad_config_still_exits_zero(tmp_path, fake_host):
    data = run_probe(tmp_path, fake_host["root"], lines=["[pool]", "numa_policy = 'sometimes'"])
    assert "KVM_SRIOV_ERROR" in data


def test_unreadable_pool_is_a_warning(tmp_path, fake_host):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pool.sqlite3").write_text("not a database")
    data = run_probe(tmp_path, fake_host["root"])
    assert "KVM_SRIOV_WARNING" in data and data["KVM_SRIOV_FREE_VFS"] == data["KVM_SRIOV_TOTAL_VFS"]


@pytest.mark.parametrize("value", ['say "hi"', "back\\slash"])
def test_quoting(value):
    from kvm_sriov.oned.probe import _q
    assert parse(f"K = {_q(value)}")["K"] == _q(value)[1:-1]


def test_a_value_with_a_newline_stays_one_attribute():
    """A control character in any value the probe prints (error texts carry
    paths and config strings) never starts an attribute of its own."""
    from kvm_sriov.oned.probe import _q
    evil = 'bad\nKVM_SRIOV_FREE_VFS = 999\r\t"x\\'
    line = "KVM_SRIOV_ERROR = " + _q(evil)
    assert "\n" not in line and "\r" not in line
    assert parse(line) == {"KVM_SRIOV_ERROR": 'bad KVM_SRIOV_FREE_VFS = 999  \\"x\\\\'}


@pytest.mark.parametrize("read_from", ["holdings file", "database"])
def test_output_byte_for_byte(tmp_path, read_from):
    """What monitord reads stays exactly as it was (order, spacing, quoting),
    whatever is done to make the probe faster, from the pool's holdings file
    as from its database (the file missing). /dev/shm's free space is the
    one host-dependent figure."""
    big_host(tmp_path / "root", pfs=2, vfs=5)
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add("0000:10:00.2", "0000:10:00.0", 7, "one-7", "", "attached", "deploy")
    pool.close()
    held = tmp_path / "state" / "pool.sqlite3.held"
    assert held.is_file()
    if read_from == "database":
        held.unlink()
    conf = tmp_path / "probe.toml"
    conf.write_text(f'[sysfs]\nroot = "{tmp_path / "root"}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
                    '[ivshmem]\nmax_host_mb = 64\n')
    done = subprocess.run([str(PROBE)], capture_output=True, text=True,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    expected = (Path(__file__).parent / "golden" / "probe_2pfs_5vfs.txt").read_text()
    shm = re.compile(r"^KVM_SRIOV_IVSHMEM_FREE_MB = \d+$", re.M)
    assert shm.sub("KVM_SRIOV_IVSHMEM_FREE_MB = N", done.stdout) == \
        shm.sub("KVM_SRIOV_IVSHMEM_FREE_MB = N", expected)


# The one list of what the probe's path must not import: oned's monitor runs
# the probe every cycle on every host, and the interpreter's start plus the
# standard modules it loads are most of its time (bench/probe_bench.py).
NOT_ON_THE_PROBE_PATH = {
    "typing": "NamedTuple and annotations: collections.namedtuple, TYPE_CHECKING",
    "re": "addresses are checked by hand (vf/sysfs.py)",
    "enum": "comes with re and typing",
    "pathlib": "sysfs paths are strings (Sysfs.at); pathlib pulls in re, fnmatch, urllib",
    "urllib.parse": "comes with pathlib",
    "tomllib": "the configuration's plain TOML is read without it",
    "copy": "the defaults are copied by hand",
    "xml.etree.ElementTree": "ivshmem's device XML is not the probe's business",
    "lxml.etree": "no domain XML in the probe",
    "libvirt": "the probe never touches libvirt",
    "jinja2": "no templates",
    "subprocess": "the probe starts no program",
    "sqlite3": "the pool's holdings file (vf/holdings.py); the database only when that is missing",
    "tempfile": "the probe writes nothing",
    "shutil": "the probe writes nothing",
    "kvm_sriov.ivshmem.device": "only the budget (region.py) is read",
    "kvm_sriov.domain": "no domain XML",
    "kvm_sriov.ib": "IB state is read from sysfs directly",
    "kvm_sriov.node": "no host object, no pool writer",
}
# Still imported through kvm_sriov.config (not the probe's to change); each
# must really come from there (checked), so the list only ever shrinks. A key
# stands for the module and its submodules.
VIA_CONFIG: set = set()


def _modules_after(code, env):
    done = subprocess.run([sys.executable, "-S", "-c", "import sys\nsys.path.insert(0, sys.argv[1])\n" + code +
                           "\nprint(' '.join(sorted(sys.modules)))", str(PROBE.parents[4])],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_probe_path_imports_none_of_the_heavy_modules(tmp_path):
    """Run as oned runs it (python3 -S): after main(), none of the heavy
    modules is loaded, except what the configuration loader still brings."""
    big_host(tmp_path / "root", pfs=2, vfs=3)
    conf = tmp_path / "probe.toml"
    conf.write_text(f'[sysfs]\nroot = "{tmp_path / "root"}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n')
    with VfPool(tmp_path / "state" / "pool.sqlite3").transaction() as txn:   # a pool that holds a VF
        txn.add("0000:10:00.2", "0000:10:00.0", 7, "one-7", "", "attached", "deploy")
    env = dict(os.environ, KVM_SRIOV_CONFIG=str(conf))
    probe = _modules_after("import io\nfrom kvm_sriov.oned import probe\nout = io.StringIO()\n"
                           "probe.main(out=out)\nassert 'KVM_SRIOV_FREE_VFS = 5' in out.getvalue(), out.getvalue()",
                           env)
    config = _modules_after("from kvm_sriov import config\nconfig.load()", env)
    heavy = {h for h in NOT_ON_THE_PROBE_PATH if h in probe or any(m.startswith(h + ".") for m in probe)}
    assert heavy <= VIA_CONFIG, sorted(heavy - VIA_CONFIG)
    assert VIA_CONFIG <= config, f"no longer imported by the config loader: {sorted(VIA_CONFIG - config)}"
