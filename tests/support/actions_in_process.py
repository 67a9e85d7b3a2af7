"""OpenNebula's deployment file (tests/fixtures/opennebula/deployment.0) made into
a VM with `nics` IB NICs, for the actions in-process on libvirt's test driver
(the `run` fixture of tests/conftest.py)."""

from xml.etree import ElementTree as etree

from tests.conftest import FIXTURES

DEPLOYMENT = (FIXTURES / "opennebula" / "deployment.0").read_text()
UUID = "a3e014a1-e0ac-51b5-ba2e-2a3c7eea1c40"


def deployment(nics=1, name="one-42", uuid=UUID, bridge="ib-sriov"):
    root = etree.fromstring(DEPLOYMENT.encode())
    root.set("type", "test")
    root.find("name").text = name
    root.find("uuid").text = uuid
    devices = root.find("devices")
    ib = [i for i in devices.iter("interface") if i.find("source").get("bridge") == "ib-sriov"][0]
    ib.find("source").set("bridge", bridge)
    for n in range(1, nics):
        extra = etree.fromstring(etree.tostring(ib))
        extra.find("mac").set("address", f"02:00:0a:64:01:{n:02x}")
        devices.append(extra)
    if nics == 0:
        devices.remove(ib)
    return etree.tostring(root, encoding="unicode")
