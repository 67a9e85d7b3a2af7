"""Host configuration: one TOML file with documented defaults.

Files are merged in this order, later ones winning key by key:
built-in defaults, the cluster-wide file that travels with OpenNebula's
remotes (``<remotes>/etc/vmm/kvm-sriov/kvm-sriov.toml``), the host-local
``/etc/kvm-sriov/kvm-sriov.toml``, and the file named by ``$KVM_SRIOV_CONFIG``.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from .errors import ConfigError
from .vf.sysfs import normalize_pci_address

HOST_CONFIG = "/etc/kvm-sriov/kvm-sriov.toml"
REMOTES_CONFIG = "etc/vmm/kvm-sriov/kvm-sriov.toml"  # relative to remotes/
ENV_CONFIG = "KVM_SRIOV_CONFIG"

DEFAULTS: dict[str, dict[str, Any]] = {
    "pool": {
        "pfs": [],
        "skip_vfs_in_host_use": True,
        "whole_pfs": False,
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
    # who makes the fabric enforce the partitions (docs/infiniband.md, 2.3): "opensm"
    # (partitions.conf on each SM node) or "ufm" (its REST API)
    "fabric": {
        "manager": "opensm",
        # opensm: every SM node, master and standbys, each sent the file through
        # infiniband.sm_push_command with {node} replaced ([]: the one SM node as before)
        "sm_nodes": [],
        # reads an SM node's partitions file back, {node} replaced ([]: only this machine's)
        "sm_read_command": [],
        # ufm: its address (https://ufm.example.org), a file only oneadmin can read holding
        # user:password, the CA that signed its certificate ("": the system's), each call's
        # timeout and the tries after a failed one (connection errors, timeouts, 429, 5xx)
        "ufm_url": "",
        "ufm_credentials": "",
        "ufm_ca_file": "",
        "ufm_seconds": 10,
        "ufm_retries": 3,
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


class Config(NamedTuple):
    """The merged configuration (load()); immutable, _replace gives a changed copy."""
    pfs: tuple[str, ...]
    skip_vfs_in_host_use: bool
    whole_pfs: bool
    exclude_vfs: tuple[str, ...]
    state_dir: Path
    reservation_grace_seconds: float
    numa_policy: str
    bridge: str
    libvirt_uri: str
    shutdown_seconds: float
    lock_seconds: float
    hotplug_seconds: float
    detach_retry_seconds: float
    migrate_seconds: float
    dest_uri: str
    peer_command: tuple[str, ...]
    peer_remotes: str
    live_migration: bool
    sysfs_root: Path
    guid_policy: str
    partitions_file: Path
    sources: tuple[str, ...] = ()
    # InfiniBand extras (docs/infiniband.md)
    ip_command: str = "ip"
    default_partition_members: tuple[str, ...] = ("SELF=full", "ALL_SWITCHES=full")
    sm_reload_command: tuple[str, ...] = ()
    sm_config: Optional[Path] = None
    pkey_range: Optional[tuple[int, int]] = None
    pkeys_per_user: int = 16
    pkeys_per_group: int = 64
    sm_push_command: tuple[str, ...] = ()
    sm_push_seconds: float = 8
    hpc_profile: bool = False
    hpc_hugepages: bool = True
    hpc_hugepage_size_kib: int = 0
    ivshmem_max_region_mb: int = 1024
    ivshmem_max_host_mb: int = 0
    ivshmem_max_owner_mb: int = 0
    datastore_location: str = ""
    fabric_manager: str = "opensm"
    sm_nodes: tuple[str, ...] = ()
    sm_read_command: tuple[str, ...] = ()
    ufm_url: str = ""
    ufm_credentials: Optional[Path] = None
    ufm_ca_file: Optional[Path] = None
    ufm_seconds: float = 10
    ufm_retries: int = 3

    @property
    def pool_db(self) -> Path:
        return self.state_dir / "pool.sqlite3"


def pkey_range(text: str) -> Optional[tuple[int, int]]:
    """infiniband.pkey_range: '0x1000-0x1fff' -> (0x1000, 0x1fff); '' -> None (no automatic keys)."""
    t = (text or "").strip().lower()
    if not t:
        return None
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
            if isinstance(value, float) and not math.isfinite(value):  # nan passes every <, <= check
                raise ConfigError(f"{origin}: {section}.{key} must be a finite number, got {value!r}")
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
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deep") from None


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
    fabric = _fabric(m["fabric"], ib)
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
        whole_pfs=pool["whole_pfs"],
        exclude_vfs=tuple(excluded),
        state_dir=Path(pool["state_dir"]),
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
        sysfs_root=Path(m["sysfs"]["root"]),
        guid_policy=m["infiniband"]["guid_policy"],
        partitions_file=Path(m["infiniband"]["partitions_file"]),
        sources=sources,
        ip_command=ib["ip_command"],
        default_partition_members=tuple(ib["default_partition_members"]),
        sm_reload_command=tuple(ib["sm_reload_command"]),
        sm_config=Path(ib["sm_config"]) if ib["sm_config"] else None,
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
        **fabric,
    )


FABRIC_MANAGERS = ("opensm", "ufm")
NODE = "{node}"   # where an SM node's name goes in infiniband.sm_push_command and fabric.sm_read_command


def node_problem(node: str) -> Optional[str]:
    """Why a name cannot be an SM node in a command line (None: it can)."""
    if not (0 < len(node) <= 253) or node.startswith("-") or not all(
            c.isascii() and (c.isalnum() or c in "._:@[]-") for c in node):
        return f"{node!r} is not a host name (letters, digits, . _ : @ [ ] -, not starting with -)"
    return None


def _fabric(f: dict, ib: dict) -> dict:
    """[fabric], checked: the Config fields it gives."""
    if f["manager"] not in FABRIC_MANAGERS:
        raise ConfigError(f"fabric.manager must be one of {', '.join(FABRIC_MANAGERS)}")
    for key in ("sm_nodes", "sm_read_command"):
        if not all(isinstance(s, str) and s.strip() for s in f[key]):
            raise ConfigError(f"fabric.{key} must be a list of non-empty strings")
    for node in f["sm_nodes"]:
        why = node_problem(node)
        if why:
            raise ConfigError(f"fabric.sm_nodes: {why}")
    if len(set(f["sm_nodes"])) != len(f["sm_nodes"]):
        raise ConfigError("fabric.sm_nodes names a node twice")
    if f["sm_nodes"] and not any(NODE in arg for arg in ib["sm_push_command"]):
        raise ConfigError(f"fabric.sm_nodes needs infiniband.sm_push_command with {NODE} where a node's "
                          f"name goes, e.g. [\"ssh\", \"-o\", \"BatchMode=yes\", \"--\", \"{NODE}\", \"kvm-sriov\", "
                          f"\"partitions\", \"--install\", \"-\", \"--reload\"]")
    if f["sm_read_command"] and f["sm_nodes"] and not any(NODE in arg for arg in f["sm_read_command"]):
        raise ConfigError(f"fabric.sm_read_command needs {NODE} where a node's name goes")
    if not f["sm_nodes"] and any(NODE in arg for arg in list(ib["sm_push_command"]) + f["sm_read_command"]):
        raise ConfigError(f"infiniband.sm_push_command or fabric.sm_read_command names {NODE}, but "
                          f"fabric.sm_nodes names no node")
    if not 1 <= f["ufm_seconds"] <= 600:
        raise ConfigError("fabric.ufm_seconds must be from 1 to 600")
    if not (type(f["ufm_retries"]) is int and 0 <= f["ufm_retries"] <= 10):
        raise ConfigError("fabric.ufm_retries must be a whole number from 0 to 10")
    for key in ("ufm_credentials", "ufm_ca_file"):
        if f[key] and not f[key].startswith("/"):
            raise ConfigError(f"fabric.{key} must be an absolute path (or \"\")")
    if f["manager"] == "ufm":
        url = re.fullmatch(r"(https?)://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?", f["ufm_url"])
        if not url:
            raise ConfigError(f"fabric.ufm_url {f['ufm_url']!r} is not https://<host>[:port] (UFM's address)")
        if url.group(1) == "http" and url.group(2) not in ("127.0.0.1", "localhost", "[::1]"):
            raise ConfigError("fabric.ufm_url must be https:// (the credentials would cross the network in "
                              "clear; http:// only for a UFM on this machine)")
        if not f["ufm_credentials"]:
            raise ConfigError("fabric.manager is ufm: set fabric.ufm_credentials (a file only oneadmin can "
                              "read, holding user:password)")
    return dict(fabric_manager=f["manager"], sm_nodes=tuple(f["sm_nodes"]),
                sm_read_command=tuple(f["sm_read_command"]), ufm_url=f["ufm_url"].rstrip("/"),
                ufm_credentials=Path(f["ufm_credentials"]) if f["ufm_credentials"] else None,
                ufm_ca_file=Path(f["ufm_ca_file"]) if f["ufm_ca_file"] else None,
                ufm_seconds=float(f["ufm_seconds"]), ufm_retries=f["ufm_retries"])
