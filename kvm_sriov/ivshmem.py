"""IVShmem: one host shared-memory region per (owner, VM group), shown to
each of that group's VMs on this host as a QEMU ``ivshmem-plain`` PCI device
(libvirt ``<shmem>``), so co-resident MPI ranks can talk through memory
instead of down to the HCA and back (docs/ivshmem.md).

- The request: ``KVM_SRIOV_IVSHMEM = [ SIZE = "<MB>" ]`` in the VM template.
- The region's name comes only from what oned controls (the owner's UID and
  the VM group's ID), never from a string a user chose, so no tenant can
  name, and so join, another one's region.
- Regions and their users live in the pool's SQLite database (tables
  ``ivshmem_region``, ``ivshmem_user``), changed inside pool transactions.
  A region file is created only after its row is committed and removed
  before its row goes, so a crash leaves at most a row without a file,
  which reconcile settles; never a file nobody knows.
- The first HEADER_BYTES of a region are the host's: a header listing the
  region's users on this host (the guest side publishes it, see
  contextualization/ivshmem), rewritten on every join and leave.
"""

from __future__ import annotations

import os
import re
import struct
import time
from pathlib import Path
from typing import Iterable, NamedTuple, Optional
from xml.etree import ElementTree as ET

from .errors import DriverError, InputError

ATTRIBUTE = "KVM_SRIOV_IVSHMEM"
PREFIX = "kvm-sriov-ivshmem"
NAME = re.compile(rf"^{PREFIX}-u(\d+)-g(\d+)$")
# libvirt hands QEMU /dev/shm/<name>: the region must be there, whatever the config
SHM_DIR = Path("/dev/shm")
MAX_SIZE_MB = 65536            # libvirt: a power of two; more would be a typo, not a wish
METADATA_NS = "urn:kvm-sriov:ivshmem:1"
ET.register_namespace("ivshmem", METADATA_NS)

# The host's header at the start of the region (little endian); guests use
# the bytes from HEADER_BYTES on.
HEADER_BYTES = 4096
MAGIC = b"KSRIVSHM"
VERSION = 1
_HEAD = struct.Struct("<8sIIIIQII")  # magic version generation header_bytes count size uid vmgroup
MAX_USERS = (HEADER_BYTES - _HEAD.size) // 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS ivshmem_region (
    name    TEXT PRIMARY KEY,          -- kvm-sriov-ivshmem-u<uid>-g<vmgroup>, a file in /dev/shm
    uid     INTEGER NOT NULL,
    vmgroup INTEGER NOT NULL,
    size_mb INTEGER NOT NULL,
    since   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ivshmem_user (
    vm_id   INTEGER PRIMARY KEY,       -- a VM uses one region at most
    region  TEXT NOT NULL,
    domain  TEXT NOT NULL,
    state   TEXT NOT NULL,             -- reserved | attached (as VFs, pool.py)
    since   REAL NOT NULL
);
"""


class Request(NamedTuple):
    uid: int
    vmgroup: int
    size_mb: int

    @property
    def name(self) -> str:
        return f"{PREFIX}-u{self.uid}-g{self.vmgroup}"


class User(NamedTuple):
    vm_id: int
    region: str
    domain: str
    state: str
    since: float


# -- the request -----------------------------------------------------------
def _text(el: Optional[ET.Element]) -> Optional[str]:
    return None if el is None or el.text is None else el.text.strip()


def _vector(vm: ET.Element) -> Optional[ET.Element]:
    for where in ("USER_TEMPLATE", "TEMPLATE"):
        found = vm.find(f"{where}/{ATTRIBUTE}")
        if found is not None:
            return found
    return None


def size_mb(text: Optional[str]) -> int:
    if text is None or not re.fullmatch(r"[0-9]{1,6}", text):
        raise InputError(f"{ATTRIBUTE}: SIZE must be a whole number of MB, got {str(text)[:40]!r}")
    size = int(text)
    if size < 1 or size > MAX_SIZE_MB or size & (size - 1):
        raise InputError(f"{ATTRIBUTE}: SIZE {size} MB must be a power of two from 1 to {MAX_SIZE_MB} "
                         f"(libvirt and the PCI BAR need a power of two)")
    return size


def request_of(vm: Optional[ET.Element], uid: Optional[int] = None) -> Optional[Request]:
    """The VM's request from its OpenNebula VM XML (vm.xml, or the VM in an
    action's stdin), None without the attribute. uid: the owner as the
    deployment file says (wins over the VM XML's)."""
    if vm is None:
        return None
    vector = _vector(vm)
    if vector is None:
        return None
    size = size_mb(_text(vector.find("SIZE")) if len(vector) else None)
    group = _text(vm.find("TEMPLATE/VMGROUP/VMGROUP_ID"))
    if group is None or not re.fullmatch(r"[0-9]{1,10}", group):
        raise InputError(f"{ATTRIBUTE}: the VM is in no VM group; VMs share a region through "
                         f"their OpenNebula VM group (VMGROUP = [ VMGROUP_ID = ..., ROLE = ... ])")
    if uid is None:
        owner = _text(vm.find("UID"))
        if owner is None or not re.fullmatch(r"[0-9]{1,10}", owner):
            raise InputError(f"{ATTRIBUTE}: the VM XML names no owner (UID)")
        uid = int(owner)
    return Request(uid, int(group), size)


def vm_xml_beside(deployment_file: str) -> Optional[ET.Element]:
    """vm.xml, which oned's deploy writes next to the deployment file."""
    path = Path(deployment_file).parent / "vm.xml"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if ATTRIBUTE not in text:
        return None  # most VMs: no need to parse it
    from . import domain_xml
    return domain_xml.parse(text, str(path))


def vm_of_action(text: str) -> Optional[ET.Element]:
    """The VM element of an action's stdin (restore, migrate)."""
    if not text:
        return None
    from . import domain_xml
    root = domain_xml.parse(text, "action XML")
    return root if root.tag == "VM" else root.find("VM")


def deployment_uid(root: ET.Element) -> Optional[int]:
    """<metadata><one:vm><one:uid> of OpenNebula's deployment file."""
    for el in root.iter():
        if str(el.tag).endswith("}uid") and "opennebula.org" in str(el.tag):
            text = (el.text or "").strip()
            return int(text) if re.fullmatch(r"[0-9]{1,10}", text) else None
    return None


# -- the device in the domain XML -----------------------------------------
class Placement(NamedTuple):
    """Where the device sits: a root port of its own (q35: PCIe slots are
    hot-pluggable only behind one), or a free slot of the PCI bus (pc)."""
    bus: int
    slot: int
    root_port: Optional[int]  # the controller index we add, None on pc


def _pci_addresses(root: ET.Element) -> set[tuple[int, int]]:
    out = set()
    for a in root.iter("address"):
        if a.get("type") == "pci" and a.get("bus") and a.get("slot"):
            try:
                out.add((int(a.get("bus"), 0), int(a.get("slot"), 0)))
            except ValueError:
                continue
    return out


def placement_for(root: ET.Element) -> Placement:
    machine = (root.find("os/type").get("machine", "") if root.find("os/type") is not None else "")
    devices = root.find("devices")
    if "q35" in machine:
        used = [int(c.get("index", "0")) for c in devices.findall("controller") if c.get("type") == "pci"]
        index = max(used, default=0) + 1
        return Placement(index, 0, index)
    taken = {slot for bus, slot in _pci_addresses(root) if bus == 0}
    for slot in range(0x1f, 0x02, -1):
        if slot not in taken:
            return Placement(0, slot, None)
    raise InputError(f"{ATTRIBUTE}: no free PCI slot on bus 0 for the shared-memory device")


def shmem_element(name: str, size: int, where: Placement) -> ET.Element:
    shmem = ET.Element("shmem", name=name)
    ET.SubElement(shmem, "model", type="ivshmem-plain")
    ET.SubElement(shmem, "size", unit="M").text = str(size)
    ET.SubElement(shmem, "address", type="pci", domain="0x0000", bus=f"0x{where.bus:02x}",
                  slot=f"0x{where.slot:02x}", function="0x0")
    return shmem


def add_device(root: ET.Element, request: Request) -> Placement:
    """Put the region's device (and its root port on q35) into a deployment
    file, and our record of it into <metadata>."""
    where = placement_for(root)
    devices = root.find("devices")
    if where.root_port is not None:
        ET.SubElement(devices, "controller", type="pci", index=str(where.root_port), model="pcie-root-port")
    devices.append(shmem_element(request.name, request.size_mb, where))
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.SubElement(root, "metadata")
    metadata.append(record_element(request, where))
    return where


def record_element(request: Request, where: Placement, namespaced: bool = True) -> ET.Element:
    ns = f"{{{METADATA_NS}}}" if namespaced else ""
    return ET.Element(f"{ns}ivshmem", region=request.name, uid=str(request.uid),
                      vmgroup=str(request.vmgroup), size_mb=str(request.size_mb),
                      bus=str(where.bus), slot=str(where.slot))


class Record(NamedTuple):
    request: Request
    where: Placement


def recorded(root: ET.Element) -> Optional[Record]:
    """Our record in a domain's (or saved image's) metadata, None if none."""
    el = root.find(f"metadata/{{{METADATA_NS}}}ivshmem")
    if el is None:
        return None
    try:
        request = Request(int(el.get("uid")), int(el.get("vmgroup")), size_mb(el.get("size_mb")))
        where = Placement(int(el.get("bus")), int(el.get("slot")), None)
    except (TypeError, ValueError):
        raise InputError("the domain's ivshmem record is damaged") from None
    if el.get("region") != request.name:
        raise InputError("the domain's ivshmem record names another region than its owner's group")
    return Record(request, where)


def live_regions(root: ET.Element) -> list[str]:
    """Names of our regions a domain XML has devices for."""
    return [s.get("name") for s in root.findall("devices/shmem") if NAME.match(s.get("name") or "")]


# -- region files ------------------------------------------------------------
def region_path(name: str, shm_dir: Path = SHM_DIR) -> Path:
    if not NAME.match(name):
        raise InputError(f"{name!r} is not a kvm-sriov shared-memory region")
    return shm_dir / name


def _open_region(name: str, shm_dir: Path, create: bool) -> int:
    """/dev/shm is writable by everyone: never follow a link, never use a
    file someone else made (it could be read by them)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    path = region_path(name, shm_dir)
    try:
        fd = os.open(path, flags, 0o660)
    except OSError as exc:
        raise DriverError(f"shared-memory region {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o002 or not (st.st_mode & 0o170000 == 0o100000):
        os.close(fd)
        raise DriverError(f"shared-memory region {path} exists but was not made by this driver "
                          f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}); remove it")
    return fd


def write_header(name: str, size: int, users: Iterable[int], shm_dir: Path = SHM_DIR,
                 create: bool = False) -> None:
    """(Re)write the host's header; create: a new region, sized."""
    uid, group = (int(x) for x in NAME.match(name).groups())
    ids = sorted(set(users))[:MAX_USERS]
    fd = _open_region(name, shm_dir, create)
    try:
        if create:  # QEMU runs as the driver's user (oneadmin) or its group: nobody else
            os.fchmod(fd, 0o660)
            os.ftruncate(fd, size * 1024 * 1024)
        old = os.pread(fd, _HEAD.size, 0)
        gen = _HEAD.unpack(old)[2] if len(old) == _HEAD.size and old[:8] == MAGIC else 0
        gen += 1 + (gen & 1)  # odd while being written: a reader retries
        body = struct.pack(f"<{len(ids)}I", *ids).ljust(HEADER_BYTES - _HEAD.size, b"\0")
        os.pwrite(fd, _HEAD.pack(MAGIC, VERSION, gen, HEADER_BYTES, len(ids), size << 20, uid, group), 0)
        os.pwrite(fd, body, _HEAD.size)
        os.pwrite(fd, struct.pack("<I", gen + 1), 12)
    finally:
        os.close(fd)


def read_header(data: bytes) -> dict:
    """The header as a dict (the tests and the guest side read it this way)."""
    magic, version, gen, hbytes, count, size, uid, group = _HEAD.unpack(data[:_HEAD.size])
    if magic != MAGIC:
        raise ValueError("no kvm-sriov ivshmem header")
    users = list(struct.unpack(f"<{count}I", data[_HEAD.size:_HEAD.size + 4 * count]))
    return {"version": version, "generation": gen, "header_bytes": hbytes, "size": size,
            "uid": uid, "vmgroup": group, "vms": users}


def remove_file(name: str, shm_dir: Path = SHM_DIR) -> None:
    region_path(name, shm_dir).unlink(missing_ok=True)


# -- the table (call inside a pool transaction: txn.db) -----------------------
def ensure_schema(db) -> None:
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def users(db, region: Optional[str] = None) -> list[User]:
    ensure_schema(db)
    sql, args = "SELECT vm_id, region, domain, state, since FROM ivshmem_user", ()
    if region is not None:
        sql, args = sql + " WHERE region = ?", (region,)
    return [User(*r) for r in db.execute(sql + " ORDER BY vm_id", args)]


def user_of(db, vm_id: int) -> Optional[User]:
    ensure_schema(db)
    row = db.execute("SELECT vm_id, region, domain, state, since FROM ivshmem_user WHERE vm_id = ?",
                     (vm_id,)).fetchone()
    return User(*row) if row else None


def regions(db) -> dict[str, int]:
    """name -> size in MB."""
    ensure_schema(db)
    return dict(db.execute("SELECT name, size_mb FROM ivshmem_region ORDER BY name"))


def add_user(db, request: Request, vm_id: int, domain: str, now: Optional[float] = None) -> bool:
    """Record the VM as a user of its group's region (reserved); True when
    the region is new here (its file is to be made once this commits)."""
    ensure_schema(db)
    now = time.time() if now is None else now
    row = db.execute("SELECT size_mb FROM ivshmem_region WHERE name = ?", (request.name,)).fetchone()
    if row is not None and row[0] != request.size_mb:
        raise InputError(f"{ATTRIBUTE}: SIZE {request.size_mb} MB, but VM group {request.vmgroup}'s "
                         f"region on this host has {row[0]} MB; all VMs of a group must ask the same")
    held = user_of(db, vm_id)
    if held is not None and held.region != request.name:
        raise DriverError(f"VM {vm_id} already uses shared-memory region {held.region}")
    if row is None:
        db.execute("INSERT INTO ivshmem_region VALUES (?,?,?,?,?)",
                   (request.name, request.uid, request.vmgroup, request.size_mb, now))
    db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
               (vm_id, request.name, domain, "reserved", now))
    return row is None


def set_attached(db, vm_id: int, now: Optional[float] = None) -> None:
    ensure_schema(db)
    db.execute("UPDATE ivshmem_user SET state = 'attached', since = ? WHERE vm_id = ?",
               (time.time() if now is None else now, vm_id))


def drop_user(db, vm_id: int, shm_dir: Path = SHM_DIR) -> Optional[str]:
    """The VM leaves its region; the region goes with its last user (file
    first, row second: a crash in between leaves a row reconcile removes).
    Returns the region's name if it was removed."""
    held = user_of(db, vm_id)
    if held is None:
        return None
    db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (vm_id,))
    return _settle(db, held.region, shm_dir)


def _settle(db, name: str, shm_dir: Path) -> Optional[str]:
    """After a user left: remove an empty region, else refresh its header."""
    left = [u.vm_id for u in users(db, name)]
    size = regions(db).get(name)
    if left:
        if size is not None:
            try:
                write_header(name, size, left, shm_dir)
            except DriverError:
                pass  # a region file someone removed: reconcile says so
        return None
    remove_file(name, shm_dir)
    db.execute("DELETE FROM ivshmem_region WHERE name = ?", (name,))
    return name


def publish(db, name: str, shm_dir: Path = SHM_DIR, create: bool = False) -> None:
    """Write the region's header from the table (create: make the file)."""
    size = regions(db)[name]
    write_header(name, size, [u.vm_id for u in users(db, name)], shm_dir, create)


# -- reconcile -------------------------------------------------------------
class Change(NamedTuple):
    kind: str     # drop | attach | adopt | remove-region
    vm_id: int
    region: str
    why: str

    def __str__(self) -> str:
        return f"ivshmem {self.kind:13} {self.region} (VM {self.vm_id}): {self.why}"


def plan(db, live: dict[str, tuple[int, list[str]]], grace: float, now: float,
         busy: frozenset = frozenset(), abandoned: frozenset = frozenset()) -> list[Change]:
    """live: running domain name -> (vm id, our regions it has a device for)."""
    changes = []
    known = users(db)
    by_vm = {u.vm_id: u for u in known}
    for u in known:
        if u.vm_id in busy:
            continue
        age = now - u.since + (grace + 1 if u.vm_id in abandoned else 0)
        running = live.get(u.domain)
        if running is not None and u.region in running[1]:
            if u.state != "attached":
                changes.append(Change("attach", u.vm_id, u.region, "its domain has the device"))
        elif running is None and (u.state == "attached" or age > grace):
            changes.append(Change("drop", u.vm_id, u.region, f"domain {u.domain} not running"))
        elif running is not None and age > grace:
            changes.append(Change("drop", u.vm_id, u.region, f"domain {u.domain} runs without it"))
    for domain, (vm_id, names) in sorted(live.items()):
        for name in names:
            if vm_id not in busy and (vm_id not in by_vm or by_vm[vm_id].region != name):
                changes.append(Change("adopt", vm_id, name, f"running domain {domain} uses it"))
    dropped = {c.vm_id for c in changes if c.kind == "drop"}
    adopted = {c.region for c in changes if c.kind == "adopt"}
    in_use = {u.region for u in known if u.vm_id not in dropped} | adopted
    for name in regions(db):
        if name not in in_use:
            changes.append(Change("remove-region", -1, name, "no VM uses it"))
    return changes


def apply(db, changes: Iterable[Change], live: dict[str, tuple[int, list[str]]], now: float,
          shm_dir: Path = SHM_DIR, log=None) -> None:
    domains = {vm_id: d for d, (vm_id, _) in live.items()}
    touched = set()
    for c in changes:
        if c.kind == "attach":
            set_attached(db, c.vm_id, now)
        elif c.kind == "drop":
            db.execute("DELETE FROM ivshmem_user WHERE vm_id = ?", (c.vm_id,))
            touched.add(c.region)
        elif c.kind == "adopt":
            uid, group = (int(x) for x in NAME.match(c.region).groups())
            if c.region not in regions(db):
                path = region_path(c.region, shm_dir)
                size = path.stat().st_size >> 20 if path.exists() else 0
                db.execute("INSERT INTO ivshmem_region VALUES (?,?,?,?,?)", (c.region, uid, group, size, now))
                if not size and log:
                    log("WARN", f"shared-memory region {path} of running VM {c.vm_id} is gone from "
                                f"/dev/shm; VMs joining it now would not share memory with it")
            db.execute("INSERT OR REPLACE INTO ivshmem_user VALUES (?,?,?,?,?)",
                       (c.vm_id, c.region, domains.get(c.vm_id, f"one-{c.vm_id}"), "attached", now))
            touched.add(c.region)
        elif c.kind == "remove-region":
            remove_file(c.region, shm_dir)
            db.execute("DELETE FROM ivshmem_region WHERE name = ?", (c.region,))
    for name in touched:
        if name in regions(db) and users(db, name):
            try:
                publish(db, name, shm_dir)
            except DriverError:
                pass
