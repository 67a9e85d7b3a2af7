"""OpenNebula's kvm scripts as they act on libvirt, for rung 1 only: the
actions there run in-process against libvirt's test driver, which lives in
this process and so no real script can reach. Each stand-in does what the
real script does to libvirt and answers as it does (exit code, stdout);
rung 2 (test_actions_libvirtd.py) runs the real scripts from OpenNebula."""

from __future__ import annotations

import sys
from pathlib import Path

import libvirt

from kvm_sriov.actions import checkpoint, delegate, lifecycle


class StockOnTestDriver:
    def __init__(self, conn: libvirt.virConnect):
        self.conn = conn
        self.calls: list[tuple] = []  # (action, argv, stdin bytes)
        self.codes: dict[str, int] = {}  # action -> exit code to answer with, instead of acting

    def install(self, monkeypatch) -> "StockOnTestDriver":
        for module in (delegate, lifecycle, checkpoint):
            monkeypatch.setattr(module, "run_stock", self)
        return self

    def _lookup(self, deploy_id: str):
        for find in (self.conn.lookupByUUIDString, self.conn.lookupByName):
            try:
                return find(deploy_id)
            except libvirt.libvirtError:
                pass
        return None

    def __call__(self, remotes, sent, stdin=None, capture=False) -> delegate.StockResult:
        data = sent.raw if stdin is None else stdin
        self.calls.append((sent.action, list(sent.argv), data))
        if sent.action in self.codes:
            return delegate.StockResult(self.codes[sent.action], "")
        out = ""
        if sent.action == "deploy":
            dep = Path(sent.argv[0])  # `mkdir -p; cat > $DEP_FILE`
            dep.parent.mkdir(parents=True, exist_ok=True)
            dep.write_bytes(data or b"")
            try:
                dom = self.conn.createXML(dep.read_text(), 0)
            except libvirt.libvirtError:
                print(f"ERROR: deploy: Could not create domain from {dep}", file=sys.stderr)
                return delegate.StockResult(255, "")
            out = dom.UUIDString() + "\n"
        elif sent.action == "save":  # the real one: mv an old checkpoint aside, virsh save
            dom = self._lookup(sent.argv[0])
            try:
                dom.save(sent.argv[1])
            except (AttributeError, libvirt.libvirtError):
                print(f"ERROR: save: Could not save {sent.argv[0]} to {sent.argv[1]}", file=sys.stderr)
                return delegate.StockResult(1, "")
        elif sent.action == "restore":  # virsh restore, then rm the checkpoint
            try:
                self.conn.restore(sent.argv[0])
            except libvirt.libvirtError:
                print(f"ERROR: restore: Could not restore from {sent.argv[0]}", file=sys.stderr)
                return delegate.StockResult(1, "")
            Path(sent.argv[0]).unlink()
        elif sent.action in ("shutdown", "cancel"):
            dom = self._lookup(sent.argv[0])
            if dom is not None and dom.isActive():  # an unknown domain: exit 0, as the real ones
                dom.destroy()  # the test driver has no guest to power off by ACPI
        if not capture:
            sys.stdout.write(out)
            out = ""
        return delegate.StockResult(0, out)
