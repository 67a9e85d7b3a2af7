"""Rung 1: NUMA facts: cpusets, the host's nodes on the fake sysfs, a VM's nodes."""

from xml.etree import ElementTree as etree

import pytest

from kvm_sriov.errors import InputError
from kvm_sriov.vf import numa
from kvm_sriov.vf.sysfs import Sysfs


def test_cpusets():
    assert numa.parse_cpuset("0-3,8,^2") == {0, 1, 3, 8}
    assert numa.format_cpuset({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    with pytest.raises(InputError):
        numa.parse_cpuset("a-b")


def test_host_nodes(fake_host):
    assert numa.host_nodes(Sysfs(fake_host["root"])) == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}


NODES = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}


@pytest.mark.parametrize("xml,expected", [
    ("<domain/>", None),
    ("<domain><numatune><memory nodeset='1'/></numatune></domain>", {1}),
    ("<domain><numatune><memnode cellid='0' nodeset='0'/><memnode cellid='1' nodeset='1'/></numatune></domain>", {0, 1}),
    ("<domain><cputune><vcpupin vcpu='0' cpuset='5'/><vcpupin vcpu='1' cpuset='6'/></cputune></domain>", {1}),
    ("<domain><vcpu cpuset='0-1,4'>2</vcpu></domain>", {0, 1}),
])
def test_vm_nodes(xml, expected):
    got = numa.vm_nodes(etree.fromstring(xml), NODES)
    assert (set(got) if got else None) == expected
