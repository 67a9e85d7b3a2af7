"""Rung 1: NIC -> hostdev on OpenNebula's real deployment file."""

import copy

import pytest
from kvm_sriov.vf import discovery
from kvm_sriov.domain import domain_xml
from kvm_sriov.errors import InputError
from kvm_sriov.vf.sysfs import Sysfs
from tests.conftest import FIXTURES

DEPLOYMENT = (FIXTURES / "opennebula" / "deployment.0").read_text()


@pytest.fixture
def vf(fake_host):
    return discovery.discover(Sysfs(fake_host["root"])).vf("0000:81:00.2")


def test_finds_only_the_marked_nic():
    nics = domain_xml.sriov_nics(domain_xml.parse(DEPLOYMENT), "ib-sriov")
    assert [(n.request.mac, n.request.pf_selector) for n in nics] == [("02:00:0a:64:00:2a", None)]


def test_bridge_selector():
    assert domain_xml.bridge_selector("ib-sriov", "ib-sriov") == (True, None)
    assert domain_xml.bridge_selector("ib-sriov:mlx5_1", "ib-sriov") == (True, "mlx5_1")
    assert domain_xml.bridge_selector("ib-sriov2", "ib-sriov") == (False, None)
    assert domain_xml.bridge_selector("ib-sriov:", "ib-sriov") == (False, None)


def test_replacement_keeps_everything_else(vf):
    root = domain_xml.parse(DEPLOYMENT)
    before = copy.deepcopy(root)
    nic = domain_xml.sriov_nics(root, "ib-sriov")[0]
    domain_xml.replace_with_hostdev(nic, vf)
    domain_xml.record_nics(root, [domain_xml.NicRecord(nic.request.mac, "ib-sriov", vf.address, vf.pf)])
    out = domain_xml.parse(domain_xml.to_string(root))

    hostdevs = out.findall("devices/hostdev")
    assert len(hostdevs) == 1
    h = hostdevs[0]
    assert (h.get("mode"), h.get("type"), h.get("managed")) == ("subsystem", "pci", "yes")
    assert dict(h.find("source/address").attrib) == {
        "domain": "0x0000", "bus": "0x81", "slot": "0x00", "function": "0x2"}
    assert h.find("alias").get("name") == "ua-sriov-02000a64002a"
    # the hostdev sits where the interface was
    devices = [c.tag for c in out.find("devices")]
    assert devices.index("hostdev") == [c.tag for c in before.find("devices")].index("interface") + 1

    # every other element is byte-for-byte what OpenNebula wrote
    def others(tree):
        return [domain_xml.to_string(e) for e in tree.iter()
                if e.tag not in ("hostdev", "source", "address", "alias", "interface", "mac", "target",
                                 "model", "driver", "devices", "domain", "metadata")
                and not str(e.tag).startswith("{")]
    assert others(out) == others(before)
    bridges = [i.find("source").get("bridge") for i in out.iter("interface")]
    assert bridges == ["br0"]
    br0 = domain_xml.to_string(before.findall("devices/interface")[0])
    assert domain_xml.to_string(out.findall("devices/interface")[0]) == br0
    # the metadata says which NIC got which VF, next to OpenNebula's own
    assert domain_xml.recorded_nics(out) == [
        domain_xml.NicRecord("02:00:0a:64:00:2a", "ib-sriov", "0000:81:00.2", "0000:81:00.0")]
    assert out.find("metadata/{http://opennebula.org/xmlns/libvirt/1.0}vm") is not None
    # OpenNebula's monitoring finds its metadata by the one: prefix: kept as written
    text = domain_xml.to_string(out)
    assert "<one:vm" in text and "ns0:" not in text
    one = "{http://opennebula.org/xmlns/libvirt/1.0}"
    # CDATA sections come back as the same text (libvirt keeps no CDATA either)
    assert out.findtext("vcpu") == "4"
    assert out.findtext(f"metadata/{one}vm/{one}system_datastore") == "/var/lib/one//datastores/0/42"


def test_boot_order_moves_to_hostdev(vf):
    xml = """<domain><name>one-1</name><devices><interface type='bridge'>
      <source bridge='ib-sriov'/><mac address='02:00:00:00:00:01'/><boot order='2'/>
      </interface></devices></domain>"""
    root = domain_xml.parse(xml)
    domain_xml.replace_with_hostdev(domain_xml.sriov_nics(root, "ib-sriov")[0], vf)
    assert root.find("devices/hostdev/boot").get("order") == "2"


def test_pci_hostdevs_roundtrip(vf):
    root = domain_xml.parse(DEPLOYMENT)
    domain_xml.replace_with_hostdev(domain_xml.sriov_nics(root, "ib-sriov")[0], vf)
    assert list(domain_xml.pci_hostdevs(root)) == ["0000:81:00.2"]


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("<domain><name>x</name>", "not well-formed"),
    ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><domain><name>&x;</name></domain>',
     "DOCTYPE"),
])
def test_bad_xml_refused(text, message):
    with pytest.raises(InputError, match=message):
        domain_xml.parse(text)


def test_nic_without_mac_refused():
    root = domain_xml.parse("<domain><name>n</name><devices><interface type='bridge'>"
                            "<source bridge='ib-sriov'/></interface></devices></domain>")
    with pytest.raises(InputError, match="no MAC"):
        domain_xml.sriov_nics(root, "ib-sriov")


def test_not_a_domain():
    with pytest.raises(InputError, match="expected a libvirt <domain>"):
        domain_xml.domain_name(domain_xml.parse("<VM/>"))
