"""Reading samples.csv with the csv module.

A campaign writes thousands to tens of thousands of rows; 20,000 read in
about a tenth of a second, so nothing faster is worth its code. Files of
an older layout (without placement or params) read with those columns'
defaults. Anything unreadable is one HarnessError naming the file and line.
"""
from __future__ import annotations

import csv

from .analysis import CAT_DEFAULTS, GROUP_COLS, Samples
from .errors import HarnessError


def _rows(path):
    """The rows of one file as dicts, read as they are used (no list of a
    million dicts in memory)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            try:
                header = reader.fieldnames or []
                if header and not set(GROUP_COLS[:5]) <= set(header) | set(CAT_DEFAULTS):
                    raise HarnessError(f"{path}: not a samples.csv (columns {','.join(header)})")
                yield from reader
            except (csv.Error, UnicodeDecodeError) as e:
                # csv bounds a field at 128 KiB (csv.field_size_limit)
                raise HarnessError(f"{path}:{reader.line_num}: not a readable samples.csv ({e})") from None
    except OSError as e:
        raise HarnessError(f"{path}: {e.strerror or e}") from None


def read(paths):
    """Samples from one or more samples.csv files."""
    return Samples.from_rows(row for path in paths for row in _rows(path))
