"""Host configuration: one TOML file with documented defaults.

Files are merged in this order, later ones winning key by key:
built-in defaults, the cluster-wide file that travels with OpenNebula's
remotes (``<remotes>/etc/vmm/kvm-sriov/kvm-sriov.toml``), the host-local
``/etc/kvm-sriov/kvm-sriov.toml``, and the file named by ``$KVM_SRIOV_CONFIG``.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from pathlib import Path
    from typing import Any, Optional, Sequence

from .errors import ConfigError
from .vf.sysfs import normalize_pci_address

HOST_CONFIG = "/etc/kvm-sriov/kvm-sriov.toml"
REMOTES_CONFIG = "etc/vmm/kvm-sriov/kvm-sriov.toml"  # relative to remotes/
ENV_CONFIG = "KVM_SRIOV_CONFIG"

DEFAULTS: dict[str, dict[str, Any]] = {
    "pool": {
        "pfs": [],
        "skip_vfs_in_host_use": True,
        "exclude_vfs": [],
        "state_dir": "/var/lib/one/kvm-sriov",
        "reservation_grace_seconds": 300,
        "numa_policy": "prefer",
    },
    "network": {"bridge": "ib-sriov"},
    "libvirt": {"uri": "qemu:///system"},
    "timeouts": {"shutdown_seconds": 300, "lock_seconds": 60, "hotplug_seconds": 60,
                 "detach_retry_seconds": 15, "migrate_seconds": 3600},
    "migration": {
        "dest_uri": "qemu+ssh://{host}/system",
        "peer_command": ["ssh", "-o", "BatchMode=yes", "--", "{host}"],  # no host read as an option
        "peer_remotes": "/var/tmp/one",
        "live": True,
    },
    "sysfs": {"root": "/"},
    "infiniband": {
        "guid_policy": "mac",
        "partitions_file": "/etc/opensm/partitions.conf",
        # IPoIB and the subnet manager (docs/infiniband.md)
        "ip_command": "ip",
        "default_partition_members": ["SELF=full", "ALL_SWITCHES=full"],
        "sm_reload_command": ["systemctl", "kill", "--signal=HUP", "opensm.service"],
        "sm_config": "",
        # the front-end's network hook (docs/infiniband.md): keys for KVM_SRIOV_PKEY = "AUTO"
        # ("0x1000-0x1fff"; "": none), and how the file reaches the SM node ([]: this machine
        # is the SM node; else a command reading the file on stdin, e.g. ssh sm1 kvm-sriov
        # partitions --install - --reload)
        "pkey_range": "",
        # keys of that range one owner, and one group, may hold (oneadmin's: no limit)
        "pkeys_per_user": 16,
        "pkeys_per_group": 64,
        "sm_push_command": [],
        "sm_push_seconds": 8,
    },
    "hpc": {
        "profile": False,
        "hugepages": True,
        "hugepage_size_kib": 0,
    },
    # shared-memory regions (docs/ivshmem.md): what a tenant's SIZE may take
    "ivshmem": {
        "max_region_mb": 1024,   # per region (a tenant may ask up to 65536)
        "max_host_mb": 0,        # all regions of the host; 0: half of /dev/shm's size
        "max_owner_mb": 0,       # all regions of one owner (uid) on the host; 0: half of max_host_mb
    },
    # oned.conf's DATASTORE_LOCATION; "": the one oned names in each action
    # (its system datastore's BASE_PATH), so deployment files stay inside it
    "opennebula": {"datastore_location": ""},
}

GUID_POLICIES = ("mac", "none")

NUMA_POLICIES = ("prefer", "require", "ignore")


# collections.namedtuple, not typing.NamedTuple: the monitoring probe does
# not import typing. Each field with its type (and default) beside it.
class Config(namedtuple("Config", [
        "pfs",  # tuple[str, ...]
        "skip_vfs_in_host_use",  # bool
        "exclude_vfs",  # tuple[str, ...]
        "state_dir",  # Path
        "reservation_grace_seconds",  # float
        "numa_policy",  # str
        "bridge",  # str
        "libvirt_uri",  # str
        "shutdown_seconds",  # float
        "lock_seconds",  # float
        "hotplug_seconds",  # float
        "detach_retry_seconds",  # float
        "migrate_seconds",  # float
        "dest_uri",  # str
        "peer_command",  # tuple[str, ...]
        "peer_remotes",  # str
        "live_migration",  # bool
        "sysfs_root",  # Path
        "guid_policy",  # str
        "partitions_file",  # Path
        "sources",  # tuple[str, ...] = ()
        # InfiniBand extras (docs/infiniband.md)
        "ip_command",  # str = "ip"
        "default_partition_members",  # tuple[str, ...] = ("SELF=full", "ALL_SWITCHES=full")
        "sm_reload_command",  # tuple[str, ...] = ()
        "sm_config",  # Optional[Path] = None
        "pkey_range",  # Optional[tuple[int, int]] = None
        "pkeys_per_user",  # int = 16
        "pkeys_per_group",  # int = 64
        "sm_push_command",  # tuple[str, ...] = ()
        "sm_push_seconds",  # float = 8
        "hpc_profile",  # bool = False
        "hpc_hugepages",  # bool = True
        "hpc_hugepage_size_kib",  # int = 0
        "ivshmem_max_region_mb",  # int = 1024
        "ivshmem_max_host_mb",  # int = 0
        "ivshmem_max_owner_mb",  # int = 0
        "datastore_location",  # str = ""
        ],
        defaults=((), "ip", ("SELF=full", "ALL_SWITCHES=full"), (), None, None, 16, 64, (), 8, False, True, 0, 1024, 0, 0, "",))):
    __slots__ = ()

    @property
    def pool_db(self) -> Path:
        return self.state_dir / "pool.sqlite3"

    def text(self, name: str) -> str:
        """A path field, or pool_db, as text: no pathlib (the probe)."""
        if name == "pool_db":
            return os.path.join(self.text("state_dir"), "pool.sqlite3")
        return os.fspath(tuple.__getitem__(self, self._fields.index(name)))


def _path_field(index: int) -> property:
    def get(self):
        value = tuple.__getitem__(self, index)
        if value is None:
            return None
        from pathlib import Path
        return Path(value)
    return property(get)


# The path fields are kept as text and made Paths when read: pathlib (with re,
# fnmatch and urllib) would be a third of the monitoring probe's start.
for _name in ("state_dir", "sysfs_root", "partitions_file", "sm_config"):
    setattr(Config, _name, _path_field(Config._fields.index(_name)))


def pkey_range(text: str) -> Optional[tuple[int, int]]:
    """infiniband.pkey_range: '0x1000-0x1fff' -> (0x1000, 0x1fff); '' -> None (no automatic keys)."""
    t = (text or "").strip().lower()
    if not t:
        return None
    import re  # here, not at the top: the monitoring probe loads this module and never re
    m = re.fullmatch(r"(0x[0-9a-f]{1,4}|[0-9]{1,5})\s*-\s*(0x[0-9a-f]{1,4}|[0-9]{1,5})", t)
    if not m:
        raise ConfigError(f"infiniband.pkey_range {text!r} is not a range like 0x1000-0x1fff")
    low, high = (int(x, 16) if x.startswith("0x") else int(x) for x in m.groups())
    if not 1 <= low <= high <= 0x7FFE:
        raise ConfigError(f"infiniband.pkey_range {text!r} must lie within 0x0001-0x7ffe, low to high "
                          f"(the membership bit is set by PKEY_MEMBERSHIP, 0x7fff is the default partition)")
    return low, high


def _merge(base: dict, extra: Mapping, origin: str) -> None:
    for section, values in extra.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{origin}: unknown section [{section}]")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: [{section}] must be a table")
        for key, value in values.items():
            if key not in DEFAULTS[section]:
                raise ConfigError(f"{origin}: unknown key {section}.{key}")
            expected = type(DEFAULTS[section][key])
            numeric = expected in (int, float) and isinstance(value, (int, float))
            if not (isinstance(value, expected) or numeric) or isinstance(value, bool) != (expected is bool):
                raise ConfigError(
                    f"{origin}: {section}.{key} must be {expected.__name__}, got {value!r}")
            base[section][key] = value


def _read(path: Path) -> dict:
    """A file names commands the driver runs (sm_reload_command, ip_command):
    read only when nobody but root and this user can have changed it, by the
    rule the entry points apply to the library (kvm_sriov_bootstrap.py)."""
    from kvm_sriov_bootstrap import untrusted
    real = os.path.realpath(path)  # what is checked is what is read
    try:
        with open(real, "rb") as fh:
            why = untrusted(real)
            if why:
                raise ConfigError(f"{path} is not read: {why} (another user could change what it runs)")
            text = fh.read().decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    plain = _plain_toml(text)
    if plain is not None:
        return plain
    try:  # Python 3.11+ (Debian 12); RHEL 9's 3.9 has python3-tomli
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


# The plain TOML these files are written in, read without tomllib (which
# imports re, typing and datetime: a third of the monitoring probe's time).
# Anything else, errors included, is left to tomllib (None); for what it
# accepts the result is tomllib's (tests/driver/test_config_plain_toml.py).
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = frozenset("0123456789")


def _plain_toml(text: str) -> Optional[dict]:
    if not text.isascii() or not text.replace("\n", "").replace("\t", "").isprintable() or "\\" in text:
        return None
    out: dict = {}
    table = out
    for line in text.split("\n"):
        line = line.strip(" \t")
        if not line or line[0] == "#":
            continue
        if line[0] == "[":
            name, end, rest = line[1:].partition("]")
            name = name.strip(" \t")
            if not end or not _BARE.issuperset(name) or not name or name in out or not _comment(rest):
                return None
            table = out[name] = {}
            continue
        key, eq, rest = line.partition("=")
        key = key.strip(" \t")
        if not eq or not key or not _BARE.issuperset(key) or key in table:
            return None
        value, rest = _plain_value(rest.lstrip(" \t"), True)
        if rest is None or not _comment(rest):
            return None
        table[key] = value
    return out


def _comment(rest: str) -> bool:
    rest = rest.lstrip(" \t")
    return not rest or rest[0] == "#"


def _plain_value(text: str, array_ok: bool):
    """(value, the rest of the line) or (None, None): a one-line string
    without escapes, a decimal integer, a boolean, or a one-line array of those."""
    if text[:1] in ('"', "'"):
        q = text[0]
        end = text.find(q, 1)
        if end < 0 or text[1:3] == q * 2:   # unterminated, or a multi-line string
            return None, None
        return text[1:end], text[end + 1:]
    if text[:1] == "[" and array_ok:
        items, rest = [], text[1:].lstrip(" \t")
        while rest[:1] != "]":
            item, rest = _plain_value(rest, False)
            if rest is None:
                return None, None
            items.append(item)
            rest = rest.lstrip(" \t")
            if rest[:1] == ",":
                rest = rest[1:].lstrip(" \t")
            elif rest[:1] != "]":
                return None, None
        return items, rest[1:]
    n = 0
    while n < len(text) and text[n] not in " \t,]#":
        n += 1
    word, rest = text[:n], text[n:]
    if word in ("true", "false"):
        return word == "true", rest
    digits = word[1:] if word[:1] in ("+", "-") else word
    if digits and _DIGITS.issuperset(digits) and (digits == "0" or digits[0] != "0"):
        return int(word), rest
    return None, None


def config_files(remotes_dir: Optional[Path]) -> list[Path]:
    """The files that exist, in merge order."""
    found = []
    if remotes_dir is not None and os.path.isfile(os.path.join(remotes_dir, REMOTES_CONFIG)):
        found.append(os.path.join(remotes_dir, REMOTES_CONFIG))
    if os.path.isfile(HOST_CONFIG):
        found.append(HOST_CONFIG)
    env = os.environ.get(ENV_CONFIG)
    if env:
        if not os.path.isfile(env):
            raise ConfigError(f"${ENV_CONFIG} names {env}, which does not exist")
        found.append(env)
    return found


def load(remotes_dir: Optional[Path] = None, files: Optional[Sequence[Path]] = None,
         overrides: Optional[Mapping] = None) -> Config:
    merged = {s: {k: list(v) if isinstance(v, list) else v for k, v in d.items()} for s, d in DEFAULTS.items()}
    paths = list(files) if files is not None else config_files(remotes_dir)
    for path in paths:
        _merge(merged, _read(path), str(path))
    if overrides:
        _merge(merged, overrides, "overrides")
    return _build(merged, tuple(str(p) for p in paths))


def _build(m: dict, sources: tuple[str, ...]) -> Config:
    pool = m["pool"]
    if not all(isinstance(s, str) and s.strip() for s in pool["pfs"]):
        raise ConfigError("pool.pfs must be a list of non-empty strings")
    excluded = []
    for text in pool["exclude_vfs"]:
        address = normalize_pci_address(text) if isinstance(text, str) else None
        if not address:
            raise ConfigError(f"pool.exclude_vfs: {text!r} is not a PCI address")
        excluded.append(address)
    mig = m["migration"]
    if not mig["peer_command"] or not all(isinstance(a, str) for a in mig["peer_command"]):
        raise ConfigError("migration.peer_command must be a non-empty list of strings")
    if pool["numa_policy"] not in NUMA_POLICIES:
        raise ConfigError(f"pool.numa_policy must be one of {', '.join(NUMA_POLICIES)}")
    for key in ("reservation_grace_seconds",):
        if pool[key] < 0:
            raise ConfigError(f"pool.{key} must be >= 0")
    for key, value in m["timeouts"].items():
        if value <= 0:
            raise ConfigError(f"timeouts.{key} must be > 0")
    if m["timeouts"]["detach_retry_seconds"] < 6:  # a repeat inside the guest's 5 s blink cancels it
        raise ConfigError("timeouts.detach_retry_seconds must be >= 6")
    bridge = m["network"]["bridge"]
    if not bridge or ":" in bridge:
        raise ConfigError("network.bridge must be a non-empty name without ':'")
    ib, hpc = m["infiniband"], m["hpc"]
    if ib["guid_policy"] not in GUID_POLICIES:
        raise ConfigError(f"infiniband.guid_policy must be one of {', '.join(GUID_POLICIES)}")
    for key in ("default_partition_members", "sm_reload_command", "sm_push_command"):
        if not all(isinstance(s, str) and s.strip() for s in ib[key]):
            raise ConfigError(f"infiniband.{key} must be a list of non-empty strings")
    key_range = pkey_range(ib["pkey_range"])
    for key in ("pkeys_per_user", "pkeys_per_group"):
        if not (type(ib[key]) is int and ib[key] >= 1):
            raise ConfigError(f"infiniband.{key} must be a whole number >= 1")
    if not 1 <= ib["sm_push_seconds"] <= 600:
        raise ConfigError("infiniband.sm_push_seconds must be from 1 to 600")
    if hpc["hugepage_size_kib"] < 0:
        raise ConfigError("hpc.hugepage_size_kib must be >= 0")
    shm = m["ivshmem"]
    if not (isinstance(shm["max_region_mb"], int) and 1 <= shm["max_region_mb"] <= 65536):
        raise ConfigError("ivshmem.max_region_mb must be a whole number of MB from 1 to 65536")
    if not (isinstance(shm["max_host_mb"], int) and shm["max_host_mb"] >= 0):
        raise ConfigError("ivshmem.max_host_mb must be a whole number of MB >= 0 (0: half of /dev/shm)")
    if not (isinstance(shm["max_owner_mb"], int) and shm["max_owner_mb"] >= 0):
        raise ConfigError("ivshmem.max_owner_mb must be a whole number of MB >= 0 (0: half of max_host_mb)")
    location = m["opennebula"]["datastore_location"]
    if not isinstance(location, str) or (location and not location.startswith("/")):
        raise ConfigError("opennebula.datastore_location must be an absolute path (or \"\")")
    return Config(
        pfs=tuple(s.strip() for s in pool["pfs"]),
        skip_vfs_in_host_use=pool["skip_vfs_in_host_use"],
        exclude_vfs=tuple(excluded),
        state_dir=pool["state_dir"],
        reservation_grace_seconds=float(pool["reservation_grace_seconds"]),
        numa_policy=pool["numa_policy"],
        bridge=bridge,
        libvirt_uri=m["libvirt"]["uri"],
        shutdown_seconds=float(m["timeouts"]["shutdown_seconds"]),
        lock_seconds=float(m["timeouts"]["lock_seconds"]),
        hotplug_seconds=float(m["timeouts"]["hotplug_seconds"]),
        detach_retry_seconds=float(m["timeouts"]["detach_retry_seconds"]),
        migrate_seconds=float(m["timeouts"]["migrate_seconds"]),
        dest_uri=mig["dest_uri"],
        peer_command=tuple(mig["peer_command"]),
        peer_remotes=mig["peer_remotes"],
        live_migration=mig["live"],
        sysfs_root=m["sysfs"]["root"],
        guid_policy=m["infiniband"]["guid_policy"],
        partitions_file=m["infiniband"]["partitions_file"],
        sources=sources,
        ip_command=ib["ip_command"],
        default_partition_members=tuple(ib["default_partition_members"]),
        sm_reload_command=tuple(ib["sm_reload_command"]),
        sm_config=ib["sm_config"] or None,
        pkey_range=key_range,
        pkeys_per_user=ib["pkeys_per_user"],
        pkeys_per_group=ib["pkeys_per_group"],
        sm_push_command=tuple(ib["sm_push_command"]),
        sm_push_seconds=float(ib["sm_push_seconds"]),
        hpc_profile=hpc["profile"],
        hpc_hugepages=hpc["hugepages"],
        hpc_hugepage_size_kib=int(hpc["hugepage_size_kib"]),
        ivshmem_max_region_mb=shm["max_region_mb"],
        ivshmem_max_host_mb=shm["max_host_mb"],
        ivshmem_max_owner_mb=shm["max_owner_mb"],
        datastore_location=location,
    )
