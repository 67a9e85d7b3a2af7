"""Errors raised by the harness."""


class HarnessError(Exception):
    """Base class for every error the harness raises on purpose."""


class ParseError(HarnessError):
    """Benchmark output is not what it should be.

    Always names the file (or "<text>") and, where one is to blame, the
    1-based line number and the line itself, e.g.::

        osu_latency.txt:1: osu_latency rejected its options: 'Invalid option [-f]'
    """

    def __init__(self, source, line, message, text=None):
        self.source = str(source)
        self.line = line
        self.message = message
        self.text = text
        where = self.source if line is None else f"{self.source}:{line}"
        full = f"{where}: {message}"
        if text is not None:   # cut: the line may be a VM's, of any length
            full += f": {text.strip()[:200]!r}"
        super().__init__(full)


class RunError(HarnessError):
    """A benchmark command failed (non-zero exit, missing binary...)."""


class OrchestrationError(HarnessError):
    """OpenNebula did not give us the VMs we asked for."""
