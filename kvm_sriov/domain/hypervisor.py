"""The few libvirt operations the driver needs, with libvirt's errors turned
into one-line reasons. libvirt is the truth about what runs on this host."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple, Optional

from ..errors import HypervisorError
from . import domain_xml

# The libvirt module, imported by the first Hypervisor (libvirt_module): the
# import alone costs tens of milliseconds, and an action on a VM without VFs
# hands over to the stock script without ever connecting.
libvirt = None


def libvirt_module():
    """libvirt, imported once and quiet; for every module that calls it."""
    global libvirt
    if libvirt is None:
        import libvirt as module
        # libvirt prints every error to stderr by default; OpenNebula would take
        # those lines for the failure reason, so the driver reports errors itself.
        module.registerErrorHandler(lambda _ctx, _err: None, None)
        libvirt = module
    return libvirt


ONE_DOMAIN = re.compile(r"^one-(\d+)$")


class DomainRef(NamedTuple):
    name: str
    uuid: str

    @property
    def vm_id(self) -> int:
        """OpenNebula names its domains one-<vmid>; anything else is not ours."""
        m = ONE_DOMAIN.match(self.name)
        return int(m.group(1)) if m else -1


class LiveState(NamedTuple):
    """What libvirt runs right now."""
    domains: dict[str, DomainRef]      # name -> ref, active domains only
    hostdevs: dict[str, DomainRef]     # PCI address -> the domain holding it


def _reason(exc: libvirt.libvirtError) -> str:
    return (exc.get_error_message() or str(exc)).strip()


class Hypervisor:
    def __init__(self, uri: str):
        libvirt_module()
        self.uri = uri
        self._conn: Optional[libvirt.virConnect] = None

    @property
    def conn(self) -> libvirt.virConnect:
        if self._conn is None:
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as exc:
                raise HypervisorError(f"cannot connect to libvirt at {self.uri}: {_reason(exc)}") from None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass
            self._conn = None

    def lookup(self, deploy_id: str) -> Optional[libvirt.virDomain]:
        """By UUID (what deploy prints) or by name; None if there is none."""
        finders: list[Callable[[str], libvirt.virDomain]] = [self.conn.lookupByName]
        if re.fullmatch(r"[0-9a-fA-F-]{32,36}", deploy_id):
            finders.insert(0, self.conn.lookupByUUIDString)
        for find in finders:
            try:
                return find(deploy_id)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() not in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_INVALID_ARG):
                    raise HypervisorError(f"looking up domain {deploy_id}: {_reason(exc)}") from None
        return None

    @staticmethod
    def is_active(dom: libvirt.virDomain) -> bool:
        libvirt_module()  # a static method: there may be no Hypervisor yet
        try:
            return bool(dom.isActive())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return False  # a transient domain that stopped is gone
            raise HypervisorError(f"domain {dom.name()}: {_reason(exc)}") from None

    def destroy(self, dom: libvirt.virDomain) -> None:
        try:
            dom.destroy()
        except libvirt.libvirtError as exc:
            if self.is_active(dom):
                raise HypervisorError(f"could not destroy {dom.name()}: {_reason(exc)}") from None

    def _call(self, what: str, fn: Callable[[], int]) -> None:
        try:
            fn()
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"{what}: {_reason(exc)}") from None

    def saved_image_xml(self, path: str) -> str:
        try:
            return self.conn.saveImageGetXMLDesc(path, 0)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"cannot read the checkpoint {path}: {_reason(exc)}") from None

    def set_metadata(self, dom: libvirt.virDomain, records) -> None:
        """Keep the live domain's record of its VF NICs current."""
        records = list(records)
        if not records and not domain_xml.recorded_nics(domain_xml.parse(dom.XMLDesc(0))):
            return  # a VM without VF NICs keeps its metadata as OpenNebula wrote it
        xml = domain_xml.to_string(domain_xml.metadata_element(records, namespaced=False))
        self._call(f"could not update the metadata of {dom.name()}",
                   lambda: dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, "sriov",
                                           domain_xml.METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE))

    @staticmethod
    def migrate(dom: libvirt.virDomain, dconn: libvirt.virConnect, live: bool,
                copy_storage: bool = False) -> libvirt.virDomain:
        """Move a running domain back to this host after a failed VF attach
        there (the way there is OpenNebula's migrate); returns it here."""
        libvirt_module()
        flags = (libvirt.VIR_MIGRATE_LIVE if live else 0) | (
            libvirt.VIR_MIGRATE_NON_SHARED_DISK if copy_storage else 0)
        try:
            return dom.migrate(dconn, flags, None, None, 0)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"libvirt could not migrate {dom.name()} to {dconn.getURI()}: "
                                  f"{_reason(exc)}") from None

    def live_state(self) -> LiveState:
        try:
            doms = self.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"cannot list domains: {_reason(exc)}") from None
        domains, hostdevs = {}, {}
        for dom in doms:
            try:
                ref = DomainRef(dom.name(), dom.UUIDString())
                xml = dom.XMLDesc(0)
            except libvirt.libvirtError:
                continue  # stopped while we looked: not running, holds nothing
            domains[ref.name] = ref
            for address in domain_xml.pci_hostdevs(domain_xml.parse_live(xml)):
                hostdevs[address] = ref
        return LiveState(domains, hostdevs)
