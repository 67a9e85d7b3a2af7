"""PKey isolation through the subnet manager: opensm's ``partitions.conf``.

Every OpenNebula virtual network marked for InfiniBand VFs (``BRIDGE =
"ib-sriov"`` or ``"ib-sriov:<pf>"``) becomes one partition whose PKey is the
network's ``VLAN_ID`` and whose members are the port GUIDs of *every* MAC
its address ranges can hand out (AR ``MAC`` + ``SIZE``), derived with the
network's ID as the driver derives them (guid.from_mac). The file is
therefore static per network: a VM joins its network's partition the moment
its VF carries its GUID, with no per-VM call to the SM, and can never be a
member of another network's PKey (its GUID is listed nowhere else).

With the network ID in the GUID, two networks leasing the same MACs
(``MAC_GLOBAL_SPACE = "NO"``) still have disjoint GUIDs. The MAC-only GUIDs
(VMs deployed before that rule, or on a network whose ID does not fit,
which new VF NICs are refused) are listed too, unless ``mac_only=False``;
they are unique on the fabric only when the MACs are: a GUID whose MAC two
address spaces can lease is ambiguous and listed in no partition. That is
counted over every network on the bridge, left-out ones and reservations'
parents on other bridges included (a VM of a left-out network still
carries its GUID). A network that cannot be read, is too large, or asks for
another membership of a PKey that an earlier network holds, or a PKey that an
earlier network of another owner holds, is left out.
Each is said, on stderr and in the file: one bad network never blocks the
partitions of the others. A reservation (``onevnet reserve``) leases its
parent's MACs under its parent's PKey: it is folded into its parent,
whatever membership its owner set.

A network of whole PFs (``BRIDGE = "ib-pf"``, docs/gpu.md) is a partition
too, but its VMs' ports carry their PFs' own (burned-in) GUIDs, not GUIDs of
MACs: its members are the port GUIDs its ``KVM_SRIOV_PF_GUIDS`` names (the
PFs that may serve it, as the host probe reports them: PORT_GUID). They name
fabric ports, so they are taken only from a network oneadmin owns (UID 0);
a GUID two networks name is in neither, as for MACs.

The Default partition (0x7fff) keeps only the members configured in
``infiniband.default_partition_members`` (the SM's own port and switches by
default), so VMs are not full members of it.

Grammar (opensm's documented partition-config format):
``Name=PKey[, ipoib][, defmember=full|limited] : member[=full|limited], ... ;``
"""

from __future__ import annotations

import bisect
import re
import subprocess
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Sequence

from ..domain.domain_xml import bridge_selector, parse
from ..vf.policy import is_whole_pf_bridge
from ..errors import DriverError, InputError
from ..files import atomic_write
from . import guid, opensm_check

MEMBERSHIPS = ("full", "limited")
DEFAULT_PKEY = 0x7FFF
MAX_GUIDS_PER_NETWORK = 65536
MAC_MASK = (1 << 48) - 1
# opensm reads the file with fgets() into 4 KiB and parses a longer line's
# rest as configuration (PARSE ERROR, then its default partition): every line
# we write stays far below that.
MAX_LINE_BYTES = 1024
NAME_CHARS = 64          # of a network's name quoted in a comment
MAX_NAMED_NETWORKS = 4   # networks sharing a PKey named in the partition's name
GONE_STATES = ("3", "4")  # LOCK_DELETE, DONE: being deleted (oned refuses it while VMs hold leases)
PF_GUIDS = "KVM_SRIOV_PF_GUIDS"   # a whole-PF network's members: its PFs' port GUIDs
MAX_PF_GUIDS = 4096


class AddressRange(NamedTuple):
    mac: str
    size: int


class Network(NamedTuple):
    id: int
    name: str
    pkey: int                          # 0x0001-0x7ffe (membership bit stripped)
    membership: str = "full"
    ranges: tuple[AddressRange, ...] = ()   # a left-out network's may be any size: never expanded
    parent: Optional[int] = None       # a reservation's parent network
    problem: str = ""                  # why it cannot be a partition (left out)
    unknown_macs: bool = False         # an address range without a usable MAC/SIZE
    counted_only: bool = False         # a reservation's parent on another bridge: no partition
    uid: Optional[int] = None          # its owner: networks of two owners never share a partition
    pf_guids: Optional[tuple[str, ...]] = None   # a whole-PF network's members (PF_GUIDS); None: MACs'

    def mac_ints(self) -> Iterable[int]:
        for ar in self.ranges:
            start = int(ar.mac.replace(":", ""), 16)
            for n in range(ar.size):
                yield (start + n) & MAC_MASK

    def macs(self) -> Iterable[str]:
        for v in self.mac_ints():
            yield ":".join(f"{(v >> s) & 0xff:02x}" for s in range(40, -8, -8))

    @property
    def space(self) -> int:
        """Its address space: the network that owns its MACs (a reservation's parent)."""
        return self.parent if self.parent is not None else self.id

    @property
    def guid_space(self) -> Optional[int]:
        """The network in its VMs' GUIDs: its own ID, a reservation's parent's
        (vm_template.TemplateNic.address_space); None: it does not fit."""
        return self.space if guid.space_fits(self.space) else None

    def port_guids(self) -> list[str]:
        """The GUIDs deploy gives its VMs today: none when its ID does not
        fit (guid.new_nic_spaces refuses such NICs); a whole-PF network's:
        its PFs' own."""
        if self.pf_guids is not None:
            return list(self.pf_guids)
        if self.guid_space is None:
            return []
        return [guid.port_guid(m, self.guid_space) for m in self.macs()]

    def mac_only_guids(self) -> list[str]:
        """MAC-only GUIDs of its MACs (VMs deployed before the network was in
        the GUID, or on a network whose ID does not fit); none on a whole-PF network."""
        if self.pf_guids is not None:
            return []
        return [guid.port_guid(m) for m in self.macs()]


def parse_pkey(text: str, where: str) -> int:
    """'0x8001', '32769', '1' -> 0x0001. Refuses 0 and the default PKey."""
    t = str(text).strip().lower()
    try:
        value = int(t, 16) if t.startswith("0x") else int(t)
    except ValueError:
        raise InputError(f"{where}: VLAN_ID {text!r} is not a PKey (e.g. 0x8001)") from None
    if not 0 <= value <= 0xFFFF:
        raise InputError(f"{where}: PKey {text!r} is out of range")
    base = value & 0x7FFF
    if base in (0, DEFAULT_PKEY):
        raise InputError(f"{where}: PKey {text!r} is reserved (0 and 0x7fff cannot isolate)")
    return base


# -- from OpenNebula's virtual networks ----------------------------------------
def networks_from_xml(text: str, bridge: str = "ib-sriov") -> list[Network]:
    """Networks from ``onevnet list -x`` / ``one.vnpool.info`` (a VNET_POOL or
    one VNET): those on ``bridge``, then the parents of their reservations
    that are on another bridge (counted_only: their MACs count when deciding
    which MAC-only GUIDs are ambiguous)."""
    return networks_from_root(parse(text, "virtual network XML"), bridge)


def networks_from_root(root, bridge: str = "ib-sriov") -> list[Network]:
    """networks_from_xml of a document parsed already (the network hook parses oned's
    pool once: a thousand networks take a quarter of a second)."""
    if root.tag not in ("VNET_POOL", "VNET"):   # not oned's answer: never an empty file for it
        raise InputError(f"virtual network XML: <{_short(root.tag)}> is neither a VNET_POOL nor a VNET")
    vnets = [root] if root.tag == "VNET" else root.findall("VNET")
    found, others = [], {}
    for v in vnets:
        vid = _number(v.findtext("ID"))
        if (v.findtext("STATE") or "").strip() in GONE_STATES:
            continue
        ours, _ = bridge_selector((v.findtext("BRIDGE") or "").strip(), bridge)
        whole = is_whole_pf_bridge((v.findtext("BRIDGE") or "").strip())
        if not (ours or whole):
            if vid is not None:
                others.setdefault(vid, v)
            continue
        if vid is None:
            raise InputError(f"a virtual network has no usable ID: {_short(v.findtext('ID') or '')!r}")
        net = _network(v, vid, v.findtext("NAME") or f"vnet{vid}", bridge, whole)
        found.append(_whole_pfs(v, net) if whole else net)
    ids = {n.id for n in found}
    for pid in sorted({n.parent for n in found if n.parent is not None} - ids):
        if pid in others:
            v = others[pid]
            ranges, unknown = _ranges(v, f"network {pid}")
            found.append(Network(pid, v.findtext("NAME") or f"vnet{pid}", 0, ranges=ranges, counted_only=True,
                                 unknown_macs=bool(unknown), problem=(
                                     f"{unknown} (a parent of a reservation on {bridge})" if unknown else "")))
    return found


def _number(text: Optional[str]) -> Optional[int]:
    """ASCII digits only (str.isdigit() takes '١٢' and '²')."""
    t = (text or "").strip()
    return int(t) if re.fullmatch(r"[0-9]{1,18}", t) else None


UNKNOWN_MACS = "its MACs are unknown, so no partition lists MAC-only GUIDs"


def _ranges(v, where: str) -> tuple[tuple[AddressRange, ...], str]:
    """Every address range, whatever its size (never expanded here), and why
    one cannot be read ("" when all can)."""
    ranges, bad = [], ""
    for ar in v.findall("AR_POOL/AR"):
        mac, size = (ar.findtext("MAC") or "").strip().lower(), _number(ar.findtext("SIZE") or "0")
        if not guid.MAC.match(mac) or size is None:
            bad = bad or (f"{where}: address range {_short(ar.findtext('AR_ID') or '?')!r} has no usable "
                          f"MAC/SIZE: {UNKNOWN_MACS}")
            continue
        ranges.append(AddressRange(mac, size))
    return tuple(ranges), bad


def _network(v, vid: int, name: str, bridge: str, whole: bool = False) -> Network:
    """The network, or one with ``problem`` set (left out) that still knows
    its address ranges: its VMs' MAC-only GUIDs are ambiguous all the same.
    whole: a network of whole PFs, whose MACs give no GUID (not read)."""
    where = f"network {vid} ({_short(name)!r})"
    parent = _number(v.findtext("PARENT_NETWORK_ID"))
    ranges, unknown = ((), "") if whole else _ranges(v, where)
    uid = _number(v.findtext("UID"))
    left = Network(vid, name, 0, ranges=ranges, parent=parent, unknown_macs=bool(unknown), uid=uid)
    vlan = (v.findtext("VLAN_ID") or v.findtext("TEMPLATE/VLAN_ID") or "").strip()
    if not vlan:
        return left._replace(problem=f"{where}: BRIDGE is {bridge} but it has no VLAN_ID (its PKey)"
                                     + (f"; {UNKNOWN_MACS}" if unknown else ""))
    membership = (v.findtext("TEMPLATE/PKEY_MEMBERSHIP") or "full").strip().lower()
    if membership not in MEMBERSHIPS:
        return left._replace(problem=f"{where}: PKEY_MEMBERSHIP must be full or limited, got "
                                     f"{_short(membership)!r}" + (f"; {UNKNOWN_MACS}" if unknown else ""))
    if unknown:
        return left._replace(problem=unknown)
    if sum(ar.size for ar in ranges) > MAX_GUIDS_PER_NETWORK:  # never expanded
        return left._replace(problem=f"{where} can lease more than {MAX_GUIDS_PER_NETWORK} MACs: "
                                     f"too many GUIDs for one partition")
    try:
        pkey = parse_pkey(vlan, where)
    except InputError as exc:
        return left._replace(problem=str(exc))
    return Network(vid, name, pkey, membership, ranges, parent, uid=uid)


def _whole_pfs(v, net: Network) -> Network:
    """A whole-PF network: its members are its PF_GUIDS, its MACs give none.
    Left out (problem) when they cannot be trusted or read."""
    net = net._replace(pf_guids=())
    if net.problem:
        return net
    where = f"network {net.id} ({_short(net.name)!r})"
    if net.uid != 0:
        return net._replace(problem=f"{where}: a network of whole PFs must be owned by oneadmin: its "
                                    f"{PF_GUIDS} names fabric ports, which no tenant may choose")
    text = (v.findtext(f"TEMPLATE/{PF_GUIDS}") or "").replace(",", " ").split()
    if len(text) > MAX_PF_GUIDS:
        return net._replace(problem=f"{where}: {PF_GUIDS} names more than {MAX_PF_GUIDS} GUIDs")
    guids = [guid.normalize(t) for t in text]
    bad = next((t for t, g in zip(text, guids) if g is None or g in (guid.ALL_F, guid.ZERO)), None)
    if bad is not None:
        return net._replace(problem=f"{where}: {PF_GUIDS}: {_short(bad)!r} is not a port GUID "
                                    f"(as the host probe reports it, PORT_GUID: e.g. 0x0002c90300a1b2c3)")
    return net._replace(pf_guids=tuple(dict.fromkeys(guids)))


# -- partitions.conf -------------------------------------------------------------
HEADER = """\
# opensm partition configuration, generated by `kvm-sriov partitions`.
# Do not edit: regenerated from OpenNebula's virtual networks. Each network
# with BRIDGE={bridge} is one partition (PKey = its VLAN_ID) whose members are
# the port GUIDs of every MAC it can lease, with the network's ID in the GUID
# (and MAC-only, for VMs deployed before that rule) (docs/infiniband.md).
"""


class LeftOut(NamedTuple):
    network: Network
    why: str

    def __str__(self) -> str:
        return f"network {self.network.id} ({_short(self.network.name)!r}) left out: {self.why}"


def plan(networks: Sequence[Network]) -> tuple[dict[int, list[Network]], set[str], list[LeftOut], dict]:
    """-> (PKey -> its networks, GUIDs no partition may list, what was left out,
    each listed network -> (its port GUIDs, its MAC-only GUIDs), derived once).

    A MAC-only GUID names no network: it is ambiguous as soon as two address
    spaces can lease its MAC. That is counted over every network given, the
    ones left out and reservations' parents on other bridges included: a VM
    of a network that is in no partition still carries its GUID."""
    by_pkey, ambiguous, left_out, own = _plan_own(networks)
    guids = {net: (own[net], net.mac_only_guids()) for nets in by_pkey.values() for net in nets}
    if any(n.unknown_macs for n in networks):   # some MACs unknown: any could be shared
        ambiguous |= {g for _, mac_only in guids.values() for g in mac_only}
        return by_pkey, ambiguous, left_out, guids
    shared = _shared_macs(networks)
    starts = [s for s, _ in shared]
    for net, (_, mac_only) in guids.items():
        for m, g in zip(net.mac_ints(), mac_only):
            i = bisect.bisect_right(starts, m) - 1
            if i >= 0 and m < shared[i][1]:
                ambiguous.add(g)
    return by_pkey, ambiguous, left_out, guids


def _shared_macs(networks: Sequence[Network]) -> list[tuple[int, int]]:
    """Sorted, disjoint [start, end) MAC intervals that two or more address
    spaces can lease (ranges as intervals: a left-out network's may be huge)."""
    by_space: dict[int, list[tuple[int, int]]] = {}
    for net in networks:
        for ar in net.ranges:
            start = int(ar.mac.replace(":", ""), 16)
            end = start + min(ar.size, MAC_MASK + 1)
            spans = by_space.setdefault(net.space, [])
            spans.append((start, min(end, MAC_MASK + 1)))
            if end > MAC_MASK + 1:        # wraps, as macs() does
                spans.append((0, end - MAC_MASK - 1))
    events: list[tuple[int, int]] = []
    for spans in by_space.values():      # merged per space: the sweep counts spaces, not ranges
        spans.sort()
        merged: list[list[int]] = []
        for start, end in spans:
            if start >= end:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            events += [(start, 1), (end, -1)]
    shared: list[tuple[int, int]] = []
    depth, since = 0, 0
    for at, step in sorted(events):      # ends (-1) sort before starts at the same MAC
        if depth >= 2 and at > since:
            if shared and shared[-1][1] == since:
                shared[-1] = (shared[-1][0], at)
            else:
                shared.append((since, at))
        depth += step
        since = at
    return shared


def _plan_own(networks: Sequence[Network]) -> tuple[dict[int, list[Network]], set[str], list[LeftOut], dict]:
    """plan() by the GUIDs deploy gives today (port_guids), and each kept network's."""
    by_id = {n.id: n for n in networks if not n.counted_only}
    left_out: list[LeftOut] = []
    kept: list[Network] = []
    for net in sorted(networks, key=lambda n: n.id):
        if net.problem:
            left_out.append(LeftOut(net, net.problem))
        elif net.counted_only:
            continue
        elif net.parent is not None and net.parent in by_id:
            continue  # a reservation: its leases are its parent's MACs, in its parent's partition
        elif sum(ar.size for ar in net.ranges) > MAX_GUIDS_PER_NETWORK:
            left_out.append(LeftOut(net, f"it can lease more than {MAX_GUIDS_PER_NETWORK} MACs"))
        else:
            kept.append(net)
    owner: dict[str, Network] = {}   # port GUID -> the first network that can lease its MAC
    ambiguous: set[str] = set()      # GUIDs two networks can lease: listed nowhere
    by_pkey: dict[int, list[Network]] = {}
    own: dict[Network, list[str]] = {}   # equal networks (a hand-made file) have equal GUIDs
    for net in kept:
        guids = own[net] = net.port_guids()
        shared = {g for g in guids if g in owner}
        for g in guids:
            owner.setdefault(g, net)
        if shared and (net.pf_guids is not None or owner[min(shared)].pf_guids is not None):
            ambiguous |= shared
            clash = owner[min(shared)]
            left_out.append(LeftOut(net, (
                f"it names {len(shared)} port GUID(s) network {clash.id} ({_short(clash.name)!r}) lists too "
                f"(e.g. {min(shared)}): a PF serves one network of whole PFs; those GUIDs are in no partition")))
            continue
        if shared:
            ambiguous |= shared
            clash = owner[min(shared)]
            left_out.append(LeftOut(net, (
                f"it can lease {len(shared)} MAC(s) network {clash.id} ({_short(clash.name)!r}) can lease too "
                f"(e.g. port GUID {min(shared)}): two VMs would share a GUID; those GUIDs are in no "
                f"partition. Give the networks disjoint MACs (oned.conf MAC_GLOBAL_SPACE = \"YES\" or "
                f"their own AR MAC)")))
            continue
        first = by_pkey.get(net.pkey, [None])[0]
        if first is not None and first.membership != net.membership:
            left_out.append(LeftOut(net, f"PKey 0x{net.pkey:04x} is {first.membership} in network "
                                         f"{first.id}, it asks for {net.membership}"))
            continue
        if first is not None and first.uid != net.uid:
            # VLAN_ID is the owner's to write (onevnet update, a template's extra): a tenant
            # naming another's key must not join that partition. The oldest network keeps it.
            left_out.append(LeftOut(net, f"PKey 0x{net.pkey:04x} is network {first.id}'s, whose owner "
                                         f"is another user: networks of different users never share a "
                                         f"partition"))
            continue
        by_pkey.setdefault(net.pkey, []).append(net)
    return by_pkey, ambiguous, sorted(left_out, key=lambda x: x.network.id), own


def render(networks: Sequence[Network], default_members: Sequence[str] = ("SELF=full", "ALL_SWITCHES=full"),
           bridge: str = "ib-sriov", left_out: Optional[list] = None, mac_only: bool = True) -> str:
    """partitions.conf; what had to be left out is appended to ``left_out``
    (when given) and said in the file. mac_only=False leaves out the MAC-only
    GUIDs of networks whose ID the GUIDs carry (once no VM deployed before
    that rule runs)."""
    by_pkey, ambiguous, skipped, guids = plan(networks)
    if left_out is not None:
        left_out.extend(skipped)
    lines = [HEADER.format(bridge=bridge),
             f"Default=0x7fff, ipoib : {', '.join(default_members)} ;", ""]
    for x in skipped:
        lines.append(f"# {_one_line(str(x))}")
    if skipped:
        lines.append("")
    for pkey, nets in sorted(by_pkey.items()):
        name = ("_".join(f"one_vnet_{n.id}" for n in nets) if len(nets) <= MAX_NAMED_NETWORKS
                else f"one_pkey_0x{pkey:04x}")
        for n in nets:  # one comment line per network and per range: any number of ranges stays short
            if n.pf_guids is not None:
                lines.append(f"# network {n.id} {_short(n.name)!r}: whole PFs, their own port GUIDs ({PF_GUIDS})")
                continue
            lines.append(f"# network {n.id} {_short(n.name)!r}" + ("" if n.ranges else ": no address ranges")
                         + ("" if n.guid_space is not None else
                            f": ID above {guid.MAX_SPACE}, VF NICs refused; MAC-only GUIDs of earlier VMs"))
            lines += [f"#   {ar.mac}+{ar.size}" for ar in n.ranges]
        members = list(dict.fromkeys(
            g for n in nets for g in guids[n][0] + (guids[n][1] if mac_only else [])
            if g not in ambiguous))
        head = f"{name}=0x{pkey | 0x8000:04x}, ipoib, defmember={nets[0].membership}"
        if not members:
            lines.append(f"{head} : ;")  # no members (yet); without the ':' opensm rejects the whole file
        else:
            lines.append(f"{head} :")
            body = [f"    0x{g.replace(':', '')}" for g in members]
            lines.append(",\n".join(body) + " ;")
        lines.append("")
    text = "\n".join(lines)
    long = next((line for line in text.split("\n") if len(line.encode()) >= MAX_LINE_BYTES), None)
    if long is not None:  # opensm would drop every partition for it
        raise InputError(f"a partitions.conf line would be {len(long.encode())} bytes "
                         f"(opensm reads < 4095, we keep < {MAX_LINE_BYTES}): {long[:80]}...")
    return text


def _one_line(text: str) -> str:
    flat = text.replace("\n", " ").replace("\r", " ").encode()
    return flat[:MAX_LINE_BYTES // 2].decode(errors="ignore")


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "..."


def write(path: Path, content: str) -> bool:
    """Atomically replace ``path`` with ``content``; False when it already had it."""
    try:
        if path.read_text() == content:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, content, mode=0o644)
    return True


def install(target: Path, text: str) -> bool:
    """opensm judges the file, then it replaces target; True when it changed.
    A rejected file leaves target as it was (DriverError, opensm's lines)."""
    verdict = opensm_check.check_text(text)
    if not verdict.accepted:
        raise DriverError(f"opensm rejects the generated file, {target} left as it was: "
                          + " | ".join(verdict.errors))
    return write(target, text)


def reload_sm(command: Sequence[str]) -> None:
    """Make opensm re-read its partitions (a heavy sweep, e.g. SIGHUP)."""
    if not command:
        raise DriverError("infiniband.sm_reload_command is empty: tell opensm to reload yourself")
    try:
        done = subprocess.run(list(command), capture_output=True, encoding="utf-8", errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        raise DriverError(f"{' '.join(command)} failed ({done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()}")


def pkey_of(networks: Sequence[Network], mac: str, space: Optional[int] = None) -> Optional[int]:
    """The PKey of the partition a VF with the GUID of ``mac`` on network ``space`` joins."""
    g = guid.port_guid(mac, space)
    return next((n.pkey for n in networks if not (n.problem or n.counted_only)
                 and (g in n.port_guids() or g in n.mac_only_guids())), None)
