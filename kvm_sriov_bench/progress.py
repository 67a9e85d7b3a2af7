"""Progress bars for long runs (tqdm when installed, quiet otherwise)."""
from __future__ import annotations

import contextlib
import sys


class _Null:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass


@contextlib.contextmanager
def bar(total, desc, enabled=True):
    if not enabled:
        yield _Null()
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield _Null()
        return
    with tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True) as pb:
        yield pb
