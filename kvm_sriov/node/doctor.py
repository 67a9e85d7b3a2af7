"""``kvm-sriov doctor``: is this host ready for InfiniBand VFs? Each check
says what it saw and, when it is not fine, exactly what to do.

Everything read goes through the configured sysfs root (``/proc/cmdline``
too: ``<root>/proc/cmdline``), so tests run the same checks on fake hosts.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from dataclasses import dataclass
from typing import Optional

from ..domain.hypervisor import Hypervisor
from ..errors import ConfigError, DriverError
from ..fabric import manager
from ..frontend import network_hook
from ..ib import guid
from ..ivshmem import region as ivshmem_region
from ..vf import availability, discovery, pool, state_folder, topology
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


def check_vfs(sysfs: Sysfs, cfg, held_whole: dict[str, int]
              ) -> tuple[list[Result], Optional[discovery.HostInventory]]:
    """held_whole: PF -> the VM holding it passed through whole (its VFs are off meanwhile)."""
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
        if pf.address in held_whole:  # no VFs by design: enabling them now would take them from under the VM
            out.append(Result(name, "OK", f"passed through whole to VM {held_whole[pf.address]}: its VFs "
                                          f"are off until the VM lets it go (kvm-sriov status)"))
            continue
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


# -- GPUDirect RDMA between a passed-through GPU and a VF ----------------------
# PCIe extended capabilities (PCIe base spec): ACS and ATS, and the ACS
# Control bits that matter. P2P Request/Completion Redirect send a peer
# request up to the root complex (and its IOMMU): the kernel turns them on
# for the IOMMU groups that keep each VF assignable on its own. Direct
# Translated P2P lets a request whose address the device already had
# translated (ATS) go straight to the peer while the redirects stay on.
CONFIG_SIZE = 4096          # a PCIe function's config space (256 bytes: conventional PCI)
USER_CONFIG = 128           # what the kernel shows anyone but root: 64 bytes, 128 for CardBus
EXT_CAPS = 0x100            # where the extended capabilities start
ACS_ID, ATS_ID = 0x000D, 0x000F
ACS_REDIRECT = 0x0004 | 0x0008
ACS_DIRECT_TRANSLATED = 0x0040
SHOWN = 8                   # devices a line names, then "and N more"


def _config_space(sysfs: Sysfs, address: str) -> tuple[Optional[bytes], Optional[str]]:
    """A function's config space as sysfs gives it (its first 64 bytes to
    anyone but root), bytes: read_small's rules (no link at the file, no
    FIFO or device, bounded) without its decoding."""
    path = sysfs.at("bus", "pci", "devices", address, "config")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return None, "is a link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "is not a file"
        return os.read(fd, CONFIG_SIZE), None
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)


def _ext_capability(config: bytes, cap_id: int) -> Optional[int]:
    """Where an extended capability starts, or None. Each offset is visited
    at most once (a list that loops or leaves the space ends the walk)."""
    offset, seen = EXT_CAPS, set()
    while EXT_CAPS <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def _word(config: bytes, offset: int) -> int:
    return int.from_bytes(config[offset:offset + 2], "little")


def _shown(items) -> str:
    items = sorted(items)
    return ", ".join(items[:SHOWN]) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _ports_between(sysfs: Sysfs, c: topology.Closeness) -> set[str]:
    """The switch ports below the bridge a GPU and a PF share, on both paths."""
    ports = set()
    for device in (c.gpu, c.pf):
        place, _why = topology.read_place(sysfs, device)
        if place is not None and c.shared in place.ancestors:
            below = place.ancestors[place.ancestors.index(c.shared) + 1:]
            ports |= {p for p in below if p in place.bridges}
    return ports


def check_gpudirect(sysfs: Sysfs, inv: Optional[discovery.HostInventory]) -> list[Result]:
    """GPUDirect RDMA from a VM between a passed-through GPU and a VF of an
    HCA behind the same PCIe switch: the switch ports between them must let
    the HCA's ATS-translated peer requests through (ACS Direct Translated
    P2P) and the HCA must offer ATS. Nothing on a host without both a GPU
    and a pool PF (docs/gpu.md, section 8)."""
    if inv is None or not inv.pfs:
        return []
    topo = topology.gpu_topology(sysfs, inv.pfs)
    if not topo.gpus:
        return []
    pairs = [c for c in topo.closeness if c.level == "switch"]
    if not pairs:
        return [Result("GPUDirect RDMA", "INFO", f"{len(topo.gpus)} GPU(s), none behind a PCIe switch with "
                       f"an HCA of the pool: GPU-HCA traffic crosses the CPU's root complex, no switch "
                       f"setting changes that")]
    ports = set().union(*(_ports_between(sysfs, c) for c in pairs))
    hcas = {c.pf for c in pairs}
    configs = {a: _config_space(sysfs, a) for a in sorted(ports | hcas)}
    unread = sorted(a for a, (data, why) in configs.items() if why)
    short = sorted(a for a, (data, why) in configs.items() if data is not None and len(data) <= USER_CONFIG)
    out = []
    if unread:
        out.append(Result("GPUDirect RDMA config space", "WARN", f"cannot read the config space of "
                          f"{_shown(unread)}: {configs[unread[0]][1]}"))
    if short:
        return out + [Result("GPUDirect RDMA config space", "INFO",
                             f"ACS and ATS not read: the kernel shows {_shown(short)}'s extended config "
                             f"space to root only", "run kvm-sriov doctor as root")]
    redirected, no_dt = [], []
    for port in sorted(ports):
        data = configs[port][0]
        acs = _ext_capability(data, ACS_ID) if data else None
        if acs is None or not _word(data, acs + 6) & ACS_REDIRECT or _word(data, acs + 6) & ACS_DIRECT_TRANSLATED:
            continue
        (redirected if _word(data, acs + 4) & ACS_DIRECT_TRANSLATED else no_dt).append(port)
    if redirected:
        out.append(Result(
            "GPUDirect RDMA: ACS", "WARN",
            f"PCIe switch port(s) {_shown(redirected)} between GPUs and HCAs send peer traffic to the "
            f"root complex (ACS P2P redirect on, Direct Translated P2P off)",
            f"turn on Direct Translated P2P there, isolation stays: kernel parameter pci=config_acs="
            f"{';'.join(f'1xxxxxx@{p}' for p in redirected)} (Linux 6.11+; older: setpci -s <port> "
            f"ECAP_ACS+0x6.w=0040:0040 at each boot), not pci=disable_acs_redir (it joins the GPU and "
            f"the HCA's VFs in one IOMMU group)"))
    if no_dt:
        out.append(Result(
            "GPUDirect RDMA: ACS", "WARN",
            f"PCIe switch port(s) {_shown(no_dt)} between GPUs and HCAs send peer traffic to the root "
            f"complex and cannot pass translated requests (no Direct Translated P2P)",
            "none that keeps each VF assignable on its own (pci=disable_acs_redir joins the GPU and the "
            "HCA's VFs in one IOMMU group): GPUDirect RDMA there crosses the root complex"))
    if not redirected and not no_dt and not unread:
        out.append(Result("GPUDirect RDMA: ACS", "OK", f"the {len(ports)} PCIe switch port(s) between "
                          f"GPUs and HCAs pass peer traffic (no ACS redirect, or Direct Translated P2P on)"))
    no_ats = [a for a in sorted(hcas) if configs[a][0] and _ext_capability(configs[a][0], ATS_ID) is None]
    if no_ats:
        out.append(Result("GPUDirect RDMA: ATS", "WARN",
                          f"HCA(s) {_shown(no_ats)} behind a GPU's switch offer no ATS: their VFs' peer "
                          f"requests are untranslated, and ACS sends them to the root complex",
                          f"mlxconfig -d <pci> set ATS_ENABLED=true for {_shown(no_ats)}, then a cold "
                          f"reboot"))
    elif not unread:
        out.append(Result("GPUDirect RDMA: ATS", "OK", f"HCA(s) {_shown(hcas)} behind a GPU's switch "
                          f"offer ATS"))
    return out


def gpudirect_as_root(cfg) -> list[Result]:
    """check_gpudirect where the kernel shows the whole config space: run
    as root, doctor reads it before it becomes the pool's owner (cli.py)."""
    sysfs = Sysfs(cfg.sysfs_root)
    try:
        inv = discovery.discover(sysfs, cfg.pfs, cfg.skip_vfs_in_host_use)
    except DriverError:  # check_vfs says why
        return []
    return check_gpudirect(sysfs, inv)


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


def run_checks(cfg, libvirt_check: bool = True, gpudirect: Optional[list[Result]] = None) -> list[Result]:
    """gpudirect: gpudirect_as_root's lines, read before the switch to the pool's owner."""
    sysfs = Sysfs(cfg.sysfs_root)
    results = check_iommu(sysfs)
    try:
        held_whole = availability.read_holdings(cfg.pool_db).pfs
    except DriverError:  # check_state_dir says what is wrong with the pool
        held_whole = {}
    vf_results, _inv = check_vfs(sysfs, cfg, held_whole)
    results += vf_results
    results.append(check_vfio(sysfs))
    results += check_gpudirect(sysfs, _inv) if gpudirect is None else gpudirect
    if libvirt_check:
        results.append(check_libvirt(cfg))
    results.append(check_state_dir(cfg))
    results += check_sm(cfg)
    results += check_network_hook(cfg)
    results += check_ivshmem(cfg)
    return results
