#!/usr/bin/python3
"""Imports in kvm_sriov/ run one way: top to bottom, with no circle.

    dev-tools/check_imports.py [PACKAGE_DIR]

Reads every import (module level and inside functions) of every module,
maps each module to its unit (a subpackage, or a module at the top of the
package), and prints one line per offence: a unit importing one declared
above it in LAYERS or not declared at all, and any circle of modules.
Exit 1 if there is one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# The one place the layer order is declared: top to bottom. A unit may
# import only the units below it.
LAYERS = (
    # the entry point of the admin CLI
    "cli",
    "actions",      # the OpenNebula VMM actions and the migration peer's commands
    "metrics",      # Prometheus figures read from the layers below (kvm-sriov metrics)
    "node",         # this host: pool + inventory + libvirt + GUIDs, the peer client, doctor, the monitoring probe
    "scheduler",    # the placer oned's scheduler runs
    "frontend",     # the front-end beside oned: oned.conf registration, the network hooks
    "fabric",       # the partition manager: opensm on every SM node, or UFM
    "oned",         # what oned sends (action XML, VM template), its vmm_exec defaults, its version
    "ivshmem",      # shared-memory regions
    "ib",           # GUIDs, partitions, OpenSM
    "domain",       # libvirt: domain XML, hypervisor, hot-plug, HPC profile
    "config",       # the driver's configuration
    "vf",           # PFs, VFs, the pool, policy, NUMA, intents
    "opennebula",   # the driver protocol: argv, stdin, log lines
    "files",        # a file replaced whole (write, then rename)
    "locks",        # an flock with a deadline
    "failpoints", "errors",
    "__init__",     # the package itself (its version)
)


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name (from root's name) -> file, for every module under root."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, path: Path, known: dict[str, Path]):
    """(line, imported module) for every import of a module of the tree."""
    tree = ast.parse(path.read_text(), str(path))
    here = _package_of(name, path).split(".")
    top = name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    yield node.lineno, _known_prefix(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != top:
                continue
            for alias in node.names:
                whole = f"{origin}.{alias.name}"
                yield node.lineno, whole if whole in known else _known_prefix(origin, known)


def _known_prefix(dotted: str, known: dict[str, Path]) -> str:
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def unit(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Strongly connected groups of more than one module (Tarjan), each with
    a path around it."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append((group, _cycle_in(sorted(group), graph)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_in(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One circle through the group's first module, by breadth-first search."""
    members, start = set(group), group[0]
    came = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in came:
                came[w] = v
                queue.append(w)
    return group


def check(root: Path, layers=LAYERS) -> list[str]:
    known = _modules(root)
    offences, graph = [], {}
    for name, path in known.items():
        src = unit(name)
        for line, target in _imports(name, path, known):
            if target == name:
                continue
            graph.setdefault(name, set()).add(target)
            dst = unit(target)
            where = f"{path}:{line}"
            if src not in layers:
                offences.append(f"{where}: {src} is not in the layer order (dev-tools/check_imports.py LAYERS)")
            elif dst not in layers:
                offences.append(f"{where}: {dst} is not in the layer order (dev-tools/check_imports.py LAYERS)")
            elif layers.index(dst) < layers.index(src):
                offences.append(f"{where}: upward import: {src} imports {target} ({dst} is declared above {src})")
    for members, circle in _circles(graph):
        rest = sorted(set(members) - set(circle))
        offences.append("circle: " + " -> ".join(circle) + (f" (also in it: {', '.join(rest)})" if rest else ""))
    return offences


def main(argv) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1] / "kvm_sriov")
    offences = check(root)
    for line in offences:
        print(line)
    print(f"{len(_modules(root))} modules read")
    print(f"imports: {0 if offences else 1} passed, {len(offences)} failed")  # the count rake's summary reads
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
