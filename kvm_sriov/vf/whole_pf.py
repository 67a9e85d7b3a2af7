"""A PF passed through whole: which PF may be, and switching its VFs off
and back on around it.

A NIC on a whole-PF network (``BRIDGE = "ib-pf"`` or ``"ib-pf:<pf>"``,
policy.WHOLE_PF_BRIDGE) gets a pool PF itself, not one of its VFs. The PF
must not carry VFs while a VM has it (they would be the VM's, and the host
could not take them back), so it is taken only when none of its VFs is
anyone's, its VF count is recorded in the pool (pool.PfAssignment) and its
VFs are switched off (``sriov_numvfs`` 0). libvirt's ``managed='yes'``
moves it to vfio-pci for the VM and back to its driver after. Given back,
it leaves vfio-pci if it is still there, and gets its recorded VF count
again; only then is the pool's row removed, so a crash at any step leaves
a row that reconcile finishes giving back.

A PF's IB port GUID is its own (burned in): nothing is written to it. The
partition of its network must list it (docs/gpu.md, "Whole HCAs").
"""

from __future__ import annotations

import errno
from typing import Iterable, Optional

from ..errors import DriverError
from .discovery import IN_HOST_USE, PhysicalFunction, VirtualFunction
from .sysfs import Sysfs

# the driver libvirt binds a PF to for a VM: a PF found there is a VM's
VFIO = "vfio-pci"


def problems(pf: PhysicalFunction, vfs: Iterable, skip_in_host_use: bool) -> tuple[str, ...]:
    """Why this pool PF must never be passed through whole, whoever holds
    what (empty: it may be). vfs: its VFs as discovery or availability read
    them (``address``, ``problems``)."""
    vfs = list(vfs)
    found = []
    if pf.driver is None:
        found.append("bound to no driver, so its VFs cannot be switched off and on")
    elif pf.driver == VFIO:
        found.append(f"bound to {VFIO}: passed through by something else")
    if pf.iommu_group is None:
        found.append("no IOMMU group (is the IOMMU enabled on the kernel command line?)")
    else:
        others = sorted(set(pf.group_members) - {pf.address} - {v.address for v in vfs})
        if others:
            found.append(f"IOMMU group {pf.iommu_group} also holds {', '.join(others)}")
    if skip_in_host_use and pf.up_netdevs:
        found.append(f"{IN_HOST_USE} ({', '.join(pf.up_netdevs)} is up)")
    if skip_in_host_use:
        busy = [v.address for v in vfs if any(p.startswith(IN_HOST_USE) for p in v.problems)]
        if busy:
            found.append(f"its VF {busy[0]} is {IN_HOST_USE}" + (f" (and {len(busy) - 1} more)" if busy[1:] else ""))
    return tuple(found)


# A whole PF lets its guest send subnet management packets (QP0), which a
# VF cannot: on a shared fabric a tenant could then reconfigure ports or act
# as an SM. So the operator turns them on per host, once the SM's M_Key
# protects the ports (docs/gpu.md).
OFF = ("whole PFs are off on this host (pool.whole_pfs = false; turn them on once the SM's "
       "M_Key protects the fabric's ports, docs/gpu.md)")


def why_not_free(pf: PhysicalFunction, vfs: Iterable, skip_in_host_use: bool,
                 held_vfs, held_pfs, enabled: bool = True) -> Optional[str]:
    """None when the PF may be passed through whole now; else why not, in a
    few words. held_vfs: VF addresses someone holds (the pool's, and for
    deploy the running domains' and those with a GUID record); held_pfs: PF
    address -> the VM holding it whole; enabled: pool.whole_pfs."""
    if pf.address in held_pfs:
        return f"passed through whole to VM {held_pfs[pf.address]}"
    if not enabled:
        return OFF
    vfs = list(vfs)
    taken = [v.address for v in vfs if v.address in held_vfs]
    if taken:
        return f"{len(taken)} of its VFs held ({taken[0]}{', ...' if taken[1:] else ''})"
    found = problems(pf, vfs, skip_in_host_use)
    return "; ".join(found) if found else None


def as_device(pf: PhysicalFunction) -> VirtualFunction:
    """The PF as the device a VM's NIC gets: the record the hostdev, hot-plug
    and metadata steps take for a VF, with the PF's own address as both its
    address and its PF, and index -1 (it is no VF of anything)."""
    return VirtualFunction(address=pf.address, index=-1, pf=pf.address, numa_node=pf.numa_node,
                           iommu_group=pf.iommu_group, group_members=pf.group_members, driver=pf.driver,
                           netdevs=pf.netdevs, ib_ports=pf.ib_ports)


def is_whole(device: VirtualFunction) -> bool:
    """Does this allocated device stand for a whole PF (as_device)?"""
    return device.index < 0 and device.address == device.pf


# -- its VFs off and on ------------------------------------------------------------
def _attribute(sysfs: Sysfs, address: str, name: str) -> str:
    return sysfs.at("bus", "pci", "devices", address, name)


def num_vfs(sysfs: Sysfs, address: str) -> int:
    """The PF's enabled VFs now (sriov_numvfs); DriverError when unreadable."""
    n = sysfs.read_int(_attribute(sysfs, address, "sriov_numvfs"))
    if n is None or n < 0:
        raise DriverError(f"PF {address}: cannot read its sriov_numvfs")
    return n


def _write(sysfs: Sysfs, path: str, text: str, what: str) -> None:
    try:
        sysfs.write(path, text)
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise DriverError(f"{what}: {path}: {why}") from None


def switch_off(sysfs: Sysfs, address: str) -> None:
    """The PF's VFs go (sriov_numvfs 0), confirmed: none is left."""
    if num_vfs(sysfs, address):
        _write(sysfs, _attribute(sysfs, address, "sriov_numvfs"), "0",
               f"PF {address}: cannot switch its VFs off")
    left = num_vfs(sysfs, address)
    if left:
        raise DriverError(f"PF {address}: {left} VFs still enabled after sriov_numvfs 0")


def switch_on(sysfs: Sysfs, address: str, count: int) -> None:
    """Give the PF back to the host: off vfio-pci if it is still there
    (libvirt gives it back when the VM ends; a crash may not have), bound to
    its own driver again, and ``count`` VFs, confirmed. The caller has made
    sure no running domain holds it."""
    driver = sysfs.link_name(_attribute(sysfs, address, "driver"))
    if driver == VFIO:
        _write(sysfs, sysfs.at("bus", "pci", "drivers", VFIO, "unbind"), address,
               f"PF {address}: cannot take it off {VFIO}")
        driver = None
    if driver is None:  # its own driver again: no override left, then a probe
        if sysfs.read(_attribute(sysfs, address, "driver_override")) not in (None, "(null)", ""):
            _write(sysfs, _attribute(sysfs, address, "driver_override"), "\n",
                   f"PF {address}: cannot clear its driver_override")
        _write(sysfs, sysfs.at("bus", "pci", "drivers_probe"), address,
               f"PF {address}: cannot bind it to its driver")
        driver = sysfs.link_name(_attribute(sysfs, address, "driver"))
        if driver in (None, VFIO):
            raise DriverError(f"PF {address}: bound to {driver or 'no driver'} after a probe, so its "
                              f"{count} VFs cannot be switched on; bind it to its driver")
    now = num_vfs(sysfs, address)
    if now != count:
        path = _attribute(sysfs, address, "sriov_numvfs")
        what = f"PF {address}: cannot switch its {count} VFs on"
        if now:  # the kernel takes a new count only from 0
            _write(sysfs, path, "0", what)
        if count:
            _write(sysfs, path, str(count), what)
    now = num_vfs(sysfs, address)
    if now != count:
        raise DriverError(f"PF {address}: {now} VFs enabled after sriov_numvfs {count}")
