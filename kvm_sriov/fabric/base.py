"""What every partition manager takes and gives: the partitions (opensm's
partitions.conf grammar, ``parse``), one report per place that enforces
them, what each place enforces now, and the interface (``Manager``)."""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from ..errors import InputError

MEMBERSHIPS = ("full", "limited", "both")
KEYWORDS = ("ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF")
DEFAULT_PKEY = 0x7FFF
MAX_MESSAGE = 400
MAX_PARTITIONS = 65536


class Member(NamedTuple):
    guid: str          # 16 lowercase hex digits, or one of KEYWORDS
    membership: str    # full | limited | both


class Partition(NamedTuple):
    name: str
    pkey: int                      # 0x0001-0x7fff, the membership bit stripped
    membership: str                # its default membership (opensm's defmember)
    ipoib: bool
    members: tuple[Member, ...]

    def guids(self) -> dict[str, str]:
        """GUID -> membership (keywords left out: only opensm knows them)."""
        return {m.guid: m.membership for m in self.members if m.guid not in KEYWORDS}


class Report(NamedTuple):
    """What one place (an SM node) did with the partitions."""
    where: str      # "" for the one SM node of a configuration without fabric.sm_nodes
    ok: bool
    message: str    # one line


class Reading(NamedTuple):
    """What one place enforces now (None and why: it could not be read)."""
    where: str
    partitions: Optional[list[Partition]]
    error: str = ""


class Manager:
    """The interface every backend gives."""
    name = ""
    fix = ""   # doctor's fix when enforcing failed
    own_default = False   # True: the place keeps its own Default partition (0x7fff), kvm-sriov's is not sent

    def enforce(self, text: str, only: Optional[set[str]] = None) -> list[Report]:
        """Each place (only those whose Report.where is in ``only``, when given) made to
        enforce ``text``: one report per place it went to."""
        raise NotImplementedError

    def missing(self) -> str:
        """What this backend lacks to read back what it enforces and to enforce it (one line:
        what to install or configure); "" when nothing. Nothing is contacted."""
        return ""

    def enforced(self) -> list[Reading]:
        raise NotImplementedError

    def made(self) -> Optional[set[int]]:
        """The PKeys kvm-sriov made where others make PKeys too (UFM); None: every PKey the
        place enforces is kvm-sriov's (opensm's partitions file). DriverError when that
        record cannot be read."""
        return None


def managed(made: Optional[set[int]], pkey: int) -> bool:
    """The one rule of what kvm-sriov may change at a place: a PKey it made, with every GUID
    member of it. ``made`` None (opensm): every PKey there, since the partitions file is the
    driver's own, rendered whole from oned's networks; else (UFM) only the PKeys recorded
    as made (Manager.made). No member of any other PKey is kvm-sriov's to remove."""
    return made is None or pkey in made


def one_line(text, limit: int = MAX_MESSAGE) -> str:
    return " ".join(str(text).split())[:limit]


# -- opensm's partitions.conf, read back -------------------------------------------------
_HEAD = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*=\s*(0x[0-9a-fA-F]{1,4}|[0-9]{1,5})\s*((?:,[^:]*)?)$")
_MEMBER = re.compile(r"(0x[0-9a-fA-F]{1,16}|[A-Z_]+)(?:\s*=\s*(full|limited|both))?$")


def parse(text: str) -> list[Partition]:
    """Partitions of a partitions.conf: ``Name=PKey[, ipoib][, defmember=M] :
    member[=M], ... ;`` with opensm's keywords (ALL, SELF, ...) as members.
    Comments and blank lines are skipped; what kvm-sriov does not write
    (multicast groups, a partition without a PKey) is InputError, one line."""
    partitions, seen = [], set()
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    statements = body.split(";")
    if statements[-1].strip():
        raise InputError(f"partitions file: {one_line(statements[-1], 80)!r} has no closing ';'")
    for statement in statements[:-1]:
        if not statement.strip():
            continue
        head, colon, members = statement.partition(":")
        found = _HEAD.match(head)
        if not colon or not found:
            raise InputError(f"partitions file: {one_line(statement, 80)!r} is not Name=PKey[, flags] : members")
        name, key, flags = found.groups()
        pkey = (int(key, 16) if key.lower().startswith("0x") else int(key)) & 0x7FFF
        if pkey == 0 or pkey in seen:
            raise InputError(f"partitions file: partition {name!r}: PKey {key} is 0 or given twice")
        seen.add(pkey)
        ipoib, membership = False, "limited"   # opensm's default defmember
        for flag in (f.strip() for f in flags.split(",") if f.strip()):
            word, _, value = flag.partition("=")
            if word.strip() == "ipoib":
                ipoib = True
            elif word.strip() == "defmember" and value.strip() in MEMBERSHIPS:
                membership = value.strip()
        listed = []
        for item in (m.strip() for m in members.replace("\n", " ").split(",")):
            if not item:
                continue
            got = _MEMBER.match(item)
            if not got or (not got.group(1).startswith("0x") and got.group(1) not in KEYWORDS):
                raise InputError(f"partitions file: partition {name!r}: member {one_line(item, 40)!r} is not a "
                                 f"GUID or one of {', '.join(KEYWORDS)}")
            guid = got.group(1)
            guid = f"{int(guid, 16):016x}" if guid.startswith("0x") else guid
            listed.append(Member(guid, got.group(2) or membership))
        partitions.append(Partition(name, pkey, membership, ipoib, tuple(listed)))
        if len(partitions) > MAX_PARTITIONS:
            raise InputError(f"partitions file: more than {MAX_PARTITIONS} partitions")
    return partitions
