"""Rung 1: the region table (who uses which region) and its reconcile plan, on a
real SQLite pool and a temporary folder standing for /dev/shm."""

import pytest

from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.errors import InputError
from kvm_sriov.vf.pool import VfPool


@pytest.fixture
def db(tmp_path):
    pool = VfPool(tmp_path / 'pool.sqlite3')
    with pool.transaction() as txn:
        yield txn.db


def test_join_leave_header_and_last_user_removes(db, tmp_path):
    req = ivshmem.Request(3, 7, 4)
    assert ivshmem_table.add_user(db, req, 10, 'one-10') is True
    ivshmem_table.publish(db, req.name, tmp_path)
    assert ivshmem_table.add_user(db, req, 11, 'one-11') is False
    ivshmem_table.publish(db, req.name, tmp_path)
    f = tmp_path / req.name
    assert f.stat().st_size == 4 << 20 and oct(f.stat().st_mode & 0o777) == '0o660'
    head = ivshmem_region.read_header(f.read_bytes()[:ivshmem_region.HEADER_BYTES])
    assert head['vms'] == [10, 11] and (head['uid'], head['vmgroup'], head['size']) == (3, 7, 4 << 20)
    assert head['generation'] % 2 == 0
    with pytest.raises(InputError, match='must ask the same'):
        ivshmem_table.add_user(db, ivshmem.Request(3, 7, 8), 12, 'one-12')
    assert ivshmem_table.drop_user(db, 10, tmp_path) is None and f.exists()
    assert ivshmem_region.read_header(f.read_bytes()[:4096])['vms'] == [11]
    assert ivshmem_table.drop_user(db, 11, tmp_path) == req.name and not f.exists()
    assert ivshmem_table.regions(db) == {} and ivshmem_table.users(db) == []


def test_a_file_someone_else_made_is_refused(db, tmp_path):
    req = ivshmem.Request(3, 7, 4)
    (tmp_path / 'target').write_text('x')
    (tmp_path / req.name).symlink_to(tmp_path / 'target')
    ivshmem_table.add_user(db, req, 10, 'one-10')
    with pytest.raises(Exception, match='region'):
        ivshmem_table.publish(db, req.name, tmp_path)
    assert (tmp_path / 'target').read_text() == 'x'


def test_reconcile_plan(db, tmp_path):
    a, b = ivshmem.Request(3, 7, 4), ivshmem.Request(4, 7, 4)
    for vm, req in ((10, a), (11, a), (12, b)):
        ivshmem_table.add_user(db, req, vm, f'one-{vm}', now=100.0)
    ivshmem_table.publish(db, a.name, tmp_path)
    ivshmem_table.publish(db, b.name, tmp_path)
    ivshmem_table.set_attached(db, 10, now=100.0)
    # 10 runs with the device, 11 (reserved) not yet past grace, 12 gone but
    # abandoned; 13 runs with a's device without a row
    live = {'one-10': (10, {a.name: 4}), 'one-13': (13, {a.name: 4})}
    changes = ivshmem_table.plan(db, live, grace=300, now=200.0, abandoned=frozenset({12}))
    assert sorted((c.kind, c.vm_id, c.region) for c in changes) == [
        ('adopt', 13, a.name), ('drop', 12, b.name), ('remove-region', -1, b.name)]
    ivshmem_table.apply(db, changes, live, 200.0, tmp_path)
    assert not (tmp_path / b.name).exists() and (tmp_path / a.name).exists()
    assert [u.vm_id for u in ivshmem_table.users(db)] == [10, 11, 13]
    assert ivshmem_table.plan(db, live, grace=300, now=200.0) == []
    # past grace the reserved 11 goes; nothing runs: everything goes
    changes = ivshmem_table.plan(db, {}, grace=300, now=1000.0)
    ivshmem_table.apply(db, changes, {}, 1000.0, tmp_path)
    assert ivshmem_table.regions(db) == {} and not (tmp_path / a.name).exists()


def test_a_join_between_another_joins_two_transactions_makes_the_file(db, tmp_path):
    """A's row is committed (new region), B joins and publishes before A has
    made the file: B's publish makes it, sized; A's then only rewrites the header."""
    req = ivshmem.Request(3, 7, 2)
    assert ivshmem_table.add_user(db, req, 10, "one-10") is True
    assert ivshmem_table.add_user(db, req, 11, "one-11") is False
    ivshmem_table.publish(db, req.name, tmp_path)
    assert (tmp_path / req.name).stat().st_size == 2 << 20
    with open(tmp_path / req.name, "r+b") as f:
        f.seek(ivshmem_region.HEADER_BYTES)
        f.write(b"data")
    ivshmem_table.publish(db, req.name, tmp_path)
    data = (tmp_path / req.name).read_bytes()
    assert ivshmem_region.read_header(data)["vms"] == [10, 11] and data[4096:4100] == b"data"
