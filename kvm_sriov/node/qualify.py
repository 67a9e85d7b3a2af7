"""``kvm-sriov qualify``: may tenants land on this KVM host with ConnectX VFs?

A read-only run: one PASS / WARN / FAIL / SKIP line per check, with the fix
for each, and the same lines as a JSON and a text report an operator can
attach to a ticket. Exit 0 when nothing FAILs, 1 otherwise. Only with
``--write-test`` is anything changed: a GUID written to one free VF per PF,
read back and restored, the VF taken through the pool meanwhile.

Checks doctor already makes are doctor's (the kernel command line and the
IOMMU groups, vfio-pci, libvirt); the rest are finer than doctor's one line
per PF: the hardware, the PF's driver, SR-IOV enabled, each VF's IOMMU group
and driver, the PF's NUMA node, each InfiniBand port's link layer and
state, the subnet manager (sminfo) and whether it serves VF ports (opensm's
virt_enabled 2), the SM's partitions as far as this host can read them,
hugepages per NUMA node for the HPC profile, kernel, libvirt, QEMU and
OpenNebula versions against their minimums. On an SR-IOV PF that is not a
ConnectX (the nested test host's emulated PF) every InfiniBand check says
"not InfiniBand hardware" and is WARN or SKIP, never FAIL.

The host's files are read below the configured root (``--sysfs-root``:
fixtures; the SM's partitions file and opensm's config at their configured
paths), through reads that never block (a FIFO), never run long (a 100 MB
file) and never follow a link at the file itself; an odd file is one FAIL
line naming it, never a traceback. Tools (sminfo, the SM nodes' read
command) run bounded in time and output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .. import __version__
from .. import config as config_mod
from ..errors import DriverError
from ..vf.sysfs import Sysfs, read_small

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
STATUSES = (PASS, WARN, FAIL, SKIP)
REPORT_SCHEMA = 1           # bump when a key of the JSON report changes meaning
QEMU_SECONDS = 10
QEMU_OFF_PATH = ("/usr/libexec/qemu-kvm",)  # RHEL's QEMU, not on PATH
REMOTES = (Path("/var/tmp/one"), Path("/var/lib/one/remotes"))  # a host's (onehost sync), a front-end's
NOT_IB = "not InfiniBand hardware"

MELLANOX = "15b3"
# PF device IDs of the cards kvm-sriov drives, from pci.ids and mlx5_core's
# PCI table (tests/fixtures/qualify/README.md says where each comes from).
CONNECTX = {"1003": "ConnectX-3", "1007": "ConnectX-3 Pro", "1013": "ConnectX-4", "1015": "ConnectX-4 Lx",
            "1017": "ConnectX-5", "1019": "ConnectX-5 Ex", "101b": "ConnectX-6", "101d": "ConnectX-6 Dx",
            "101f": "ConnectX-6 Lx", "1021": "ConnectX-7", "1023": "ConnectX-8"}
CONNECTX_DRIVERS = ("mlx5_core", "mlx4_core")
IOMMU_FIX = "enable VT-d (Intel) or AMD-Vi (AMD) in the firmware setup; on Intel also boot with intel_iommu=on"


@dataclass(frozen=True)
class Check:
    name: str
    status: str         # PASS | WARN | FAIL | SKIP
    detail: str
    fix: Optional[str] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


# -- bounded reads ---------------------------------------------------------------------
def _not_plain(path) -> Optional[str]:
    """Why a file another function reads whole is not a plain file (None:
    it is, or it is missing): such a read would wait on a FIFO forever."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else "is not a plain file (a FIFO, a device or a link)"


def _short(text: Optional[str], limit: int = 80) -> str:
    """An attribute's text as one bounded line of a report."""
    return " ".join((text or "").split())[:limit]


class BoundedSysfs(Sysfs):
    """Sysfs whose every read goes through read_small (discovery's and
    doctor's included); the odd files met are kept, one line each."""

    def __init__(self, root):
        super().__init__(root)
        self.odd: dict[str, str] = {}

    def read(self, path) -> Optional[str]:
        text, why = read_small(path)
        if why:
            self.odd.setdefault(os.fspath(path), why)
        return text


# -- doctor's checks, as qualify's lines -----------------------------------------------
_LEVELS = {"OK": PASS, "INFO": PASS, "WARN": WARN, "FAIL": FAIL}


def _from_doctor(result, fail_as: str = FAIL) -> Check:
    status = _LEVELS.get(result.level, WARN)
    return Check(result.name, fail_as if status == FAIL else status, result.message, result.fix)


def check_iommu(sysfs: BoundedSysfs) -> list[Check]:
    """doctor's kernel command line and IOMMU groups, and the IOMMU units
    the kernel registered (/sys/class/iommu: dmar0, ivhd0, ...)."""
    from . import doctor
    out = []
    cmdline = sysfs.root / "proc" / "cmdline"
    _text, why = read_small(cmdline)
    if why:  # doctor reads it whole and would wait on a FIFO: say so, read nothing
        sysfs.odd.setdefault(str(cmdline), why)
    else:
        out += [_from_doctor(r) for r in doctor.check_iommu(sysfs)]
    units = sysfs.listdir(sysfs.path("class", "iommu"))
    if units:
        out.append(Check("IOMMU units", PASS, ", ".join(units[:8]) + (f" and {len(units) - 8} more"
                                                                      if len(units) > 8 else "")))
    else:
        out.append(Check("IOMMU units", FAIL, "/sys/class/iommu is empty: the kernel runs no IOMMU, "
                                              "no VF can be passed through", IOMMU_FIX))
    return out


# -- one PF and its VFs ----------------------------------------------------------------
def _is_connectx(pf) -> bool:
    return pf.vendor == MELLANOX


def check_hardware(pf) -> Check:
    name = f"PF {pf.address} hardware"
    ident = f"{pf.vendor}:{pf.device}, class 0x{pf.class_code:06x}"
    if not _is_connectx(pf):
        return Check(name, WARN, f"{ident}: {NOT_IB} (an emulated SR-IOV PF, as on the nested test "
                                 f"host?): the InfiniBand checks are skipped")
    model = CONNECTX.get(pf.device, "a ConnectX qualify does not know")
    kind = "InfiniBand" if pf.is_infiniband else "Ethernet" if pf.class_code >> 8 == 0x0200 else "other"
    return Check(name, PASS, f"{model} ({ident}, {kind})")


def check_pf_driver(pf) -> Check:
    name = f"PF {pf.address} driver"
    if not _is_connectx(pf):
        return Check(name, SKIP, f"{NOT_IB}: no mlx5_core expected (bound to {pf.driver or 'no driver'})")
    if pf.driver in CONNECTX_DRIVERS:
        return Check(name, PASS, pf.driver)
    if pf.driver is None:
        return Check(name, FAIL, "no driver bound: no VFs, no InfiniBand device",
                     "modprobe mlx5_core (ConnectX-3: mlx4_core)")
    return Check(name, FAIL, f"bound to {pf.driver}, not mlx5_core",
                 f"echo {pf.address} > /sys/bus/pci/drivers/{pf.driver}/unbind; "
                 f"echo {pf.address} > /sys/bus/pci/drivers/mlx5_core/bind")


def check_sriov(pf, vfs) -> Check:
    name = f"PF {pf.address} SR-IOV"
    if pf.total_vfs == 0:
        fix = (f"mlxconfig -d {pf.address} set SRIOV_EN=1 NUM_OF_VFS=<n>, then reboot (firmware settings "
               f"take effect at the next boot)" if _is_connectx(pf)
               else "enable SR-IOV in the device's firmware or emulator")
        return Check(name, FAIL, "sriov_totalvfs is 0: the firmware offers no VFs", fix)
    if pf.num_vfs == 0:
        return Check(name, FAIL, f"VFs are not enabled (0 of {pf.total_vfs})",
                     f"echo {pf.total_vfs} > /sys/bus/pci/devices/{pf.address}/sriov_numvfs; to keep it "
                     f"across boots, a file in /etc/kvm-sriov/vfs.d with DEVICE=/sys/bus/pci/devices/"
                     f"{pf.address} and NUMVFS={pf.total_vfs} (kvm-sriov-vfs.service, docs/install.md)")
    if not vfs:
        return Check(name, FAIL, f"sriov_numvfs says {pf.num_vfs} but no virtfn link is there",
                     f"echo 0 > /sys/bus/pci/devices/{pf.address}/sriov_numvfs, then write {pf.num_vfs} again")
    return Check(name, PASS, f"{pf.num_vfs} of {pf.total_vfs} VFs enabled")


def _shown(items: list[str], limit: int = 3) -> str:
    return "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def check_vf_groups(pf, vfs) -> Check:
    name = f"PF {pf.address} VF IOMMU groups"
    if not vfs:
        return Check(name, SKIP, "no VFs enabled")
    none = [v.address for v in vfs if v.iommu_group is None]
    if none:
        return Check(name, FAIL, f"{len(none)} of {len(vfs)} VFs have no IOMMU group (e.g. {none[0]}): "
                                 f"the IOMMU is off", IOMMU_FIX)
    shared = [f"{v.address} shares group {v.iommu_group} with "
              f"{', '.join(m for m in v.group_members if m != v.address)}"
              for v in vfs if set(v.group_members) - {v.address}]
    if shared:
        return Check(name, FAIL if len(shared) == len(vfs) else WARN,
                     f"{len(shared)} of {len(vfs)} VFs share their IOMMU group and are never offered: "
                     + _shown(shared),
                     "put the HCA in a slot whose root port or switch has ACS (or enable ACS in the "
                     "firmware setup), so each VF gets a group of its own")
    return Check(name, PASS, f"each of the {len(vfs)} VFs is alone in its IOMMU group")


def check_vf_drivers(pf, vfs) -> Check:
    """A VF is unbound, on vfio-pci (a VM holds it, or libvirt left it
    there) or on the PF's own driver, which libvirt unbinds at attach."""
    name = f"PF {pf.address} VF drivers"
    if not vfs:
        return Check(name, SKIP, "no VFs enabled")
    counts: dict[str, int] = {}
    for v in vfs:
        counts[v.driver or "unbound"] = counts.get(v.driver or "unbound", 0) + 1
    seen = ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))
    expected = {None, "vfio-pci", pf.driver}
    odd = [f"{v.address} on {v.driver}" for v in vfs if v.driver not in expected]
    busy = [f"{v.address}: {p}" for v in vfs for p in v.problems if p.startswith("in use on the host")]
    if odd:
        return Check(name, WARN, f"{seen}; unexpected: {_shown(odd)}",
                     f"unbind them (echo <vf> > /sys/bus/pci/devices/<vf>/driver/unbind); "
                     f"VFs belong to {pf.driver or 'the PF driver'} or vfio-pci")
    if busy:
        return Check(name, WARN, f"{seen}; never offered while the host uses them: {_shown(busy)}",
                     "take their host netdevs down (ip link set <dev> down) or unbind them")
    return Check(name, PASS, seen)


def check_numa(pf, host_nodes: int, numa_policy: str) -> Check:
    name = f"PF {pf.address} NUMA node"
    if pf.numa_node is not None:
        return Check(name, PASS, f"node {pf.numa_node}")
    if host_nodes <= 1:
        return Check(name, PASS, "unknown (-1), and the host has one NUMA node: nothing to choose")
    return Check(name, FAIL if numa_policy == "require" else WARN,
                 f"unknown (-1) on a host with {host_nodes} NUMA nodes: VMs cannot be placed beside their VF"
                 + (" and pool.numa_policy = require refuses them" if numa_policy == "require" else ""),
                 "turn on the firmware's NUMA information (ACPI SRAT/_PXM; no 'node interleaving')")


def _state(text: Optional[str]) -> str:
    """'4: ACTIVE' -> 'ACTIVE' (the kernel's '%d: %s'), else the text as it is."""
    text = _short(text, 40) or "?"
    return text.partition(": ")[2] or text


def check_ib_ports(sysfs: BoundedSysfs, pf) -> list[Check]:
    if not _is_connectx(pf):
        return [Check(f"PF {pf.address} InfiniBand ports", SKIP, f"{NOT_IB}: no InfiniBand port to check")]
    if not pf.ib_ports:
        return [Check(f"PF {pf.address} InfiniBand ports", FAIL, "no RDMA device for this PF "
                      "(/sys/class/infiniband has none): mlx5_ib is not loaded", "modprobe mlx5_ib")]
    out = []
    card_port = int(pf.address[-1]) + 1  # a ConnectX has one PF per port: function .0 is port 1
    for port in pf.ib_ports:
        base = sysfs.ib_class(port.device, "ports", str(port.port))
        label = f"IB port {port.device}/{port.port}"
        layer = sysfs.read(base / "link_layer")
        if layer == "Ethernet":
            out.append(Check(f"{label} link layer", FAIL, "Ethernet (RoCE): the port is not in InfiniBand "
                             "mode, its VFs get no GUID and no partition",
                             f"mlxconfig -d {pf.address} set LINK_TYPE_P{card_port}=1 (1 = IB, 2 = ETH), "
                             f"then reboot"))
            out.append(Check(f"{label} state", SKIP, "link layer Ethernet: no InfiniBand state"))
            continue
        if layer != "InfiniBand":
            out.append(Check(f"{label} link layer", WARN, f"{_short(layer, 40) or 'unreadable'}: neither "
                             f"InfiniBand nor Ethernet"))
        else:
            out.append(Check(f"{label} link layer", PASS, "InfiniBand"))
        state, phys = _state(sysfs.read(base / "state")), _state(sysfs.read(base / "phys_state"))
        rate = _short(sysfs.read(base / "rate")) or "rate ?"
        if state == "ACTIVE" and phys == "LinkUp":
            out.append(Check(f"{label} state", PASS, f"ACTIVE, LinkUp, {rate}"))
            out.append(check_sm(sysfs, port, label))
        elif phys != "LinkUp":
            out.append(Check(f"{label} state", FAIL, f"{state}, physical state {phys}: no link",
                             "check the cable, the transceiver and the switch port (ibstat shows the same)"))
        else:
            out.append(Check(f"{label} state", FAIL, f"{state}, LinkUp: the link is up but no subnet "
                             f"manager has brought the port to ACTIVE",
                             "run opensm on the fabric, with virt_enabled 2 for VF ports (docs/infiniband.md)"))
    return out


# -- the subnet manager and its virtualisation of VF ports -------------------------------
TOOL_SECONDS = 10           # a diag tool's whole run (its MAD timeout is 1 s)
TOOL_MAX_BYTES = 16 * 1024  # sminfo says one line
INSTALL_DIAGS = "apt-get install infiniband-diags (dnf install infiniband-diags on RHEL)"
SM_VIRT_FIX = ("on the subnet manager: opensm: 'virt_enabled 2' in opensm.conf, then restart opensm (NVIDIA's "
               "opensm 5.x: Debian's opensm 3.3 has no virt_enabled); UFM: turn its virtualization setting on")
# sminfo's one line (infiniband-diags sminfo.c: "sminfo: sm lid %d sm guid 0x%PRIx64, activity count
# %u priority %d state %d %s"); nothing else is taken for an answer
SMINFO_LINE = re.compile(r"sminfo: sm lid (\d{1,5}) sm guid 0x([0-9a-f]{1,16}), activity count (\d{1,10}) "
                         r"priority (\d{1,2}) state (\d) (SMINFO_[A-Z]{6,8}|\?\?\?)")
SM_STATES = ["SMINFO_NOTACT", "SMINFO_DISCOVER", "SMINFO_STANDBY", "SMINFO_MASTER"]
ZERO_GUID = "0000000000000000"


def run_tool(argv: Sequence[str]) -> tuple[Optional[str], str]:
    """(its output, "") or (None, why): a read-only diag tool, its output
    bounded, its run bounded (it and what it starts are killed)."""
    from ..fabric.opensm import run_bounded
    try:
        code, out = run_bounded(argv, TOOL_SECONDS, "", TOOL_MAX_BYTES)
    except DriverError:  # its wording is the SM node's: say it as a tool's
        return None, f"{argv[0]} gave no answer within {TOOL_SECONDS} s and {TOOL_MAX_BYTES // 1024} KiB"
    if code:
        return None, f"{argv[0]} exited {code}: {_short(' | '.join(out.strip().splitlines()[-2:]), 200)}"
    return out, ""


def parse_sminfo(text: str) -> Optional[dict]:
    """sminfo's line -> {lid, guid, activity, priority, state}; None when it is not that line."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("sminfo: sm lid")]
    found = SMINFO_LINE.fullmatch(lines[0]) if len(lines) == 1 else None
    if not found:
        return None
    lid, guid_hex, activity, priority, state, name = found.groups()
    if not (1 <= int(lid) <= 0xBFFF and int(priority) <= 15 and SM_STATES[int(state):int(state) + 1] == [name]):
        return None  # a unicast LID, SMInfo's 4-bit priority, the state's own name: else not sminfo
    return {"lid": int(lid), "guid": "0x" + guid_hex.rjust(16, "0"), "activity": int(activity),
            "priority": int(priority), "state": name.removeprefix("SMINFO_")}


def check_sm(sysfs: BoundedSysfs, port, label: str) -> Check:
    """The subnet manager this port's SM LID names: sminfo (SM LID, GUID,
    priority, state), read-only (no modifier argument: with one sminfo SETs)."""
    name = f"{label} subnet manager"
    sm_lid = _short(sysfs.read(sysfs.ib_class(port.device, "ports", str(port.port), "sm_lid")), 20) or "?"
    tool = shutil.which("sminfo")
    if tool is None:
        return Check(name, WARN, f"SM LID {sm_lid} (sysfs); sminfo not installed: the SM's state and "
                                 f"priority are not read", INSTALL_DIAGS)
    out, why = run_tool([tool, "-C", port.device, "-P", str(port.port), "-t", "1000"])
    if out is None:
        return Check(name, WARN, f"SM LID {sm_lid} (sysfs); {why}",
                     "run qualify as root (sminfo opens /dev/infiniband/umad*); is the port ACTIVE?")
    sm = parse_sminfo(out)
    if sm is None:
        return Check(name, WARN, f"SM LID {sm_lid} (sysfs); sminfo said something else: "
                                 f"{_short(out, 120)!r}")
    seen = f"SM at LID {sm['lid']} (GUID {sm['guid']}), priority {sm['priority']}, {sm['state']}"
    if sm["state"] != "MASTER":
        return Check(name, WARN, f"{seen}: the SM this port names is not the master",
                     "look at the fabric's SMs (sminfo, and opensm's log on each SM node)")
    return Check(name, PASS, seen)


def _gid_guid(text: Optional[str]) -> Optional[str]:
    """The port GUID in a GID 'fe80:0000:0000:0000:e41d:2d03:0060:0002' (its last 64 bits)."""
    digits = (text or "").replace(":", "").lower()
    return digits[16:] if len(digits) == 32 and all(c in "0123456789abcdef" for c in digits) else None


def _vf_policy(sysfs: BoundedSysfs, pf, vf) -> Optional[str]:
    """A VF's port policy (mlx5's sriov/<n>/policy: Down, Up, Follow); None: no such file."""
    from ..ib import guid
    backend = guid.backend_for(sysfs, pf, vf.index, ip_command="")  # sysfs only: nothing is run
    try:
        return backend.read().policy if backend is not None else None
    except ValueError:  # bytes that are no text: not the kernel's
        return None


def check_vf_ports(sysfs: BoundedSysfs, pf, vfs) -> Check:
    """Does the SM virtualise VF ports (opensm virt_enabled 2)? Seen on a VF
    a host driver holds (its own IB device): its port ACTIVE with a GUID.
    Without one, the VFs' GUID files say what is set, not whether the SM
    serves them."""
    from ..ib import guid
    name = f"PF {pf.address} VF ports (SM virtualisation)"
    own = [(vf, p) for vf in vfs for p in vf.ib_ports]
    seen, held_down = [], []
    for vf, p in own:
        if _vf_policy(sysfs, pf, vf) == "Down":  # its port is down by its own policy, whatever the SM does
            held_down.append(vf.address)
            continue
        base = sysfs.ib_class(p.device, "ports", str(p.port))
        seen.append((vf, p, _state(sysfs.read(base / "state")), _gid_guid(sysfs.read(base / "gids" / "0"))))
    up = [s for s in seen if s[2] == "ACTIVE" and s[3] not in (None, ZERO_GUID)]
    if up:
        vf, p, _, port_guid = up[0]
        return Check(name, PASS, f"{len(up)} of {len(seen)} VF ports the host holds are ACTIVE with a "
                                 f"GUID (e.g. {vf.address}, {p.device}: 0x{port_guid}): the SM serves VF ports")
    if seen:
        vf, p, state, port_guid = seen[0]
        what = "GUID 0" if port_guid in (None, ZERO_GUID) else f"GUID 0x{port_guid}"
        return Check(name, FAIL, f"no VF port comes up: e.g. {vf.address} ({p.device}) is {state} with {what} "
                                 f"while its PF's port is up: the SM does not virtualise VF ports "
                                 f"(opensm's virt_enabled is not 2), or the VF had no GUID when its driver "
                                 f"bound", SM_VIRT_FIX)
    if held_down:
        return Check(name, WARN, f"not proven: the VFs the host holds ({_shown(held_down)}) have policy Down, "
                                 f"so their ports stay down whatever the SM does",
                     f"on one free VF: echo Follow > /sys/bus/pci/devices/{pf.address}/sriov/<n>/policy, unbind "
                     f"and bind it to mlx5_core again, run qualify again; if its port stays down: " + SM_VIRT_FIX)
    states = []
    for vf in vfs:
        backend = guid.backend_for(sysfs, pf, vf.index, ip_command="")  # sysfs only: nothing is run
        if backend is not None:
            try:
                states.append(backend.read().port)
            except ValueError:  # bytes that are no text: not a GUID the kernel wrote
                states.append(None)
    if not states:
        return Check(name, WARN, "no VF has its own IB device on the host and no GUID file (netlink only): "
                                 "VF ports are not seen from here",
                     "bind one VF to mlx5_core (echo <vf> > /sys/bus/pci/drivers/mlx5_core/bind), run qualify "
                     "again; " + SM_VIRT_FIX)
    unset = sum(1 for g in states if g in (None, guid.ALL_F, guid.ZERO))
    return Check(name, WARN, f"not proven: no VF has its own IB device on the host (all on vfio-pci or unbound); "
                             f"their GUID files hold {len(states) - unset} GUID(s) set, {unset} unset (the driver "
                             f"sets one per NIC at deploy)",
                 "bind one free VF to mlx5_core (echo <vf> > /sys/bus/pci/drivers/mlx5_core/bind) and run "
                 "qualify again: its port must reach ACTIVE with a GUID; if it stays down: " + SM_VIRT_FIX)


def check_pfs(sysfs: BoundedSysfs, cfg) -> tuple[list[Check], list]:
    """Every configured PF and its VFs; also gives the PFs (for hugepages)."""
    from ..vf import discovery
    try:
        inv = discovery.discover(sysfs, cfg.pfs, cfg.skip_vfs_in_host_use)
    except DriverError as exc:
        return [Check("configured PFs", FAIL, str(exc), "fix pool.pfs in kvm-sriov.toml "
                      "(PCI address, netdev, mlx5_0[:port] or vendor:device)")], []
    if not inv.pfs:
        return [Check("configured PFs", FAIL, "no SR-IOV capable InfiniBand PF found"
                      + (f" for pool.pfs = {list(cfg.pfs)}" if cfg.pfs else ""),
                      "check `lspci -d 15b3:`, that the firmware enables SR-IOV (mlxconfig -d <pci> set "
                      "SRIOV_EN=1 NUM_OF_VFS=<n>) and that the port is InfiniBand (LINK_TYPE_P1=1), "
                      "then reboot")], []
    out = [Check("configured PFs", PASS, ", ".join(pf.address for pf in inv.pfs))]
    for pf in inv.pfs:
        vfs = [v for v in inv.vfs if v.pf == pf.address]
        out += [check_hardware(pf), check_pf_driver(pf), check_sriov(pf, vfs), check_vf_groups(pf, vfs),
                check_vf_drivers(pf, vfs), check_numa(pf, len(numa_nodes(sysfs)), cfg.numa_policy)]
        ports = check_ib_ports(sysfs, pf)
        out += ports
        if any(c.name.endswith(" state") and c.status == PASS for c in ports) and vfs:
            out.append(check_vf_ports(sysfs, pf, vfs))  # only a port the SM brought up says anything
    return out, list(inv.pfs)


# -- the SM's partitions ------------------------------------------------------------------
MAX_PARTITIONS_BYTES = 16 << 20   # a partitions file read here (a large cloud's is a few MB)
ON_FRONT_END = ("each OpenNebula network's own partition is checked on the front-end, which knows the networks "
                "(kvm-sriov partitions --check)")
OPEN_DEFAULT = ("ALL", "ALL_CAS")


def partition_readings(sysfs: BoundedSysfs, cfg) -> list:
    """What the SM enforces, as far as this host can see it: the partitions
    file when this host is the SM node, else each SM node's copy through
    fabric.sm_read_command (or UFM); [] when neither is to be had."""
    from ..errors import ConfigError, InputError
    from ..fabric import base, manager
    path = cfg.partitions_file
    text, why = read_small(path, limit=MAX_PARTITIONS_BYTES)
    if why:
        sysfs.odd.setdefault(str(path), why)
    if text is not None:
        try:
            return [base.Reading(f"{path} (this host)", base.parse(text))]
        except InputError as exc:
            return [base.Reading(f"{path} (this host)", None, base.one_line(exc))]
    if not (cfg.sm_read_command or getattr(cfg, "fabric_manager", "opensm") != "opensm"):
        return []
    try:
        return manager.for_config(cfg).enforced()
    except (ConfigError, DriverError) as exc:
        return [base.Reading("the fabric manager", None, base.one_line(exc))]


def check_partitions(sysfs: BoundedSysfs, cfg) -> list[Check]:
    name = "SM partitions"
    readings = partition_readings(sysfs, cfg)
    if not readings:
        return [Check(name, WARN, f"not visible from this host: no {cfg.partitions_file} here (not an SM node) "
                                  f"and no fabric.sm_read_command", ON_FRONT_END)]
    out = []
    for r in readings:
        if r.partitions is None:
            out.append(Check(f"{name} on {r.where or 'the SM node'}", WARN, f"not read: {r.error}",
                             "make the SM node's copy readable (fabric.sm_read_command), or " + ON_FRONT_END))
            continue
        default = [p for p in r.partitions if p.pkey == 0x7FFF]
        open_to_all = [m for p in default for m in p.members
                       if m.guid in OPEN_DEFAULT and m.membership in ("full", "both")]
        if open_to_all:
            out.append(Check(f"{name} on {r.where or 'the SM node'}", FAIL,
                             f"the Default partition (0x7fff) makes {open_to_all[0].guid} full members: every "
                             f"VF, of any network, can reach every other through it",
                             "infiniband.default_partition_members = [\"SELF=full\", \"ALL_SWITCHES=full\"] "
                             "on the front-end, then kvm-sriov network-hook --resync"))
            continue
        keys = sorted(p.pkey for p in r.partitions if p.pkey != 0x7FFF)
        shown = ", ".join(f"0x{k:04x}" for k in keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        out.append(Check(f"{name} on {r.where or 'the SM node'}", PASS,
                         f"{len(keys)} partition(s) besides Default" + (f": {shown}" if keys else "")
                         + f"; {ON_FRONT_END}"))
    read = [r for r in readings if r.partitions is not None]
    seen = {r.where: {(p.pkey, tuple(sorted(p.guids().items()))) for p in r.partitions} for r in read}
    if len({frozenset(v) for v in seen.values()}) > 1:
        out.append(Check(name, FAIL, f"the SM nodes enforce different partitions ({', '.join(seen)}): after a "
                                     f"failover other VMs share a partition",
                         "kvm-sriov network-hook --resync on the front-end (it sends the file to every SM node)"))
    return out


def check_sm_config(sysfs: BoundedSysfs, cfg) -> list[Check]:
    """doctor's opensm checks (virt_enabled 2, partition_config_file) when
    this host runs the SM (infiniband.sm_config); none otherwise."""
    from . import doctor
    if cfg.sm_config is None:
        return []
    _text, why = read_small(cfg.sm_config)
    if why:  # doctor reads it whole and would wait on a FIFO: say so, read nothing
        sysfs.odd.setdefault(str(cfg.sm_config), why)
        return []
    return [_from_doctor(r) for r in doctor.check_sm(cfg)]


# -- host-wide -------------------------------------------------------------------------
def numa_nodes(sysfs: Sysfs) -> list[int]:
    """The host's NUMA node numbers (their CPU lists are not needed here)."""
    names = sysfs.listdir(sysfs.path("devices", "system", "node"))
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit() and len(n) < 12)


def _hugepage_kib(sysfs: BoundedSysfs) -> Optional[int]:
    for line in (sysfs.read(sysfs.root / "proc" / "meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Hugepagesize" and value.split()[:1] and value.split()[0].isdigit():
            return int(value.split()[0])
    return None


def check_hugepages(sysfs: BoundedSysfs, cfg, pfs) -> list[Check]:
    """The HPC profile backs a VM's memory with hugepages on its VF's NUMA
    node (strict): that node needs pages of the configured size."""
    if not cfg.hpc_profile:
        return [Check("hugepages", SKIP, "hpc.profile is off: VMs get hugepages only when they ask for the "
                                         "HPC profile themselves (KVM_SRIOV_HPC)")]
    if not cfg.hpc_hugepages:
        return [Check("hugepages", SKIP, "hpc.hugepages = false: the HPC profile uses no hugepages")]
    size = cfg.hpc_hugepage_size_kib or _hugepage_kib(sysfs)
    if not size:
        return [Check("hugepages", WARN, "the default hugepage size is unknown (no Hugepagesize in /proc/meminfo)",
                      "set hpc.hugepage_size_kib (2048 or 1048576)")]
    nodes = numa_nodes(sysfs)
    wanted = sorted({pf.numa_node for pf in pfs if pf.numa_node is not None}) or nodes
    persist = (f"hugepagesz={size // 1024}M hugepages=<n> on the kernel command line" if size < 1048576
               else "hugepagesz=1G hugepages=<n> on the kernel command line (1 GiB pages: at boot)")
    out = []
    for node in wanted or [None]:
        base = (sysfs.path("devices", "system", "node", f"node{node}", "hugepages", f"hugepages-{size}kB")
                if node is not None else sysfs.path("kernel", "mm", "hugepages", f"hugepages-{size}kB"))
        name = f"hugepages on NUMA node {node}" if node is not None else "hugepages"
        pages, free = sysfs.read_int(base / "nr_hugepages"), sysfs.read_int(base / "free_hugepages")
        if pages is None:
            out.append(Check(name, FAIL, f"no {size} kB hugepages on this kernel ({base} is missing)", persist))
        elif pages == 0:
            out.append(Check(name, FAIL, f"0 pages of {size} kB: HPC VMs pinned here cannot start",
                             f"echo <n> > /{base.relative_to(sysfs.root)}/nr_hugepages, and persist it: "
                             + persist))
        elif free == 0:
            out.append(Check(name, WARN, f"{pages} pages of {size} kB, none free: the next HPC VM pinned to this "
                                         f"node cannot start", f"free some (what holds them: grep -i huge "
                                                               f"/proc/meminfo, VMs on the node) or raise "
                                                               f"/{base.relative_to(sysfs.root)}/nr_hugepages"))
        else:
            out.append(Check(name, PASS, f"{pages} pages of {size} kB ({pages * size / 1048576:.1f} GiB), "
                                         f"{free if free is not None else '?'} free"))
    return out


def check_vfio(sysfs: BoundedSysfs) -> Optional[Check]:
    """doctor's; None when a file it would read whole is odd (that file's line says so)."""
    from . import doctor
    modules = sysfs.root / "lib" / "modules" / os.uname().release
    for f in (modules / "modules.dep", modules / "modules.builtin"):
        why = _not_plain(f)
        if why:
            sysfs.odd.setdefault(str(f), why)
            return None
    return _from_doctor(doctor.check_vfio(sysfs))


# -- versions ----------------------------------------------------------------------------
# The oldest versions with what kvm-sriov uses (docs/install.md, "Minimum versions", says why)
MIN_KERNEL = (4, 6)     # VF GUIDs through netlink (ip link set <pf> vf N node_guid/port_guid)
MIN_LIBVIRT = (2, 5)    # <shmem><model type='ivshmem-plain'/> (IVShmem regions)
MIN_QEMU = (2, 6)       # the ivshmem-plain device
_LEADING_VERSION = re.compile(r"(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?")


def version_of(text: str) -> Optional[tuple[int, ...]]:
    """'6.8.0-49-generic' -> (6, 8, 0); None when text does not start with a version."""
    found = _LEADING_VERSION.match(text or "")
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


def _dotted(version: Sequence[int]) -> str:
    return ".".join(str(n) for n in version)


def _below(version: Optional[tuple[int, ...]], minimum: tuple[int, ...]) -> bool:
    return version is not None and version < minimum


def check_kernel(sysfs: BoundedSysfs) -> Check:
    release = _short(sysfs.read(sysfs.root / "proc" / "sys" / "kernel" / "osrelease"))
    detail = f"Linux {release}" if release else (f"Linux {os.uname().release} (os.uname: no "
                                                 f"/proc/sys/kernel/osrelease under {sysfs.root})")
    if _below(version_of(release or os.uname().release), MIN_KERNEL):
        return Check("kernel", WARN, f"{detail}: older than {_dotted(MIN_KERNEL)}, which VF GUIDs through "
                                     f"netlink need", f"a kernel >= {_dotted(MIN_KERNEL)} (the distribution's "
                                                      f"current one)")
    return Check("kernel", PASS, detail)


def libvirt_versions(cfg) -> Optional[tuple[int, str, int]]:
    """(libvirt's version, its hypervisor type, that hypervisor's version) as
    libvirt's getLibVersion/getType/getVersion give them; None when libvirt
    cannot be asked (doctor's libvirt line says why)."""
    try:
        from ..domain.hypervisor import Hypervisor
        hv = Hypervisor(cfg.libvirt_uri)
        try:
            return hv.conn.getLibVersion(), str(hv.conn.getType())[:40], hv.conn.getVersion()
        finally:
            hv.close()
    except Exception:  # a missing binding, a daemon that is down, libvirtError: doctor's line says which
        return None


def _from_number(n: int) -> tuple[int, int, int]:
    """libvirt's major * 1,000,000 + minor * 1,000 + release."""
    return n // 1000000, n // 1000 % 1000, n % 1000


def check_libvirt_version(cfg) -> Optional[Check]:
    got = libvirt_versions(cfg)
    if got is None:
        return None
    lib, kind, hypervisor = got
    version = _from_number(lib)
    detail = f"libvirt {_dotted(version)}" + (f", {kind} {_dotted(_from_number(hypervisor))}" if hypervisor else "")
    if _below(version, MIN_LIBVIRT):
        return Check("libvirt version", WARN, f"{detail}: older than {_dotted(MIN_LIBVIRT)}, whose ivshmem-plain "
                                              f"shared memory kvm-sriov's IVShmem regions use",
                     f"libvirt >= {_dotted(MIN_LIBVIRT)} (the distribution's current packages)")
    return Check("libvirt version", PASS, detail)


def check_opennebula(sysfs: BoundedSysfs, remotes_dir: Optional[Path] = None) -> Check:
    """The OpenNebula release of the remotes onehost sync put here (their
    VERSION file), against the ones kvm-sriov is tested with; remotes_dir
    (--remotes): those remotes, not the usual places under the root."""
    from ..oned import versions
    tested = versions.supported()
    want = ", ".join(tested)
    places = [Path(remotes_dir)] if remotes_dir else REMOTES
    for remotes in places:
        path = (remotes if remotes_dir else sysfs.root.joinpath(*remotes.parts[1:])) / "VERSION"
        text, why = read_small(path, limit=256)
        if why:
            sysfs.odd.setdefault(str(path), why)
            continue
        if text is None:
            continue
        shown = _short(text, 40)
        if versions.major_minor(text) is None:
            return Check("OpenNebula", WARN, f"{path} holds {shown!r}, not a version",
                         "onehost sync --force on the front-end (as oneadmin)")
        if not versions.is_supported(text, tested):
            return Check("OpenNebula", WARN, f"the remotes in {remotes} are OpenNebula {shown}; kvm-sriov is "
                                             f"tested with {want} only",
                         "check OpenNebula's release notes before tenants land here, or run a tested release")
        return Check("OpenNebula", PASS, f"the remotes in {remotes} are OpenNebula {shown} (tested: {want})")
    return Check("OpenNebula", WARN, f"no OpenNebula remotes here ({' or '.join(str(r) for r in places)}): "
                                     f"the host has not been synced yet",
                 "onehost create <host> -i kvm -v kvm-sriov, or onehost sync --force (as oneadmin, front-end)")


def check_libvirt(cfg) -> Check:
    """doctor's libvirt check; a missing binding or daemon is a WARN here
    (the versions are what qualify reports)."""
    from . import doctor
    try:
        return _from_doctor(doctor.check_libvirt(cfg), fail_as=WARN)
    except Exception as exc:  # whatever the binding raises, one line (libvirtError has no common base)
        return Check("libvirt", WARN, f"{cfg.libvirt_uri}: {' '.join(str(exc).split())[:300]}",
                     "start libvirtd (systemctl start libvirtd)")


def check_qemu() -> Check:
    found = [p for p in (shutil.which(f"qemu-system-{os.uname().machine}"), shutil.which("qemu-kvm"),
                         *QEMU_OFF_PATH) if p and os.path.isfile(p)]
    if not found:
        return Check("QEMU", WARN, f"no qemu-system-{os.uname().machine} or qemu-kvm found",
                     "apt-get install qemu-system-x86 (Debian) or dnf install qemu-kvm (RHEL)")
    try:
        done = subprocess.run([found[0], "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=QEMU_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("QEMU", WARN, f"{found[0]} --version: {getattr(exc, 'strerror', None) or exc}")
    first = done.stdout[:400].decode("utf-8", "replace").partition("\n")[0].strip()
    if done.returncode or not first:
        return Check("QEMU", WARN, f"{found[0]} --version exited {done.returncode}")
    version = version_of(first.removeprefix("QEMU emulator version ")) if first.startswith("QEMU emulator") else None
    if _below(version, MIN_QEMU):
        return Check("QEMU", WARN, f"{_short(first)} ({found[0]}): older than {_dotted(MIN_QEMU)}, which has "
                                   f"the ivshmem-plain device", f"QEMU >= {_dotted(MIN_QEMU)}")
    return Check("QEMU", PASS, f"{_short(first)} ({found[0]})")


# -- --write-test: a GUID written to a free VF, read back, restored ----------------------
WRITE_TEST_VM = -2                    # who holds the VF in the pool meanwhile (no VM has a negative ID)
WRITE_TEST_DOMAIN = "kvm-sriov-qualify"
WRITE_TEST_MAC = "02:6b:73:71:00:01"  # its GUID: outside OpenNebula's default MAC prefix (02:00)


def _guid_state(backend):
    """What a VF's GUID files say now (the library's own reading)."""
    return backend.read()


def write_test(cfg, pfs) -> list[Check]:
    """Per InfiniBand PF: one free VF taken through the pool (so no action
    can take it meanwhile), a GUID written and read back with the driver's
    own GUID code (ib/guid.py, as deploy does), the VF's GUIDs restored and
    the VF given back, whatever fails on the way (try/finally; a kill -9 in
    between leaves a pool intent and a GUID record that the next action or
    kvm-sriov reconcile undoes)."""
    from .host import Host
    if cfg.guid_policy == "none":
        return [Check("GUID write test", SKIP, "infiniband.guid_policy = none: the driver writes no GUID")]
    targets = [pf for pf in pfs if _is_connectx(pf) and pf.ib_ports and pf.num_vfs]
    if not targets:
        return [Check("GUID write test", SKIP, "no InfiniBand PF with VFs to test on")]
    host = Host(cfg)
    out: list[Check] = []
    try:
        with host.operation(WRITE_TEST_VM, "qualify"):   # reconcile leaves the VF alone while it runs
            for pf in targets:
                out.append(_write_test_pf(host, pf))
    except DriverError as exc:   # the pool, its lock or libvirt: nothing was taken
        out.append(Check("GUID write test", FAIL, _short(str(exc), 300),
                         "see the line above (libvirt, the pool's state folder); kvm-sriov doctor"))
    finally:
        host.close()
    return out


def _not_writable_safely(backend) -> Optional[str]:
    """Why the GUID files the library would open for writing are not the
    kernel's (a link would take the write elsewhere, a FIFO would block it):
    they are checked here, under a root qualify may have been pointed at."""
    from ..ib import guid
    if isinstance(backend, guid.Mlx5Sysfs):
        files = [backend.folder / n for n in ("node", "port", "policy")]
        folders = [backend.folder, backend.folder.parent]
    elif isinstance(backend, guid.Mlx4Sysfs):
        files, folders = [backend.path], [backend.path.parent]
    else:
        return None   # netlink: ip writes, no file
    for folder in folders:
        if os.path.islink(folder):
            return f"{folder} is a symbolic link"
    for f in files:
        why = _not_plain(f)
        if why:
            return f"{f} {why}"
    return None


def _write_test_pf(host, pf) -> Check:
    from ..ib import guid
    from ..vf import policy
    name = f"PF {pf.address} GUID write test"
    try:
        taken = host.reserve(WRITE_TEST_VM, WRITE_TEST_DOMAIN, [policy.VfRequest(WRITE_TEST_MAC, pf.address)],
                             "qualify")
    except DriverError as exc:
        return Check(name, WARN, f"no VF taken: {_short(str(exc), 200)}", "run it again with a VF free")
    vf = taken[0].vf
    try:
        backend = guid.backend_for(host.sysfs, host.inventory.pf(pf.address), vf.index, host.config.ip_command)
        if backend is None:
            return Check(name, SKIP, f"VF {vf.address} has no InfiniBand identity to write")
        odd = _not_writable_safely(backend)
        if odd:
            return Check(name, FAIL, f"VF {vf.address}: nothing written: {odd}",
                         "this is not what the kernel puts there: look at who made it (or at --sysfs-root)")
        before = _guid_state(backend)
        records, read_back, problem = [], None, None
        try:
            records = host.program_guids(WRITE_TEST_VM, taken)   # writes, reads back, refuses a collision
            read_back = _guid_state(backend).port
        except Exception as exc:  # whatever breaks between write and restore is this VF's FAIL line
            problem = _short(str(exc) if isinstance(exc, DriverError) else f"{type(exc).__name__}: {exc}", 200)
        finally:
            restored = host.restore_vf_guids([vf.address]) if records else []
        after = _guid_state(backend)
    except (DriverError, ValueError) as exc:
        return Check(name, FAIL, f"VF {vf.address}: {_short(str(exc), 200)}",
                     "kvm-sriov guids shows what is set; kvm-sriov reconcile restores a recorded GUID")
    finally:
        host.release(taken)
    wrote = records[0].port_guid if records else guid.port_guid(WRITE_TEST_MAC)
    if problem:
        return Check(name, FAIL, f"VF {vf.address} ({backend.name}): {problem}",
                     "the VF's GUID files or ip link must take a GUID (docs/infiniband.md, GUIDs)")
    if read_back != wrote:
        return Check(name, FAIL, f"VF {vf.address} ({backend.name}): wrote {wrote}, read back {read_back}",
                     "the firmware or driver ignores the write: mlx5_core's sriov/<n>/port, or a kernel with VF "
                     "GUIDs through netlink")
    # what guid.restore writes back: the original, or the released state when there was none (or
    # another VM's GUID nothing recorded); a backend without a policy (mlx4, netlink) reads none
    kept = before.port if before.port and not guid.mac_derived(before.port) else None
    expected = (kept or (guid.ZERO if backend.name == "mlx4-sysfs" else guid.ALL_F),
                None if before.policy is None else
                before.policy if before.policy in guid.POLICIES else guid.RELEASED_POLICY)
    if not restored or (after.port, after.policy) != expected:
        return Check(name, FAIL, f"VF {vf.address}: GUID {wrote} written and read back, but not restored: "
                                 f"reads {after.port} ({after.policy}), was {before.port} ({before.policy})",
                     "kvm-sriov reconcile restores it from its record (kvm-sriov guids shows it)")
    return Check(name, PASS, f"VF {vf.address} ({backend.name}): {wrote} written, read back, restored to "
                             f"{after.port} ({after.policy}); the VF is free again")


# -- the run and its reports -------------------------------------------------------------
def run(config, sysfs_root=None, libvirt_check: bool = True, write: bool = False, remotes=None,
        vm=None) -> list[Check]:
    """Every check, in the order an operator fixes them. Reads only, unless
    ``write``: then a GUID is written to a free VF and restored, or ``vm``
    (qualify_vm's VM test, called with the config and the PFs found): then a
    throwaway VM gets a VF, last."""
    sysfs = BoundedSysfs(config.sysfs_root if sysfs_root is None else sysfs_root)
    checks = check_iommu(sysfs)
    pf_checks, pfs = check_pfs(sysfs, config)
    checks += pf_checks
    vfio = check_vfio(sysfs)
    checks += [vfio] if vfio else []
    checks += check_sm_config(sysfs, config)
    if pfs and not any(_is_connectx(pf) for pf in pfs):   # the nested test host's emulated PF
        checks.append(Check("SM partitions", SKIP, f"{NOT_IB}: no subnet manager serves these PFs"))
    else:
        checks += check_partitions(sysfs, config)
    checks += check_hugepages(sysfs, config, pfs)
    checks.append(check_kernel(sysfs))
    if libvirt_check:
        checks.append(check_libvirt(config))
        version = check_libvirt_version(config)
        checks += [version] if version else []
    checks.append(check_qemu())
    checks.append(check_opennebula(sysfs, remotes))
    no_libvirt = ("--no-libvirt: a VF cannot be taken safely without asking libvirt which VFs its domains "
                  "hold", "run it without --no-libvirt")
    if write:
        checks += write_test(config._replace(sysfs_root=sysfs.root), pfs) if libvirt_check else [
            Check("GUID write test", FAIL, *no_libvirt)]
    if vm is not None:
        checks += vm(config._replace(sysfs_root=sysfs.root), pfs) if libvirt_check else [
            Check("VM test", FAIL, *no_libvirt)]
    for path, why in sysfs.odd.items():
        checks.append(Check(f"file {path}", FAIL, f"{why}: not read, so the checks that need it are unreliable",
                            "this is not what the kernel puts there: look at who made it (or at --sysfs-root)"))
    return checks


def summary(checks: Sequence[Check]) -> dict:
    return {s: sum(c.status == s for c in checks) for s in STATUSES}


def report_json(checks: Sequence[Check], sysfs_root, when: Optional[float] = None) -> dict:
    when = time.time() if when is None else when
    counts = summary(checks)
    return {"schema": REPORT_SCHEMA, "tool": "kvm-sriov qualify", "version": __version__,
            "host": socket.gethostname(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
            "sysfs_root": str(sysfs_root), "qualified": counts[FAIL] == 0, "summary": counts,
            "checks": [c.as_dict() for c in checks]}


def report_text(checks: Sequence[Check], sysfs_root, when: Optional[float] = None) -> str:
    when = time.time() if when is None else when
    width = max((len(c.name) for c in checks), default=0)
    lines = [f"kvm-sriov qualify {__version__} on {socket.gethostname()}, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(when))}, root {sysfs_root}", ""]
    for c in checks:
        lines.append(f"[{c.status}] {c.name:<{width}}  {c.detail}")
        if c.fix:
            lines.append(f"{'':6} {'':<{width}}  fix: {c.fix}")
    counts = summary(checks)
    lines += ["", f"{len(checks)} checks: {counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, "
                  f"{counts[SKIP]} skipped: " + ("QUALIFIED" if counts[FAIL] == 0 else "NOT QUALIFIED")]
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options, for the kvm-sriov subcommand too."""
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    p.add_argument("--text", metavar="PATH", help="also write the text report to PATH")
    p.add_argument("--sysfs-root", metavar="DIR",
                   help="read <DIR>/sys and <DIR>/proc instead of the host's (fixtures; default: sysfs.root)")
    p.add_argument("--no-libvirt", action="store_true", help="skip the libvirt connection")
    p.add_argument("--write-test", action="store_true",
                   help="also write a GUID to one free VF per PF, read it back and restore it (changes the "
                        "VF for a moment; the VF is taken through the pool meanwhile)")
    p.add_argument("--remotes", metavar="DIR",
                   help="OpenNebula's remotes on this host, with the driver's action scripts (default: "
                        "/var/tmp/one, where onehost sync puts them)")


def run_command(cfg, args: argparse.Namespace, vm=None) -> int:
    """Print the report, write the files asked for; 0 when nothing FAILs.
    vm: the VM test (qualify_vm, which adds --vm to the command line)."""
    from ..files import atomic_write
    root = Path(args.sysfs_root) if args.sysfs_root else cfg.sysfs_root
    if not (root / "sys").is_dir():
        print(f"kvm-sriov qualify: {root / 'sys'} is not a directory: not a sysfs root", file=sys.stderr)
        return 1
    checks = run(cfg, sysfs_root=root, libvirt_check=not args.no_libvirt, write=args.write_test,
                 remotes=args.remotes, vm=vm)
    when = time.time()
    text = report_text(checks, root, when)
    sys.stdout.write(text)
    outputs = [(args.json, json.dumps(report_json(checks, root, when), indent=2) + "\n"), (args.text, text)]
    for path, data in outputs:
        if path:
            try:
                atomic_write(path, data)
            except OSError as exc:
                print(f"kvm-sriov qualify: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
                return 1
    return 1 if summary(checks)[FAIL] else 0


def main(argv: Optional[Sequence[str]] = None, cfg=None) -> int:
    p = argparse.ArgumentParser(prog="kvm-sriov qualify",
                                description="read-only checks that a KVM host is ready for ConnectX VFs")
    p.add_argument("--config", help="extra config file (like $KVM_SRIOV_CONFIG)")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        if cfg is None:
            files = config_mod.config_files(None) + ([Path(args.config)] if args.config else [])
            cfg = config_mod.load(files=files)
        return run_command(cfg, args)
    except DriverError as exc:
        print(f"kvm-sriov qualify: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
