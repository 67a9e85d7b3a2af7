"""``kvm-sriov partitions --repair``: the subnet manager's side made to match oned's networks.

The drift is found as ``--check`` finds it (drift.check). Each place with a finding
kvm-sriov may repair (drift.repairable: base.managed is the one rule of what is
kvm-sriov's) is made to enforce the file the network hook sends, through the same
partition manager (Manager.enforce, to those places only): an opensm SM node gets the
file pushed (installed and opensm reloaded there when it differs), UFM is brought in line
PKey by PKey (missing GUIDs added, GUIDs its networks do not list removed, PKeys
kvm-sriov made that no network has removed; a PKey someone else made is never changed).
A place with no such finding is not contacted, so a repair repeated changes nothing.
Then each place is checked again: what is left is said, with its fix.
"""

from __future__ import annotations

from typing import NamedTuple

from .base import Manager, one_line
from .drift import HERE, Result, check


MAX_LINE = 2000      # what one place's change says (UFM's report is 1500 at most)


class Change(NamedTuple):
    """What was done at one place."""
    place: str
    ok: bool
    message: str      # one line: the manager's report
    before: dict      # kind -> the findings there before (repairable or not)

    def line(self) -> str:
        found = ", ".join(f"{kind} {n}" for kind, n in self.before.items())
        return f"{self.place}: {'changed' if self.ok else 'FAILED'}: {self.message} (drift there before: {found})"


class Repaired(NamedTuple):
    changes: list[Change]
    before: Result
    after: Result      # before itself when nothing was changed

    @property
    def exit_code(self) -> int:
        """As --check's, of what is left (0 only when none is), and 1 at least when a change
        failed."""
        failed = any(not c.ok for c in self.changes)
        return max(self.after.exit_code, int(failed))

    def as_json(self) -> dict:
        """--check's JSON of what is left, and what was changed."""
        return dict(self.after.as_json(), changed=[
            {"place": c.place, "ok": c.ok, "message": c.message, "before": c.before} for c in self.changes])

    def lines(self) -> list[str]:
        head = [c.line() for c in self.changes] or [
            "nothing changed: " + ("what drift there is is not kvm-sriov's to repair, or cannot be read"
                                   if self.before.exit_code else "no drift")]
        if self.after.exit_code:
            head.append("left:")
        return head + self.after.lines()


def repair(manager: Manager, desired_text: str) -> Repaired:
    """Each place ``manager`` enforces made to enforce ``desired_text`` (what the network
    hook sends) where it has drift kvm-sriov may repair; then checked again. A place that
    fails is reported and stops no other."""
    before = check(manager, desired_text)
    places = {p.place: p for p in before.places if p.repairable}
    if not places:
        return Repaired([], before, before)
    reports = manager.enforce(desired_text, only={"" if name == HERE else name for name in places})
    changes = []
    for r in reports:
        name = r.where or HERE
        changes.append(Change(name, r.ok, one_line(r.message, MAX_LINE),
                              places[name].counts if name in places else {}))
    return Repaired(changes, before, check(manager, desired_text))
