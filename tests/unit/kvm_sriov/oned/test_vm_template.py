"""Rung 1: the reader of OpenNebula's vm.xml (the <VM> document oned writes
next to the deployment file): attributes, owner, VM group, NIC networks, and
what it refuses."""

import os
import re

import pytest

from kvm_sriov.oned import vm_template
from kvm_sriov.errors import InputError
from tests.conftest import FIXTURES

ACTION = (FIXTURES / "opennebula" / "action-deploy.xml").read_text()
VM = re.search(r"<VM>.*</VM>", ACTION, re.S).group(0)  # the <VM> oned also writes as vm.xml


def vm_xml(user="", template="", nics=""):
    text = VM.replace("<USER_TEMPLATE>", "<USER_TEMPLATE>" + user, 1)
    return text.replace("<TEMPLATE>", "<TEMPLATE>" + template + nics, 1)


def beside(tmp_path, text):
    folder = tmp_path / "0" / "42"
    folder.mkdir(parents=True)
    (folder / "vm.xml").write_text(text + "\n")
    return str(folder / "deployment.0")


def test_real_vm_document(tmp_path):
    t = vm_template.load(beside(tmp_path, VM))
    assert (t.vm_id, t.uid, t.vmgroup_id, t.vmgroup_role) == (42, 0, None, None)
    assert t.attributes() == {}
    assert t.nics() == [vm_template.TemplateNic("02:00:0a:00:00:2a", 0, None, "br0"),
                        vm_template.TemplateNic("02:00:0a:64:00:2a", 5, None, "ib-sriov")]


def test_attributes_user_template_first(tmp_path):
    t = vm_template.load(beside(tmp_path, vm_xml(
        user="<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC><KVM_SRIOV_IVSHMEM><SIZE>256</SIZE></KVM_SRIOV_IVSHMEM>",
        template="<KVM_SRIOV_HPC>no</KVM_SRIOV_HPC><KVM_SRIOV_NUMA> require </KVM_SRIOV_NUMA>"
                 "<VMGROUP><ROLE>workers</ROLE><VMGROUP_ID>7</VMGROUP_ID></VMGROUP>")))
    assert t.attribute("KVM_SRIOV_HPC") == "yes"
    assert t.attribute("KVM_SRIOV_NUMA") == "require"
    assert t.attribute("KVM_SRIOV_NOPE") is None
    assert t.attributes() == {"KVM_SRIOV_HPC": "yes", "KVM_SRIOV_NUMA": "require"}
    assert t.vector("KVM_SRIOV_IVSHMEM") == {"SIZE": "256"}
    assert (t.vmgroup_id, t.vmgroup_role) == (7, "workers")
    with pytest.raises(InputError, match="single value"):
        t.attribute("KVM_SRIOV_IVSHMEM")
    with pytest.raises(InputError, match="must be a vector"):
        t.vector("KVM_SRIOV_HPC")


def test_nic_networks_and_reservations():
    t = vm_template.VmTemplate.from_text(vm_xml(nics=(
        "<NIC><MAC>02:00:0A:00:00:05</MAC><NETWORK_ID>3</NETWORK_ID><BRIDGE>ib-sriov</BRIDGE></NIC>"
        "<NIC><MAC>02:00:0a:00:00:06</MAC><NETWORK_ID>9</NETWORK_ID>"
        "<PARENT_NETWORK_ID>4</PARENT_NETWORK_ID></NIC>"
        "<NIC><MAC>02:00:0a:00:00:07</MAC><NETWORK_ID>١٢</NETWORK_ID></NIC>")))
    spaces = t.address_spaces()
    assert spaces["02:00:0a:00:00:05"] == 3      # MACs lower-cased
    assert spaces["02:00:0a:00:00:06"] == 4      # a reservation leases its parent's MACs
    assert spaces["02:00:0a:00:00:07"] is None   # not ASCII digits: no network


def test_missing_file_is_none(tmp_path):
    assert vm_template.load(str(tmp_path / "deployment.0")) is None


@pytest.mark.parametrize("text, message", [
    ('<!DOCTYPE VM [<!ENTITY x "y">]><VM><ID>1</ID></VM>', "DOCTYPE"),
    ("<VM>" * 100 + "</VM>" * 100, "deep"),
    ("<DOMAIN/>", "expected OpenNebula's <VM>"),
    ("<VM><ID>1</VM>", "not well-formed"),
    ("", "empty"),
])
def test_refused(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        vm_template.load(beside(tmp_path, text))


def test_symlink_and_non_utf8_refused(tmp_path):
    folder = tmp_path / "42"
    folder.mkdir()
    (tmp_path / "other.xml").write_text(VM)
    os.symlink(tmp_path / "other.xml", folder / "vm.xml")
    with pytest.raises(InputError, match="symlink"):
        vm_template.load(str(folder / "deployment.0"))
    (folder / "vm.xml").unlink()
    (folder / "vm.xml").write_bytes(b"<VM><NAME>\xff</NAME></VM>")
    with pytest.raises(InputError, match="UTF-8"):
        vm_template.load(str(folder / "deployment.0"))
    (folder / "vm.xml").unlink()
    os.mkfifo(folder / "vm.xml")
    with pytest.raises(InputError, match="regular file"):
        vm_template.load(str(folder / "deployment.0"))
