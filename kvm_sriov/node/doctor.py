"""``kvm-sriov doctor``: is this host ready for InfiniBand VFs? Each check
says what it saw and, when it is not fine, exactly what to do.

Everything read goes through the configured sysfs root (``/proc/cmdline``
too: ``<root>/proc/cmdline``), so tests run the same checks on fake hosts.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Optional

from ..domain.hypervisor import Hypervisor
from ..errors import ConfigError, DriverError
from ..fabric import manager
from ..frontend import network_hook
from ..ib import guid
from ..ivshmem import region as ivshmem_region
from ..vf import discovery, pool, state_folder
from ..vf.sysfs import Sysfs


@dataclass(frozen=True)
class Result:
    name: str
    level: str          # OK | WARN | FAIL | INFO
    message: str
    fix: Optional[str] = None


def _cmdline(root) -> str:
    try:
        return (root / "proc" / "cmdline").read_text()
    except OSError:
        return ""


def check_iommu(sysfs: Sysfs) -> list[Result]:
    out = []
    args = _cmdline(sysfs.root).split()
    on = [a for a in args if a in ("intel_iommu=on", "amd_iommu=on") or a.startswith("iommu=")]
    vendor = "amd_iommu=on" if os.path.exists(sysfs.path("module", "kvm_amd")) else "intel_iommu=on"
    if on:
        out.append(Result("IOMMU on the kernel command line", "OK", " ".join(on)))
    else:
        out.append(Result("IOMMU on the kernel command line", "WARN",
                          "neither intel_iommu=on nor amd_iommu=on is set (some kernels enable it by default)",
                          f"add '{vendor} iommu=pt' to GRUB_CMDLINE_LINUX in /etc/default/grub, "
                          f"run update-grub and reboot"))
    groups = sysfs.listdir(sysfs.path("kernel", "iommu_groups"))
    if groups:
        out.append(Result("IOMMU active", "OK", f"{len(groups)} IOMMU groups"))
    else:
        out.append(Result("IOMMU active", "FAIL", "/sys/kernel/iommu_groups is empty: no VF can be passed through",
                          f"enable VT-d/AMD-Vi in the firmware and boot with '{vendor} iommu=pt'"))
    return out


def check_vfs(sysfs: Sysfs, cfg) -> tuple[list[Result], Optional[discovery.HostInventory]]:
    try:
        inv = discovery.discover(sysfs, cfg.pfs, cfg.skip_vfs_in_host_use)
    except DriverError as exc:
        return [Result("SR-IOV PFs", "FAIL", str(exc), "fix pool.pfs in kvm-sriov.toml "
                       "(PCI address, netdev, mlx5_0[:port] or vendor:device)")], None
    out = []
    if not inv.pfs:
        out.append(Result("SR-IOV PFs", "FAIL", "no SR-IOV capable InfiniBand PF found",
                          "check `lspci -d 15b3:` and that the firmware enables SR-IOV "
                          "(mlxconfig -d <dev> set SRIOV_EN=1 NUM_OF_VFS=<n>, then reboot)"))
    for pf in inv.pfs:
        name = f"PF {pf.address} ({','.join(pf.ib_devices) or 'no IB device'})"
        vfs = [v for v in inv.vfs if v.pf == pf.address]
        usable = [v for v in vfs if v.eligible]
        if pf.total_vfs == 0:  # nothing to echo: the firmware offers no VFs
            out.append(Result(name, "FAIL", "the firmware offers no VFs (sriov_totalvfs is 0)",
                              f"mlxconfig -d {pf.address} set SRIOV_EN=1 NUM_OF_VFS=<n>, then reboot"))
        elif pf.num_vfs == 0:
            out.append(Result(name, "FAIL", f"VFs are not enabled (0 of {pf.total_vfs})",
                              f"echo {pf.total_vfs} > /sys/bus/pci/devices/{pf.address}/sriov_numvfs "
                              f"(persist it with the Puppet module or a udev rule)"))
        elif not usable:
            why = vfs[0].problems[0] if vfs and vfs[0].problems else "none listed"
            out.append(Result(name, "FAIL", f"{pf.num_vfs} VFs enabled, none usable: {why}"))
        else:
            bad = [v for v in vfs if not v.eligible]
            msg = f"{len(usable)} of {pf.num_vfs} VFs usable"
            out.append(Result(name, "WARN" if bad else "OK",
                              msg + (f"; e.g. {bad[0].address}: {bad[0].problems[0]}" if bad else "")))
        for port in pf.ib_ports:
            base = sysfs.ib_class(port.device, "ports", str(port.port))
            state = (sysfs.read(base / "state") or "?").partition(": ")[2] or "?"
            if state != "ACTIVE":
                out.append(Result(f"IB link {port.device}/{port.port}", "WARN",
                                  f"port state {state}: no subnet manager has brought it up (or no cable)",
                                  "run opensm on the fabric with virt_enabled 2 (docs/infiniband.md)"))
            else:
                out.append(Result(f"IB link {port.device}/{port.port}", "OK",
                                  f"ACTIVE, {sysfs.read(base / 'rate') or '?'}: a subnet manager runs"))
        if pf.ib_ports and vfs and guid.backend_for(sysfs, pf, vfs[0].index, "") is None:
            ip = shutil.which(cfg.ip_command) if cfg.ip_command else None
            out.append(Result(f"GUID control {pf.address}", "OK" if ip else "FAIL",
                              "no GUID files in sysfs; netlink through " + (ip or "ip (not found)"),
                              None if ip else "install iproute2 or set infiniband.ip_command"))
    return out, inv


def check_vfio(sysfs: Sysfs) -> Result:
    if os.path.isdir(sysfs.path("bus", "pci", "drivers", "vfio-pci")) or \
            os.path.isdir(sysfs.path("module", "vfio_pci")):
        return Result("vfio-pci", "OK", "driver loaded")
    release = os.uname().release
    mod_root = sysfs.root / "lib" / "modules" / release
    for f in ("modules.dep", "modules.builtin"):
        try:
            if "vfio-pci.ko" in (mod_root / f).read_text():
                return Result("vfio-pci", "OK", f"available as a module for {release} (libvirt loads it)")
        except OSError:
            pass
    return Result("vfio-pci", "FAIL", "the vfio-pci driver is neither loaded nor installed",
                  "modprobe vfio-pci (and add vfio-pci to /etc/modules-load.d/vfio.conf)")


def check_libvirt(cfg) -> Result:
    try:
        hv = Hypervisor(cfg.libvirt_uri)
        try:
            version = hv.conn.getLibVersion()
        finally:
            hv.close()
    except ImportError:
        return Result("libvirt", "FAIL", "python3-libvirt is not installed", "apt-get install python3-libvirt")
    except DriverError as exc:
        return Result("libvirt", "FAIL", str(exc),
                      "start libvirtd (systemctl start libvirtd) and add oneadmin to the libvirt group")
    return Result("libvirt", "OK", f"{cfg.libvirt_uri} answers (libvirt {version // 1000000}."
                                   f"{version // 1000 % 1000}.{version % 1000})")


def check_state_dir(cfg) -> Result:
    d = cfg.state_dir
    existing = next(p for p in [d, *d.parents] if p.exists())
    if existing == d:  # the driver's user's alone (vf/state_folder.py); root has become its owner
        try:
            state_folder.check(d)
            state_folder.check_files(*pool.sqlite_files(cfg.pool_db))
        except DriverError as exc:
            return Result("pool state", "FAIL", str(exc),
                          f"chown -R oneadmin:oneadmin {d} && chmod 750 {d}, after looking at what is there")
    if os.access(existing, os.W_OK):
        return Result("pool state", "OK", f"{d} is writable" if existing == d
                      else f"{d} will be created (in {existing}, writable)")
    what = "is not writable" if existing == d else f"does not exist and {existing} is not writable"
    return Result("pool state", "FAIL", f"{d} {what} by uid {os.getuid()}",
                  f"mkdir -p {d} && chown oneadmin:oneadmin {d}")


def check_sm(cfg) -> list[Result]:
    if cfg.sm_config is None:
        return [Result("opensm", "INFO", "no subnet manager on this host (infiniband.sm_config is empty)")]
    try:
        text = cfg.sm_config.read_text()
    except OSError as exc:
        return [Result("opensm config", "FAIL", f"{cfg.sm_config}: {exc.strerror}",
                       "install opensm and write its config: opensm -c /etc/opensm/opensm.conf")]
    settings = {}
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#") and len(words) >= 2:
            settings[words[0]] = words[1]
    out = []
    if settings.get("virt_enabled") == "2":
        out.append(Result("opensm virtualization", "OK", "virt_enabled 2"))
    else:
        out.append(Result("opensm virtualization", "FAIL",
                          f"virt_enabled is {settings.get('virt_enabled', 'unset')}: VF ports stay down",
                          f"set 'virt_enabled 2' in {cfg.sm_config} and restart opensm"))
    part = settings.get("partition_config_file")
    if part and part != str(cfg.partitions_file):
        out.append(Result("opensm partitions", "WARN", f"opensm reads {part}, kvm-sriov writes {cfg.partitions_file}",
                          f"set partition_config_file {cfg.partitions_file} in {cfg.sm_config}"))
    return out


def check_network_hook(cfg) -> list[Result]:
    """On the front-end: how the last run of the network hook went (none: not a front-end)."""
    status = network_hook.read_status(cfg.state_dir)
    if status is None:
        return []
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(status.get("time") or 0)))
    message = str(status.get("message", ""))[:800]
    if status.get("ok"):
        return [_drift_after(status, f"last run {when}: {message}")]
    fixes = []
    if status.get("not_updated"):
        fixes.append("oned refuses to write into a network its owner locked, even to oneadmin: "
                     "onevnet unlock <id> (its owner or oneadmin)")
    if not status.get("sm_ok", True):
        try:
            fixes.append(manager.for_config(cfg).fix)
        except ConfigError as exc:
            fixes.append(str(exc))
    return [Result("network hook", "FAIL", f"last run {when} failed: {message}",
                   "; ".join(fixes or ["see the message"]) + ", then run kvm-sriov network-hook --resync "
                   "(onehook show <id> has each run's output)")]


def _drift_after(status: dict, line: str) -> Result:
    """A run that worked: OK, unless the check after it found a place enforcing something
    else (drift's exit 1). A place it could not read back stays OK, its note in the message."""
    drift = status.get("drift") if isinstance(status.get("drift"), dict) else {}
    if drift.get("exit_code") == 1:
        return Result("network hook", "WARN", line, "kvm-sriov partitions --check says where; "
                      "kvm-sriov partitions --repair makes what is kvm-sriov's match oned")
    return Result("network hook", "OK", line)


def check_ivshmem(cfg) -> list[Result]:
    """Shared-memory regions: /dev/shm and the budget, and files there under
    a region's name that the driver's user did not make (each keeps its
    group's VMs from getting a region on this host)."""
    shm = ivshmem_region.shm_dir()
    try:  # the driver's user owns its state; doctor may run as root
        uid = cfg.state_dir.stat().st_uid
    except OSError:
        uid = os.geteuid()
    size, free = ivshmem_region.shm_mb(shm)
    budget = ivshmem_region.host_budget_mb(cfg.ivshmem_max_host_mb, shm)
    out = [Result("shared memory (ivshmem)", "OK" if size else "WARN",
                  f"{shm}: {size} MB, {free} MB free; regions up to {cfg.ivshmem_max_region_mb} MB each, "
                  f"{budget} MB in all" if size else f"{shm} cannot be read: no region can be made",
                  None if size else "mount a tmpfs on /dev/shm")]
    foreign = [name for name, mine in ivshmem_region.region_files(shm, uid).items() if not mine]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        out.append(Result("foreign region files", "WARN",
                          f"{len(foreign)} file(s) in {shm} named like a region but not made by the "
                          f"driver's user (uid {uid}), or linked: {shown}; their VM groups get no "
                          f"region on this host",
                          f"find out who made them (ls -l {shm}), then remove them"))
    return out


def run_checks(cfg, libvirt_check: bool = True) -> list[Result]:
    sysfs = Sysfs(cfg.sysfs_root)
    results = check_iommu(sysfs)
    vf_results, _inv = check_vfs(sysfs, cfg)
    results += vf_results
    results.append(check_vfio(sysfs))
    if libvirt_check:
        results.append(check_libvirt(cfg))
    results.append(check_state_dir(cfg))
    results += check_sm(cfg)
    results += check_network_hook(cfg)
    results += check_ivshmem(cfg)
    return results
