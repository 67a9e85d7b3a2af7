"""The front-end reaches each simulated host by its own ssh alias and
monitors it with the kvm-sriov probe; the shipped templates are accepted."""

import re

from tests.conftest import REPO
from tests.opennebula.conftest import HOST_VFS


def test_each_alias_lands_in_its_own_host(frontend):
    seen = set()
    for name, host in frontend.hosts.items():
        ns = host.ssh("readlink /proc/self/ns/mnt").stdout.strip()
        assert ns == host.mount_ns, name
        # the remotes oned synced are the host's own (its private /var/tmp)
        assert host.ssh("test -x /var/tmp/one/vmm/kvm-sriov/deploy", check=False).returncode == 0, name
        seen.add(ns)
    assert len(seen) == len(frontend.hosts)


def test_hosts_monitored_with_kvm_sriov_attributes(frontend):
    for name, vfs in HOST_VFS.items():
        assert frontend.host_state(name) == "MONITORED"
        tmpl = frontend.xml("onehost", "show", frontend.host(name).one_name).find("TEMPLATE")
        assert tmpl.findtext("VM_MAD") == "kvm-sriov"
        assert tmpl.findtext("KVM_SRIOV_ERROR") is None
        assert tmpl.findtext("KVM_SRIOV_FREE_VFS") == str(vfs), name
        assert tmpl.findtext("KVM_SRIOV_TOTAL_VFS") == str(vfs), name


def test_shipped_templates_are_accepted(frontend, ib_network):
    # the network made from templates/network/ is the driver's kind of network
    net = frontend.xml("onevnet", "show", ib_network).find("TEMPLATE")
    assert net.findtext("VN_MAD") == "dummy" and net.findtext("BRIDGE") == "ib-sriov"
    vm_tmpl = REPO / "templates" / "vm" / "ib-hpc-node.tmpl"
    name = re.search(r'^NAME\s*=\s*"(.*)"', vm_tmpl.read_text(), re.M).group(1)
    if frontend.cli("onetemplate", "show", name, check=False).returncode != 0:
        frontend.create("template", str(vm_tmpl))
    tmpl = frontend.xml("onetemplate", "show", name).find("TEMPLATE")
    assert tmpl.findtext("SCHED_REQUIREMENTS") == "KVM_SRIOV_FREE_VFS > 0"
    assert tmpl.find("NIC[NETWORK='ib-pkey-0x8001']") is not None
