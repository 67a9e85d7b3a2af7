"""IVShmem regions on this host, as the actions use them: join and leave
under the pool lock, plug and unplug the device (confirmed, as VFs are),
and reconcile the region tables with what libvirt runs."""

from __future__ import annotations

import time
from typing import Optional

from ..domain import domain_xml, hotplug
from ..domain.hypervisor import DomainRef, libvirt_module
from ..errors import DriverError, HypervisorError, InputError
from ..opennebula import log
from ..vf import intents
from . import device as ivshmem, region as ivshmem_region, table as ivshmem_table

REGION = "shared-memory region"  # what the hot-plug messages call the device


def live_regions(host) -> dict[str, tuple[int, dict[str, int]]]:
    """Running domain name -> (its OpenNebula VM id, {region: size in MB}):
    the region this driver's own record in the domain's metadata names, if
    the domain has its device. A device without our record (a domain
    someone else defined) is not ours to adopt."""
    libvirt = libvirt_module()
    out = {}
    try:
        doms = host.hypervisor.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"cannot list domains: {exc.get_error_message()}") from None
    for dom in doms:
        try:
            name, xml = dom.name(), dom.XMLDesc(0)
        except libvirt.libvirtError:
            continue  # stopped while we looked
        out[name] = (DomainRef(name, "").vm_id, recorded_regions(domain_xml.parse(xml)))
    return out


def recorded_regions(root) -> dict[str, int]:
    try:
        record = ivshmem.recorded(root)
    except InputError:
        return {}  # a damaged record names nothing we would trust
    if record is None or record.request.name not in ivshmem.live_regions(root):
        return {}
    return {record.request.name: record.request.size_mb}


def budget(config) -> ivshmem_table.Budget:
    host_mb = ivshmem_region.host_budget_mb(config.ivshmem_max_host_mb)
    return ivshmem_table.Budget(config.ivshmem_max_region_mb, host_mb,
                                ivshmem_region.owner_budget_mb(config.ivshmem_max_owner_mb, host_mb))


def check_budget(host, request: ivshmem.Request) -> None:
    """Refused at deploy, before anything is taken: a size this host would
    never give (what is in use is counted at the join, under the pool lock)."""
    ivshmem_table.fits(request, budget(host.config))


def _reconcile_in(host, txn, live, dry_run: bool = False) -> list[ivshmem_table.Change]:
    now = time.time()
    pending = intents.all_intents(txn)
    busy = frozenset(i.vm_id for i in pending if intents.is_active(i, host.config.state_dir, now))
    abandoned = frozenset(i.vm_id for i in pending) - busy
    changes = ivshmem_table.plan(txn.db, live, host.config.reservation_grace_seconds, now, busy, abandoned)
    if not dry_run:
        ivshmem_table.apply(txn.db, changes, live, now, log=log)
        for i in pending:  # settled now (the VF reconcile leaves a region user's intent to us,
            # and a VM that still has VFs keeps it for the VF reconcile)
            if i.vm_id in abandoned and not intents.remote_pending(i) and not txn.assignments(i.vm_id):
                intents.clear(txn, i.vm_id)
    return changes


def reconcile(host, dry_run: bool = False) -> list[ivshmem_table.Change]:
    """Regions := libvirt's truth: no region without a user, no user without
    its region, a region file only while a VM uses it."""
    live = live_regions(host)
    with host.pool.transaction() as txn:
        return _reconcile_in(host, txn, live, dry_run)


def join(host, vm_id: int, domain: str, request: ivshmem.Request) -> None:
    """The VM becomes a (reserved) user of its group's region; the region's
    file is made once its row is committed. Earlier crashes are settled
    first, so a region a dead action left is not joined by mistake."""
    live = live_regions(host)
    limits = budget(host.config)
    with host.pool.transaction() as txn:
        _reconcile_in(host, txn, live)
        new = ivshmem_table.add_user(txn.db, request, vm_id, domain, budget=limits)
    with host.pool.transaction() as txn:
        try:
            ivshmem_table.publish(txn.db, request.name)
        except (DriverError, OSError):
            ivshmem_table.drop_user(txn.db, vm_id, log=log)
            raise
    log("INFO", f"shared memory: VM {vm_id} joins region {request.name} ({request.size_mb} MB"
                f"{', new' if new else ''})")


def keyed_at_deploy(vm_id: int, record: Optional[ivshmem.Record], vm) -> None:
    """A VM keeps the region of the owner it had at deploy (its record) until
    it is deployed again, `onevm chown` or not (docs/ivshmem.md): say so
    when oned's VM (vm: the action's, None: unknown) has another owner."""
    uid = getattr(vm, "uid", None)
    if record is not None and uid is not None and uid != record.request.uid:
        log("WARN", f"VM {vm_id} is owned by uid {uid} now; it keeps shared-memory region "
                    f"{record.request.name} of uid {record.request.uid}, its owner at deploy, "
                    f"until it is deployed again")


def attached(host, vm_id: int) -> None:
    with host.pool.transaction() as txn:
        ivshmem_table.set_attached(txn.db, vm_id)


def leave(host, vm_id: int) -> None:
    """The VM stops using its region here; the region goes with its last
    user. Best effort, never raises: it runs once the VM's VFs are safe,
    and what it could not do is logged and left to reconcile."""
    try:
        with host.pool.transaction() as txn:
            held = ivshmem_table.user_of(txn.db, vm_id)
            gone = ivshmem_table.drop_user(txn.db, vm_id, log=log)
    except Exception as exc:
        log("ERROR", f"shared memory: VM {vm_id} could not leave its region ({type(exc).__name__}: "
                     f"{exc}); `kvm-sriov reconcile` settles it")
        return
    if held is not None:
        log("INFO", f"shared memory: VM {vm_id} leaves region {held.region}"
                    + (" (last user: region removed)" if gone else ""))


def uses(host, vm_id: int) -> Optional[ivshmem_table.User]:
    with host.pool.transaction() as txn:
        return ivshmem_table.user_of(txn.db, vm_id)


# -- the device in a running domain: hot-plugged as VFs are (domain/hotplug.py)
def _has(dom, name: str) -> bool:
    return name in ivshmem.live_regions(domain_xml.parse(dom.XMLDesc(0), f"live XML of {dom.name()}"))


def device_xml(record: ivshmem.Record) -> str:
    return domain_xml.to_string(ivshmem.shmem_element(record.request.name, record.request.size_mb,
                                                      record.where))


def _live(record: ivshmem.Record) -> hotplug.Live:
    """The record's device, if the running domain has it, as the engine asks."""
    name = record.request.name
    return lambda dom: {name: device_xml(record)} if _has(dom, name) else {}


def record_of(dom) -> Optional[ivshmem.Record]:
    return ivshmem.recorded(domain_xml.parse(dom.XMLDesc(0), f"live XML of {dom.name()}"))


def unplug(dom, record: ivshmem.Record, timeout: float, retry_every: float) -> None:
    """Take the device off (libvirt refuses to save or migrate a domain with
    an ivshmem peer, and a master's migration would overwrite the group's
    region on the other side with this VM's copy); confirmed, the request
    repeated as for VFs."""
    hotplug.unplug(dom, REGION, [record.request.name], _live(record), timeout, retry_every)


def plug(dom, record: ivshmem.Record, timeout: float) -> None:
    hotplug.plug(dom, REGION, {record.request.name: device_xml(record)}, _live(record), timeout)
