"""VM groups in the scheduler input, as the placer needs them: which VMs
must share a host, which must not, and where the group's VMs are.

OpenNebula 7.4 puts every VM of a pending VM's group in VM_POOL (running ones
too) and the groups in VM_GROUP_POOL. Its rank placer turns the rules into
requirements (CURRENT_VMS, ID); the placer keeps them in force after it
drops VMs whose host ran out of VFs, and says which rule keeps a VM waiting.

- A role with POLICY = ANTI_AFFINED: no two of its VMs on one host.
- A rule ANTI_AFFINED = "a, b": no VM of a on a host with a VM of b.
- A role with POLICY = AFFINED, and a rule AFFINED = "a, b" (overlapping sets
  merged, as rank does): all those VMs on a host where one of them is.
- HOST_AFFINED / HOST_ANTI_AFFINED of a role: the hosts its VMs may use.
Everything read here comes from oned; names only ever appear through shown().
"""

from __future__ import annotations

from typing import NamedTuple, Optional
from xml.etree import ElementTree as ET

from ..opennebula import shown

ACTIVE = "3"   # VM STATE ACTIVE: it holds a host (rank's is_active)


def _int(text) -> Optional[int]:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _id_set(text) -> frozenset:
    return frozenset(i for i in (_int(p) for p in str(text or "").split(",")) if i is not None)


class Apart(NamedTuple):
    label: str                      # "role ranks of VM group 3"
    sides: tuple[frozenset, ...]    # VMs per role
    intra: bool                     # one role: its VMs apart from each other

    def conflicts(self, vm: int) -> frozenset:
        if self.intra:
            return self.sides[0] - {vm}
        return frozenset().union(*(s for s in self.sides if vm not in s))


class Together(NamedTuple):
    label: str
    vms: frozenset


class Groups:
    """The VM groups of one scheduler input, and where their VMs are (those
    placed in this window added with place())."""

    def __init__(self, root: ET.Element):
        self.where: dict[int, int] = {}
        for h in root.iterfind("HOST_POOL/HOST"):
            hid = _int(h.findtext("ID"))
            for v in h.iterfind("VMS/ID"):
                if hid is not None and _int(v.text) is not None:
                    self.where[_int(v.text)] = hid
        for vm in root.iterfind("VM_POOL/VM"):
            history = vm.findall("HISTORY_RECORDS/HISTORY")
            vid, hid = _int(vm.findtext("ID")), _int(history[-1].findtext("HID")) if history else None
            if (vm.findtext("STATE") or "").strip() == ACTIVE and vid is not None and hid is not None and hid >= 0:
                self.where[vid] = hid
        self.apart: dict[int, list[Apart]] = {}
        self.together: dict[int, Together] = {}
        self.allowed: dict[int, tuple[frozenset, frozenset]] = {}   # vm -> (HOST_AFFINED, HOST_ANTI_AFFINED)
        for g in root.iterfind("VM_GROUP_POOL/VM_GROUP"):
            self._read(g)

    def _read(self, g: ET.Element) -> None:
        gid = _int(g.findtext("ID"))
        roles: dict[str, frozenset] = {}
        sets: list[tuple[str, frozenset]] = []
        for r in g.iterfind("ROLES/ROLE"):
            name = (r.findtext("NAME") or "").strip()
            vms = _id_set(r.findtext("VMS"))
            roles[name] = vms
            label = f"role {shown(name)} of VM group {gid}"
            policy = (r.findtext("POLICY") or "").strip().upper()
            if policy == "ANTI_AFFINED" and len(vms) > 1:
                for vm in vms:
                    self.apart.setdefault(vm, []).append(Apart(label, (vms,), True))
            elif policy == "AFFINED" and vms:   # one VM too: the role's next VMs join it
                sets.append((label, vms))
            rules = (_id_set(r.findtext("HOST_AFFINED")), _id_set(r.findtext("HOST_ANTI_AFFINED")))
            if rules[0] or rules[1]:
                for vm in vms:
                    self.allowed[vm] = rules
        for kind in ("AFFINED", "ANTI_AFFINED"):
            for rule in g.iterfind(f"TEMPLATE/{kind}"):
                names = [n.strip() for n in (rule.text or "").split(",") if n.strip() in roles]
                if len(names) < 2:
                    continue
                label = f"rule {shown(', '.join(names))} of VM group {gid}"
                if kind == "AFFINED":
                    sets.append((label, frozenset().union(*(roles[n] for n in names))))
                else:
                    apart = Apart(label, tuple(roles[n] for n in names), False)
                    for vm in frozenset().union(*apart.sides):
                        self.apart.setdefault(vm, []).append(apart)
        merged: list[tuple[str, frozenset]] = []
        for label, vms in sets:      # overlapping sets are one set
            for other in [m for m in merged if m[1] & vms]:
                merged.remove(other)
                label, vms = other[0], other[1] | vms
            merged.append((label, vms))
        for label, vms in merged:
            for vm in vms:
                self.together[vm] = Together(label, vms)

    def place(self, vm: int, hid: int) -> None:
        self.where[vm] = hid

    def host_allowed(self, vm: int, hid: int) -> bool:
        affined, anti = self.allowed.get(vm, (frozenset(), frozenset()))
        return (not affined or hid in affined) and hid not in anti

    def apart_problem(self, vm: int, hid: int) -> Optional[Apart]:
        """The rule a VM breaks on host hid (a VM it must avoid is there)."""
        for rule in self.apart.get(vm, ()):
            if any(self.where.get(other) == hid for other in rule.conflicts(vm)):
                return rule
        return None

    def together_hosts(self, vm: int) -> tuple[Optional[Together], frozenset]:
        """The VM's affinity set and the hosts its other VMs are on (empty: none placed)."""
        rule = self.together.get(vm)
        if rule is None:
            return None, frozenset()
        return rule, frozenset(self.where[o] for o in rule.vms if o != vm and o in self.where)

    def in_group(self, vm: int) -> bool:
        return vm in self.apart or vm in self.together or vm in self.allowed
