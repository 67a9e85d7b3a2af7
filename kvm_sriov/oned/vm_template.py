"""The OpenNebula VM document (``<VM>``) that oned writes as ``vm.xml``
next to the deployment file before deploy runs, read once and small.

Per-VM wishes live there as plain template attributes a user may set
(``KVM_SRIOV_HPC = "yes"``, ``KVM_SRIOV_NUMA = "require"``,
``KVM_SRIOV_GPU_AFFINITY = "switch"``, ``KVM_SRIOV_IVSHMEM = [ SIZE = "256" ]``),
not in RAW, which would let users inject domain XML. oned keeps attributes
it does not know in USER_TEMPLATE; TEMPLATE is read after it (an
administrator's template may carry them there). The same XML comes on stdin with some actions (action_xml.py): use
``from_text`` for it.

Parsed by domain_xml.parse: size and depth bounded, DOCTYPE refused. The
file is opened without following a symlink, so the VM's directory cannot
point the driver at another file.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..domain import domain_xml
from ..errors import InputError
from ..opennebula import MAX_ID, shown

FILE_NAME = "vm.xml"
_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only (str.isdigit() takes '١٢')


class TemplateNic(NamedTuple):
    """A NIC of the VM document (TEMPLATE/NIC)."""
    mac: str
    network_id: Optional[int]          # NETWORK_ID: the network the lease came from
    parent_network_id: Optional[int]   # PARENT_NETWORK_ID: set when that network is a reservation
    bridge: str = ""

    @property
    def address_space(self) -> Optional[int]:
        """The network whose address ranges own the MAC: a reservation
        (``onevnet reserve``, one level only in OpenNebula) leases its parent's."""
        return self.parent_network_id if self.parent_network_id is not None else self.network_id


def _int(text: Optional[str]) -> Optional[int]:
    """A NIC's network ID; None when it is none (absent, not ASCII digits).
    Above oned's int32: refused, oned never writes one."""
    t = (text or "").strip()
    if not _DIGITS.fullmatch(t):
        return None
    if len(t) > 10 or int(t) > MAX_ID:
        raise InputError(f"network ID {shown(t)} is not an OpenNebula ID (0 to {MAX_ID})")
    return int(t)


class VmTemplate:
    def __init__(self, root: ET.Element, where: str = FILE_NAME):
        if root.tag != "VM":
            raise InputError(f"{where}: expected OpenNebula's <VM> document, got <{root.tag}>")
        self.root = root
        self.where = where

    @classmethod
    def from_text(cls, text: str, where: str = "VM XML") -> "VmTemplate":
        return cls(domain_xml.parse(text, where), where)

    # -- who and where ------------------------------------------------------
    def _id(self, path: str) -> Optional[int]:
        """An ID of the document as oned writes it (non-negative int32); None
        when absent or empty; anything else is refused (it names no object,
        and would not fit where IDs are stored)."""
        t = (self.root.findtext(path) or "").strip()
        if not t:
            return None
        if not _DIGITS.fullmatch(t) or len(t) > 10 or int(t) > MAX_ID:
            raise InputError(f"{self.where}: {path} {shown(t)!r} is not an OpenNebula ID (0 to {MAX_ID})")
        return int(t)

    @property
    def vm_id(self) -> Optional[int]:
        return self._id("ID")

    @property
    def uid(self) -> Optional[int]:
        """The owner's user ID."""
        return self._id("UID")

    @property
    def gid(self) -> Optional[int]:
        return self._id("GID")

    @property
    def vmgroup_id(self) -> Optional[int]:
        """TEMPLATE/VMGROUP/VMGROUP_ID: the VM group the VM is a role of (None: none)."""
        return self._id("TEMPLATE/VMGROUP/VMGROUP_ID")

    @property
    def vmgroup_role(self) -> Optional[str]:
        role = (self.root.findtext("TEMPLATE/VMGROUP/ROLE") or "").strip()
        return role or None

    # -- attributes -----------------------------------------------------------
    def _first(self, name: str) -> Optional[ET.Element]:
        for where in ("USER_TEMPLATE", "TEMPLATE"):
            el = self.root.find(f"{where}/{name}")
            if el is not None:
                return el
        return None

    def attribute(self, name: str) -> Optional[str]:
        """A single-valued attribute, stripped; None when absent or empty.
        USER_TEMPLATE first, then TEMPLATE. A vector under that name is refused."""
        el = self._first(name)
        if el is None:
            return None
        if len(el):
            raise InputError(f"{self.where}: {name} must be a single value, not a vector [ ... ]")
        return (el.text or "").strip() or None

    def vector(self, name: str) -> Optional[dict[str, str]]:
        """A vector attribute (``NAME = [ K = "v", ... ]``) as K -> v; None
        when absent. A single value under that name is refused."""
        el = self._first(name)
        if el is None:
            return None
        if not len(el) and (el.text or "").strip():
            raise InputError(f"{self.where}: {name} must be a vector, e.g. {name} = [ SIZE = \"256\" ]")
        return {child.tag: (child.text or "").strip() for child in el}

    def attributes(self, prefix: str = "KVM_SRIOV_") -> dict[str, str]:
        """Every single-valued attribute whose name starts with ``prefix``
        (TEMPLATE's, overridden by USER_TEMPLATE's)."""
        found: dict[str, str] = {}
        for where in ("TEMPLATE", "USER_TEMPLATE"):
            for el in self.root.iterfind(f"{where}/*"):
                if str(el.tag).startswith(prefix) and not len(el):
                    found[el.tag] = (el.text or "").strip()
        return found

    # -- NICs ------------------------------------------------------------------
    def nics(self) -> list[TemplateNic]:
        """TEMPLATE/NIC (and NIC_ALIAS) with a MAC, in document order."""
        out = []
        for tag in ("NIC", "NIC_ALIAS"):
            for nic in self.root.iterfind(f"TEMPLATE/{tag}"):
                mac = (nic.findtext("MAC") or "").strip().lower()
                if mac:
                    out.append(TemplateNic(mac, _int(nic.findtext("NETWORK_ID")),
                                           _int(nic.findtext("PARENT_NETWORK_ID")),
                                           (nic.findtext("BRIDGE") or "").strip()))
        return out

    def address_spaces(self) -> dict[str, Optional[int]]:
        """MAC -> the network whose address ranges lease it (see TemplateNic)."""
        return {n.mac: n.address_space for n in self.nics()}


def path_beside(deployment_file: str) -> Path:
    return Path(deployment_file).parent / FILE_NAME


def load(deployment_file: str, only_naming: tuple[str, ...] = ()) -> Optional[VmTemplate]:
    """vm.xml next to ``deployment_file``; None when there is none (a deploy
    run by hand, an older oned). Refused (InputError): a symlink, not a
    regular file, too large, not UTF-8, not well-formed, a DOCTYPE, not <VM>.

    only_naming: the attributes the caller reads; a document in which none
    of these names occurs cannot hold one (an element's name is spelt out,
    and without a DOCTYPE no entity can spell it) and gives None unparsed:
    every deploy asks, and most VMs have none of them."""
    path = path_beside(deployment_file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror} (a symlink is refused)") from None
    try:  # the type first: a directory opens, and a file object of it raises IsADirectoryError
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise InputError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(domain_xml.MAX_XML_CHARS * 4 + 1)  # UTF-8: at most 4 bytes per character
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8") from None
    if only_naming and "<!DOCTYPE" not in text and not any(name in text for name in only_naming):
        return None
    return VmTemplate.from_text(text, str(path))
