"""Reading samples.csv fast: a million rows in a fraction of a second and a
bounded amount of memory.

The csv module builds a dict per row (3 s and 1.2 GB for 1 M rows). Here
the file is read in blocks of whole lines as bytes, and numpy finds the
line ends and commas. Every column before ``trial`` (benchmark ... size)
together is the row's group, so the bytes of that prefix are hashed per row
and only one line per distinct group is decoded; ``trial`` and ``value``
are converted column-wise, two blocks at a time on two threads; groups
are listed in the order the file first has them. A block that is not the
harness's plain layout (other columns, quoted fields, a hash collision) is
read with the csv module instead, so every file still reads, only slower.
"""
from __future__ import annotations

import csv
import io
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .analysis import CAT_COLS, CAT_DEFAULTS, GROUP_COLS, NUM_COLS, SAMPLE_FIELDS, Samples
from .errors import HarnessError

BLOCK = 2 << 20          # bytes read at a time: two blocks are scanned at once, and
                         # 2 MB keeps their temporaries small (8 MB: +100 MB peak)
_PRIME = np.uint64(0x100000001B3)
_NFIELDS = len(SAMPLE_FIELDS)
_TRIAL = SAMPLE_FIELDS.index("trial")
_VALUE = SAMPLE_FIELDS.index("value")
assert SAMPLE_FIELDS[:_TRIAL] == list(GROUP_COLS), "group columns must lead samples.csv"


class _Slow(Exception):
    """This block is not in the plain layout: use the csv module."""


_WIDE = 64               # longest field read column-wise (trial, value)
_P10 = 10.0 ** np.arange(23)


# 0xff bytes then zeros: at offset 512 - L, a mask of the first L bytes
_STEP = np.concatenate((np.full(512, 255, dtype=np.uint8), np.zeros(512, dtype=np.uint8)))
_PAD = 512               # zero bytes after a block's last line


def _words(a):
    """The 8 bytes at every offset of a byte array as one uint64 each (an
    unaligned view, nothing copied)."""
    return np.ndarray((len(a) - 7,), dtype=np.uint64, buffer=a, strides=(1,))


_STEP_WORDS = _words(_STEP)


def _cells(padded, start, length, width):
    """Bytes [start, start+length) per row, zero-padded to ``width`` columns.
    Wide fields: rows of a sliding-window view of the block (no index
    matrix), masked by a window over _STEP. Narrow ones (numbers): 8 bytes
    at a time, one gather per word instead of a row copy each (~3x faster);
    a view of ``width`` columns, not contiguous."""
    if width > 16:
        m = np.lib.stride_tricks.sliding_window_view(padded, width)[start]
        m &= np.lib.stride_tricks.sliding_window_view(_STEP, width)[_PAD - length]
        return m
    off = np.arange(0, width, 8)
    m = _words(padded)[start[:, None] + off]
    m &= _STEP_WORDS[(_PAD - length)[:, None] + off]
    return m.view(np.uint8)[:, :width]


def _digits(m):
    """Column-major views of a zero-padded byte matrix: (bytes, used, is a
    digit), one row per column of ``m``, so the per-column loops below read
    contiguous memory."""
    t = np.ascontiguousarray(m.T)
    return t, t != 0, (t - np.uint8(48)) <= 9


def _integers(m):
    """Non-negative decimal integers, one per row of a zero-padded byte matrix."""
    t, used, digit = _digits(m)
    if np.any(used & ~digit) or not np.all(used[0]):
        raise _Slow("not an integer")
    d = (t.astype(np.int64) - 48) * used
    mul = np.where(used, 10, 1)
    acc = np.zeros(len(m), dtype=np.int64)
    for k in range(len(t)):
        acc *= mul[k]
        acc += d[k]
    return acc


def _decimals(m):
    """Plain decimals ([-]digits[.digits], up to 15 significant digits) read
    exactly as float() would: the digits as an integer below 2**53 divided
    by a power of ten is one correctly rounded operation. Anything else
    (exponents, inf, longer mantissas) goes through numpy's own parser."""
    neg = m[:, 0] == 45
    body = m
    if neg.any():
        body = np.where(neg[:, None], np.roll(m, -1, axis=1), m)
        body[neg, -1] = 0
    t, used, digit = _digits(body)
    dot = t == 46
    ok = np.all(~used | dot | digit) and np.all(dot.sum(axis=0) <= 1) \
        and np.all(used[0]) and np.all(digit.sum(axis=0) <= 15)
    if not ok:
        return np.array(np.ascontiguousarray(m).view(f"S{m.shape[1]}").ravel()).astype(np.float64)
    d = (t.astype(np.int64) - 48) * digit
    mul = np.where(digit, 10, 1)
    acc = np.zeros(len(m), dtype=np.int64)
    after = np.zeros(len(m), dtype=np.int64)      # digits after the dot
    seen = np.zeros(len(m), dtype=bool)
    for k in range(len(t)):
        acc *= mul[k]
        acc += d[k]
        seen |= dot[k]
        after += digit[k] & seen
    v = acc.astype(np.float64) / _P10[after]
    return np.where(neg, -v, v)


def _unique(h):
    """np.unique(h, return_index=True, return_inverse=True), sorting one
    hash per run of equal neighbours: a harness writes each group's trials
    together, so a block of ~70,000 rows holds a few dozen runs."""
    new = np.empty(len(h), dtype=bool)
    new[0] = True
    np.not_equal(h[1:], h[:-1], out=new[1:])
    runs = np.flatnonzero(new)
    uh, first, inv = np.unique(h[runs], return_index=True, return_inverse=True)
    return uh, runs[first], np.repeat(inv, np.diff(np.append(runs, len(h))))


def _block(buf, padded, scratch=None):
    """(hash, keys, trial, value) per line of one block of whole lines;
    ``padded``: the same bytes followed by _PAD zero bytes. ``scratch``: two
    bool arrays at least as long as the block, reused from block to block
    (fresh 8 MB temporaries cost a page fault per 4 KiB, most of the scan)."""
    if scratch is None:
        scratch = np.empty((2, len(buf)), dtype=bool)
    newline, mark = scratch[0, :len(buf)], scratch[1, :len(buf)]
    # one pass: every comma and line end; a plain line has exactly 14 + 1
    np.equal(buf, 10, out=newline)
    np.equal(buf, 44, out=mark)
    np.bitwise_or(mark, newline, out=mark)
    marks = np.nonzero(mark)[0]
    np.equal(buf, 34, out=mark)
    if len(marks) % _NFIELDS or mark.any():
        raise _Slow("quotes or another column count")
    marks = marks.reshape(-1, _NFIELDS)
    ends = marks[:, -1]
    # every 15th mark a line end and no other: the other marks are commas
    if np.any(buf[ends] != 10) or np.count_nonzero(newline) != len(ends):
        raise _Slow("ragged lines")
    commas = marks[:, :-1]
    n = len(ends)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    kend = commas[:, _TRIAL - 1]
    lens = kend - starts
    width = int(-(-int(lens.max()) // 8) * 8)
    if width > _PAD:
        raise _Slow("long group columns")
    m = _cells(padded, starts, lens, width)
    words = m.view(np.uint64)
    h = np.full(n, 0xCBF29CE484222325, dtype=np.uint64)
    for k in range(words.shape[1]):
        h ^= words[:, k]
        h *= _PRIME
    h ^= lens.astype(np.uint64)
    uh, first, inv = _unique(h)
    # the bytes behind equal hashes are equal: each row as the row before it
    # (a run of one group), each run's first row as its group's first row
    words_eq = np.all(words[1:] == words[:-1], axis=1)
    heads = np.flatnonzero(inv[1:] != inv[:-1]) + 1
    if not np.all(words_eq[inv[1:] == inv[:-1]]) or \
            not np.array_equal(words[heads], words[first[inv[heads]]]):
        raise _Slow("hash collision")
    fields = []
    for col in (_TRIAL, _VALUE):
        a, b = commas[:, col - 1] + 1, commas[:, col]
        w = int((b - a).max())
        if w <= 0 or w > _WIDE:
            raise _Slow("empty or long number")
        fields.append(_cells(padded, a, b - a, w))
    trial = _integers(fields[0])
    try:
        value = _decimals(fields[1])
    except ValueError:
        raise _Slow("not a number") from None
    keys = {int(uh[j]): bytes(buf[starts[first[j]]:kend[first[j]]]) for j in range(len(uh))}
    return h, keys, trial, value


def _slow_rows(text, header):
    return list(csv.DictReader(io.StringIO(text), fieldnames=header))


def read(paths):
    """Samples from one or more samples.csv files."""
    hashes, trials, values, keys = [], [], [], {}
    slow = []

    def collect(job):
        future, block, cut, header = job
        if future is not None:
            try:
                h, k, t, v = future.result()
                if any(x in keys and keys[x] != k[x] for x in k):
                    raise _Slow("hash collision across blocks")
                keys.update(k)
                hashes.append(h), trials.append(t), values.append(v)
                return
            except _Slow:
                pass
        slow.extend(_slow_rows(block[:cut].decode(), header))

    # numpy lets go of the GIL in its loops: two blocks at once use both
    # cores of a small host. Three buffers take turns (fresh pages cost a
    # fault each), so a block is read while the two before it are scanned;
    # results are taken in file order.
    buffers = [(bytearray(BLOCK + _PAD), np.empty((2, BLOCK + _PAD), dtype=bool)) for _ in range(3)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending = deque()
        turn = 0
        for path in paths:
            with open(path, "rb") as f:
                head = f.readline()
                header = next(csv.reader([head.decode()])) if head else []
                plain = header == SAMPLE_FIELDS
                if not plain and header and not set(GROUP_COLS[:5]) <= set(header) | set(CAT_DEFAULTS):
                    raise HarnessError(f"{path}: not a samples.csv (columns {','.join(header)})")
                # read behind the carried partial line, with room for the
                # padding: no copy of the block to join or to pad
                rest = b""
                while True:
                    block, scratch = buffers[turn % 3]
                    turn += 1
                    if len(block) < len(rest) + BLOCK + _PAD:   # a line longer than a block
                        block = bytearray(len(rest) + BLOCK + _PAD)
                    block[:len(rest)] = rest
                    got = f.readinto(memoryview(block)[len(rest):len(rest) + BLOCK])
                    end = len(rest) + got
                    if not got:
                        if end and block[end - 1] != 10:
                            block[end] = 10
                            end += 1
                        cut = end
                    else:
                        cut = block.rfind(b"\n", 0, end) + 1
                    rest = bytes(block[cut:end])
                    block[cut:cut + _PAD] = bytes(_PAD)
                    if cut:
                        future = None
                        if plain:
                            chunk = np.frombuffer(block, dtype=np.uint8)
                            future = pool.submit(_block, chunk[:cut], chunk[:cut + _PAD],
                                                 scratch if scratch.shape[1] >= cut else None)
                        pending.append((future, block, cut, header))
                        while len(pending) > 2:    # the buffer read next is free again
                            collect(pending.popleft())
                    if not got:
                        break
        while pending:
            collect(pending.popleft())
    fast = _assemble(hashes, trials, values, keys)
    if not slow:
        return fast
    rows = Samples.from_rows(slow)
    return rows if fast is None else fast.concat(rows)


def _assemble(hashes, trials, values, keys):
    if not hashes:
        return None
    h = np.concatenate(hashes)
    uh, first, inv = _unique(h)
    # groups in the order the file first has them, not in hash order: a
    # hash hides the block's widest group columns, so the same file read in
    # other blocks would otherwise list its groups otherwise
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    uh, inv = uh[order], rank[inv]
    groups = [next(csv.reader([keys[int(x)].decode()])) for x in uh]
    # two spellings of one group ("01" and "1", "" and the default) are one group
    canon, remap = {}, np.empty(len(groups), dtype=np.int64)
    for j, g in enumerate(groups):
        key = tuple(g[c] or CAT_DEFAULTS.get(name, "") for c, name in enumerate(CAT_COLS)) + \
            tuple(int(g[c] or 0) for c in range(len(CAT_COLS), len(GROUP_COLS)))
        remap[j] = canon.setdefault(key, len(canon))
    if len(canon) < len(groups):
        first = {}
        for j in range(len(groups)):
            first.setdefault(int(remap[j]), j)
        groups = [groups[first[k]] for k in range(len(canon))]
        inv = remap[inv]
    ng = len(groups)
    cats = {}
    for c, name in enumerate(CAT_COLS):
        labels, codes = np.unique(np.array([g[c] or CAT_DEFAULTS.get(name, "") for g in groups],
                                           dtype=object).astype(str), return_inverse=True)
        cats[name] = (codes.astype(np.int32)[inv], [str(x) for x in labels])
    nums = {}
    for c, name in enumerate(NUM_COLS[:-1], start=len(CAT_COLS)):
        try:
            per_group = np.array([int(g[c] or 0) for g in groups], dtype=np.int64)
        except ValueError as e:
            raise HarnessError(f"samples: {name} is not an integer ({e})") from None
        nums[name] = per_group[inv]
    nums["trial"] = np.concatenate(trials)
    s = Samples(cats, nums, np.concatenate(values))
    s.groups = (ng, inv)     # dense group ids over GROUP_COLS, already known
    return s
