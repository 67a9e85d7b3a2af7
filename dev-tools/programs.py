#!/usr/bin/python3
"""Which programs a suite's code starts, and which Debian package gives each.

    programs.py scan PATH...                      programs found, one a line (JSON with -v)
    programs.py require PKG... -- PATH...         one line per missing program, exit 1
    programs.py lint < suites.json                every program of every suite is provided by
                                                  a package that suite declares (or the base system)

What counts as a program the code starts (Python files, read with ast):
  - the first element of a list/tuple given to subprocess.run/Popen/check_*/call or to a
    function named _run/run (also _run('ip', ...) with plain string arguments);
  - a string that is an absolute path under /usr/bin, /usr/sbin, /bin or /sbin;
  - the first word of each line of a shell script held in a string (sh -c '...'), and the
    first element of a list literal whose second element is an option ('-x'): "maybe"s,
    only counted when they name a program this machine or PACKAGE_OF knows.
PACKAGE_OF (simhost/prereq.py) maps each program to its package, so a missing one can say what to install
even on a machine that never had it; the lint checks it against `dpkg -S` here.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH_DIRS = ('/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin')

sys.path.insert(0, str(ROOT))
from simhost.prereq import PACKAGE_OF  # noqa: E402  (program -> package)
# what the code names but no Debian package gives: OpenNebula's own commands (its
# build), links the harness makes itself, words that only look like commands
NOT_DEBIAN = {
    'one', 'oned', 'onevm', 'onehost', 'onetemplate', 'onevnet', 'oneimage', 'onedatastore',
    'onemarket', 'onegroup', 'oneuser', 'onecluster',
    '/usr/bin/qemu-kvm-one',   # simhost.frontend links it to qemu-system-x86_64
    'release',                 # a subcommand of the driver's peer helper
    'kvm-sriov', 'kvm-sriov-bench',
    # run inside a simulated guest or L1's initramfs (busybox), not on this machine
    'poweroff', 'ifconfig', 'insmod',
}
SUBPROCESS_FUNCS = {'run', 'Popen', 'check_output', 'check_call', 'call', '_run'}
ABS = re.compile(r'^/(?:usr/)?s?bin/[A-Za-z0-9_.+-]+$')
COMMAND_LINE = re.compile(r'^\s*[a-z][a-z0-9_.+-]*\s+-{1,2}[A-Za-z]')
WORD = re.compile(r'^[a-z][a-z0-9_.+-]*$')
SHELL_WORDS = {'set', 'cd', 'exec', 'echo', 'export', 'for', 'do', 'done', 'if', 'then', 'fi', 'else',
               'while', 'case', 'esac', 'in', 'return', 'shift', 'local', 'read', 'test', 'true',
               'false', 'wait', 'trap', 'eval', 'exit', 'say', 'finish', 'fail', 'wait_for', 'n'}


def _const_str(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _first_word(s: str):
    w = s.strip().split(None, 1)
    return w[0] if w else None


def _shell_lines(text: str):
    for line in re.split(r'\n|;|&&|\|\||\|', text):
        if re.match(r'^\s*[^\s=]+\s*=', line):   # an assignment or a config line, not a command
            continue
        w = _first_word(line.lstrip('( '))
        if w and (WORD.match(w) or ABS.match(w)) and w not in SHELL_WORDS:
            yield w


class _Finder(ast.NodeVisitor):
    def __init__(self):
        self.found = {}   # program -> 'certain' | 'maybe'

    def add(self, prog, how):
        if prog and (self.found.get(prog) != 'certain'):
            self.found[prog] = how

    def visit_Call(self, node):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        via_subprocess = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and f.value.id == 'subprocess'
        if node.args and (via_subprocess or (isinstance(f, ast.Name) and name in SUBPROCESS_FUNCS)):
            first = node.args[0]
            if isinstance(first, ast.BinOp):   # ['ip', 'netns', 'exec', ns] + cmd
                first = first.left
            if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
                self.add(_const_str(first.elts[0]), 'certain')
            elif name == '_run' and _const_str(first):
                self.add(_const_str(first), 'certain')
        self.generic_visit(node)

    def visit_List(self, node):
        if len(node.elts) >= 2:
            a, b = _const_str(node.elts[0]), _const_str(node.elts[1])
            if a and b and WORD.match(a) and b.startswith('-'):
                self.add(a, 'maybe')
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            self._text(node.value)

    def visit_JoinedStr(self, node):
        # an f-string as a whole, its fields as a placeholder word
        self._text(''.join(v.value if _const_str(v) is not None else 'X' for v in node.values))
        for v in node.values:
            if not isinstance(v, ast.Constant):
                self.visit(v)

    def _text(self, s):
        first = _first_word(s)
        if first and ABS.match(first):
            self.add(first, 'certain')
        if '\n' in s and not s.lstrip().startswith('<'):   # a script, not XML
            for w in _shell_lines(s):
                self.add(w, 'maybe')
        elif COMMAND_LINE.match(s):   # 'virtlogd -d -p ...'
            self.add(_first_word(s), 'maybe')

    def visit_Expr(self, node):
        if _const_str(node.value) is None:   # not a docstring
            self.generic_visit(node)


def scan(paths) -> dict:
    """program -> 'certain'/'maybe' for every Python file under paths."""
    finder = _Finder()
    for p in paths:
        p = ROOT / p
        files = sorted(p.rglob('*.py')) if p.is_dir() else [p]
        for f in files:
            if f.suffix != '.py' and f.read_bytes()[:2] != b'#!':
                continue
            try:
                tree = ast.parse(f.read_text(errors='replace'), str(f))
            except SyntaxError:
                continue
            finder.visit(tree)
    return finder.found


def locate(prog: str):
    """Where the program is on this machine, or None."""
    if prog.startswith('/'):
        return prog if os.path.exists(prog) else None
    for d in PATH_DIRS:
        if os.access(os.path.join(d, prog), os.X_OK):
            return os.path.join(d, prog)
    return None


def dpkg_owner(path: str):
    """The package that installed path (usrmerge: /bin/x is /usr/bin/x), or None."""
    candidates = [path, os.path.realpath(path)]
    for c in list(candidates):
        if c.startswith('/usr/'):
            candidates.append(c[4:])
        else:
            candidates.append('/usr' + c)
    for c in candidates:
        p = subprocess.run(['dpkg-query', '-S', c], capture_output=True, text=True)
        if p.returncode == 0:
            for line in p.stdout.splitlines():
                pkg, _, f = line.partition(': ')
                if f.strip() == c and 'diversion' not in pkg:
                    return pkg.split(':')[0].split(',')[0].strip()
    return None


def relevant(found: dict) -> list:
    """The programs worth checking: every certain one, a maybe one only if known."""
    out = []
    for prog, how in sorted(found.items()):
        if prog in NOT_DEBIAN:
            continue
        if how == 'certain' or prog in PACKAGE_OF or locate(prog):
            out.append(prog)
    return out


def require(packages, paths) -> int:
    """Print one line per program the code starts that is not on this machine."""
    missing = [p for p in relevant(scan(paths)) if not locate(p)]
    for prog in missing:
        pkg = PACKAGE_OF.get(prog)
        where = prog if prog.startswith('/') else prog
        print(f'missing {where}: apt-get install {pkg}' if pkg else
              f'missing {where}: no package known for it (simhost/prereq.py PACKAGE_OF)')
    return 1 if missing else 0


def _depends_graph(packages) -> dict:
    """package -> the packages it depends on (apt-get install --no-install-recommends
    pulls them all; a virtual package stands for its providers), for packages and
    everything below them: one apt-cache call."""
    p = subprocess.run(['apt-cache', 'depends', '--recurse', '--no-recommends', '--no-suggests',
                        '--no-conflicts', '--no-breaks', '--no-replaces', '--no-enhances', *packages],
                       capture_output=True, text=True)
    graph, current, virtual = {}, None, False
    for line in p.stdout.splitlines():
        if not line.startswith(' '):
            current, virtual = line.strip().split(':')[0], False
            graph.setdefault(current, set())
            continue
        text = line.strip().lstrip('|')
        if ':' in text:   # "Depends: name" / "PreDepends: <virtual>"
            name = text.split(':', 1)[1].strip()
            virtual = name.startswith('<')
            if not virtual:
                graph[current].add(name.split(':')[0])
        elif virtual:     # a provider of the virtual package above
            graph[current].add(text.split(':')[0])
    return graph


def _closure(packages, graph) -> set:
    """The packages and everything they depend on."""
    seen, todo = set(), list(packages)
    while todo:
        pkg = todo.pop()
        if pkg not in seen:
            seen.add(pkg)
            todo.extend(graph.get(pkg, ()))
    return seen


def _base_packages() -> set:
    """Priority required: what every Debian system (debootstrap --variant=minbase) has."""
    p = subprocess.run(['dpkg-query', '-W', '-f', '${Package} ${Priority} ${Essential}\n'],
                       capture_output=True, text=True)
    return {f[0] for f in (l.split() for l in p.stdout.splitlines())
            if len(f) >= 2 and (f[1] == 'required' or f[-1] == 'yes')}


def lint(suites: dict) -> int:
    """suites: name -> {"packages": [...], "code": [...]}. Prints one line per problem."""
    problems = []
    base = _base_packages()
    owners = {}
    graph = _depends_graph(sorted({p for s in suites.values() for p in s['packages']}))
    for name, s in sorted(suites.items()):
        closure = _closure(s['packages'], graph) | base
        for prog in relevant(scan(s['code'])):
            if prog not in owners:
                here = locate(prog)
                owners[prog] = dpkg_owner(here) if here else None
            mapped, seen = PACKAGE_OF.get(prog), owners[prog]
            mismatch = f'{prog}: PACKAGE_OF says {mapped}, dpkg -S says {seen}'
            if seen and mapped and seen != mapped and mismatch not in problems:
                problems.append(mismatch)
            pkg = seen or mapped
            if pkg is None:
                problems.append(f'{name}: starts {prog}, which is neither installed here nor in '
                                'PACKAGE_OF (dev-tools/programs.py): add it with its package')
            elif pkg not in closure:
                problems.append(f'{name}: starts {prog} from package {pkg}, which the suite does not '
                                f'declare (rakelib: packages: [..., "{pkg}"])')
    for line in problems:
        print(line)
    print(f'{len(suites)} passed, 0 failed' if not problems else f'0 passed, {len(problems)} failed')
    return 1 if problems else 0


def main(argv) -> int:
    if argv[:1] == ['scan']:
        found = scan(argv[1:])
        for prog in relevant(found):
            print(prog)
        return 0
    if argv[:1] == ['require'] and '--' in argv:
        i = argv.index('--')
        return require(argv[1:i], argv[i + 1:])
    if argv[:1] == ['lint']:
        return lint(json.load(sys.stdin))
    print(__doc__.strip().split('\n\n')[0], file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
