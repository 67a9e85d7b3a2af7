"""What the subnet manager enforces, compared with what oned's networks need
(``kvm-sriov partitions --check``). Read-only: nothing is changed anywhere.

The desired partitions are the file the network hook sends (the caller renders
it from oned: frontend/network_hook.desired); each place the partition manager
enforces them is read back through ``Manager.enforced`` (each opensm SM node's
file, UFM's PKeys and GUIDs). Both sides are compared parsed (base.parse), so
what the file format makes equivalent is no drift: order, hex case, 0x8001 vs
0x0001, whitespace, comments, partition names.

Each difference is one finding: its kind, the place, the PKey and the GUID it
is about, one line saying what it means and one saying what fixes it. Per
place and kind at most MAX_LISTED findings are listed (a place that lost a
large network would otherwise print every GUID); ``counts`` has them all, and
``repairable`` how many of them ``kvm-sriov partitions --repair`` (fabric/repair.py)
may fix there without touching what is not kvm-sriov's (base.managed).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Optional

from ..errors import DriverError, InputError
from .base import DEFAULT_PKEY, Manager, Partition, managed, one_line, parse

# How many PKeys one port's PKey table holds. ConnectX-4 and later (mlx5): the Linux
# driver computes the table size as 128 << the firmware's log size, 128 at least
# (MLX5_MIN_PKEY_TABLE_SIZE in include/linux/mlx5/device.h), and ibv_devinfo shows
# max_pkeys 128 on such cards; NVIDIA's ib-kubernetes README (Limitations) says a node may
# be associated with up to 128 PKeys. ConnectX-3 (mlx4) reports max_pkeys 128 too
# (ibv_devinfo in github.com/claudebarthels/infinity issue 5), and in SR-IOV mode
# mlx4 reports one less to the SM, keeping index 127 for itself (Linux commit
# 6634961c14d3, "mlx4: Put physical GID and P_Key table sizes in mlx4_phys_caps").
PKEY_TABLE = 128
MAX_LISTED = 100

EXTRA = "extra_member"            # a GUID in a partition its network does not list: reachable from it
MEMBERSHIP = "membership"         # full where its network says limited, or the other way round
TAKEN = "pkey_taken"              # UFM: a network's PKey is someone else's, its partition not enforced
DISAGREE = "nodes_disagree"       # SM nodes enforce different partitions (a failover changes them)
TOO_MANY = "too_many_pkeys"       # a port in more PKeys than its PKey table holds
MISSING_PKEY = "missing_pkey"     # a network's PKey is not enforced at all
MISSING_MEMBER = "missing_member"  # a GUID its network lists is not a member
STALE = "stale_pkey"              # a PKey kvm-sriov made that no network has any more
UNREADABLE = "unreadable"         # the place (or oned) could not be read: nothing known about it
KINDS = (EXTRA, MEMBERSHIP, TAKEN, DISAGREE, TOO_MANY, MISSING_PKEY, MISSING_MEMBER, STALE, UNREADABLE)

WIDE = ("ALL", "ALL_CAS")          # opensm's keywords for every port (every channel adapter)
HERE = "the SM node"               # the place name of the one SM node of a config without fabric.sm_nodes
RESYNC = "kvm-sriov network-hook --resync (sends oned's partitions to every place again)"


class Finding(NamedTuple):
    kind: str
    place: str
    pkey: Optional[int]
    guid: Optional[str]     # 16 hex digits or an opensm keyword (ALL, SELF, ...)
    message: str
    fix: str

    def as_json(self) -> dict:
        return {"kind": self.kind, "place": self.place, "pkey": None if self.pkey is None else f"0x{self.pkey:04x}",
                "guid": self.guid, "message": self.message, "fix": self.fix}

    def line(self) -> str:
        return f"{self.place}: {self.kind}: {self.message}; fix: {self.fix}"


class Place(NamedTuple):
    place: str
    error: str                # "": read
    counts: dict              # kind -> findings there (all of them, listed or not)
    repairable: int = 0       # of those, the ones kvm-sriov may repair (``repairable``)


class Result(NamedTuple):
    places: list[Place]
    findings: list[Finding]   # the most serious first; at most MAX_LISTED per place and kind

    @property
    def exit_code(self) -> int:
        """0 no drift, 1 drift, 2 a place could not be read (whatever the others show)."""
        if any(p.error for p in self.places):
            return 2
        return 1 if any(p.counts for p in self.places) else 0

    def as_json(self) -> dict:
        return {"places": [{"place": p.place, "read": not p.error, "error": p.error, "counts": p.counts}
                           for p in self.places],
                "findings": [f.as_json() for f in self.findings]}

    def lines(self) -> list[str]:
        out = [f.line() for f in self.findings]
        for p in self.places:
            for kind, n in p.counts.items():
                listed = sum(f.place == p.place and f.kind == kind for f in self.findings)
                if n > listed:
                    out.append(f"{p.place}: {kind}: {n - listed} more not listed (--json has the counts)")
        found = sum(sum(p.counts.values()) for p in self.places)
        unread = [p.place for p in self.places if p.error]
        if unread:
            others = found - len(unread)
            out.append(f"cannot check {', '.join(unread)}" + (f"; {others} other finding(s)" if others else ""))
        elif found:
            out.append(f"{found} finding(s) at {sum(bool(p.counts) for p in self.places)} of "
                       f"{len(self.places)} place(s)")
        else:
            out.append(f"no drift: {', '.join(p.place for p in self.places)} enforce(s) what oned's networks need")
        return out


def unread(place: str, why: str) -> Result:
    """A check that could not start (e.g. oned's networks could not be read)."""
    finding = Finding(UNREADABLE, place, None, None, one_line(why), "fix what the line says, then check again")
    return Result([Place(place, finding.message, {UNREADABLE: 1})], [finding])


def check(manager: Manager, desired_text: str) -> Result:
    """Each place ``manager`` enforces, against the partitions of ``desired_text`` (what
    the network hook sends)."""
    want = {p.pkey: p for p in parse(desired_text) if not (manager.own_default and p.pkey == DEFAULT_PKEY)}
    tenants: dict[str, set[int]] = {}      # GUID -> the desired PKeys listing it
    for p in want.values():
        for g in p.guids():
            tenants.setdefault(g, set()).add(p.pkey)
    readings = manager.enforced()
    try:
        made = manager.made()
        made_error = ""
    except (DriverError, InputError) as exc:
        made, made_error = None, one_line(exc)
    places, found = [], []
    read = []
    for r in readings:
        name = r.where or HERE
        error = r.error or ("" if r.partitions is not None else "nothing read")
        if not error and made_error:
            error = made_error
        if error:
            one = [Finding(UNREADABLE, name, None, None, error,
                           "make it readable (fabric.sm_read_command, infiniband.partitions_file, or UFM's "
                           "fabric.ufm_*), then check again")]
        else:
            one = _place(name, r.partitions, want, made, tenants)
            read.append((name, r.partitions))
        places.append((name, error, one))
    if len(read) > 1:
        first_name, first = read[0]
        for name, partitions in read[1:]:
            differ = _differ(first, partitions)
            if differ:
                shown = ", ".join(f"0x{k:04x}" for k in differ[:8]) + (" ..." if len(differ) > 8 else "")
                next(p for p in places if p[0] == name)[2].append(Finding(
                    DISAGREE, name, None, None,
                    f"enforces other partitions than {first_name}: {len(differ)} PKey(s) differ ({shown}); "
                    f"after a failover the fabric's partitions change",
                    RESYNC + "; fabric.sm_nodes must list every SM node"))
    result_places = []
    for name, error, one in places:
        counts = Counter(f.kind for f in one)
        fixable = sum(repairable(f, set() if made_error else made) for f in one)
        result_places.append(Place(name, error, {k: counts[k] for k in KINDS if counts[k]}, fixable))
        listed = Counter()
        for f in sorted(one, key=_order):
            listed[f.kind] += 1
            if listed[f.kind] <= MAX_LISTED:
                found.append(f)
    return Result(result_places, sorted(found, key=_order))


def repairable(f: Finding, made: Optional[set[int]]) -> bool:
    """Whether making the place enforce oned's partitions again fixes ``f`` without touching
    anything that is not kvm-sriov's (base.managed, the one rule; ``made`` as Manager.made
    gives it). A missing PKey is made (nobody has it). A place that cannot be read is sent
    the file only where the place is kvm-sriov's whole (opensm's file, as every hook run
    sends it). Neither nodes that disagree nor too many PKeys on a port are repaired as such:
    the node that differs from oned has findings of its own, and a port's PKeys are what its
    networks ask, or come with extra and stale findings of their own."""
    if f.kind == MISSING_PKEY:
        return True
    if f.kind in (TOO_MANY, DISAGREE):
        return False
    if f.pkey is None:     # unreadable
        return made is None
    return managed(made, f.pkey)


def _order(f: Finding):
    return KINDS.index(f.kind), f.place, -1 if f.pkey is None else f.pkey, f.guid or ""


def _members(p: Partition) -> dict[str, str]:
    """GUID or keyword -> membership."""
    return {m.guid: m.membership for m in p.members}


def _differ(a: list[Partition], b: list[Partition]) -> list[int]:
    left = {p.pkey: _members(p) for p in a}
    right = {p.pkey: _members(p) for p in b}
    return sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))


def _name(p: Partition) -> str:
    return f" ({p.name})" if p.name else ""


def _place(place: str, have: list[Partition], want: dict[int, Partition], made: Optional[set[int]],
           tenants: dict[str, set[int]]) -> list[Finding]:
    out = []
    enforced = {p.pkey: p for p in have}
    for key, p in sorted(enforced.items()):
        members = _members(p)
        ours = managed(made, key)
        if key in want and ours:
            wanted = _members(want[key])
            for g, m in sorted(members.items()):
                if g not in wanted:
                    also = sorted(tenants.get(g, ()))
                    out.append(Finding(
                        EXTRA, place, key, g,
                        f"{g} is a {m} member of PKey 0x{key:04x}{_name(want[key])}, which its network does not "
                        f"list" + (f" ({g} is a port of PKey {_keys(also)})" if also else "")
                        + ": it reaches that network's VMs", RESYNC))
                elif wanted[g] != m:
                    out.append(Finding(MEMBERSHIP, place, key, g,
                                       f"{g} is a {m} member of PKey 0x{key:04x}{_name(want[key])}, its network "
                                       f"says {wanted[g]}", RESYNC))
            for g in sorted(set(wanted) - set(members)):
                out.append(Finding(MISSING_MEMBER, place, key, g,
                                   f"{g} is not a member of PKey 0x{key:04x}{_name(want[key])}: a VM with that port "
                                   f"GUID cannot reach its network", RESYNC))
            continue
        if key in want:
            out.append(Finding(TAKEN, place, key, None,
                               f"PKey 0x{key:04x} is there but not kvm-sriov's: network partition "
                               f"{want[key].name} is not enforced",
                               f"give that network another VLAN_ID, or delete PKey 0x{key:04x} there if nobody "
                               f"uses it"))
        elif ours:
            out.append(Finding(STALE, place, key, None,
                               f"PKey 0x{key:04x}{_name(p)} ({len(members)} member(s)) is enforced but no network "
                               f"has it (deleted, or its VLAN_ID changed)", RESYNC))
        out += _exposed(place, key, members, ours, tenants)
    for key in sorted(set(want) - set(enforced)):
        out.append(Finding(MISSING_PKEY, place, key, None,
                           f"PKey 0x{key:04x}{_name(want[key])} ({len(want[key].members)} member(s)) is not "
                           f"enforced: its network's VMs cannot reach each other", RESYNC))
    per_port = Counter(g for p in have if p.pkey != DEFAULT_PKEY for g in p.guids())
    for g, n in sorted(per_port.items()):
        if n + 1 > PKEY_TABLE:   # + the Default partition, every port's
            out.append(Finding(TOO_MANY, place, None, g,
                               f"{g} is in {n + 1} PKeys with the Default one; a ConnectX port's PKey table holds "
                               f"{PKEY_TABLE}: the SM cannot give it them all",
                               f"take {g} out of some partitions (fewer networks for that port)"))
    return out


def _exposed(place: str, key: int, members: dict[str, str], ours: bool,
             tenants: dict[str, set[int]]) -> list[Finding]:
    """Tenants' ports in a PKey no network has (stale, or someone else's): fine while
    every member is of one network's partition, else each tenant's port there is
    reachable from outside its partition. ALL or ALL_CAS there: every port is."""
    if ours:
        whose, fix = "no network has it", RESYNC
    else:
        whose, fix = "not kvm-sriov's", f"remove it from PKey 0x{key:04x} there (the hook never changes that PKey)"
    out = [Finding(EXTRA, place, key, g, f"{g} (every port, each tenant's) is a {m} member of PKey 0x{key:04x} "
                                         f"({whose})", fix)
           for g, m in sorted(members.items()) if g in WIDE]
    common: Optional[set[int]] = None
    for g in members:
        common = set(tenants.get(g, ())) if common is None else common & tenants.get(g, set())
        if not common:
            break
    if common:   # one network's ports only
        return out
    return out + [Finding(EXTRA, place, key, g,
                          f"{g}, a port of PKey {_keys(sorted(tenants[g]))}, is a {m} member of PKey 0x{key:04x} "
                          f"({whose}) with ports of other partitions: they reach it", fix)
                  for g, m in sorted(members.items()) if g in tenants]


def _keys(keys) -> str:
    return ", ".join(f"0x{k:04x}" for k in keys)
