"""Rung 1: the shared-memory request, region names, the device XML, the
region table and its reconcile plan, on a real SQLite pool and a temporary
folder standing for /dev/shm."""

from xml.etree import ElementTree as ET

import libvirt
import pytest

from kvm_sriov.ivshmem import device as ivshmem, host as ivshmem_host, region as ivshmem_region
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.errors import HypervisorError, InputError
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.oned.vm_template import VmTemplate


def vm_xml(size='256', group='7', uid='3', where='USER_TEMPLATE'):
    attr = '' if size is None else f'<KVM_SRIOV_IVSHMEM><SIZE>{size}</SIZE></KVM_SRIOV_IVSHMEM>'
    grp = '' if group is None else f'<VMGROUP><ROLE>ranks</ROLE><VMGROUP_ID>{group}</VMGROUP_ID></VMGROUP>'
    tmpl, user = (attr, '') if where == 'TEMPLATE' else ('', attr)
    return VmTemplate.from_text(f'<VM><ID>5</ID><UID>{uid}</UID><TEMPLATE>{grp}{tmpl}</TEMPLATE>'
                                f'<USER_TEMPLATE>{user}</USER_TEMPLATE></VM>')


def test_request_name_comes_from_owner_and_group_only():
    r = ivshmem.request_of(vm_xml())
    assert r == ivshmem.Request(3, 7, 256) and r.name == 'kvm-sriov-ivshmem-u3-g7'
    assert ivshmem.request_of(vm_xml(where='TEMPLATE'), uid=9).name == 'kvm-sriov-ivshmem-u9-g7'
    assert ivshmem.request_of(vm_xml(size=None)) is None
    assert ivshmem.request_of(None) is None


@pytest.mark.parametrize('size, why', [('0', 'power of two'), ('3', 'power of two'),
                                       ('131072', 'power of two'), ('abc', 'whole number'),
                                       ('', 'whole number'), ('-4', 'whole number'),
                                       ('99999999', 'whole number')])
def test_bad_sizes_are_refused(size, why):
    with pytest.raises(InputError, match=why):
        ivshmem.request_of(vm_xml(size=size))


def test_no_group_no_size_or_a_single_value_is_refused():
    with pytest.raises(InputError, match='no VM group'):
        ivshmem.request_of(vm_xml(group=None))
    with pytest.raises(InputError, match='whole number'):
        ivshmem.request_of(VmTemplate.from_text('<VM><UID>1</UID><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>'
                                                '<OTHER>1</OTHER></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>'))
    with pytest.raises(InputError, match='must be a vector'):
        ivshmem.request_of(VmTemplate.from_text('<VM><USER_TEMPLATE><KVM_SRIOV_IVSHMEM>256'
                                                '</KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>'))


def test_q35_device_gets_a_root_port_of_its_own():
    root = ET.fromstring("<domain><os><type machine='q35'>hvm</type></os><devices>"
                         "<controller type='pci' index='0' model='pcie-root'/>"
                         "<controller type='pci' index='6' model='pcie-root-port'/></devices></domain>")
    where = ivshmem.add_device(root, ivshmem.Request(3, 7, 64))
    assert where == ivshmem.Placement(7, 0, 7)
    shmem = root.find('devices/shmem')
    assert shmem.get('name') == 'kvm-sriov-ivshmem-u3-g7' and shmem.find('model').get('type') == 'ivshmem-plain'
    assert shmem.find('address').get('bus') == '0x07'
    assert root.find("devices/controller[@index='7']").get('model') == 'pcie-root-port'
    rec = ivshmem.recorded(ET.fromstring(ET.tostring(root)))
    assert rec.request == ivshmem.Request(3, 7, 64) and rec.where.bus == 7


def test_pc_device_takes_a_free_slot_of_bus_0():
    root = ET.fromstring("<domain><os><type machine='pc'>hvm</type></os><devices><disk>"
                         "<address type='pci' domain='0' bus='0x00' slot='0x1f' function='0'/></disk>"
                         "</devices></domain>")
    assert ivshmem.add_device(root, ivshmem.Request(1, 2, 4)) == ivshmem.Placement(0, 0x1e, None)


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


# -- the device in a running domain: the VFs' hot-plug engine (domain/hotplug.py)
class SlowGuestWithRegion:
    """A running domain whose guest ignores the first `ignored` unplug
    requests for its shared-memory device, as libvirt reports such a guest:
    the detach succeeds and the device stays in the live XML."""

    def __init__(self, record, ignored, plugged=True):
        self.record, self.ignored, self.plugged = record, ignored, plugged
        self.requests = []

    def name(self):
        return 'one-42'

    def XMLDesc(self, flags=0):
        shmem = ivshmem_host.device_xml(self.record) if self.plugged else ''
        return f"<domain type='kvm'><name>one-42</name><devices>{shmem}</devices></domain>"

    def detachDeviceFlags(self, xml, flags):
        assert xml == ivshmem_host.device_xml(self.record)
        self.requests.append(xml)
        if len(self.requests) > self.ignored:
            self.plugged = False
        return 0

    def attachDeviceFlags(self, xml, flags):
        self.plugged = True
        return 0


RECORD = ivshmem.Record(ivshmem.Request(3, 7, 64), ivshmem.Placement(1, 0, 8))


def test_a_guest_that_ignored_the_region_unplug_is_asked_again(capsys):
    dom = SlowGuestWithRegion(RECORD, ignored=1)
    ivshmem_host.unplug(dom, RECORD, timeout=10, retry_every=0.3)
    assert not dom.plugged and len(dom.requests) == 2
    assert 'shared-memory region kvm-sriov-ivshmem-u3-g7 still present' in capsys.readouterr().err


def test_a_guest_that_never_lets_the_region_go_times_out_with_the_reason():
    dom = SlowGuestWithRegion(RECORD, ignored=10**6)
    with pytest.raises(HypervisorError, match='did not release shared-memory region kvm-sriov-ivshmem-u3-g7 '
                                              'within 1s .*is the guest OS up and handling PCIe hot-unplug'):
        ivshmem_host.unplug(dom, RECORD, timeout=1, retry_every=0.4)
    assert len(dom.requests) >= 2


def test_the_region_device_is_plugged_and_confirmed_or_the_refusal_said():
    dom = SlowGuestWithRegion(RECORD, ignored=0, plugged=False)
    ivshmem_host.plug(dom, RECORD, timeout=1)
    assert dom.plugged

    def refuse(xml, flags):
        raise libvirt.libvirtError('unsupported configuration: no hotplug')
    dom = SlowGuestWithRegion(RECORD, ignored=0, plugged=False)
    dom.attachDeviceFlags = refuse
    with pytest.raises(HypervisorError, match='libvirt refused to attach shared-memory region '
                                              'kvm-sriov-ivshmem-u3-g7 to one-42'):
        ivshmem_host.plug(dom, RECORD, timeout=1)
