"""Rung 1: one owner's regions take at most its share of a host's
shared-memory budget (ivshmem.max_owner_mb, default half of the host's), so
a tenant whose VM groups fill its share cannot keep another tenant's region
off the host. Counted where a region is admitted: table.add_user, inside
the pool transaction, on a real SQLite pool."""

import io
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError, InputError
from kvm_sriov.ivshmem import device as ivshmem, host as ivshmem_host, region as ivshmem_region
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.vf.pool import VfPool

A, B = 3, 5     # two tenants' uids


@pytest.fixture
def pool(tmp_path):
    pool = VfPool(tmp_path / "pool.sqlite3")
    yield pool
    pool.close()


def admit(pool, budget, uid: int, group: int, size: int, vm: int) -> bool:
    with pool.transaction() as txn:
        return ivshmem_table.add_user(txn.db, ivshmem.Request(uid, group, size), vm, f"one-{vm}",
                                      budget=budget)


def test_a_tenant_that_filled_its_share_cannot_keep_another_tenants_region_off_the_host(pool):
    cfg = config.load(files=[], overrides={"ivshmem": {"max_host_mb": 64}})
    budget = ivshmem_host.budget(cfg)
    assert budget == ivshmem_table.Budget(1024, 64, 32)          # default: half of the host's
    assert admit(pool, budget, A, 1, 16, 10) and admit(pool, budget, A, 2, 16, 11)
    with pytest.raises(InputError, match=r"owner uid 3's shared-memory budget on this host: "
                                         r"32 of 32 MB in use .*ivshmem.max_owner_mb"):
        admit(pool, budget, A, 3, 1, 12)
    assert admit(pool, budget, B, 1, 1, 20)                       # same group ID, other owner
    assert not admit(pool, budget, A, 1, 16, 13)                  # joining A's region costs nothing
    with pool.transaction() as txn:
        assert ivshmem_table.used_mb(txn.db) == 33
        assert (ivshmem_table.used_mb(txn.db, A), ivshmem_table.used_mb(txn.db, B)) == (32, 1)
        assert sorted(u.vm_id for u in ivshmem_table.users(txn.db)) == [10, 11, 13, 20]   # 12: no row
        ivshmem_table.drop_user(txn.db, 11)                       # A's group 2 ends: room again
    assert admit(pool, budget, A, 3, 8, 12)


def test_the_owners_share_is_counted_in_the_transaction_that_admits(pool):
    budget = ivshmem_table.Budget(max_region_mb=64, max_host_mb=64, max_owner_mb=16)
    with pytest.raises(InputError, match="owner uid 3"):
        with pool.transaction() as txn:
            ivshmem_table.add_user(txn.db, ivshmem.Request(A, 1, 8), 10, "one-10", budget=budget)
            ivshmem_table.add_user(txn.db, ivshmem.Request(A, 2, 8), 11, "one-11", budget=budget)
            ivshmem_table.add_user(txn.db, ivshmem.Request(A, 3, 8), 12, "one-12", budget=budget)
    with pool.transaction() as txn:       # rolled back whole: nothing of the three stays
        assert ivshmem_table.regions(txn.db) == {}


def test_the_host_budget_still_binds_when_the_owners_share_is_larger(pool):
    budget = ivshmem_table.Budget(max_region_mb=64, max_host_mb=16, max_owner_mb=64)
    assert admit(pool, budget, A, 1, 8, 10) and admit(pool, budget, B, 1, 8, 11)
    with pytest.raises(InputError, match="16 of 16 MB in use .*ivshmem.max_host_mb"):
        admit(pool, budget, A, 2, 1, 12)


def test_deploy_refuses_a_size_above_the_owners_share_before_anything_is_taken():
    cfg = config.load(files=[], overrides={"ivshmem": {"max_host_mb": 64, "max_owner_mb": 8}})
    with pytest.raises(InputError, match="0 of 8 MB in use"):
        ivshmem_table.fits(ivshmem.Request(A, 1, 16), ivshmem_host.budget(cfg))


def test_config_max_owner_mb(tmp_path):
    cfg = config.load(files=[], overrides={"ivshmem": {"max_host_mb": 100, "max_owner_mb": 40}})
    assert cfg.ivshmem_max_owner_mb == 40 and ivshmem_host.budget(cfg).max_owner_mb == 40
    assert config.load(files=[]).ivshmem_max_owner_mb == 0
    assert ivshmem_region.owner_budget_mb(0, 101) == 50
    for bad in (-1, 1.5, "64"):
        with pytest.raises(ConfigError, match="max_owner_mb"):
            config.load(files=[], overrides={"ivshmem": {"max_owner_mb": bad}})
    shipped = config.load(files=[Path(__file__).resolve().parents[2] / "etc/vmm/kvm-sriov/kvm-sriov.toml"])
    assert shipped.ivshmem_max_owner_mb == 0
    text = (Path(__file__).resolve().parents[2] / "etc/vmm/kvm-sriov/kvm-sriov.toml").read_text()
    assert "\nmax_owner_mb = 0\n" in text


@pytest.mark.parametrize("name, uid", [
    ("kvm-sriov-ivshmem-u3-g7", 3), ("kvm-sriov-ivshmem-u2147483647-g0", 2147483647),
    ("kvm-sriov-ivshmem-u-g7", None), ("kvm-sriov-ivshmem-u3-g", None), ("kvm-sriov-ivshmem-u3", None),
    ("kvm-sriov-ivshmem-u3-g7-g8", None), ("kvm-sriov-ivshmem-u\u0663-g7", None),
    ("other-u3-g7", None), ("kvm-sriov-ivshmem-u" + "9" * 11 + "-g1", None)])
def test_a_regions_owner_is_read_from_its_name_as_device_names_it(name, uid):
    assert ivshmem_region.owner_of(name) == uid
    if uid is not None:
        assert ivshmem.NAME.match(name).group(1) == str(uid)
    assert ivshmem.Request(3, 7, 1).name.startswith(ivshmem_region._NAME_HEAD)


def test_the_probe_reports_each_owners_use_and_the_share_and_the_placer_honours_them(tmp_path):
    """The host probe's figures, as the placer reads them from the host template:
    A's share is full there, B's VM goes there and A's does not."""
    from kvm_sriov.node import probe
    from kvm_sriov.scheduler.placement import HostVfs, VfNeed
    cfg = config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")},
                                           "sysfs": {"root": str(tmp_path / "none")},
                                           "ivshmem": {"max_host_mb": 64}})
    pool = VfPool(cfg.pool_db)
    budget = ivshmem_host.budget(cfg)
    for uid, group, size, vm in ((A, 1, 16, 10), (A, 2, 16, 11), (B, 4, 2, 20)):
        assert admit(pool, budget, uid, group, size, vm)
    pool.close()
    out = io.StringIO()
    probe.report(cfg, out)
    lines = out.getvalue().splitlines()
    assert "KVM_SRIOV_IVSHMEM_MAX_OWNER_MB = 32" in lines
    assert 'KVM_SRIOV_IVSHMEM_OWNERS_MB = "3:32 5:2"' in lines
    attrs = dict((k, v.strip('"')) for k, _, v in (line.partition(" = ") for line in lines)
                 if k.startswith("KVM_SRIOV_") and not v.startswith("["))
    host = HostVfs.from_monitoring(attrs)
    assert "32 of 32 MB per owner in use by uid 3" == host.region_problem(
        VfNeed((), region=ivshmem.Request(A, 3, 1).name, region_mb=1))
    assert host.region_problem(VfNeed((), region=ivshmem.Request(B, 5, 1).name, region_mb=1)) is None
