"""Automatic partition keys, and what an API hook's CALL_INFO says.

A network asks for a key with ``KVM_SRIOV_PKEY = "AUTO"`` (and no VLAN_ID);
the hook gives it the lowest key of ``infiniband.pkey_range`` that no
network on the IB bridge uses, whatever its membership (a reservation uses
its parent's), within its owner's and its group's quotas of keys of the
range (``infiniband.pkeys_per_user``, ``pkeys_per_group``; oneadmin and the
oneadmin group have none), so one tenant cannot take every key. The key is
written into the network as VLAN_ID, so nothing but oned holds which key is
whose: a deleted network's key is free again.

CALL_INFO is built by oned from the caller's parameters without escaping
them, and re-serialised by onehem: a tenant decides much of its text. It is
only a hint of which networks to look at; what is written always comes from
oned's own view of the networks.
"""

from __future__ import annotations

import base64
import binascii
import re
import xml.etree.ElementTree as ET
from typing import NamedTuple, Optional, Sequence

from ..config import pkey_range
from ..domain import domain_xml
from ..domain.domain_xml import bridge_selector
from ..vf.policy import is_whole_pf_bridge
from ..errors import InputError
from .partitions import DEFAULT_PKEY, parse_pkey

AUTO = "AUTO"
ATTRIBUTE = "KVM_SRIOV_PKEY"
ERROR_ATTRIBUTE = "KVM_SRIOV_PKEY_ERROR"
# what the hook writes into a network; an update setting nothing else is its own
HOOK_ATTRIBUTES = ("VLAN_ID", ERROR_ATTRIBUTE)
ADMIN_ID = 0   # oneadmin and the oneadmin group: no quota (they may write VLAN_ID themselves)
MAX_STDIN_BYTES = 8 * 1024 * 1024     # base64 of oned's largest template, with room
MAX_CALL_INFO_CHARS = 6 * 1024 * 1024

# the one.vn.* calls (and the template instantiation, which allocates without
# one.vn.allocate) that can change what the partitions file says
NETWORK_CALLS = ("one.vn.allocate", "one.vn.delete", "one.vn.update", "one.vn.add_ar", "one.vn.rm_ar",
                 "one.vn.update_ar", "one.vn.reserve", "one.vn.free_ar", "one.vntemplate.instantiate")
# a state hook (RESOURCE = NET, STATE = READY): oned 7.4 creates a network in LOCK_CREATE, its
# address ranges reach AR_POOL only when the network driver is done, after the allocate hook
READY = "net.ready"
# and a state hook on NET/DONE: one.vn.delete returns in LOCK_DELETE, the network is gone
# (and its key free) only when its driver is done
DONE = "net.done"
STATE_HOOKS = {READY: "READY", DONE: "DONE"}
LOCK_CREATE = "2"
# calls whose new network's ID is the result (OUT parameter 2)
RESULT_IS_NETWORK = ("one.vn.allocate", "one.vn.reserve", "one.vntemplate.instantiate")
# calls whose network is the first argument after the session (IN parameter 2)
ARGUMENT_IS_NETWORK = ("one.vn.delete", "one.vn.update", "one.vn.add_ar", "one.vn.rm_ar",
                       "one.vn.update_ar", "one.vn.reserve", "one.vn.free_ar")


# -- the admin's range -------------------------------------------------------------
parse_range = pkey_range  # '0x1000-0x1fff' -> (0x1000, 0x1fff); '' -> None (no automatic keys)


# -- networks as oned has them -------------------------------------------------------
class VnetKey(NamedTuple):
    id: int
    bridge_ok: bool        # on the IB bridge
    parent: Optional[int]
    vlan: str              # VLAN_ID as written ("" if none)
    wants_auto: bool
    error: str             # KVM_SRIOV_PKEY_ERROR as written
    creating: bool = False  # LOCK_CREATE: its address ranges are not in AR_POOL yet
    done: bool = False      # DONE: deleted, its key is free
    uid: Optional[int] = None  # its owner and group: whose quota its key counts in
    gid: Optional[int] = None


def _number(text: Optional[str]) -> Optional[int]:
    t = (text or "").strip()
    return int(t) if re.fullmatch(r"[0-9]{1,18}", t) else None


def vnets(root, bridge: str) -> list[VnetKey]:
    """Every VNET of a VNET_POOL (or one VNET) with an ID."""
    found = []
    for v in ([root] if root.tag == "VNET" else root.findall("VNET")):
        vid = _number(v.findtext("ID"))
        if vid is None:
            continue
        ours = (bridge_selector((v.findtext("BRIDGE") or "").strip(), bridge)[0]
                or is_whole_pf_bridge((v.findtext("BRIDGE") or "").strip()))   # whole PFs: a partition too
        vlan = (v.findtext("VLAN_ID") or v.findtext("TEMPLATE/VLAN_ID") or "").strip()
        auto = (v.findtext(f"TEMPLATE/{ATTRIBUTE}") or "").strip().upper() == AUTO
        found.append(VnetKey(vid, ours, _number(v.findtext("PARENT_NETWORK_ID")), vlan, auto,
                             (v.findtext(f"TEMPLATE/{ERROR_ATTRIBUTE}") or "").strip(),
                             (v.findtext("STATE") or "").strip() == LOCK_CREATE,
                             (v.findtext("STATE") or "").strip() == "4",
                             _number(v.findtext("UID")), _number(v.findtext("GID"))))
    return found


def on_bridge(nets: Sequence[VnetKey]) -> list[VnetKey]:
    """Networks on the bridge, and reservations whose parent is."""
    by_id = {n.id: n for n in nets}
    return [n for n in nets if n.bridge_ok or (n.parent in by_id and by_id[n.parent].bridge_ok)]


def used_pkeys(nets: Sequence[VnetKey]) -> set[int]:
    """Keys (membership bit stripped) of every network on the bridge; a
    VLAN_ID that is not a key takes none (that network is left out of the file)."""
    used = set()
    for n in on_bridge(nets):
        if n.vlan and not n.done:
            try:
                used.add(parse_pkey(n.vlan, f"network {n.id}"))
            except InputError:
                pass
    return used


def wanting(nets: Sequence[VnetKey]) -> list[VnetKey]:
    """Networks on the bridge asking for a key and not having one (not
    reservations: they take their parent's), lowest ID first."""
    return sorted((n for n in on_bridge(nets) if n.wants_auto and not n.vlan and n.parent is None),
                  key=lambda n: n.id)


class Choice(NamedTuple):
    network: int
    pkey: Optional[int]
    error: str = ""
    over_quota: bool = False   # its owner's or group's quota, not the range, said no


def held(nets: Sequence[VnetKey], key_range: tuple[int, int]) -> tuple[dict, dict]:
    """Keys of the range each owner, and each group, holds: (uid -> keys, gid -> keys),
    counted from oned's networks (not reservations: they use their parent's)."""
    by_user: dict[Optional[int], set[int]] = {}
    by_group: dict[Optional[int], set[int]] = {}
    for n in on_bridge(nets):
        if not n.vlan or n.done or n.parent is not None:
            continue
        try:
            k = parse_pkey(n.vlan, f"network {n.id}")
        except InputError:
            continue
        if key_range[0] <= k <= key_range[1]:
            by_user.setdefault(n.uid, set()).add(k)
            by_group.setdefault(n.gid, set()).add(k)
    return by_user, by_group


def choose(nets: Sequence[VnetKey], key_range: Optional[tuple[int, int]],
           per_user: Optional[int] = None, per_group: Optional[int] = None) -> list[Choice]:
    """A key (or why none) for each network wanting one, lowest free first, as long
    as its owner holds fewer than per_user and its group fewer than per_group keys
    of the range (None: no limit)."""
    want = wanting(nets)
    if not want:
        return []
    if key_range is None:
        return [Choice(n.id, None, "no automatic PKey: infiniband.pkey_range is empty on the front-end")
                for n in want]
    used = used_pkeys(nets)
    by_user, by_group = held(nets, key_range)
    low, high = key_range
    free = (k for k in range(low, high + 1) if k not in used and k != DEFAULT_PKEY)
    out = []
    for n in want:
        user, group = by_user.setdefault(n.uid, set()), by_group.setdefault(n.gid, set())
        exempt = ADMIN_ID in (n.uid, n.gid)
        if per_user is not None and not exempt and len(user) >= per_user:
            out.append(Choice(n.id, None, f"its owner (user {n.uid}) holds {len(user)} PKeys of the range, "
                                          f"its quota (infiniband.pkeys_per_user): delete one of its IB "
                                          f"networks first", over_quota=True))
            continue
        if per_group is not None and not exempt and len(group) >= per_group:
            out.append(Choice(n.id, None, f"its group (group {n.gid}) holds {len(group)} PKeys of the range, "
                                          f"its quota (infiniband.pkeys_per_group): delete one of the "
                                          f"group's IB networks first", over_quota=True))
            continue
        k = next(free, None)
        if k is None:
            out.append(Choice(n.id, None, f"every PKey of infiniband.pkey_range 0x{low:04x}-0x{high:04x} is in use"))
            continue
        user.add(k)
        group.add(k)
        out.append(Choice(n.id, k))
    return out


# -- CALL_INFO ----------------------------------------------------------------------------
class Call(NamedTuple):
    method: str
    success: bool
    networks: tuple[int, ...]   # the networks it names (a hint, never trusted)
    # a one.vn.update merging nothing but HOOK_ATTRIBUTES (what the hook itself writes):
    # those, as written; None for any other call or template
    hook_attributes: Optional[dict[str, str]] = None


def parse_stdin(data: bytes) -> Call:
    """The hook's stdin: ``<method> <base64 CALL_INFO>`` (ARGUMENTS = "<method> $API")."""
    if len(data) > MAX_STDIN_BYTES:
        raise InputError(f"hook arguments are larger than {MAX_STDIN_BYTES // (1024 * 1024)} MiB")
    words = data.split()
    if len(words) != 2:
        raise InputError(f"hook arguments must be '<call> <base64 CALL_INFO>', got {len(words)} word(s)")
    try:
        method = words[0].decode("ascii")
    except UnicodeDecodeError:
        method = ""
    if method not in NETWORK_CALLS + tuple(STATE_HOOKS):
        raise InputError(f"hook arguments: {words[0][:40]!r} is not a network call kvm-sriov follows")
    try:
        text = base64.b64decode(words[1], validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise InputError("hook arguments: CALL_INFO is not base64 of UTF-8 text") from None
    if method in STATE_HOOKS:
        return parse_state_hook(method, text)
    return parse_call_info(method, text)


def _document(text: str, what: str, tag: str):
    """text as XML whose root is <tag>: bounded in size, DOCTYPE refused, depth bounded."""
    if len(text) > MAX_CALL_INFO_CHARS:
        raise InputError(f"{what} is larger than {MAX_CALL_INFO_CHARS // (1024 * 1024)} MiB")
    root = domain_xml.parse(text, what)
    if root.tag != tag:
        raise InputError(f"{tag} expected, got <{root.tag[:40]}>")
    return root


def parse_state_hook(method: str, text: str) -> Call:
    """$TEMPLATE of a NET state hook: the network's XML."""
    root = _document(text, "the network's XML", "VNET")
    vid = _number(root.findtext("ID"))
    return Call(method, True, () if vid is None else (vid,))


def parse_call_info(method: str, text: str) -> Call:
    root = _document(text, "CALL_INFO", "CALL_INFO")
    success = (root.findtext("RESULT") or "").strip() == "1"
    values: dict[tuple[str, int], ET.Element] = {}
    for p in root.findall("PARAMETERS/PARAMETER"):
        kind, pos = (p.findtext("TYPE") or "").strip(), _number(p.findtext("POSITION"))
        # the session and the ID precede the caller's template; oned's results
        # follow it, so anything the template smuggles in comes before them
        if pos is not None and (kind == "OUT" or (kind, pos) not in values):
            values[(kind, pos)] = p.find("VALUE")

    def value(key: tuple[str, int]) -> str:
        found = values.get(key)
        return "" if found is None else (found.text or "").strip()

    if ("OUT", 1) in values and value(("OUT", 1)) != "true":
        success = False
    ids = []
    if method in ARGUMENT_IS_NETWORK:
        ids.append(_number(value(("IN", 2))))
    if method in RESULT_IS_NETWORK:
        ids.append(_number(value(("OUT", 2))))
    attributes = None
    template = values.get(("IN", 3))
    if method == "one.vn.update" and value(("IN", 4)) == "1" and template is not None and len(template) == 0:
        attributes = hook_attributes(template.text or "")   # a merge (1) of text without markup
    return Call(method, success, tuple(sorted({i for i in ids if i is not None})), attributes)


_ATTRIBUTE_LINE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*')


def hook_attributes(template: str) -> Optional[dict[str, str]]:
    """The attributes of a template of plain ``NAME = "value"`` lines when they are
    all the hook's own; None for anything else (a vector, a comment, XML, another
    attribute, one twice, none at all): an update that may have changed more."""
    found: dict[str, str] = {}
    for line in template.split("\n"):
        if not line.strip():
            continue
        m = _ATTRIBUTE_LINE.fullmatch(line)
        if m is None or m.group(1).upper() not in HOOK_ATTRIBUTES or m.group(1).upper() in found:
            return None
        found[m.group(1).upper()] = m.group(2)
    return found or None
