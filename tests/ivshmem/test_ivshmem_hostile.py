"""Rung 1: what a guest writes into its region, what a tenant puts into a
template and what another local account puts into /dev/shm is hostile to
the host: bounded, never read back, never able to stop a clean-up. On a real
SQLite pool, a temporary folder standing for /dev/shm."""

import io
import os
import struct
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov import config
from kvm_sriov.node import doctor
from kvm_sriov.ivshmem import (device as ivshmem, host as ivshmem_host, region as ivshmem_region,
                               table as ivshmem_table)
from kvm_sriov.node import probe
from kvm_sriov.errors import ConfigError, DriverError, InputError
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.oned.vm_template import VmTemplate

REQ = ivshmem.Request(3, 7, 4)


@pytest.fixture
def shm(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir(mode=0o1777)
    monkeypatch.setattr(ivshmem_region, "SHM_DIR", d)
    return d


@pytest.fixture
def db(tmp_path):
    pool = VfPool(tmp_path / "pool.sqlite3")
    with pool.transaction() as txn:
        yield txn.db


def header(shm, name=REQ.name):
    return ivshmem_region.read_header((shm / name).read_bytes()[:ivshmem_region.HEADER_BYTES])


@pytest.mark.parametrize("word", [0xFFFFFFFD, 0xFFFFFFFE, 0xFFFFFFFF])
def test_a_header_a_guest_wrote_is_never_read_back(db, shm, word):
    ivshmem_table.add_user(db, REQ, 10, "one-10")
    ivshmem_table.publish(db, REQ.name)
    with open(shm / REQ.name, "r+b") as f:   # the guest's BAR2 starts with the header
        f.write(b"\xff" * 40)
        f.seek(12)
        f.write(struct.pack("<I", word))
    ivshmem_table.add_user(db, REQ, 11, "one-11")
    ivshmem_table.publish(db, REQ.name)
    h = header(shm)
    assert h["generation"] == 4 and (h["uid"], h["vmgroup"], h["vms"]) == (3, 7, [10, 11])
    assert ivshmem_table.drop_user(db, 10) is None and header(shm)["vms"] == [11]


def test_the_generation_wraps_at_2_to_the_32(db, shm):
    ivshmem_table.add_user(db, REQ, 10, "one-10")
    ivshmem_table.publish(db, REQ.name)
    db.execute("UPDATE ivshmem_region SET generation = ?", (0xFFFFFFFE,))
    ivshmem_table.publish(db, REQ.name)
    assert header(shm)["generation"] == 0
    assert ivshmem_region.next_generation(0xFFFFFFFF) == (0xFFFFFFFF, 0)


@pytest.mark.parametrize("uid, group", [("4294967296", "7"), ("3", "4294967296"), ("2147483648", "7")])
def test_ids_above_int32_are_refused_clearly(uid, group):
    vm = VmTemplate.from_text(f"<VM><UID>{uid}</UID><TEMPLATE><VMGROUP><VMGROUP_ID>{group}</VMGROUP_ID>"
                              f"</VMGROUP></TEMPLATE><USER_TEMPLATE><KVM_SRIOV_IVSHMEM><SIZE>4</SIZE>"
                              f"</KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>")
    with pytest.raises(InputError, match="not an OpenNebula ID"):
        ivshmem.request_of(vm)
    root = ET.fromstring(f"<domain><metadata><ivshmem:ivshmem xmlns:ivshmem='{ivshmem.METADATA_NS}' "
                         f"region='kvm-sriov-ivshmem-u{uid}-g{group}' uid='{uid}' vmgroup='{group}' "
                         f"size_mb='4' bus='1' slot='0'/></metadata></domain>")
    with pytest.raises(InputError, match="damaged"):
        ivshmem.recorded(root)
    with pytest.raises(InputError):
        ivshmem_region.region_path(f"kvm-sriov-ivshmem-u{uid}-g{group}")


def test_a_hard_link_of_another_groups_region_is_refused(db, shm):
    ivshmem_table.add_user(db, REQ, 10, "one-10")
    ivshmem_table.publish(db, REQ.name)
    with open(shm / REQ.name, "r+b") as f:
        f.seek(ivshmem_region.HEADER_BYTES)
        f.write(b"group 7's data")
    other = ivshmem.Request(3, 8, 4)
    # a new region never takes the file under its name: group 8 gets fresh memory
    os.link(shm / REQ.name, shm / other.name)
    ivshmem_table.add_user(db, other, 20, "one-20")
    ivshmem_table.publish(db, other.name)
    assert (shm / other.name).stat().st_ino != (shm / REQ.name).stat().st_ino
    assert b"group 7" not in (shm / other.name).read_bytes()
    # an existing region whose file is (now) another region's: refused, both
    (shm / other.name).unlink()
    os.link(shm / REQ.name, shm / other.name)
    for name in (other.name, REQ.name):
        with pytest.raises(DriverError, match="2 links"):
            ivshmem_table.publish(db, name)


def test_a_foreign_file_is_left_alone_and_its_row_dropped(db, shm):
    ivshmem_table.add_user(db, REQ, 10, "one-10")
    ivshmem_table.publish(db, REQ.name)
    (shm / REQ.name).unlink()
    (shm / REQ.name).write_text("not ours")
    os.chown(shm / REQ.name, 54321, 54321)
    said = []
    assert ivshmem_table.drop_user(db, 10, log=lambda *a: said.append(a)) == REQ.name
    assert (shm / REQ.name).read_text() == "not ours" and ivshmem_table.regions(db) == {}
    assert "not made by this driver" in said[0][1]
    # reconcile too: a region whose file turned foreign goes without touching it
    ivshmem_table.add_user(db, ivshmem.Request(3, 9, 4), 11, "one-11", now=0.0)
    (shm / "kvm-sriov-ivshmem-u3-g9").symlink_to(shm / REQ.name)
    changes = ivshmem_table.plan(db, {}, grace=1, now=100.0)
    ivshmem_table.apply(db, changes, {}, 100.0)
    assert ivshmem_table.regions(db) == {} and (shm / "kvm-sriov-ivshmem-u3-g9").is_symlink()


def test_the_budget_refuses_what_does_not_fit(db, shm):
    budget = ivshmem_table.Budget(max_region_mb=8, max_host_mb=12, max_owner_mb=12)
    with pytest.raises(InputError, match="limit of 8 MB per region"):
        ivshmem_table.add_user(db, ivshmem.Request(3, 7, 16), 10, "one-10", budget=budget)
    assert ivshmem_table.add_user(db, ivshmem.Request(3, 7, 8), 10, "one-10", budget=budget)
    with pytest.raises(InputError, match="8 of 12 MB in use"):
        ivshmem_table.add_user(db, ivshmem.Request(4, 7, 8), 11, "one-11", budget=budget)
    assert not ivshmem_table.add_user(db, ivshmem.Request(3, 7, 8), 12, "one-12", budget=budget)
    assert ivshmem_table.add_user(db, ivshmem.Request(4, 7, 4), 13, "one-13", budget=budget)


def test_config_ivshmem_section(tmp_path, shm):
    cfg = config.load(files=[])
    assert (cfg.ivshmem_max_region_mb, cfg.ivshmem_max_host_mb) == (1024, 0)
    size, _ = ivshmem_region.shm_mb()
    assert ivshmem_host.budget(cfg) == ivshmem_table.Budget(1024, size // 2, size // 4)
    cfg = config.load(files=[], overrides={"ivshmem": {"max_region_mb": 64, "max_host_mb": 256}})
    assert ivshmem_host.budget(cfg) == ivshmem_table.Budget(64, 256, 128)
    for bad in ({"max_region_mb": 0}, {"max_region_mb": 131072}, {"max_host_mb": -1},
                {"max_region_mb": 1.5}):
        with pytest.raises(ConfigError, match="ivshmem"):
            config.load(files=[], overrides={"ivshmem": bad})
    shipped = config.load(files=[Path(__file__).resolve().parents[2] / "etc/vmm/kvm-sriov/kvm-sriov.toml"])
    assert (shipped.ivshmem_max_region_mb, shipped.ivshmem_max_host_mb) == (1024, 0)


def test_the_probe_reports_the_budget(tmp_path, shm):
    cfg = config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")},
                                           "sysfs": {"root": str(tmp_path / "none")},
                                           "ivshmem": {"max_region_mb": 64, "max_host_mb": 100}})
    pool = VfPool(cfg.pool_db)
    with pool.transaction() as txn:
        ivshmem_table.add_user(txn.db, ivshmem.Request(3, 7, 16), 10, "one-10")
        ivshmem_table.add_user(txn.db, ivshmem.Request(5, 2, 4), 11, "one-11")
    pool.close()
    out = io.StringIO()
    probe.report(cfg, out)
    lines = out.getvalue().splitlines()
    assert "KVM_SRIOV_IVSHMEM_MAX_REGION_MB = 64" in lines
    assert "KVM_SRIOV_IVSHMEM_FREE_MB = 80" in lines
    assert 'KVM_SRIOV_IVSHMEM_REGIONS = "kvm-sriov-ivshmem-u3-g7 kvm-sriov-ivshmem-u5-g2"' in lines


def test_doctor_reports_foreign_region_files(tmp_path, shm):
    cfg = config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path)}})
    assert [r.level for r in doctor.check_ivshmem(cfg)] == ["OK"]
    (shm / "kvm-sriov-ivshmem-u0-g8").write_text("x")
    os.chown(shm / "kvm-sriov-ivshmem-u0-g8", 54321, 54321)
    (shm / "kvm-sriov-ivshmem-u0-g9").write_text("ours")
    results = doctor.check_ivshmem(cfg)
    [warn] = [r for r in results if r.name == "foreign region files"]
    assert warn.level == "WARN" and "kvm-sriov-ivshmem-u0-g8" in warn.message
    assert "g9" not in warn.message and warn.fix


def test_after_chown_the_region_stays_the_deploy_owners_and_says_so(capsys):
    record = ivshmem.Record(REQ, ivshmem.Placement(1, 0, None))
    ivshmem_host.keyed_at_deploy(42, record, VmTemplate.from_text("<VM><UID>3</UID></VM>"))
    assert capsys.readouterr().err == ""
    ivshmem_host.keyed_at_deploy(42, record, VmTemplate.from_text("<VM><UID>9</UID></VM>"))
    err = capsys.readouterr().err
    assert "owned by uid 9 now" in err and REQ.name in err and "until it is deployed again" in err


def test_a_region_error_never_escapes_reconcile(db, shm, monkeypatch):
    for vm, group in ((10, 7), (11, 8)):
        ivshmem_table.add_user(db, ivshmem.Request(3, group, 4), vm, f"one-{vm}", now=0.0)
        ivshmem_table.publish(db, f"kvm-sriov-ivshmem-u3-g{group}")
    db.execute("INSERT INTO ivshmem_region (name, uid, vmgroup, size_mb, since) "
               "VALUES ('kvm-sriov-ivshmem-u4294967296-g7', 4294967296, 7, 4, 0)")   # no such ID
    real = ivshmem_region.remove_file

    def failing(name, shm=None):
        if name == "kvm-sriov-ivshmem-u3-g7":
            raise OSError(5, "Input/output error")
        return real(name, shm)
    monkeypatch.setattr(ivshmem_table, "remove_file", failing)
    said = []
    changes = ivshmem_table.plan(db, {}, grace=1, now=100.0)
    ivshmem_table.apply(db, changes, {}, 100.0, log=lambda *a: said.append(a))
    assert ivshmem_table.regions(db) == {"kvm-sriov-ivshmem-u3-g7": 4}   # kept for the next try
    assert not (shm / "kvm-sriov-ivshmem-u3-g8").exists()
    assert any("reconcile tries again" in m for _, m in said)
