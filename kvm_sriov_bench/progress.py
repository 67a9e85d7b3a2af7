"""Progress on stderr, with no third-party package: which run of how many,
and inside a long run (HPL takes hours at full size) the elapsed time and
the last thing the benchmark printed, refreshed at most every few seconds.
On a terminal the line is rewritten in place; in a log, a line is added
only when something changed and at least ``every`` seconds passed."""
from __future__ import annotations

import contextlib
import sys
import time


class Progress:
    def __init__(self, total, desc, stream=None, every=None):
        self.total, self.desc = total, desc
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = every if every is not None else (1.0 if self.tty else 30.0)
        self.current = ""
        self.started = self.run_started = time.monotonic()
        self._last_print = 0.0
        self._last_text = None

    def start(self, what):
        """A run begins (e.g. 'xhpl trial 2')."""
        self.current = what
        self.run_started = time.monotonic()
        self._show(force=True)

    def note(self, text):
        """Something the running benchmark printed (a result line, a size)."""
        self._show(extra=text.strip()[:70])

    def update(self, n=1):
        self.done += n
        self._show(force=True)

    def _show(self, extra="", force=False):
        now = time.monotonic()
        if not force and now - self._last_print < self.every:
            return
        text = (f"{self.desc}: {self.done}/{self.total} done"
                + (f", {self.current} {now - self.run_started:.0f}s" if self.current else "")
                + (f" | {extra}" if extra else ""))
        if text == self._last_text and not self.tty:
            return
        self._last_print, self._last_text = now, text
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _Null:
    def start(self, what):
        pass

    def note(self, text):
        pass

    def update(self, n=1):
        pass


@contextlib.contextmanager
def bar(total, desc, enabled=True, stream=None, every=None):
    if not enabled:
        yield _Null()
        return
    p = Progress(total, desc, stream=stream, every=every)
    try:
        yield p
    finally:
        p.close()
