#!/usr/bin/python3
"""Port files written against the flat kvm_sriov/ layout to the subpackages.

    dev-tools/relayout.py FILE...

Rewrites ``kvm_sriov.<old>`` names and ``kvm_sriov/<old>.py`` paths anywhere
in the text, and, in Python files, ``from kvm_sriov import ...`` and the
relative imports of modules under kvm_sriov/ (files already moved to their
new place). Run it once per file: its input is the old layout. The peer's
destination side (``main``) moved to kvm_sriov.actions.peer by hand.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# old flat module -> (new package, new module name)
MOVES = {
    "sysfs": ("vf", "sysfs"), "discovery": ("vf", "discovery"), "pool": ("vf", "pool"),
    "policy": ("vf", "policy"), "numa": ("vf", "numa"), "availability": ("vf", "availability"),
    "intents": ("vf", "intents"),
    "guid": ("ib", "guid"), "partitions": ("ib", "partitions"), "opensm_check": ("ib", "opensm_check"),
    "domain_xml": ("domain", "domain_xml"), "hypervisor": ("domain", "hypervisor"),
    "hotplug": ("domain", "hotplug"), "hpc_profile": ("domain", "hpc_profile"),
    "ivshmem": ("ivshmem", "device"), "ivshmem_region": ("ivshmem", "region"),
    "ivshmem_table": ("ivshmem", "table"), "ivshmem_host": ("ivshmem", "host"),
    "action_xml": ("oned", "action_xml"), "vm_template": ("oned", "vm_template"),
    "oned_defaults": ("oned", "oned_defaults"), "oned_conf": ("oned", "oned_conf"),
    "versions": ("oned", "versions"), "monitor": ("oned", "monitor"), "probe": ("oned", "probe"),
    "placement": ("scheduler", "placement"), "placement_program": ("scheduler", "placement_program"),
    "host": ("node", "host"), "reconcile": ("node", "reconcile"), "doctor": ("node", "doctor"),
    "peer": ("node", "peer"),
}
_NAMES = "|".join(sorted(MOVES, key=len, reverse=True))
DOTTED = re.compile(r"(?<![\w.])kvm_sriov\.(%s)(?![\w])" % _NAMES)
PATH = re.compile(r"(?<![\w.])kvm_sriov/(%s)\.py\b" % _NAMES)


def new_module(dotted: str) -> str:
    """kvm_sriov.<old>[.rest] -> its new dotted name."""
    parts = dotted.split(".")
    if len(parts) > 1 and parts[0] == "kvm_sriov" and parts[1] in MOVES:
        pkg, name = MOVES[parts[1]]
        parts[1:2] = [pkg, name]
    return ".".join(parts)


def _relative(source: str, package: list[str]) -> str:
    target = source.split(".")
    common = 0
    while common < min(len(target), len(package)) and target[common] == package[common]:
        common += 1
    return "." * (len(package) - common + 1) + ".".join(target[common:])


def _statement(node: ast.ImportFrom, old_pkg, new_pkg, indent: str = "") -> list[str]:
    if node.level:
        base = old_pkg[:len(old_pkg) - node.level + 1]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module
    groups: dict[str, list[str]] = {}
    for alias in node.names:
        if origin == "kvm_sriov" and alias.name in MOVES:
            pkg, name = MOVES[alias.name]
            source = f"kvm_sriov.{pkg}"
            shown = name if name == alias.name and not alias.asname else f"{name} as {alias.asname or alias.name}"
        elif origin == "kvm_sriov.actions" and alias.name == "peer":
            source, shown = origin, alias.name
        else:
            source = new_module(origin)
            shown = alias.name + (f" as {alias.asname}" if alias.asname else "")
        groups.setdefault(source, []).append(shown)
    out = []
    for source, names in groups.items():
        where = _relative(source, new_pkg) if node.level else source
        out.append(_wrapped(f"from {where} import ", names, indent))
    return out


def _wrapped(head: str, names: list[str], indent: str, width: int = 110) -> str:
    line = head + ", ".join(names)
    if len(indent) + len(line) <= width:
        return line
    rows, row = [], head + "("
    for name in names:
        if len(indent) + len(row) + len(name) + 2 > width and row.strip()[-1] != "(":
            rows.append(row.rstrip())
            row = " " * len(head + "(")
        row += name + ", "
    rows.append(row[:-2] + ")")
    return ("\n" + indent).join(rows)


def rewrite_python(text: str, old_pkg=None, new_pkg=None) -> str:
    """old_pkg/new_pkg: the package a module under kvm_sriov/ was in and is
    in now (its relative imports are rewritten); None for any other file."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if not ((node.level and old_pkg) or node.module == "kvm_sriov"):
            continue
        edits.append(node)
    for node in sorted(edits, key=lambda e: e.lineno, reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = lines[first][:node.col_offset]
        new = _statement(node, old_pkg, new_pkg, indent)
        tail = lines[last][node.end_col_offset:]
        head = lines[first][:node.col_offset]
        body = ("\n" + indent).join(new)
        lines[first:last + 1] = [head + body + tail]
    return "".join(lines)


def rewrite(path: Path, old_pkg=None, new_pkg=None) -> None:
    text = path.read_text()
    new = PATH.sub(lambda m: "kvm_sriov/%s/%s.py" % MOVES[m.group(1)], text)
    new = DOTTED.sub(lambda m: "kvm_sriov.%s.%s" % MOVES[m.group(1)], new)
    if path.suffix == ".py" or new.startswith("#!/usr/bin/python3") or new.startswith("#!/usr/bin/env python3"):
        try:
            new = rewrite_python(new, old_pkg, new_pkg)
        except SyntaxError:
            pass
    if new != text:
        path.write_text(new)


def _package_of(path: Path):
    """A module in kvm_sriov/ or kvm_sriov/actions/ (not moved): its package."""
    parts = path.resolve().parts
    if "kvm_sriov" not in parts[:-1]:
        return None
    return list(parts[parts.index("kvm_sriov"):-1])


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        pkg = _package_of(Path(arg))
        rewrite(Path(arg), pkg, pkg)
