"""Parsers for OSU micro-benchmarks (5.x, 7.x), HPL (2.0 in hpcc, 2.3),
Debian's hpcc summary, and perftest (text and JSON).

Every parser is tolerant of banners, MPI warnings and blank lines, and
strict about numbers: a data row that is not entirely finite numbers, a
run that printed its usage ("Invalid option"), a FAILED residual or a run
without any result raises :class:`ParseError` naming the file and line.

The output comes from the VMs, so it is bounded before it is read: at most
MAX_INPUT characters, MAX_LINE per line, JSON nested at most MAX_JSON_DEPTH
deep; every pattern is matched on one bounded line (or the bounded head
of the output) with bounded repetitions, so no input makes a match take
more than linear time.

A parse yields a :class:`Parsed` whose ``rows`` are tidy dicts::

    {"benchmark": "osu_latency", "metric": "latency", "unit": "us",
     "size": 128, "reported": "avg", "value": 1.69, "line": 12}

``reported`` names the statistic the benchmark itself printed (avg, min,
max, p50, p99, peak, typical, value...); statistics over trials are
computed later (analysis.py) and named separately.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

from . import osu
from .errors import ParseError

__all__ = ["Parsed", "parse_text", "parse_file", "parse_osu", "parse_hpl",
           "parse_hpcc", "parse_perftest", "parse_perftest_json", "detect"]

MIB = 1.048576  # perftest "MB/sec" is MiB/s; the harness stores 10^6 B/s
MAX_INPUT = 16 << 20   # characters of one output (hpcc's, the largest real one, is ~20 KB)
MAX_LINE = 4096        # characters of one line (the widest real one, an OSU -z header, is ~230)
MAX_JSON_DEPTH = 16    # perftest's JSON nests 3 deep


@dataclass
class Parsed:
    kind: str                      # osu | hpl | hpcc | perftest
    benchmark: str                 # osu_latency, xhpl, hpcc, ib_write_lat ...
    version: str | None
    source: str
    rows: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def _num(token, source, lineno, line):
    try:
        v = float(token)
    except ValueError:
        raise ParseError(source, lineno, f"not a number {token[:40]!r}", line) from None
    if not math.isfinite(v):
        raise ParseError(source, lineno, f"non-finite number {token[:40]!r}", line)
    return v


def _int(token, source, lineno, line):
    v = _num(token, source, lineno, line)
    if v != int(v) or v < 0:
        raise ParseError(source, lineno, f"not a non-negative integer {token[:40]!r}", line)
    return int(v)


def _lines(text, source):
    """The output's lines, once its size and every line's length are within bounds."""
    _check_size(text, source)
    lines = text.splitlines()
    if lines and max(map(len, lines)) > MAX_LINE:
        i = next(i for i, line in enumerate(lines, 1) if len(line) > MAX_LINE)
        raise ParseError(source, i, f"a line over {MAX_LINE} characters: not a benchmark's output",
                         lines[i - 1][:80])
    return lines


def _check_size(text, source):
    if len(text) > MAX_INPUT:
        raise ParseError(source, None, f"over {MAX_INPUT} characters: not a benchmark's output")


_NUMERIC_START = re.compile(r"^\s*[-+]?(\d|\.\d)")
_MPI_FAILURE = re.compile(r"(mpirun (has exited|detected|noticed)|MPI_ABORT was invoked|"
                          r"Segmentation fault|srun: error)", re.I)


def detect(text, name=""):
    """Guess the output kind from its contents (file name as a tie-breaker)."""
    head = text[:200000]
    if "Begin of Summary section" in head or "DARPA/DOE HPC Challenge" in head:
        return "hpcc"
    if re.search(r"^#[ \t]{0,16}(OSU |kvm-sriov-bench MPI ping-pong)", head, re.M) or \
            re.search(r"^Usage: osu_|^Invalid option", head, re.M):
        return "osu"
    if "HPLinpack" in head:
        return "hpl"
    stripped = head.lstrip()
    if stripped.startswith("{") and ('"results"' in head or '"test_info"' in head):
        return "perftest-json"
    if re.search(r"#bytes[ \t]{1,64}#iterations", head):
        return "perftest"
    base = os.path.basename(name)
    if base.startswith("osu_"):
        return "osu"
    if base.startswith("ib_"):
        return "perftest-json" if base.endswith(".json") else "perftest"
    if "hpcc" in base:
        return "hpcc"
    if "hpl" in base.lower():
        return "hpl"
    return None


def parse_text(text, source="<text>", kind=None, benchmark=None):
    _check_size(text, source)
    if text.startswith("HPLinpack benchmark input file"):
        raise ParseError(source, 1, "this is an HPL input file (HPL.dat / hpccinf.txt), not benchmark output",
                         text[:80].splitlines()[0])
    kind = kind or detect(text, source)
    if kind is None:
        raise ParseError(source, None, "cannot tell which benchmark wrote this output")
    if kind == "osu":
        return parse_osu(text, source, benchmark)
    if kind == "hpl":
        return parse_hpl(text, source)
    if kind == "hpcc":
        return parse_hpcc(text, source)
    if kind == "perftest":
        return parse_perftest(text, source, benchmark)
    if kind == "perftest-json":
        return parse_perftest_json(text, source, benchmark)
    raise ParseError(source, None, f"unknown output kind {kind!r}")


def parse_file(path, kind=None, benchmark=None):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read(MAX_INPUT + 1)   # more is refused without reading it all
    return parse_text(text, source=path, kind=kind, benchmark=benchmark)


# --------------------------------------------------------------------- OSU
# OSU 7.4 header columns -> (metric, reported, unit); "size", None (ignored:
# Iterations, DDT's Transmit Size) or "validation" (-c: Pass/Fail). Matched
# as whole names because OSU pads some columns with a single space ("-z" on
# bandwidth tests: "Bandwidth (MB/s) P50 Tail BW(MB/s) P90 Tail BW(MB/s)").
_OSU_COLUMNS = [
    (r"Size", "size"),
    (r"Avg Latency ?\((us|ms)\)", ("latency", "avg", None)),
    (r"Min Latency ?\((us|ms)\)", ("latency", "min", None)),
    (r"Max Latency ?\((us|ms)\)", ("latency", "max", None)),
    (r"Latency ?\((us|ms)\)", ("latency", "avg", None)),
    (r"Iterations", None),
    (r"Bandwidth ?\(MB/s\)", ("bandwidth", "avg", "MB/s")),
    (r"MB/s", ("bandwidth", "avg", "MB/s")),
    (r"Messages/s", ("message_rate", "avg", "msg/s")),
    (r"Validation", "validation"),
    (r"P(\d{1,3}(?:\.\d{1,3})?) Tail Lat\((us)\)", ("latency", "p", None)),
    (r"P(\d{1,3}(?:\.\d{1,3})?) Tail BW\(MB/s\)", ("bandwidth", "p", "MB/s")),
    (r"Transmit Size", None),
    # non-blocking collectives (osu_i*): Overall = Coll. Init + Compute + MPI_Test + MPI_Wait
    (r"Overall\((us)\)", ("latency", "overall", None)),
    (r"Compute\((us)\)", ("latency", "compute", None)),
    (r"Coll\. Init\((us)\)", ("latency", "coll_init", None)),
    (r"MPI_Test\((us)\)", ("latency", "mpi_test", None)),
    (r"MPI_Wait\((us)\)", ("latency", "mpi_wait", None)),
    (r"Pure Comm\.\((us)\)", ("latency", "pure_comm", None)),
    (r"Min Comm\.\((us)\)", ("latency", "min_comm", None)),
    (r"Max Comm\.\((us)\)", ("latency", "max_comm", None)),
    (r"Overlap\(%\)", ("overlap", "avg", "%")),
]
_OSU_COLUMN_RE = re.compile("|".join(f"(?P<c{k}>{pat})" for k, (pat, _) in enumerate(_OSU_COLUMNS)))
_OSU_HEADER_START = re.compile(r"(Size\b|Avg Latency ?\(|Latency ?\(|Overall\(|Bandwidth ?\(|MB/s)")


def _osu_columns(body, source, lineno, line):
    """Header body -> one entry per column (see _OSU_COLUMNS), every name known."""
    cols, pos = [], 0
    for m in _OSU_COLUMN_RE.finditer(body):
        if body[pos:m.start()].strip():
            raise ParseError(source, lineno, f"unknown OSU column {body[pos:m.start()].strip()[:80]!r}", line)
        pos = m.end()
        k = int(m.lastgroup[1:])
        kind = _OSU_COLUMNS[k][1]
        if isinstance(kind, tuple):
            metric, reported, unit = kind
            groups = [g for g in m.groups() if g is not None][1:]
            if reported == "p":
                reported = "p" + groups[0]
                groups = groups[1:]
            unit = unit or (groups[0] if groups else "us")
            kind = (metric, reported, unit)
        cols.append(kind)
    if body[pos:].strip():
        raise ParseError(source, lineno, f"unknown OSU column {body[pos:].strip()[:80]!r}", line)
    return cols


def _osu_name(title, version_line, source, lineno, line, wanted):
    """Title -> benchmark name; refuses titles OSU 7.4 does not print."""
    names = osu.names_for_title(title)
    if not names:
        raise ParseError(source, lineno, f"unknown OSU benchmark title {title[:80]!r} "
                         "(not one of OSU 7.4's MPI benchmarks)", line)
    if wanted:
        if wanted not in names:
            raise ParseError(source, lineno, f"{wanted} was run but the output is {names[0]}'s "
                             f"({title[:80]!r})", line)
        return wanted
    base = os.path.splitext(os.path.basename(str(source)))[0]
    for n in sorted(names, key=len, reverse=True):   # the file name picks among same-titled ones
        if base == n or base.startswith(n + "_") or base.startswith(n + "."):
            return n
    return names[0]


_OSU_PAIRS = re.compile(r"\[ {0,8}pairs: {0,8}(\d{1,9}) {0,8}\] {0,8}\[ {0,8}window size: {0,8}(\d{1,9}) {0,8}\]")
_OSU_INIT = re.compile(r"nprocs: {0,8}(\d{1,9}), {0,8}min: {0,8}(\S{1,32}) ms, {0,8}max: {0,8}(\S{1,32}) ms, {0,8}"
                       r"avg: {0,8}(\S{1,32}) ms")


def parse_osu(text, source="<text>", benchmark=None):
    lines = _lines(text, source)
    version = None
    wanted = benchmark if benchmark in osu.BENCHMARKS else None
    bench = None if wanted or benchmark is None else benchmark
    columns = None
    rows = []
    meta = {}
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("Invalid option") or s.startswith("Usage: osu_") or "invalid option --" in s:
            raise ParseError(source, i, "the benchmark rejected its options and printed its usage", s)
        if _MPI_FAILURE.search(s) or s.startswith("DATA VALIDATION ERROR"):
            # after results too: rows printed before a failed rank exit are not a good run
            raise ParseError(source, i, "MPI aborted the run" + (f" after {len(rows)} values"
                                                                 if rows else " before any result"), s)
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            t = osu.parse_title(body)
            if t is not None:
                version = t[1]
                if bench is None:
                    bench = _osu_name(t[0], body, source, i, s, wanted)
                    if bench == "osu_hello":
                        raise ParseError(source, i, "osu_hello prints no measurement "
                                         "(osu_init times MPI start-up)", s)
                continue
            if body.startswith("OSU "):
                raise ParseError(source, i, "unknown OSU benchmark title (not one of OSU 7.4's "
                                 "MPI benchmarks)", s)
            m = _OSU_PAIRS.match(body)
            if m:
                meta["pairs"], meta["window"] = int(m.group(1)), int(m.group(2))
                continue
            m = re.match(r"(Datatype|Window creation|Synchronization): {0,8}(\S{1,64}?)\.?$", body)
            if m:
                meta[m.group(1).lower().replace(" ", "_")] = m.group(2)
                continue
            m = re.match(r"kvm-sriov-bench MPI ping-pong", body)
            if m:
                bench = bench or "mpi_pingpong"
                version = version or "harness"
                continue
            if columns is None and _OSU_HEADER_START.match(body):
                columns = _osu_columns(body, source, i, line)
                continue
            continue  # other comment lines ("# Number of Sender threads", "# Overall = ...")
        m = _OSU_INIT.match(s)
        if m and bench == "osu_init":
            meta["nprocs"] = int(m.group(1))
            for reported, g in (("min", 2), ("max", 3), ("avg", 4)):
                rows.append({"benchmark": bench, "metric": "init_time", "unit": "ms", "size": 0,
                             "reported": reported, "value": _num(m.group(g), source, i, s), "line": i})
            continue
        if not _NUMERIC_START.match(s):
            continue  # warnings, banners, mpirun chatter
        if columns is None:
            raise ParseError(source, i, "data row before the OSU column header", s)
        tokens = s.split()
        if len(tokens) != len(columns):
            raise ParseError(source, i, f"expected {len(columns)} columns, got {len(tokens)}", s)
        size = 0
        values = []
        for col, tok in zip(columns, tokens):
            if col == "size":
                size = _int(tok, source, i, s)
            elif col == "validation":
                if tok != "Pass":
                    raise ParseError(source, i, f"OSU validation (-c) reports {tok[:40]!r}: the data "
                                     "received was wrong", s)
            else:
                v = _num(tok, source, i, s)
                if col is not None:
                    if v < 0:
                        raise ParseError(source, i, f"negative {col[0]} {tok[:40]!r}", s)
                    values.append((col, v))
        for (metric, reported, unit), v in values:
            if unit == "ms":
                v, unit = v * 1000.0, "us"
            rows.append({"benchmark": bench or "osu", "metric": metric, "unit": unit,
                         "size": size, "reported": reported, "value": v, "line": i})
    if version is None and columns is None:
        raise ParseError(source, None, "no OSU header ('# OSU MPI ... Test') found")
    if not rows:
        raise ParseError(source, len(lines) or None, "OSU output has no data rows (run cut short?)")
    return Parsed("osu", bench or "osu", version, str(source), rows, meta)


# --------------------------------------------------------------------- HPL
# A result line is 7 fields: T/V (WR11C2R4, ...) N NB P Q Time Gflops.
_HPL_VARIANT = re.compile(r"W[RC]\w{1,32}")
# The residual line "||Ax-b||_oo/(eps*(||A||_oo*||x||_oo+||b||_oo)*N)= 2.3e-03 ...... PASSED",
# matched after its last '='.
_HPL_RESID = re.compile(r"\s{0,64}(\S{1,64}?)\s{0,64}\.{1,64}\s{0,64}(PASSED|FAILED)\s{0,64}")


def _hpl_results(lines, source, offset=0):
    version = None
    results = []
    pending = None
    for i, line in enumerate(lines, 1 + offset):
        s = line.strip()
        m = re.match(r"HPLinpack (\S{1,32})", s)
        if m and version is None:
            version = m.group(1)
            continue
        fields = s.split() if s.startswith("W") else ()
        if len(fields) == 7 and _HPL_VARIANT.fullmatch(fields[0]):
            if pending is not None and pending["residual"] is None:
                raise ParseError(source, pending["line"], "HPL result without a residual check")
            n = _int(fields[1], source, i, s)
            nb = _int(fields[2], source, i, s)
            p = _int(fields[3], source, i, s)
            q = _int(fields[4], source, i, s)
            t = _num(fields[5], source, i, s)
            gf = _num(fields[6], source, i, s)
            if gf <= 0:
                raise ParseError(source, i, "HPL reported a non-positive Gflops", s)
            pending = {"variant": fields[0], "N": n, "NB": nb, "P": p, "Q": q,
                       "time": t, "gflops": gf, "line": i, "residual": None}
            results.append(pending)
            continue
        m = _HPL_RESID.fullmatch(s.rpartition("=")[2]) if s.startswith("||Ax-b||") and "=" in s else None
        if m:
            if pending is None:
                raise ParseError(source, i, "residual check without an HPL result", s)
            pending["residual"] = _num(m.group(1), source, i, s)
            if m.group(2) == "FAILED":
                raise ParseError(source, i, "HPL residual check FAILED: the result is wrong", s)
            continue
        if _MPI_FAILURE.search(s) and not results:
            raise ParseError(source, i, "MPI aborted the run before any result", s)
    if pending is not None and pending["residual"] is None:
        raise ParseError(source, pending["line"], "HPL result without a residual check (run cut short?)")
    return version, results


def parse_hpl(text, source="<text>"):
    lines = _lines(text, source)
    version, results = _hpl_results(lines, source)
    if not results:
        if version is None:
            raise ParseError(source, None, "no HPLinpack banner and no result line")
        raise ParseError(source, len(lines) or None, "HPL output has no result line (run cut short?)")
    return Parsed("hpl", "xhpl", version, str(source), hpl_rows("xhpl", results),
                  {"results": [{k: v for k, v in r.items()} for r in results]})


def hpl_rows(benchmark, results):
    """Two rows per HPL result (Gflops, seconds), size = N, and the rest of
    what makes it that run in ``params`` (variant, NB, P, Q): two NBs at one
    N are two groups, never pooled."""
    rows = []
    for r in results:
        params = f"{r['variant']} NB={r['NB']} P={r['P']} Q={r['Q']}"
        for metric, unit, key in (("gflops", "Gflops", "gflops"), ("time", "s", "time")):
            rows.append({"benchmark": benchmark, "metric": metric, "unit": unit, "size": r["N"],
                         "reported": "value", "value": r[key], "params": params, "line": r["line"]})
    return rows


# -------------------------------------------------------------------- hpcc
# summary key -> (benchmark, metric, unit, size key or None, scale, reported)
_HPCC_METRICS = [
    ("AvgPingPongLatency_usec", "hpcc_pingpong", "latency", "us", None, 1.0, "avg"),
    ("MinPingPongLatency_usec", "hpcc_pingpong", "latency", "us", None, 1.0, "min"),
    ("MaxPingPongLatency_usec", "hpcc_pingpong", "latency", "us", None, 1.0, "max"),
    ("AvgPingPongBandwidth_GBytes", "hpcc_pingpong", "bandwidth", "MB/s", None, 1000.0, "avg"),
    ("MinPingPongBandwidth_GBytes", "hpcc_pingpong", "bandwidth", "MB/s", None, 1000.0, "min"),
    ("MaxPingPongBandwidth_GBytes", "hpcc_pingpong", "bandwidth", "MB/s", None, 1000.0, "max"),
    ("RandomlyOrderedRingLatency_usec", "hpcc_ring_random", "latency", "us", None, 1.0, "avg"),
    ("RandomlyOrderedRingBandwidth_GBytes", "hpcc_ring_random", "bandwidth", "MB/s", None, 1000.0, "avg"),
    ("NaturallyOrderedRingLatency_usec", "hpcc_ring_natural", "latency", "us", None, 1.0, "avg"),
    ("NaturallyOrderedRingBandwidth_GBytes", "hpcc_ring_natural", "bandwidth", "MB/s", None, 1000.0, "avg"),
    ("StarDGEMM_Gflops", "hpcc_star_dgemm", "gflops", "Gflops", "DGEMM_N", 1.0, "avg"),
    ("MPIFFT_Gflops", "hpcc_mpifft", "gflops", "Gflops", "MPIFFT_N", 1.0, "value"),
    ("PTRANS_GBs", "hpcc_ptrans", "bandwidth", "MB/s", "PTRANS_n", 1000.0, "value"),
    ("MPIRandomAccess_GUPs", "hpcc_mpi_random_access", "gups", "GUP/s", "MPIRandomAccess_N", 1.0, "value"),
    ("StarSTREAM_Triad", "hpcc_star_stream_triad", "bandwidth", "MB/s", "STREAM_VectorSize", 1000.0, "avg"),
]
# hpcc's PingPong sizes: 8 bytes for latency, 2,000,000 bytes for bandwidth.
_HPCC_SIZES = {"latency": 8, "bandwidth": 2000000}


def parse_hpcc(text, source="<text>"):
    lines = _lines(text, source)
    start = end = None
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s == "Begin of Summary section.":
            start = i
        elif s == "End of Summary section.":
            end = i
    # the HPL section inside hpcc: same residual rules as standalone HPL
    version, hpl_results = _hpl_results(lines, source)
    if start is None:
        raise ParseError(source, len(lines) or None,
                         "hpcc output has no 'Begin of Summary section.' (run cut short?)")
    if end is None:
        raise ParseError(source, len(lines), "hpcc summary section is not closed (run cut short?)")
    summary = {}
    for i in range(start + 1, end):
        s = lines[i - 1].strip()
        if not s:
            continue
        if "=" not in s:
            raise ParseError(source, i, "hpcc summary line is not key=value", s)
        k, v = s.split("=", 1)
        summary[k.strip()] = (v.strip(), i)
    ok = summary.get("Success", ("", None))
    if ok[0] != "1":
        raise ParseError(source, ok[1] or start, "hpcc reports Success!=1 (a test failed)",
                         f"Success={ok[0]}")
    if "HPL_Tflops" not in summary:
        raise ParseError(source, start, "hpcc summary has no HPL_Tflops")
    if not hpl_results:
        raise ParseError(source, start, "hpcc output has no HPL result line (W...) before its summary")
    # hpcc's HPL is HPL 2.0 inside hpcc, not xhpl: its own name
    rows = hpl_rows("hpcc_hpl", hpl_results)
    for key, bench, metric, unit, size_key, scale, reported in _HPCC_METRICS:
        if key not in summary:
            continue
        raw, i = summary[key]
        v = _num(raw, source, i, f"{key}={raw}")
        if v < 0:  # hpcc writes -1 for tests it skipped
            continue
        if size_key:
            size = _int(summary[size_key][0], source, summary[size_key][1], size_key) \
                if size_key in summary else 0
        else:
            size = _HPCC_SIZES.get(metric, 0)
        rows.append({"benchmark": bench, "metric": metric, "unit": unit, "size": size,
                     "reported": reported, "value": v * scale, "line": i})
    meta = {k: v for k, (v, _) in summary.items()}
    meta["hpl_version"] = version
    meta["hpl_results"] = hpl_results
    ver = ".".join(meta.get(k, "?") for k in ("VersionMajor", "VersionMinor", "VersionMicro"))
    return Parsed("hpcc", "hpcc", ver, str(source), rows, meta)


# ---------------------------------------------------------------- perftest
# a column name: "#bytes", "#iterations", "t_min[usec]", "BW peak[MB/sec]", "99.9% percentile[usec]"
_PT_COLUMN = re.compile(r"#bytes|#iterations|[\w.%]{1,32}(?: [\w.%]{1,32})?\[[^\]]{1,16}\]")


def _perftest_column(name, source, i, line):
    low = name.lower()
    if low == "#bytes":
        return "size"
    if low == "#iterations":
        return None
    m = re.match(r"t_(min|max|typical|avg|stdev)\[usec\]", low)
    if m:
        return ("latency", m.group(1), "us", 1.0)
    m = re.match(r"([\d.]{1,8})% percentile\[usec\]", low)
    if m:
        return ("latency", "p" + m.group(1), "us", 1.0)
    m = re.match(r"bw (peak|average)\[(mb/sec|gb/sec)\]", low)
    if m:
        reported = "peak" if m.group(1) == "peak" else "avg"
        # perftest MB/sec = MiB/s; Gb/sec = 10^9 bit/s; store 10^6 B/s
        scale = MIB if m.group(2) == "mb/sec" else 125.0
        if "Gb/sec" in name:
            scale = 125.0
        return ("bandwidth", reported, "MB/s", scale)
    m = re.match(r"msgrate\[mpps\]", low)
    if m:
        return ("message_rate", "avg", "msg/s", 1e6)
    raise ParseError(source, i, f"unknown perftest column {name[:80]!r}", line)


def _perftest_name(text, source):
    m = re.search(r"(RDMA_Write|RDMA_Read|Send|Atomic(?:_\w{1,32})?)\s{1,16}(BW|Latency|Lat)\s{1,16}Test", text)
    if not m:
        base = os.path.basename(str(source))
        m2 = re.match(r"(ib_(?:write|read|send|atomic)_(?:lat|bw))", base)
        return m2.group(1) if m2 else "perftest"
    verb = {"rdma_write": "write", "rdma_read": "read", "send": "send"}.get(
        m.group(1).lower(), "atomic")
    return f"ib_{verb}_{'bw' if m.group(2) == 'BW' else 'lat'}"


def parse_perftest(text, source="<text>", benchmark=None):
    lines = _lines(text, source)
    columns = None
    rows = []
    bench = benchmark or _perftest_name(text, source)
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#bytes"):
            columns = [_perftest_column(n, source, i, s) for n in _PT_COLUMN.findall(s)]
            continue
        if re.match(r"(Couldn't|Unable|Failed|ERROR|Error)", s) and not rows:
            raise ParseError(source, i, "perftest failed before any result", s)
        if columns is None or not _NUMERIC_START.match(s):
            continue
        tokens = s.split()
        if len(tokens) != len(columns):
            raise ParseError(source, i, f"expected {len(columns)} columns, got {len(tokens)}", s)
        size = 0
        for col, tok in zip(columns, tokens):
            if col == "size":
                size = _int(tok, source, i, s)
                continue
            v = _num(tok, source, i, s)
            if col is None:
                continue
            metric, reported, unit, scale = col
            rows.append({"benchmark": bench, "metric": metric, "unit": unit, "size": size,
                         "reported": reported, "value": v * scale, "line": i})
    if columns is None:
        raise ParseError(source, None, "no perftest '#bytes #iterations ...' header found")
    if not rows:
        raise ParseError(source, len(lines), "perftest output has no data rows")
    return Parsed("perftest", bench, None, str(source), rows, {})


_PT_JSON_KEYS = {
    "t_min": ("latency", "min", 1.0), "t_max": ("latency", "max", 1.0),
    "t_typical": ("latency", "typical", 1.0), "t_avg": ("latency", "avg", 1.0),
    "t_stdev": ("latency", "stdev", 1.0),
    "bw_peak": ("bandwidth", "peak", MIB), "bw_average": ("bandwidth", "avg", MIB),
    "msgrate": ("message_rate", "avg", 1e6),
}


def parse_perftest_json(text, source="<text>", benchmark=None):
    _check_size(text, source)
    too_deep = f"perftest JSON nested more than {MAX_JSON_DEPTH} deep"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(source, e.lineno, f"invalid perftest JSON ({e.msg})") from None
    except RecursionError:   # deeper than Python's own limit
        raise ParseError(source, None, too_deep) from None
    if _json_depth(doc) > MAX_JSON_DEPTH:
        raise ParseError(source, None, too_deep)
    if not isinstance(doc, dict) or "results" not in doc:
        raise ParseError(source, None, "perftest JSON has no 'results'")
    info = doc.get("test_info") or {}
    bench = benchmark or _perftest_name(json.dumps(info), source)
    results = doc["results"]
    if isinstance(results, dict):
        results = [results]
    gbits = str(info.get("report_gbits", info.get("Report_gbits", ""))).upper() in ("ON", "TRUE", "1")
    rows = []
    for r in results:
        if not isinstance(r, dict):
            raise ParseError(source, None, "perftest JSON result is not an object")
        size = r.get("MsgSize", r.get("msg_size", r.get("bytes")))
        if size is None:
            raise ParseError(source, None, "perftest JSON result without MsgSize")
        size = _int(str(size), source, None, "MsgSize")
        for key, val in r.items():
            low = key.lower()
            m = re.match(r"(?:t_)?(\d{1,3}(?:[._]\d{1,3})?)_?percentile|percentile_?(\d{1,3}(?:[._]\d{1,3})?)", low)
            if m:
                col = ("latency", "p" + (m.group(1) or m.group(2)).replace("_", "."), 1.0)
            elif low in _PT_JSON_KEYS:
                col = _PT_JSON_KEYS[low]
            else:
                continue
            v = _num(str(val), source, None, f"{key}={val}")
            scale = col[2]
            if col[0] == "bandwidth" and gbits:
                scale = 125.0
            rows.append({"benchmark": bench, "metric": col[0], "size": size, "reported": col[1],
                         "unit": {"latency": "us", "bandwidth": "MB/s"}.get(col[0], "msg/s"),
                         "value": v * scale, "line": None})
    if not rows:
        raise ParseError(source, None, "perftest JSON has no known result fields")
    return Parsed("perftest", bench, None, str(source), rows, {"test_info": info})


def _json_depth(doc):
    """How deep lists and objects nest in doc (walked without recursion)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        value, level = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest
