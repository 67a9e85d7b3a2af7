"""The kvm-sriov VM_MAD's defaults file (oned's vmm_exec_kvm-sriov.conf),
made from OpenNebula's own vmm_exec_kvm.conf on the front-end where it is
installed: the stock file as it is (every attribute, comment and default:
UEFI firmware list, SPICE, Hyper-V, q35 ports, ...) with kvm-sriov's values
(templates/oned/vmm_exec_kvm-sriov.conf) set in place. In place, because oned
reads the FIRST attribute of a name: a second FEATURES appended at the end
would be ignored. OpenNebula's text is never part of this repository.

    python3 -m kvm_sriov.oned.oned_defaults STOCK ADDITIONS OUT   (rake install:oned_defaults)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple, Union

from ..files import atomic_write

Value = Union[str, dict]  # a single value, or a vector's {name: value}


class Span(NamedTuple):
    start: int
    end: int


class Attr(NamedTuple):
    name: str
    value: Value
    span: Span                 # the whole value: "x", x or [ ... ]
    subs: dict                 # vector only: name -> Span of its value


_NAME = re.compile(r"[A-Za-z0-9_]+")
_BLANKS = re.compile(r"[ \t\n]*")
_INLINE_BLANKS = re.compile(r"[ \t]*")
_BARE = re.compile(r"[^=,\]\[#\s\"]+")  # oned's unquoted value: anything but =,][# and blanks


class ParseError(ValueError):
    pass


def _skip(text: str, i: int) -> int:
    """Past blanks, newlines and whole-line comments (oned's lexer drops a '#'
    up to the end of its line wherever a token may start)."""
    while True:
        i = _BLANKS.match(text, i).end()
        if i < len(text) and text[i] == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl + 1
            continue
        return i


def _value(text: str, i: int, where: str) -> tuple[str, int]:
    """A single value at i: (value, end)."""
    if text.startswith('"', i):
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text.startswith('\\"', j) else 1  # only \" escapes, as in oned's lexer
        if j >= len(text):
            raise ParseError(f"{where}: unterminated string at offset {i}")
        return text[i + 1:j].replace('\\"', '"'), j + 1
    m = _BARE.match(text, i)
    if not m:
        raise ParseError(f"{where}: no value at offset {i}")
    return m.group(), m.end()


def _name_and_equals(text: str, i: int, where: str) -> tuple[str, int]:
    """``NAME =`` at offset i: the name (upper case) and the offset after '='."""
    m = _NAME.match(text, i)
    if not m:
        raise ParseError(f"{where}: attribute name expected at offset {i}: {text[i:i + 30]!r}")
    name, i = m.group().upper(), _BLANKS.match(text, m.end()).end()
    if not text.startswith("=", i):
        raise ParseError(f"{where}: '=' expected after {name}")
    return name, i + 1


def parse(text: str, where: str = "template") -> list[Attr]:
    """Every attribute of an OpenNebula template, in order, with where its
    value is in the text. Enough of oned's syntax for its vmm_exec files."""
    attrs, i = [], _skip(text, 0)
    while i < len(text):
        name, i = _name_and_equals(text, i, where)
        i = _INLINE_BLANKS.match(text, i).end()
        start = i
        if text.startswith("[", i):
            value, subs, i = {}, {}, _skip(text, i + 1)
            while not text.startswith("]", i):
                sub, i = _name_and_equals(text, i, f"{where}: {name}")
                i = _BLANKS.match(text, i).end()
                vstart = i
                value[sub], i = _value(text, i, f"{where}: {name}/{sub}")
                subs[sub] = Span(vstart, i)
                i = _skip(text, i)
                if text.startswith(",", i):
                    i = _skip(text, i + 1)
                elif not text.startswith("]", i):
                    raise ParseError(f"{where}: {name}: ',' or ']' expected at offset {i}")
            i += 1
            attrs.append(Attr(name, value, Span(start, i), subs))
        else:
            value, i = _value(text, i, f"{where}: {name}")
            attrs.append(Attr(name, value, Span(start, i), {}))
        i = _skip(text, i)
    return attrs


def _quote(value: str) -> str:
    return '"' + value.replace('"', '\\"') + '"'


def first(attrs: list[Attr]) -> dict:
    """name -> the attribute oned uses (the first of that name)."""
    out = {}
    for a in attrs:
        out.setdefault(a.name, a)
    return out


def merge(stock: str, additions: str) -> str:
    """The stock text with every attribute of ``additions`` set in it: a value
    replaced where the stock file has it (the first of its name, the one oned
    reads), a sub-attribute added to the stock vector, an attribute the stock
    file lacks appended. Nothing of the stock file is dropped."""
    have = first(parse(stock, "stock file"))
    edits, appended = [], []  # edits: (start, end, new text), applied back to front
    for add in parse(additions, "kvm-sriov additions"):
        old = have.get(add.name)
        if old is None:
            body = (_quote(add.value) if isinstance(add.value, str) else
                    "[\n" + ",\n".join(f"    {k} = {_quote(v)}" for k, v in add.value.items()) + "\n]")
            appended.append(f"{add.name} = {body}")
        elif isinstance(add.value, str) != isinstance(old.value, str):
            raise ParseError(f"{add.name}: a vector in one file and a single value in the other")
        elif isinstance(add.value, str):
            if add.value != old.value:
                edits.append((old.span.start, old.span.end, _quote(add.value)))
        else:
            new = [k for k in add.value if k not in old.subs]
            for k, v in add.value.items():
                if k in old.subs and old.value[k] != v:
                    edits.append((old.subs[k].start, old.subs[k].end, _quote(v)))
            if new:  # right after the '[': the vector's existing layout stays as it is
                at = old.span.start + 1
                edits.append((at, at, "\n" + "".join(f"    {k} = {_quote(add.value[k])},\n" for k in new)))
    out = stock
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    if appended:
        out = out.rstrip("\n") + "\n\n# kvm-sriov\n" + "\n\n".join(appended) + "\n"
    return out


HEADER = ("# OpenNebula's {stock} with kvm-sriov's values set in it\n"
          "# (made by `rake install:oned_defaults` from {additions}; regenerate it after\n"
          "# an OpenNebula upgrade, rather than editing it).\n")


def generate(stock: Path, additions: Path) -> str:
    text = merge(stock.read_text(), additions.read_text())
    return HEADER.format(stock=stock, additions=additions.name) + text


def main(argv: list) -> int:
    if len(argv) != 3:
        print("usage: python3 -m kvm_sriov.oned.oned_defaults STOCK_VMM_EXEC_KVM_CONF ADDITIONS OUT", file=sys.stderr)
        return 2
    stock, additions, out = map(Path, argv)
    if not stock.is_file():
        print(f"kvm-sriov: OpenNebula's {stock} not found: the kvm-sriov defaults are made from it "
              f"(ONE_ETC= names OpenNebula's etc directory, STOCK_VMM_CONF= the file itself)", file=sys.stderr)
        return 1
    try:
        text = generate(stock, additions)
    except (ParseError, OSError, UnicodeDecodeError) as exc:
        print(f"kvm-sriov: {exc}", file=sys.stderr)
        return 1
    atomic_write(out, text)
    print(f"wrote {out} ({stock} + {additions.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
