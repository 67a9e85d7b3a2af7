"""Rollback as one stack: each step of an action pushes what undoes it once
it has succeeded, and a failure unwinds the stack once, last step first.

    with Undo("deploy") as undo:
        allocations = host.reserve(...)
        undo.push(host.release, allocations)
        ...

Every undo step runs even if one before it raised: each error is logged
and the action's own error is what goes on up (its cause, not the undo's,
is what OpenNebula shows). A new step adds its undo in this one place.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..opennebula import log


class Undo:
    def __init__(self, action: str):
        self.action = action
        self._steps: list[tuple[Callable, tuple]] = []

    def push(self, step: Callable, *args) -> None:
        self._steps.append((step, args))

    def commit(self) -> None:
        """Past the point of no return (the VM runs elsewhere now, say):
        what was pushed so far is no longer undone."""
        self._steps.clear()

    def unwind(self) -> Optional[Exception]:
        """Run every undo step once, last pushed first; returns the first
        error (each one is logged), None if all went well."""
        first = None
        while self._steps:
            step, args = self._steps.pop()
            try:
                step(*args)
            except Exception as exc:  # the next undo steps still run
                log("ERROR", f"{self.action}: undo step {getattr(step, '__name__', step)} failed: "
                             f"{type(exc).__name__}: {exc}")
                first = first or exc
        return first

    def __enter__(self) -> "Undo":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            self._steps.clear()  # the action is done: nothing to undo
        else:
            self.unwind()
        return False
