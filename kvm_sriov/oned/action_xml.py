"""The action XML (VMM_DRIVER_ACTION_DATA) OpenNebula sends on stdin:
which of the VM's NICs are on the driver's networks. Each reader takes the
document parsed once (parse(), or the action's delegate.Sent.document)."""

from __future__ import annotations

from typing import NamedTuple
from xml.etree import ElementTree as ET

from ..domain import domain_xml
from ..vf.policy import nic_request
from .vm_template import VmTemplate

WHAT = "action XML"  # the document's name in errors


class VmNic(NamedTuple):
    nic_id: str
    mac: str
    bridge: str
    attach: bool   # the NIC being hot-plugged by attach_nic


def parse(text: str) -> ET.Element:
    return domain_xml.parse(text, WHAT)


def vm_nics(root: ET.Element) -> list[VmNic]:
    nics = []
    for nic in root.iterfind("VM/TEMPLATE/NIC"):
        mac = (nic.findtext("MAC") or "").strip().lower()
        if mac:
            nics.append(VmNic((nic.findtext("NIC_ID") or "").strip(), mac,
                              (nic.findtext("BRIDGE") or "").strip(),
                              (nic.findtext("ATTACH") or "").strip().upper() == "YES"))
    return nics


def sriov_records(root: ET.Element, marker: str) -> list[domain_xml.NicRecord]:
    """The VM's NICs that need a VF (or a whole PF), as metadata records without one yet."""
    return [domain_xml.NicRecord(n.mac, n.bridge) for n in vm_nics(root)
            if nic_request(n.mac, n.bridge, marker) is not None]   # a VF's or a whole PF's


def vm_template(root: ET.Element):
    """The action's <VM> as a vm_template.VmTemplate (None without one)."""
    vm = root.find("VM")
    return VmTemplate(vm, WHAT) if vm is not None else None


def guid_spaces(root: ET.Element) -> dict:
    """MAC -> the network that leases it (vm_template.TemplateNic.address_space)
    for every NIC of the action's VM."""
    vm = vm_template(root)
    return vm.address_spaces() if vm is not None else {}


def system_datastore_shared(root: ET.Element) -> bool:
    return (root.findtext("DATASTORE/TEMPLATE/SHARED") or "YES").strip().upper() == "YES"
