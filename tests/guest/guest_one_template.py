"""A parser for OpenNebula's template syntax (onetemplate/onevnet files,
oned.conf, vmm_exec_*.conf), written from the syntax oned accepts:

    # comment to end of line
    NAME = value                    single attribute
    NAME = "quoted \\" value"       double quotes, may span lines, \\" and \\\\ escapes
    NAME = [ A = v, B = "w" ]       vector attribute (one level, comma separated)

Names are case-insensitive (stored upper case); a name may repeat (NIC, AR).
Anything else is a syntax error with its line number.
"""
import re


class TemplateError(ValueError):
    pass


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_WORD = re.compile(r"[^\s,\[\]=\"#]+")


class _Lexer:
    def __init__(self, text):
        self.text = text
        self.i = 0

    @property
    def line(self):
        return self.text.count("\n", 0, self.i) + 1

    def skip(self):
        while self.i < len(self.text):
            c = self.text[self.i]
            if c.isspace():
                self.i += 1
            elif c == "#":
                j = self.text.find("\n", self.i)
                self.i = len(self.text) if j < 0 else j
            else:
                return

    def eof(self):
        self.skip()
        return self.i >= len(self.text)

    def peek(self):
        self.skip()
        return self.text[self.i] if self.i < len(self.text) else ""

    def expect(self, ch):
        if self.peek() != ch:
            raise TemplateError(f"line {self.line}: expected {ch!r}, found {self.peek()!r}")
        self.i += 1

    def name(self):
        self.skip()
        m = _NAME.match(self.text, self.i)
        if not m:
            raise TemplateError(f"line {self.line}: expected an attribute name, found {self.text[self.i:self.i + 10]!r}")
        self.i = m.end()
        return m.group(0).upper()

    def value(self):
        self.skip()
        if self.peek() == '"':
            return self.string()
        m = _WORD.match(self.text, self.i)
        if not m:
            raise TemplateError(f"line {self.line}: expected a value, found {self.text[self.i:self.i + 10]!r}")
        self.i = m.end()
        return m.group(0)

    def string(self):
        start = self.line
        self.i += 1
        out = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == "\\" and self.i + 1 < len(self.text) and self.text[self.i + 1] in '"\\':
                out.append(self.text[self.i + 1])
                self.i += 2
            elif c == '"':
                self.i += 1
                return "".join(out)
            else:
                out.append(c)
                self.i += 1
        raise TemplateError(f"line {start}: unterminated string")


def parse(text):
    """Returns [(NAME, str | dict)] in file order."""
    lx = _Lexer(text)
    attrs = []
    while not lx.eof():
        name = lx.name()
        lx.expect("=")
        if lx.peek() == "[":
            lx.i += 1
            vec = {}
            while True:
                key = lx.name()
                lx.expect("=")
                if lx.peek() == "[":
                    raise TemplateError(f"line {lx.line}: nested vector in {name}")
                if key in vec:
                    raise TemplateError(f"line {lx.line}: {key} twice in {name}")
                vec[key] = lx.value()
                if lx.peek() == ",":
                    lx.i += 1
                    continue
                lx.expect("]")
                break
            attrs.append((name, vec))
        else:
            attrs.append((name, lx.value()))
    return attrs


class Template:
    def __init__(self, text):
        self.attrs = parse(text)

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            return cls(f.read())

    def all(self, name):
        return [v for k, v in self.attrs if k == name.upper()]

    def get(self, name, default=None):
        vals = self.all(name)
        if len(vals) > 1:
            raise KeyError(f"{name} appears {len(vals)} times")
        return vals[0] if vals else default

    def __getitem__(self, name):
        v = self.get(name)
        if v is None:
            raise KeyError(name)
        return v

    def __contains__(self, name):
        return bool(self.all(name))
