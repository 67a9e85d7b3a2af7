"""The harness's MPI hostfile (kvm_sriov_bench.opennebula): an IPoIB address
comes from a template the tenant can change, so it must be IPv4 or IPv6 text
alone (ipaddress takes a scope id with any text after '%', newlines
included); hostfile() writes one host per line or refuses, whichever target
made the VM list."""
import pytest

from kvm_sriov_bench.errors import OrchestrationError
from kvm_sriov_bench.opennebula import BenchVM, hostfile, ipoib_address

BAD = ["fd00::1%x\n10.6.6.6 slots=999", "fd00::1%ib0", "fd00::1%", "fe80::1%ib0", "10.0.0.1\n", " 10.0.0.1",
       "10.0.0.1\x00", "fd00::1\r", "10.0.0.1 10.0.0.2", "10.0.0.1; x", "224.0.0.1", "127.0.0.1", "::", "", None]


def nic(**kw):
    return {"NIC": [{"BRIDGE": "br0", "IP": "192.168.1.2"}, dict(BRIDGE="ib-sriov:mlx5_0", **kw)]}


@pytest.mark.parametrize("raw", BAD, ids=map(repr, BAD))
@pytest.mark.parametrize("field", ["IP", "IP6_GLOBAL", "IP6"])
def test_an_address_that_is_not_one_unicast_address_alone_is_no_address(raw, field):
    assert ipoib_address(nic(**{field: raw})) is None


def test_good_addresses_in_their_normal_form():
    assert ipoib_address(nic(IP="10.1.0.7")) == "10.1.0.7"
    assert ipoib_address(nic(IP6_GLOBAL="FD00:0:0::7")) == "fd00::7"
    assert hostfile([BenchVM(1, "a", "h1", "10.1.0.7", 4), BenchVM(2, "b", "h2", "fd00::7", 2)]) == \
        "10.1.0.7 slots=4\nfd00::7 slots=2\n"


@pytest.mark.parametrize("address, vcpu", [(raw, 1) for raw in BAD] + [("10.1.0.7", 0), ("10.1.0.7", "4\nx"),
                                                                        ("10.1.0.7", 99999)],
                         ids=lambda v: repr(v))
def test_hostfile_refuses_a_vm_that_is_not_one_host_line(address, vcpu):
    with pytest.raises(OrchestrationError, match="VM 9: .* is not a hostfile line"):
        hostfile([BenchVM(1, "a", "h1", "10.1.0.8", 1), BenchVM(9, "x", "h2", address, vcpu)])
