"""Automatic partition keys, and what an API hook's CALL_INFO says.

A network asks for a key with ``KVM_SRIOV_PKEY = "AUTO"`` (and no VLAN_ID);
the hook gives it the lowest key of ``infiniband.pkey_range`` that no
network on the IB bridge uses, whatever its membership (a reservation uses
its parent's). The key is written into the network as VLAN_ID, so nothing
but oned holds which key is whose: a deleted network's key is free again.

CALL_INFO is built by oned from the caller's parameters without escaping
them, and re-serialised by onehem: a tenant decides much of its text. It is
only a hint of which networks to look at; what is written always comes from
oned's own view of the networks.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import NamedTuple, Optional, Sequence

from ..domain.domain_xml import bridge_selector
from ..config import pkey_range
from ..errors import InputError
from .partitions import DEFAULT_PKEY, parse_pkey

AUTO = "AUTO"
ATTRIBUTE = "KVM_SRIOV_PKEY"
ERROR_ATTRIBUTE = "KVM_SRIOV_PKEY_ERROR"
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
        ours, _ = bridge_selector((v.findtext("BRIDGE") or "").strip(), bridge)
        vlan = (v.findtext("VLAN_ID") or v.findtext("TEMPLATE/VLAN_ID") or "").strip()
        auto = (v.findtext(f"TEMPLATE/{ATTRIBUTE}") or "").strip().upper() == AUTO
        found.append(VnetKey(vid, ours, _number(v.findtext("PARENT_NETWORK_ID")), vlan, auto,
                             (v.findtext(f"TEMPLATE/{ERROR_ATTRIBUTE}") or "").strip(),
                             (v.findtext("STATE") or "").strip() == LOCK_CREATE,
                             (v.findtext("STATE") or "").strip() == "4"))
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


def choose(nets: Sequence[VnetKey], key_range: Optional[tuple[int, int]]) -> list[Choice]:
    """A key (or why none) for each network wanting one, lowest free first."""
    want = wanting(nets)
    if not want:
        return []
    if key_range is None:
        return [Choice(n.id, None, "no automatic PKey: infiniband.pkey_range is empty on the front-end")
                for n in want]
    used = used_pkeys(nets)
    low, high = key_range
    free = (k for k in range(low, high + 1) if k not in used and k != DEFAULT_PKEY)
    out = []
    for n in want:
        k = next(free, None)
        out.append(Choice(n.id, k) if k is not None else Choice(
            n.id, None, f"every PKey of infiniband.pkey_range 0x{low:04x}-0x{high:04x} is in use"))
    return out


# -- CALL_INFO ----------------------------------------------------------------------------
class Call(NamedTuple):
    method: str
    success: bool
    networks: tuple[int, ...]   # the networks it names (a hint, never trusted)


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
    from ..domain.domain_xml import parse
    if len(text) > MAX_CALL_INFO_CHARS:
        raise InputError(f"{what} is larger than {MAX_CALL_INFO_CHARS // (1024 * 1024)} MiB")
    root = parse(text, what)
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
    params: dict[tuple[str, int], str] = {}
    for p in root.findall("PARAMETERS/PARAMETER"):
        kind, pos = (p.findtext("TYPE") or "").strip(), _number(p.findtext("POSITION"))
        # the session and the ID precede the caller's template; oned's results
        # follow it, so anything the template smuggles in comes before them
        if pos is not None and (kind == "OUT" or (kind, pos) not in params):
            params[(kind, pos)] = (p.findtext("VALUE") or "").strip()
    if params.get(("OUT", 1), "true") != "true":
        success = False
    ids = []
    if method in ARGUMENT_IS_NETWORK:
        ids.append(_number(params.get(("IN", 2))))
    if method in RESULT_IS_NETWORK:
        ids.append(_number(params.get(("OUT", 2))))
    return Call(method, success, tuple(sorted({i for i in ids if i is not None})))
