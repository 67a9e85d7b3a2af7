"""The monitoring probe: run as OpenNebula runs it (its own process), output
parsed back with a parser of OpenNebula's template syntax, counts checked
against kvm_sriov.vf.discovery, and a bad device never failing the run."""

import os
import re
import subprocess

import pytest

from kvm_sriov.vf import discovery
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.vf.sysfs import Sysfs
from tests.conftest import REPO
from tests.support.fake_sysfs import big_host
from tests.support.probe import PROBE, parse, run_probe


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
        "IB_PHYS_STATE": "LinkUp", "IB_RATE": "100 Gb/sec (4X EDR)", "LINK_LAYER": "InfiniBand",
        "PORT_GUID": "0xe41d2d0300810002"}                     # whole PFs off: no WHOLE_*
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
    from kvm_sriov.node.probe import _q
    assert parse(f"K = {_q(value)}")["K"] == _q(value)[1:-1]


def test_a_value_with_a_newline_stays_one_attribute():
    """A control character in any value the probe prints (error texts carry
    paths and config strings) never starts an attribute of its own."""
    from kvm_sriov.node.probe import _q
    evil = 'bad\nKVM_SRIOV_FREE_VFS = 999\r\t"x\\'
    line = "KVM_SRIOV_ERROR = " + _q(evil)
    assert "\n" not in line and "\r" not in line
    assert parse(line) == {"KVM_SRIOV_ERROR": 'bad KVM_SRIOV_FREE_VFS = 999  \\"x\\\\'}


def test_output_byte_for_byte(tmp_path):
    """What monitord reads stays exactly as it was (order, spacing, quoting).
    /dev/shm's free space is the one host-dependent figure."""
    big_host(tmp_path / "root", pfs=2, vfs=5)
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add("0000:10:00.2", "0000:10:00.0", 7, "one-7", "", "attached", "deploy")
    pool.close()
    conf = tmp_path / "probe.toml"
    conf.write_text(f'[sysfs]\nroot = "{tmp_path / "root"}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
                    '[ivshmem]\nmax_host_mb = 64\n')
    done = subprocess.run([str(PROBE)], capture_output=True, text=True,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    expected = (REPO / "tests" / "ib" / "golden" / "probe_2pfs_5vfs.txt").read_text()
    shm = re.compile(r"^KVM_SRIOV_IVSHMEM_FREE_MB = \d+$", re.M)
    assert shm.sub("KVM_SRIOV_IVSHMEM_FREE_MB = N", done.stdout) == \
        shm.sub("KVM_SRIOV_IVSHMEM_FREE_MB = N", expected)


# -- what the pool holds: its database, as it is now, and only from a folder of ours ------------
def _pool_holding(tmp_path, *vfs):
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        for n, vf in enumerate(vfs):
            txn.add(vf, "0000:03:00.0", 7 + n, f"one-{7 + n}", "", "attached", "deploy")
    pool.close()
    return tmp_path / "state" / "pool.sqlite3"


@pytest.mark.parametrize("change", ["sqlite3 deletes a row", "sqlite3 adds a row", "the database is deleted",
                                    "an older CLI's transaction"])
def test_the_counts_follow_a_database_changed_behind_the_drivers_back(tmp_path, fake_host, change):
    """Whatever changed the pool (an older kvm-sriov without this one's
    bookkeeping, the sqlite3 shell, a deleted database), the probe reports
    what the database holds now."""
    import sqlite3
    db = _pool_holding(tmp_path, "0000:81:00.1", "0000:81:00.2")
    assert run_probe(tmp_path, fake_host["root"])["KVM_SRIOV_FREE_VFS"] == "4"
    if change == "the database is deleted":
        for f in (tmp_path / "state").glob("pool.sqlite3*"):
            if f.name in ("pool.sqlite3", "pool.sqlite3-wal", "pool.sqlite3-shm"):
                f.unlink()
        free, vms = "6", ""
    else:
        with sqlite3.connect(db) as raw:
            if change == "sqlite3 adds a row":
                raw.execute("INSERT INTO assignment (vf, pf, vm_id, domain, state, since) "
                            "VALUES ('0000:03:00.1', '0000:03:00.0', 9, 'one-9', 'attached', 0)")
                free, vms = "3", "7 8 9"
            elif change == "sqlite3 deletes a row":
                raw.execute("DELETE FROM assignment WHERE vf = '0000:81:00.1'")
                free, vms = "5", "8"
            else:  # what an older CLI's write looks like to this one: a commit, nothing else
                raw.execute("UPDATE assignment SET vm_id = 12 WHERE vf = '0000:81:00.2'")
                raw.execute("DELETE FROM assignment WHERE vf = '0000:81:00.1'")
                free, vms = "5", "12"
    data = run_probe(tmp_path, fake_host["root"])
    assert (data["KVM_SRIOV_FREE_VFS"], data["KVM_SRIOV_VMS"]) == (free, vms)
    assert "KVM_SRIOV_WARNING" not in data


@pytest.mark.parametrize("name", ["pool.sqlite3.held", "pool.sqlite3-wal"])
def test_a_fifo_in_the_state_folder_does_not_hang_the_probe(tmp_path, fake_host, name):
    """A reader that opened it would wait for a writer forever: as the
    holdings file an older version kept beside the pool, or under a name
    SQLite opens."""
    db = _pool_holding(tmp_path, "0000:81:00.1")
    (db.parent / name).unlink(missing_ok=True)
    os.mkfifo(db.parent / name)
    data = run_probe(tmp_path, fake_host["root"])
    if name == "pool.sqlite3.held":   # no longer anybody's file
        assert "KVM_SRIOV_WARNING" not in data and data["KVM_SRIOV_FREE_VFS"] == "5"
    else:
        assert "not a regular file" in data["KVM_SRIOV_WARNING"], data
        assert data["KVM_SRIOV_FREE_VFS"] == data["KVM_SRIOV_TOTAL_VFS"]


@pytest.mark.parametrize("planted", ["pool.sqlite3", "pool.sqlite3-shm"])
def test_a_link_in_the_state_folder_is_not_followed(tmp_path, fake_host, planted):
    """A pool that is another file by way of a link is not read (its counts
    would be whatever that file says), and a -shm link (SQLite writes its
    locks there) leaves the file it names as it was."""
    _pool_holding(tmp_path, "0000:81:00.1")
    victim = tmp_path / "elsewhere"
    target = tmp_path / "state" / planted
    if target.exists():
        os.replace(target, victim)
    else:
        victim.write_bytes(b"ssh-ed25519 AAAA oneadmin's key\n")
    before = victim.read_bytes()
    target.symlink_to(victim)
    data = run_probe(tmp_path, fake_host["root"])
    assert f"{target} is a link" in data["KVM_SRIOV_WARNING"], data
    assert victim.read_bytes() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another user's folder")
@pytest.mark.parametrize("how", ["owned by another user", "writable by others"])
def test_a_state_folder_others_can_write_is_not_read(tmp_path, fake_host, how):
    _pool_holding(tmp_path, "0000:81:00.1")
    state = tmp_path / "state"
    if how == "owned by another user":
        os.chown(state, 65534, 65534)
        expected = "belongs to uid 65534"
    else:
        state.chmod(0o777)
        expected = "is writable by group or others (mode 777)"
    data = run_probe(tmp_path, fake_host["root"])
    assert f"state folder {state} {expected}" in data["KVM_SRIOV_WARNING"], data
    assert data["KVM_SRIOV_FREE_VFS"] == data["KVM_SRIOV_TOTAL_VFS"]


# -- PFs that may be passed through whole ------------------------------------------------------
def test_free_whole_pfs_and_why_the_others_are_not(tmp_path, fake_host):
    """The probe's WHOLE_FREE is whole_pf.why_not_free on what the pool holds:
    a PF the host uses, one with a VF held or in host use, one held whole."""
    fs = fake_host["fs"]
    fs.add_netdev("0000:04:00.0", "ib2", up=False)          # the VF-less mlx5_1: nobody's
    fs.add_netdev("0000:81:00.0", "ib1", up=False)
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add_pf("0000:81:00.0", 9, "one-9", "", "attached", "deploy", num_vfs=4)
    pool.close()
    data = run_probe(tmp_path, fake_host["root"], lines=["whole_pfs = true"])
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert {a: (p["WHOLE_FREE"], p.get("WHOLE_NOT_FREE")) for a, p in pfs.items()} == {
        "0000:03:00.0": ("NO", "in use on the host (ib0 is up); its VF 0000:03:00.3 is in use on the host"),
        "0000:04:00.0": ("YES", None),
        "0000:81:00.0": ("NO", "passed through whole to VM 9")}
    assert data["KVM_SRIOV_FREE_PFS"] == "1"
    assert data["KVM_SRIOV_VMS"] == "9"                      # counted, for the placer's bookings
    assert pfs["0000:04:00.0"]["PORT_GUID"] == "0xe41d2d0300040002"


def test_whole_pfs_off_offers_none_and_shows_only_one_held_whole(tmp_path, fake_host):
    """pool.whole_pfs off (the default): no PF is offered whole and the PFs
    say nothing of it, but one a VM holds whole (turned off since) still
    shows, with its VFs not offered."""
    fs = fake_host["fs"]
    fs.add_netdev("0000:04:00.0", "ib2", up=False)          # would be free to go whole
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add_pf("0000:81:00.0", 9, "one-9", "", "attached", "deploy", num_vfs=4)
    pool.close()
    data = run_probe(tmp_path, fake_host["root"])
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert data["KVM_SRIOV_FREE_PFS"] == "0"
    assert {a: p.get("WHOLE_FREE") for a, p in pfs.items()} == {
        "0000:03:00.0": None, "0000:04:00.0": None, "0000:81:00.0": "NO"}
    assert pfs["0000:81:00.0"]["WHOLE_NOT_FREE"] == "passed through whole to VM 9"


def test_a_pf_held_whole_offers_no_vf(tmp_path, monkeypatch):
    """Its VFs are switched off while a VM has it, and none of them counts as
    free between its row and the switch-off either."""
    from kvm_sriov.vf import whole_pf
    fs = big_host(tmp_path / "root", pfs=2, vfs=3)
    fs.install_kernel(monkeypatch)
    pool = VfPool(tmp_path / "state" / "pool.sqlite3")
    with pool.transaction() as txn:
        txn.add_pf("0000:10:00.0", 4, "one-4", "", "attached", "deploy", num_vfs=3)
    pool.close()
    data = run_probe(tmp_path, tmp_path / "root")          # its row is there, its VFs not gone yet
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert (pfs["0000:10:00.0"]["ENABLED_VFS"], pfs["0000:10:00.0"]["FREE_VFS"]) == ("3", "0")
    assert (data["KVM_SRIOV_FREE_VFS"], data["KVM_SRIOV_VMS"]) == ("3", "4")
    whole_pf.switch_off(Sysfs(tmp_path / "root"), "0000:10:00.0")
    data = run_probe(tmp_path, tmp_path / "root")
    pfs = {p["ADDRESS"]: p for p in data["KVM_SRIOV_PF"]}
    assert (pfs["0000:10:00.0"]["ENABLED_VFS"], pfs["0000:10:00.0"]["FREE_VFS"]) == ("0", "0")
    assert (data["KVM_SRIOV_TOTAL_VFS"], data["KVM_SRIOV_FREE_VFS"], data["KVM_SRIOV_VMS"]) == ("3", "3", "4")
