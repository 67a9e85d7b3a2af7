"""InfiniBand GUIDs of the VFs the pool hands out: derive, program, restore.

A VF NIC gets a port GUID and a node GUID derived from its OpenNebula MAC
(docs/conventions.md), so the guest can tell which IB port is which context
NIC and the subnet manager's partitions can name the port ahead of time.

Where a VF's GUIDs live (the VF's IB device is the PF's):
- mlx5: ``<PF PCI dir>/sriov/<vf index>/{node,port,policy}``
  (= ``/sys/class/infiniband/mlx5_N/device/sriov/...``),
- mlx4: ``/sys/class/infiniband/mlx4_N/iov/ports/<p>/admin_guids/<vf index + 1>``
  (port GUID only),
- otherwise netlink: ``ip link set <PF netdev> vf N node_guid G port_guid G``.
A VF whose PF has no IB device at all (e.g. an NVMe VF) has no GUID: skipped.

Every programmed GUID is recorded, with the value it replaced, in the table
``guid`` of the pool's SQLite database, inside the pool's transaction (so the
collision check and the write are atomic across concurrent actions). Its
``port_guid`` column is UNIQUE: the database itself refuses a collision. The
record is committed *before* the VF is written (the pool's lock still held):
a process killed in between leaves a record that restores the VF, never a VF
with a VM's GUID that nothing knows about. A free VF found carrying a
MAC-derived GUID anyway (older versions, hands) is reset by ``kvm-sriov
reconcile`` and never taken for an original.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional

from .. import failpoints
from ..errors import DriverError, InputError
from ..vf.discovery import HostInventory, PhysicalFunction, VirtualFunction
from ..vf.sysfs import Sysfs

ALL_F = "ff:ff:ff:ff:ff:ff:ff:ff"
ZERO = "00:00:00:00:00:00:00:00"
POLICIES = ("Down", "Up", "Follow")
VM_POLICY = "Follow"          # the VF port follows the PF port's state
RELEASED_POLICY = "Down"

SCHEMA = """
CREATE TABLE IF NOT EXISTS guid (
    vf          TEXT PRIMARY KEY,      -- VF PCI address
    pf          TEXT NOT NULL,
    vm_id       INTEGER NOT NULL,
    mac         TEXT NOT NULL,
    port_guid   TEXT NOT NULL UNIQUE,  -- one port GUID per host, ever
    node_guid   TEXT NOT NULL DEFAULT '',
    orig_port   TEXT,                  -- what the VF had before (NULL: unknown)
    orig_node   TEXT,
    orig_policy TEXT,
    backend     TEXT NOT NULL,         -- mlx5-sysfs | mlx4-sysfs | netlink
    since       REAL NOT NULL
);
"""

Logger = Callable[[str, str], None]


def _nolog(level: str, message: str) -> None:
    pass


# -- GUID text ------------------------------------------------------------
_HEX = re.compile(r"^[0-9a-f]{16}$")
MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def normalize(text: Optional[str]) -> Optional[str]:
    """'0x0002c903000a1235', '0002:c903:000a:1235', '00:02:c9:...' -> '00:02:c9:03:00:0a:12:35'."""
    if text is None:
        return None
    t = text.strip().lower()
    if t.startswith("0x"):
        t = t[2:].rjust(16, "0")
    t = t.replace(":", "")
    return ":".join(t[i:i + 2] for i in range(0, 16, 2)) if _HEX.match(t) else None


def as_int(guid: str) -> int:
    return int(guid.replace(":", ""), 16)


def from_int(value: int) -> str:
    return normalize(f"0x{value:016x}")  # type: ignore[return-value]


# The two middle bytes of a MAC-derived GUID carry the OpenNebula network
# whose address ranges lease the MAC (its "address space"; a reservation's
# is its parent's): with oned's default MAC_GLOBAL_SPACE = "NO" two networks
# hand out the same MACs, and the MAC alone would give two VMs one GUID.
# field = (space + 1) * 2 + kind (0 port, 1 node): never 0000/0001, the
# MAC-only GUIDs of VMs deployed before the rule (or without a known
# network), which keep theirs.
MAX_SPACE = 0x7FFE


def space_fits(space: Optional[int]) -> bool:
    return space is not None and 0 <= space <= MAX_SPACE


def from_mac(mac: str, space: Optional[int] = None) -> tuple[str, str]:
    """(port GUID, node GUID) of an OpenNebula NIC MAC leased by network
    ``space`` (docs/infiniband.md). None or a network ID above MAX_SPACE:
    the MAC-only GUID (then MACs must be unique on the fabric)."""
    m = mac.strip().lower()
    if not MAC.match(m):
        raise DriverError(f"cannot derive an InfiniBand GUID from MAC {mac!r}")
    b = m.split(":")
    field = (space + 1) * 2 if space_fits(space) else 0
    middle = [[f"{(field + kind) >> 8:02x}", f"{(field + kind) & 0xff:02x}"] for kind in (0, 1)]
    return (":".join(b[:3] + middle[0] + b[3:]), ":".join(b[:3] + middle[1] + b[3:]))


def port_guid(mac: str, space: Optional[int] = None) -> str:
    return from_mac(mac, space)[0]


def new_nic_spaces(known: Optional[dict], macs: Iterable[str], policy: str = "mac") -> dict:
    """MAC -> the network whose ID goes into the GUIDs of VF NICs a VM is
    getting now (deploy, attach_nic). known: MAC -> network that leases it
    (vm_template.VmTemplate.address_spaces) from OpenNebula's VM document;
    None when there is no document (a deploy run by hand: oned writes vm.xml
    before every deploy and sends the VM with attach_nic).

    A MAC-only GUID is unique only when MACs are, and a partition that lists
    MAC-only GUIDs for VMs deployed before the network rule would then take
    in another network's VM: a NIC the document names without a network, or
    with one whose ID does not fit, is refused (InputError, before anything
    is taken). Without a document the NICs get MAC-only GUIDs, as before;
    with ``policy`` "none" no GUID is written, so nothing is refused."""
    spaces: dict[str, Optional[int]] = {}
    for mac in macs:
        space = None if known is None else known.get(mac)
        spaces[mac] = space if space_fits(space) else None
        if known is None or policy == "none" or space_fits(space):
            continue
        nic = f"NIC {mac[:40]!r}"
        if space is None:
            raise InputError(
                f"{nic}: OpenNebula's VM document names no virtual network for it (NETWORK_ID): its VF "
                f"cannot get a fabric-unique InfiniBand GUID. Attach the NIC from a virtual network")
        raise InputError(
            f"{nic}: network {space} is above {MAX_SPACE}, the largest network ID an InfiniBand GUID "
            f"can carry: its VF cannot get a fabric-unique GUID. Use a network with a lower ID, or a "
            f"reservation (onevnet reserve) of one")
    return spaces


def mac_derived(guid: Optional[str]) -> bool:
    """Looks like a MAC-only GUID (a port or node GUID of some NIC), the
    kind older versions could leave on a VF without a record. A GUID with a
    network in the middle cannot be told from an administrator's own, and
    needs not: it is only ever written after its record commits, and a
    record stays until the VF has its original back."""
    return bool(guid) and guid.split(":")[3:5] in (["00", "00"], ["00", "01"]) \
        and guid not in (ALL_F, ZERO)


# -- where a VF's GUIDs live -----------------------------------------------
class GuidState(NamedTuple):
    port: Optional[str]
    node: Optional[str]
    policy: Optional[str]


class Backend:
    name = "?"

    def read(self) -> GuidState:
        raise NotImplementedError

    def write(self, port: Optional[str], node: Optional[str], policy: Optional[str]) -> None:
        raise NotImplementedError


class Mlx5Sysfs(Backend):
    name = "mlx5-sysfs"

    def __init__(self, folder: Path):
        self.folder = folder

    def read(self) -> GuidState:
        return GuidState(normalize(Sysfs.read(self.folder / "port")),
                         normalize(Sysfs.read(self.folder / "node")),
                         Sysfs.read(self.folder / "policy"))

    def write(self, port, node, policy) -> None:
        # policy last: the port comes up only with its new identity
        for name, value in (("node", node), ("port", port), ("policy", policy)):
            if value is not None:
                _write(self.folder / name, value)


class Mlx4Sysfs(Backend):
    name = "mlx4-sysfs"

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> GuidState:
        return GuidState(normalize(Sysfs.read(self.path)), None, None)

    def write(self, port, node, policy) -> None:
        if port is not None:
            _write(self.path, "0x" + port.replace(":", ""))


class Netlink(Backend):
    """``ip link set <pf> vf N node_guid G port_guid G state ...`` (kernel >= 4.6)."""
    name = "netlink"
    STATES = {"Up": "enable", "Down": "disable", "Follow": "auto"}

    def __init__(self, ip_command: str, netdev: str, index: int):
        self.ip, self.netdev, self.index = ip_command, netdev, index

    def _run(self, *args: str) -> str:
        import subprocess  # here: ~2 ms that an action of a VM without VFs would pay
        cmd = [self.ip, *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DriverError(f"{' '.join(cmd)}: {exc}") from None
        if done.returncode != 0:
            raise DriverError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def read(self) -> GuidState:
        """iproute2 prints ``vf N ... NODE_GUID g, PORT_GUID g`` when the kernel reports them."""
        try:
            out = self._run("-d", "link", "show", "dev", self.netdev)
        except DriverError:
            return GuidState(None, None, None)
        for line in out.splitlines():
            words = line.replace(",", " ").split()
            if len(words) > 1 and words[0] == "vf" and words[1] == str(self.index):
                found = {k: normalize(words[i + 1]) for i, k in enumerate(words[:-1])
                         if k in ("NODE_GUID", "PORT_GUID")}
                return GuidState(found.get("PORT_GUID"), found.get("NODE_GUID"), None)
        return GuidState(None, None, None)

    def write(self, port, node, policy) -> None:
        args = ["link", "set", "dev", self.netdev, "vf", str(self.index)]
        if node is not None:
            args += ["node_guid", node]
        if port is not None:
            args += ["port_guid", port]
        if policy is not None:
            args += ["state", self.STATES[policy]]
        self._run(*args)


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise DriverError(f"cannot write {value} to {path}: {exc.strerror}") from None


def backend_for(sysfs: Sysfs, pf: PhysicalFunction, index: int,
                ip_command: str = "ip") -> Optional[Backend]:
    """How to set VF ``index`` of ``pf``'s GUIDs; None when it has no IB identity."""
    mlx5 = sysfs.pci(pf.address) / "sriov" / str(index)
    if (mlx5 / "port").exists():
        return Mlx5Sysfs(mlx5)
    for port in pf.ib_ports:
        mlx4 = sysfs.ib_class(port.device, "iov", "ports", str(port.port), "admin_guids", str(index + 1))
        if mlx4.exists():
            return Mlx4Sysfs(mlx4)
    if pf.ib_ports and pf.netdevs and ip_command:
        return Netlink(ip_command, pf.netdevs[0], index)
    return None


# -- records ----------------------------------------------------------------
class GuidRecord(NamedTuple):
    vf: str
    pf: str
    vm_id: int
    mac: str
    port_guid: str
    node_guid: str
    orig_port: Optional[str]
    orig_node: Optional[str]
    orig_policy: Optional[str]
    backend: str
    since: float


_COLUMNS = "vf, pf, vm_id, mac, port_guid, node_guid, orig_port, orig_node, orig_policy, backend, since"


def ensure_schema(db) -> None:
    db.execute(SCHEMA)


def records(db, vm_id: Optional[int] = None) -> list[GuidRecord]:
    ensure_schema(db)
    sql, args = f"SELECT {_COLUMNS} FROM guid", ()
    if vm_id is not None:
        sql, args = sql + " WHERE vm_id = ?", (vm_id,)
    return [GuidRecord(*row) for row in db.execute(sql + " ORDER BY vf", args)]


def _record(db, vf: str) -> Optional[GuidRecord]:
    row = db.execute(f"SELECT {_COLUMNS} FROM guid WHERE vf = ?", (vf,)).fetchone()
    return GuidRecord(*row) if row else None


# -- the host's live GUIDs (collision check) ---------------------------------
def live_guids(sysfs: Sysfs, inventory: HostInventory) -> dict[str, tuple[str, Optional[tuple[str, int]]]]:
    """port/node GUID -> (who carries it, (PF, VF index) or None for a PF's own GUID)."""
    seen: dict[str, tuple[str, Optional[tuple[str, int]]]] = {}
    for pf in inventory.pfs:
        for ibdev in pf.ib_devices:
            node = normalize(sysfs.read(sysfs.ib_class(ibdev, "node_guid")))
            if node:
                seen.setdefault(node, (f"{ibdev} (PF {pf.address}), its node GUID", None))
        for port in pf.ib_ports:
            gid = sysfs.read(sysfs.ib_class(port.device, "ports", str(port.port), "gids", "0"))
            own = normalize(gid.replace(":", "")[16:]) if gid else None
            if own:
                seen.setdefault(own, (f"{port.device} port {port.port} (PF {pf.address})", None))
            admin = sysfs.ib_class(port.device, "iov", "ports", str(port.port), "admin_guids")
            for name in sysfs.listdir(admin):
                g = normalize(sysfs.read(admin / name))
                if g and name.isdigit() and int(name) > 0:
                    seen.setdefault(g, (f"VF {int(name) - 1} of {port.device} port {port.port} "
                                        f"(PF {pf.address})", (pf.address, int(name) - 1)))
        sriov = sysfs.pci(pf.address) / "sriov"
        for name in sysfs.listdir(sriov):
            if not name.isdigit():
                continue
            for kind in ("port", "node"):
                g = normalize(sysfs.read(sriov / name / kind))
                if g:
                    seen.setdefault(g, (f"VF {name} of PF {pf.address} (its {kind} GUID)",
                                        (pf.address, int(name))))
    for unset in (ALL_F, ZERO):
        seen.pop(unset, None)
    return seen


# -- program / restore ------------------------------------------------------
def program(db, sysfs: Sysfs, inventory: HostInventory, vf: VirtualFunction, mac: str,
            vm_id: int, ip_command: str = "ip", log: Logger = _nolog,
            now: Optional[float] = None, space: Optional[int] = None) -> Optional[GuidRecord]:
    """Give ``vf`` the GUIDs of NIC ``mac`` leased by network ``space`` (see
    from_mac); record what it had. Call inside a pool transaction.

    Refuses (DriverError, nothing written) when another VF, another VM's
    record or a PF of this host already carries the port or node GUID.
    Returns None when the VF has no InfiniBand identity to program.
    """
    ensure_schema(db)
    pf = inventory.pf(vf.pf)
    backend = backend_for(sysfs, pf, vf.index, ip_command) if pf else None
    if backend is None:
        log("INFO", f"VF {vf.address} has no InfiniBand device on its PF: no GUID to set")
        return None
    port, node = from_mac(mac, space)
    clash = db.execute("SELECT vf, vm_id, mac FROM guid WHERE port_guid = ? AND vf != ?",
                       (port, vf.address)).fetchone()
    if clash:
        raise DriverError(
            f"port GUID {port} of NIC {mac} is already set on VF {clash[0]} for VM {clash[1]} "
            f"(NIC {clash[2]}): refusing a GUID collision (two NICs with one MAC?)")
    previous = _record(db, vf.address)
    current = backend.read()
    live = live_guids(sysfs, inventory)
    for g in (port, node) if backend.name != "mlx4-sysfs" else (port,):
        holder = live.get(g)
        if holder and holder[1] != (vf.pf, vf.index):
            raise DriverError(f"GUID {g} of NIC {mac} is already carried by {holder[0]} on this "
                              f"host: refusing a GUID collision")
    if previous is not None:  # the VF was ours already: keep the true originals
        orig = GuidState(previous.orig_port, previous.orig_node, previous.orig_policy)
    elif mac_derived(current.port):  # another VM's GUID nothing recorded: never give it back
        log("WARN", f"VF {vf.address} carries port GUID {current.port} of some NIC and no record: "
                    f"it gets all-F/Down when released, not that GUID")
        orig = GuidState(None, None, None)
    else:
        orig = current
    rec = GuidRecord(vf.address, vf.pf, vm_id, mac, port, node if backend.name != "mlx4-sysfs" else "",
                     orig.port, orig.node, orig.policy, backend.name, now or time.time())
    db.execute("INSERT OR REPLACE INTO guid VALUES (?,?,?,?,?,?,?,?,?,?,?)",
               (rec.vf, rec.pf, rec.vm_id, rec.mac, rec.port_guid, rec.node_guid, rec.orig_port,
                rec.orig_node, rec.orig_policy, rec.backend, rec.since))
    _make_durable(db)
    try:
        backend.write(port, node, VM_POLICY)
        failpoints.reached("guid", "written")
        after = backend.read()
        if after.port is not None and after.port != port:
            raise DriverError(f"VF {vf.address}: wrote port GUID {port} but it reads back {after.port}")
    except BaseException:
        try:
            backend.write(orig.port or ALL_F, orig.node, orig.policy or RELEASED_POLICY)
        except DriverError:
            pass
        db.execute("DELETE FROM guid WHERE vf = ?", (vf.address,))
        _make_durable(db)
        raise
    log("INFO", f"VF {vf.address}: port GUID {port}, node GUID {node} (NIC {mac}, {backend.name})")
    return rec


def _make_durable(db) -> None:
    """Commit what the pool's transaction holds so far and go on in a new one
    (the caller keeps the pool's lock, so no other action sees a gap)."""
    if db.in_transaction:
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")


def _restore_one(sysfs: Sysfs, inventory: HostInventory, rec: GuidRecord, ip_command: str,
                 log: Logger) -> bool:
    """False when the VF may still carry the VM's GUID (its record must stay)."""
    pf = inventory.pf(rec.pf)
    vf = inventory.vf(rec.vf)
    backend = backend_for(sysfs, pf, vf.index, ip_command) if pf and vf else None
    if backend is None:
        log("WARN", f"VF {rec.vf} is gone from this host: cannot restore its GUID {rec.port_guid}")
        return True
    port = rec.orig_port if rec.orig_port not in (None, rec.port_guid) else ALL_F
    node = rec.orig_node if rec.orig_node not in (None, rec.node_guid) else ALL_F
    policy = rec.orig_policy if rec.orig_policy in POLICIES else RELEASED_POLICY
    if backend.name == "mlx4-sysfs" and rec.orig_port is None:
        port = ZERO  # mlx4: 0 lets the driver/SM choose again
    try:
        backend.write(port, node, policy)
    except DriverError as exc:
        log("WARN", f"VF {rec.vf}: could not restore its GUID: {exc} (kept on record, "
                    f"retried by the next GUID change or kvm-sriov reconcile)")
        return False
    log("INFO", f"VF {rec.vf}: GUID {rec.port_guid} removed (port {port}, policy {policy})")
    return True


def restore(db, sysfs: Sysfs, inventory: HostInventory, vfs: Iterable[str],
            ip_command: str = "ip", log: Logger = _nolog) -> list[GuidRecord]:
    """Give these VFs back the GUIDs they had before us and forget the records."""
    ensure_schema(db)
    done = []
    for vf in vfs:
        rec = _record(db, vf)
        if rec is None:
            continue
        if _restore_one(sysfs, inventory, rec, ip_command, log):
            db.execute("DELETE FROM guid WHERE vf = ?", (vf,))
            done.append(rec)
    return done


def restore_vm(db, sysfs: Sysfs, inventory: HostInventory, vm_id: int,
               ip_command: str = "ip", log: Logger = _nolog) -> list[GuidRecord]:
    return restore(db, sysfs, inventory, [r.vf for r in records(db, vm_id)], ip_command, log)


def orphans(db) -> list[GuidRecord]:
    """Records whose VF the pool no longer gives to the same VM (freed by reconcile, crash...)."""
    ensure_schema(db)
    held = {row[0]: row[1] for row in db.execute("SELECT vf, vm_id FROM assignment")}
    return [r for r in records(db) if held.get(r.vf) != r.vm_id]


def restore_orphans(db, sysfs: Sysfs, inventory: HostInventory, ip_command: str = "ip",
                    log: Logger = _nolog) -> list[GuidRecord]:
    return restore(db, sysfs, inventory, [r.vf for r in orphans(db)], ip_command, log)


def strays(db, sysfs: Sysfs, inventory: HostInventory) -> list[tuple[VirtualFunction, str]]:
    """VFs no VM holds and no record covers that carry a MAC-derived GUID:
    a VM's GUID left behind (a process killed by an older version)."""
    ensure_schema(db)
    held = {row[0] for row in db.execute("SELECT vf FROM assignment")} | {r.vf for r in records(db)}
    at = {(vf.pf, vf.index): vf for vf in inventory.vfs}
    found = {}
    for g, (_, where) in live_guids(sysfs, inventory).items():
        vf = at.get(where) if where else None
        if vf is not None and vf.address not in held and mac_derived(g):
            found.setdefault(vf.address, (vf, g))
    return sorted(found.values(), key=lambda f: f[0].address)


def reset_strays(db, sysfs: Sysfs, inventory: HostInventory, ip_command: str = "ip",
                 log: Logger = _nolog) -> list[tuple[VirtualFunction, str]]:
    """All-F GUIDs and policy Down for every stray (see strays())."""
    done = []
    for vf, g in strays(db, sysfs, inventory):
        pf = inventory.pf(vf.pf)
        backend = backend_for(sysfs, pf, vf.index, ip_command) if pf else None
        if backend is None:
            continue
        try:
            backend.write(ZERO if backend.name == "mlx4-sysfs" else ALL_F,
                          None if backend.name == "mlx4-sysfs" else ALL_F, RELEASED_POLICY)
        except DriverError as exc:
            log("WARN", f"VF {vf.address}: could not reset stray GUID {g}: {exc}")
            continue
        log("INFO", f"VF {vf.address}: stray GUID {g} reset (no VM holds it)")
        done.append((vf, g))
    return done
