"""Rung 1: GUID derivation, programming through mlx5 / mlx4 sysfs and netlink,
records and restore, collision refusal."""

import sqlite3

import pytest

from kvm_sriov.ib import guid
from kvm_sriov.vf.discovery import discover
from kvm_sriov.errors import DriverError
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.vf.sysfs import Sysfs
from tests.support.fake_sysfs import ALL_F, FakeSysfs

MAC = "02:00:0a:64:00:2a"
PORT = "02:00:0a:00:00:64:00:2a"
NODE = "02:00:0a:00:01:64:00:2a"


def test_derivation_follows_conventions():
    assert guid.from_mac(MAC) == (PORT, NODE)
    assert guid.from_mac("02:00:0A:64:00:2A") == (PORT, NODE)
    with pytest.raises(DriverError):
        guid.from_mac("02:00:0a:64:00")


@pytest.mark.parametrize("text", ["0x02000a000064002a", "02000a000064002a", "0200:0a00:0064:002a",
                                  "02:00:0a:00:00:64:00:2a", "0x2000a000064002a"])
def test_normalize(text):
    assert guid.normalize(text) == PORT


def test_normalize_rejects_garbage():
    assert guid.normalize("xyz") is None and guid.normalize("") is None and guid.normalize(None) is None


@pytest.fixture
def env(fake_host, tmp_path):
    sysfs = Sysfs(fake_host["root"])
    inv = discover(sysfs)
    pool = VfPool(tmp_path / "pool.sqlite3")
    yield sysfs, inv, pool, fake_host
    pool.close()


def pf_dir(fake_host, pf):
    return fake_host["fs"].dev(pf)


def test_mlx5_program_and_restore(env):
    sysfs, inv, pool, fh = env
    vf = inv.vf("0000:03:00.1")
    sriov = pf_dir(fh, "0000:03:00.0") / "sriov" / "0"
    with pool.transaction() as txn:
        rec = guid.program(txn.db, sysfs, inv, vf, MAC, 42)
    assert (rec.port_guid, rec.node_guid, rec.backend) == (PORT, NODE, "mlx5-sysfs")
    assert (rec.orig_port, rec.orig_policy) == (ALL_F, "Down")
    assert [(sriov / f).read_text().strip() for f in ("port", "node", "policy")] == [PORT, NODE, "Follow"]
    with pool.transaction() as txn:
        assert [r.vf for r in guid.records(txn.db, 42)] == ["0000:03:00.1"]
        gone = guid.restore_vm(txn.db, sysfs, inv, 42)
    assert [r.vf for r in gone] == ["0000:03:00.1"]
    assert [(sriov / f).read_text().strip() for f in ("port", "node", "policy")] == [ALL_F, ALL_F, "Down"]
    with pool.transaction() as txn:
        assert guid.records(txn.db) == []


def test_restore_puts_back_a_real_original(env):
    sysfs, inv, pool, fh = env
    sriov = pf_dir(fh, "0000:03:00.0") / "sriov" / "1"
    (sriov / "port").write_text("11:22:33:44:55:66:77:88\n")
    (sriov / "policy").write_text("Up\n")
    with pool.transaction() as txn:
        guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.2"), MAC, 7)
        # programming again (e.g. restore after save) keeps the true original
        guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.2"), MAC, 7)
        guid.restore_vm(txn.db, sysfs, inv, 7)
    assert (sriov / "port").read_text().strip() == "11:22:33:44:55:66:77:88"
    assert (sriov / "policy").read_text().strip() == "Up"


def test_mlx4_admin_guids(env):
    sysfs, inv, pool, fh = env
    admin = fh["root"] / "sys/class/infiniband/mlx4_0/iov/ports/1/admin_guids"
    with pool.transaction() as txn:
        rec = guid.program(txn.db, sysfs, inv, inv.vf("0000:81:00.2"), MAC, 42)
    assert rec.backend == "mlx4-sysfs" and rec.node_guid == ""
    assert (admin / "2").read_text() == "0x02000a000064002a"   # VF index 1 -> entry 2
    assert (admin / "1").read_text().strip() == "0x0"
    with pool.transaction() as txn:
        guid.restore_vm(txn.db, sysfs, inv, 42)
    assert guid.normalize((admin / "2").read_text()) == "00:00:00:00:00:00:00:00"


def netlink_host(tmp_path):
    fs = FakeSysfs(tmp_path / "nl")
    fs.add_pf("0000:03:00.0", netdev="ib0", guid_files=False)
    fs.add_pf("0000:06:00.0", netdev="", ibdev="", num_vfs=2, cls=0x010802,
              vendor="1b36", device="0010")  # an NVMe-like PF without any IB device
    return Sysfs(fs.root)


def test_netlink_fallback_with_a_recording_ip(tmp_path, fake_ip):
    sysfs = netlink_host(tmp_path)
    inv = discover(sysfs, ["0000:03:00.0", "0000:06:00.0"])
    pool = VfPool(tmp_path / "p.sqlite3")
    ip = str(fake_ip / "ip")
    with pool.transaction() as txn:
        rec = guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.3"), MAC, 42, ip_command=ip)
    assert rec.backend == "netlink"
    calls = (fake_ip / "ip-calls.log").read_text().splitlines()
    assert calls[0] == "-d link show dev ib0"
    assert f"link set dev ib0 vf 2 node_guid {NODE} port_guid {PORT} state auto" in calls
    assert rec.orig_port is None  # the kernel showed nothing for VF 2 yet
    with pool.transaction() as txn:
        guid.restore_vm(txn.db, sysfs, inv, 42, ip_command=ip)
    assert (fake_ip / "ip-calls.log").read_text().splitlines()[-1] == \
        f"link set dev ib0 vf 2 node_guid {ALL_F} port_guid {ALL_F} state disable"


def test_netlink_reads_back_originals(tmp_path, fake_ip):
    sysfs = netlink_host(tmp_path)
    inv = discover(sysfs, ["0000:03:00.0"])
    ip = guid.Netlink(str(fake_ip / "ip"), "ib0", 0)
    ip.write("aa:bb:cc:dd:ee:ff:00:11", "aa:bb:cc:dd:ee:ff:00:12", None)
    pool = VfPool(tmp_path / "p.sqlite3")
    with pool.transaction() as txn:
        rec = guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1, ip_command=str(fake_ip / "ip"))
        assert (rec.orig_port, rec.orig_node) == ("aa:bb:cc:dd:ee:ff:00:11", "aa:bb:cc:dd:ee:ff:00:12")
        guid.restore_vm(txn.db, sysfs, inv, 1, ip_command=str(fake_ip / "ip"))
    assert ip.read().port == "aa:bb:cc:dd:ee:ff:00:11"


def test_netlink_failure_is_a_clear_error(tmp_path, fake_ip):
    sysfs = netlink_host(tmp_path)
    inv = discover(sysfs, ["0000:03:00.0"])
    (fake_ip / "ip-fail").touch()
    pool = VfPool(tmp_path / "p.sqlite3")
    with pytest.raises(DriverError, match="Operation not supported"):
        with pool.transaction() as txn:
            guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1, ip_command=str(fake_ip / "ip"))


def test_vf_without_ib_device_is_skipped(tmp_path):
    sysfs = netlink_host(tmp_path)
    inv = discover(sysfs, ["0000:06:00.0"])
    pool = VfPool(tmp_path / "p.sqlite3")
    logs = []
    with pool.transaction() as txn:
        assert guid.program(txn.db, sysfs, inv, inv.vfs[0], MAC, 1, log=lambda *a: logs.append(a)) is None
    assert logs == [("INFO", f"VF {inv.vfs[0].address} has no InfiniBand device on its PF: no GUID to set")]


def test_collision_with_another_vm_is_refused(env):
    sysfs, inv, pool, fh = env
    with pool.transaction() as txn:
        guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1)
    with pytest.raises(DriverError, match="refusing a GUID collision"):
        with pool.transaction() as txn:
            guid.program(txn.db, sysfs, inv, inv.vf("0000:81:00.1"), MAC, 2)
    assert (fh["root"] / "sys/class/infiniband/mlx4_0/iov/ports/1/admin_guids/1").read_text().strip() == "0x0"


def test_collision_with_a_guid_set_behind_our_back(env):
    sysfs, inv, pool, fh = env
    (pf_dir(fh, "0000:03:00.0") / "sriov" / "3" / "port").write_text(PORT + "\n")
    with pytest.raises(DriverError, match="carried by VF 3 of PF 0000:03:00.0"):
        with pool.transaction() as txn:
            guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1)


def test_collision_with_a_pf_port(env):
    sysfs, inv, pool, fh = env
    gid0 = fh["root"] / "sys/class/infiniband/mlx5_0/ports/1/gids/0"
    gid0.write_text("fe80:0000:0000:0000:0200:0a00:0064:002a\n")  # the PF's own port GUID
    with pytest.raises(DriverError, match="mlx5_0 port 1"):
        with pool.transaction() as txn:
            guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1)


def test_database_refuses_duplicate_port_guids(env):
    sysfs, inv, pool, fh = env
    with pool.transaction() as txn:
        guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 1)
        with pytest.raises(sqlite3.IntegrityError):
            txn.db.execute("INSERT INTO guid VALUES ('x','y',3,'m',?, '', NULL, NULL, NULL, 'b', 0)", (PORT,))


def test_orphans_are_restored(env):
    sysfs, inv, pool, fh = env
    with pool.transaction() as txn:
        txn.add("0000:03:00.1", "0000:03:00.0", 5, "one-5", MAC, "attached", "deploy")
        guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 5)
        assert guid.orphans(txn.db) == []
        txn.release(["0000:03:00.1"])       # e.g. reconcile freed it: VM gone
        assert [r.vf for r in guid.orphans(txn.db)] == ["0000:03:00.1"]
        guid.restore_orphans(txn.db, sysfs, inv)
        assert guid.records(txn.db) == []
    assert (pf_dir(fh, "0000:03:00.0") / "sriov/0/port").read_text().strip() == ALL_F


def test_a_kill_right_after_the_write_leaves_a_record_that_restores_the_vf(env, monkeypatch):
    """SIGKILL between the sysfs write and the end of the pool transaction:
    the record (with the original) was committed first, so the VF gets its
    original back instead of keeping VM 5's GUID with nothing to say so."""
    import os
    import signal
    sysfs, inv, pool, fh = env
    sriov = pf_dir(fh, "0000:03:00.0") / "sriov" / "0"
    pid = os.fork()
    if pid == 0:
        try:
            os.environ["KVM_SRIOV_KILL_AT"] = "guid:written"
            with pool.transaction() as txn:
                txn.add("0000:03:00.1", "0000:03:00.0", 5, "one-5", MAC, "attached", "deploy")
                guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), MAC, 5)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (sriov / "port").read_text().strip() == PORT        # written, then killed
    with pool.transaction() as txn:
        [rec] = guid.records(txn.db)
        assert (rec.vf, rec.vm_id, rec.orig_port) == ("0000:03:00.1", 5, ALL_F)
        txn.release(["0000:03:00.1"])       # reconcile: VM 5's domain never started
        assert [r.vf for r in guid.restore_orphans(txn.db, sysfs, inv)] == ["0000:03:00.1"]
    assert [(sriov / f).read_text().strip() for f in ("port", "policy")] == [ALL_F, "Down"]


def test_a_stray_vm_guid_is_never_taken_for_an_original_and_reconcile_resets_it(env):
    """A free VF carrying VM A's MAC-derived GUID with no record (left by an
    older version): VM B's release must not give A's GUID back, and the
    strays are found and reset."""
    sysfs, inv, pool, fh = env
    sriov = pf_dir(fh, "0000:03:00.0") / "sriov"
    (sriov / "0" / "port").write_text(PORT + "\n")
    (sriov / "0" / "policy").write_text("Follow\n")
    with pool.transaction() as txn:
        assert [(vf.address, g) for vf, g in guid.strays(txn.db, sysfs, inv)] == [("0000:03:00.1", PORT)]
        rec = guid.program(txn.db, sysfs, inv, inv.vf("0000:03:00.1"), "02:00:0a:64:00:2b", 6)
        assert rec.orig_port is None
        guid.restore_vm(txn.db, sysfs, inv, 6)
    assert [(sriov / "0" / f).read_text().strip() for f in ("port", "policy")] == [ALL_F, "Down"]
    (sriov / "1" / "port").write_text(PORT + "\n")
    with pool.transaction() as txn:
        assert [vf.address for vf, _ in guid.reset_strays(txn.db, sysfs, inv)] == ["0000:03:00.2"]
        assert guid.strays(txn.db, sysfs, inv) == []
    assert (sriov / "1" / "port").read_text().strip() == ALL_F
