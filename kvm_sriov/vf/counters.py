"""Traffic counters of a PF's VFs, as the host sees them.

OpenNebula's VM monitoring counts bytes on a VM's tap devices; a VF passed
through to the guest has none, so its InfiniBand traffic is invisible
there. The PF's driver reports per-VF counters over netlink (mlx5 does, for
IB VFs too: IFLA_VF_STATS), and ``ip -s -j link show dev <pf>`` prints them
under ``vfinfo_list``. The names below are those of iproute2's
print_vf_stats64 (ip/ipaddress.c): ``stats.rx`` has ``bytes``, ``packets``,
``multicast``, ``broadcast`` and, when the kernel sends it, ``dropped``;
``stats.tx`` has ``tx_bytes``, ``tx_packets`` and maybe ``dropped`` (the tx
names carry the prefix, the rx ones do not).

A VF printed without ``stats`` (a driver without per-VF counters, or an
older kernel) has no counters: it is left out, which is not an error. Any
other surprise in the output is one CountersError; the output is bounded
before it is parsed.
"""

from __future__ import annotations

import json
import subprocess
from typing import Callable, NamedTuple, Optional, Union

from ..errors import DriverError

MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # 127 VFs print a few tens of kB
MAX_VFS = 4096                        # VF indexes are below this (PCIe TotalVFs is far lower)
MAX_COUNTER = 2 ** 64                 # the kernel's counters are u64
TIMEOUT_SECONDS = 10                  # mlx5 asks the firmware once per VF
IFNAMSIZ = 16                         # the kernel's bound, with the trailing NUL
_MAX_DIGITS = 20                      # len(str(2**64 - 1)); longer numbers are refused unparsed


class CountersError(DriverError):
    """The VF counters could not be read, or the output was not what iproute2 prints."""


class VfCounters(NamedTuple):
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_dropped: Optional[int] = None  # None: the kernel does not send it
    tx_dropped: Optional[int] = None


def parse(text: Union[bytes, str]) -> dict[int, VfCounters]:
    """VF index -> counters, from ``ip -s -j link show dev <pf>``'s output
    (a JSON array holding the PF's link object). VFs without ``stats`` are
    not in the result; a PF without ``vfinfo_list`` gives {}."""
    if len(text) > MAX_OUTPUT_BYTES:
        raise CountersError(f"ip link output is larger than {MAX_OUTPUT_BYTES} bytes: refused")
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        links = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise CountersError(f"ip link output is not the JSON iproute2 prints: {str(exc)[:120]}") from None
    if not isinstance(links, list) or len(links) != 1 or not isinstance(links[0], dict):
        raise CountersError("ip link output is not a list of one link object")
    vfs = links[0].get("vfinfo_list", [])
    if not isinstance(vfs, list):
        raise CountersError("ip link output: vfinfo_list is not a list")
    if len(vfs) > MAX_VFS:
        raise CountersError(f"ip link output lists {len(vfs)} VFs, more than {MAX_VFS}")
    seen: set[int] = set()
    out: dict[int, VfCounters] = {}
    for entry in vfs:
        if not isinstance(entry, dict):
            raise CountersError("ip link output: an entry of vfinfo_list is not an object")
        index = entry.get("vf")
        if not _is_int(index) or not 0 <= index < MAX_VFS:
            raise CountersError(f"ip link output: VF index {str(index)[:40]!r} is not a number below {MAX_VFS}")
        if index in seen:
            raise CountersError(f"ip link output lists VF {index} twice")
        seen.add(index)
        if "stats" in entry:
            out[index] = _counters(index, entry["stats"])
    return out


def _counters(index: int, stats) -> VfCounters:
    where = f"ip link output: VF {index}"
    if not isinstance(stats, dict) or not isinstance(stats.get("rx"), dict) \
            or not isinstance(stats.get("tx"), dict):
        raise CountersError(f"{where}: stats is not an object with rx and tx objects")
    rx, tx = stats["rx"], stats["tx"]
    return VfCounters(rx_bytes=_counter(where, rx, "rx", "bytes"),
                      tx_bytes=_counter(where, tx, "tx", "tx_bytes"),
                      rx_packets=_counter(where, rx, "rx", "packets"),
                      tx_packets=_counter(where, tx, "tx", "tx_packets"),
                      rx_dropped=_counter(where, rx, "rx", "dropped", required=False),
                      tx_dropped=_counter(where, tx, "tx", "dropped", required=False))


def _counter(where: str, obj: dict, side: str, key: str, required: bool = True) -> Optional[int]:
    if key not in obj and not required:
        return None
    value = obj.get(key)
    if not _is_int(value) or not 0 <= value < MAX_COUNTER:
        raise CountersError(f"{where}: stats.{side}.{key} {str(value)[:40]!r} is not a counter (0 to 2**64-1)")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded_int(digits: str) -> int:
    # Refuse before converting: a megabyte of digits costs seconds to turn
    # into an int on Pythons without the 4300-digit limit.
    if len(digits.lstrip("-")) > _MAX_DIGITS:
        raise ValueError(f"a number of {len(digits)} digits")
    return int(digits)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number iproute2 prints")


def valid_netdev(name) -> bool:
    """A name the kernel accepts for a network interface (dev_valid_name:
    1 to 15 bytes, not . or .., no '/', ':' or white space) that ``ip``
    cannot take for an option (no leading '-'). Printable ASCII only: the
    kernel would take more, but the name goes into log lines and no PF of
    an OpenNebula host is named otherwise."""
    return isinstance(name, str) and 0 < len(name) < IFNAMSIZ and name not in (".", "..") \
        and not name.startswith("-") and all("!" <= c <= "~" and c not in "/:" for c in name)


def read(pf_netdev: str, run: Callable = subprocess.run, ip_command: str = "ip") -> dict[int, VfCounters]:
    """The counters of ``pf_netdev``'s VFs (parse), from ``ip -s -j link show``."""
    if not valid_netdev(pf_netdev):
        raise CountersError(f"not a network interface name: {str(pf_netdev)[:40]!r}")
    cmd = [ip_command, "-s", "-j", "link", "show", "dev", pf_netdev]
    try:
        done = run(cmd, capture_output=True, timeout=TIMEOUT_SECONDS, check=False)
    except FileNotFoundError:
        raise CountersError(f"{ip_command} not found: install iproute2") from None
    except subprocess.TimeoutExpired:
        raise CountersError(f"{' '.join(cmd)} gave no answer within {TIMEOUT_SECONDS} s") from None
    except OSError as exc:
        raise CountersError(f"{' '.join(cmd)}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace") if isinstance(done.stderr, bytes) else str(done.stderr or "")
        first = err.strip().splitlines()[0][:200] if err.strip() else f"exit status {done.returncode}"
        raise CountersError(f"{' '.join(cmd)} failed: {first}")
    return parse(done.stdout)
