"""Rung 1: what a call for a VM without VFs does before it is handed over to
the stock script: the pool is looked at read-only, without its
lock, and vm.xml is parsed only when it names an attribute kvm-sriov reads;
anything of the VM in the pool or in vm.xml still takes kvm-sriov's path."""

import fcntl
import io
import os
import sqlite3

import pytest

from kvm_sriov.vf import intents
from kvm_sriov.ivshmem import device as ivshmem, table as ivshmem_table
from kvm_sriov.oned import vm_template
from kvm_sriov.actions import lifecycle
from kvm_sriov.actions.delegate import read_sent
from kvm_sriov.errors import InputError
from kvm_sriov.node.host import Host
from kvm_sriov.opennebula import parse_argv
from tests.support.actions_in_process import deployment


@pytest.fixture
def host(fake_host, make_config):
    cfg = make_config(fake_host["root"], timeouts={"lock_seconds": 1})
    h = Host(cfg)
    yield h
    h.close()


def pool_lock_held(host):
    """Another action's pool lock, held for the block (flock: per open file)."""
    host.config.pool_db.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{host.config.pool_db}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def tables(path):
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_no_pool_database_means_nothing_and_makes_none(host):
    assert lifecycle.vf_state(host, 42) is False
    assert not host.config.pool_db.exists() and not host.config.state_dir.exists()


@pytest.mark.parametrize("what", ["assignment", "intent", "ivshmem user"])
def test_the_pool_is_read_without_its_lock(host, what):
    with host.pool.transaction() as txn:
        if what == "assignment":
            txn.add("0000:03:00.1", "0000:03:00.0", 42, "one-42", "02:00:0a:64:00:2a", "attached", "deploy")
        elif what == "intent":
            intents.record(txn, 42, "deploy", "begin", {})
        else:
            ivshmem_table.add_user(txn.db, ivshmem.Request(3, 7, 256), 42, "one-42")
        txn.add("0000:81:00.1", "0000:81:00.0", 7, "one-7", "02:00:0a:64:00:07", "attached", "deploy")
    host.pool.close()
    fd = pool_lock_held(host)  # the transaction would wait for it (and fail after 1 s)
    try:
        assert lifecycle.vf_state(host, 42) is True
        assert lifecycle.vf_state(host, 43) is False
    finally:
        os.close(fd)


def test_reading_writes_nothing(host):
    """A pool without the shared-memory tables (made on first use) keeps
    none: the read-only look does not make them to ask them."""
    with host.pool.transaction() as txn:
        txn.add("0000:81:00.1", "0000:81:00.0", 7, "one-7", "02:00:0a:64:00:07", "attached", "deploy")
    host.pool.close()
    before = host.config.pool_db.read_bytes()
    assert lifecycle.vf_state(host, 42) is False
    assert "ivshmem_user" not in tables(host.config.pool_db)
    assert host.config.pool_db.read_bytes() == before


def test_a_pool_not_in_wal_mode_is_asked_in_a_transaction(host):
    """No read-only look at a database that is not (yet) set up: the
    transaction sets it up and answers, as before."""
    host.config.state_dir.mkdir(parents=True)
    host.config.pool_db.write_bytes(b"")
    assert lifecycle.vf_state(host, 42) is False
    assert "assignment" in tables(host.config.pool_db)


# -- deploy: vm.xml --------------------------------------------------------
VM = ("<VM><ID>42</ID><UID>3</UID><GID>0</GID><TEMPLATE>{template}"
      "<VMGROUP><VMGROUP_ID>7</VMGROUP_ID><ROLE>r</ROLE></VMGROUP></TEMPLATE>"
      "<USER_TEMPLATE>{user}</USER_TEMPLATE></VM>")


def involves(host, tmp_path, vm_xml=None):
    folder = tmp_path / "datastores" / "0" / "42"
    folder.mkdir(parents=True, exist_ok=True)
    if vm_xml is not None:
        (folder / "vm.xml").write_text(vm_xml)
    argv = [str(folder / "deployment.0"), "host1", "42", "host1"]
    sent = read_sent("deploy", argv, io.StringIO(deployment(nics=0)))
    return lifecycle.involves_vfs(host, parse_argv("deploy", argv), sent)


@pytest.mark.parametrize("user", ['<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC>', '<KVM_SRIOV_NUMA>require</KVM_SRIOV_NUMA>',
                                  '<KVM_SRIOV_IVSHMEM><SIZE>256</SIZE></KVM_SRIOV_IVSHMEM>'])
def test_a_vm_with_an_attribute_of_ours_is_ours(host, tmp_path, user):
    assert involves(host, tmp_path, VM.format(template="", user=user)) is True


def test_a_vm_without_any_is_not(host, tmp_path):
    assert involves(host, tmp_path) is False
    assert involves(host, tmp_path, VM.format(template="<NAME>x</NAME>", user="<OTHER>KVM_SRIOV</OTHER>")) is False


def test_vm_xml_naming_none_is_not_parsed(tmp_path):
    dep = str(tmp_path / "deployment.0")
    names = ("KVM_SRIOV_HPC", "KVM_SRIOV_NUMA")
    (tmp_path / "vm.xml").write_text("<VM><NAME>unclosed</VM>")
    assert vm_template.load(dep, only_naming=names) is None  # nothing of ours can be in it
    with pytest.raises(InputError):
        vm_template.load(dep)
    (tmp_path / "vm.xml").write_text("<VM><USER_TEMPLATE><KVM_SRIOV_HPC>yes</USER_TEMPLATE></VM>")
    with pytest.raises(InputError):  # it names one: parsed, and refused
        vm_template.load(dep, only_naming=names)


def test_vm_xml_with_a_doctype_is_parsed_and_refused(tmp_path):
    """An entity could spell the name without its letters in the file."""
    (tmp_path / "vm.xml").write_text('<!DOCTYPE VM [<!ENTITY h "&#60;KVM&#95;SRIOV&#95;HPC>yes&#60;/KVM&#95;'
                                     'SRIOV&#95;HPC>">]><VM><USER_TEMPLATE>&h;</USER_TEMPLATE></VM>')
    with pytest.raises(InputError, match="DOCTYPE"):
        vm_template.load(str(tmp_path / "deployment.0"), only_naming=("KVM_SRIOV_HPC",))


def test_the_file_checks_stay(tmp_path):
    (tmp_path / "other.xml").write_text("<VM/>")
    os.symlink(tmp_path / "other.xml", tmp_path / "vm.xml")
    with pytest.raises(InputError, match="symlink"):
        vm_template.load(str(tmp_path / "deployment.0"), only_naming=("KVM_SRIOV_HPC",))

