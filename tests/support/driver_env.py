"""Shared by the driver's rung-2 and rung-3 tests: a driver installed the
way `onehost sync` leaves it, a config per test, and what to look at."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Callable

import libvirt
from lxml import etree

from kvm_sriov.domain import domain_xml
from tests.conftest import FIXTURES, REPO
from simhost import stock_kvm
from simhost.opennebula_call import Result, one_call


def install_remotes(dest: Path) -> Path:
    """`rake install` into a host's /var/tmp/one, next to OpenNebula's own
    kvm driver (which kvm-sriov runs for the hypervisor work)."""
    remotes = dest / "var" / "tmp" / "one"
    stock_kvm.install(remotes)
    subprocess.run(["rake", "install", f"REMOTES={remotes}"], cwd=REPO, check=True, capture_output=True)
    return remotes


def node_env(remotes: Path, **extra) -> dict:
    """The environment of an action on a host: ours, plus what a node's
    OpenNebula packages give the stock ruby scripts."""
    return dict(os.environ, **stock_kvm.environment(stock_kvm.ruby_lib(remotes)), **extra)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, sections: dict) -> Path:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class DriverOnHost:
    """The installed scripts on one (simulated) host, called as OpenNebula does."""

    def __init__(self, remotes: Path, config: Path, host_name: str, wrapper=()):
        self.remotes, self.config, self.host_name = remotes, config, host_name
        self.wrapper = list(wrapper)  # e.g. into a simulated host's namespaces

    def vm_file(self, name: str, vmid: int = 42, ds: int = 0) -> str:
        """<system datastore>/<vm id>/<name>, as OpenNebula names the VM's files."""
        return str(Path(self.config).parent / "datastores" / str(ds) / str(vmid) / name)

    def __call__(self, action: str, args: list, vmid: int = 42, stdin: str = "",
                 local: bool = False, extra_env: dict = None) -> Result:
        env = node_env(self.remotes, KVM_SRIOV_CONFIG=str(self.config), **(extra_env or {}))
        return one_call(self.remotes, action, args, vmid, self.host_name, stdin, env=env, local=local,
                        wrapper=self.wrapper)


def pool_rows(state_dir: Path) -> list[tuple]:
    db = Path(state_dir) / "pool.sqlite3"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT vf, vm_id, state FROM assignment ORDER BY vf").fetchall()


def domain_active(uri: str, uuid: str) -> bool:
    conn = libvirt.open(uri)
    try:
        return bool(conn.lookupByUUIDString(uuid).isActive())
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def destroy_all(uri: str) -> None:
    conn = libvirt.open(uri)
    try:
        for d in conn.listAllDomains():
            if d.isActive():
                d.destroy()
    finally:
        conn.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 90.0, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def nested_host_driver(remotes: Path, tmp_path: Path, pf: str, hotplug_seconds: float) -> DriverOnHost:
    """The driver on the nested SR-IOV host (rung 3): its system libvirtd, one PF."""
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "kvm-sriov.toml", {
        "pool": {"pfs": [pf], "state_dir": str(state)},
        "libvirt": {"uri": "qemu:///system"},
        "timeouts": {"hotplug_seconds": hotplug_seconds, "shutdown_seconds": 240},
    })
    d = DriverOnHost(remotes, cfg, "host1")
    d.state, d.tmp = state, tmp_path
    return d


def cluster_config(config_dir: Path, remotes: Path, host, **sections: dict) -> Path:
    """The config of one of simhost's `two_hosts` (host: its LibvirtHost):
    its own libvirtd and pool under config_dir, and its peer reached by the
    peer's libvirt socket and a local command where production has qemu+ssh
    and ssh. Written to config_dir/<host>.toml, where the peer command finds
    the other host's; sections (e.g. pool={"exclude_vfs": [...]}) add to it."""
    sock = f"{host.workdir}/{{host}}/run/libvirt-sock"
    merged = {"pool": {"state_dir": str(config_dir / host.name / "state")},
              "libvirt": {"uri": host.uri},
              "migration": {"dest_uri": "qemu+unix:///system?socket=" + sock,
                            "peer_command": ["/usr/bin/env", f"KVM_SRIOV_CONFIG={config_dir}/{{host}}.toml"],
                            "peer_remotes": str(remotes)}}
    for section, values in sections.items():
        merged.setdefault(section, {}).update(values)
    return write_config(config_dir / f"{host.name}.toml", merged)


def vf_driver(address: str):
    """The kernel driver a (real) PCI function is bound to, None if none."""
    try:
        return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{address}/driver"))
    except OSError:
        return None


def running_hostdevs(uri: str) -> dict[str, list[str]]:
    """Domain name -> its PCI hostdevs (sorted), for every running domain."""
    conn = libvirt.open(uri)
    try:
        return {d.name(): sorted(domain_xml.pci_hostdevs(domain_xml.parse(d.XMLDesc(0))))
                for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)}
    finally:
        conn.close()


def action_xml(name, ib_nic, system_ds=None, shared=True):
    """The real action XML of a MIGRATE/SAVE/RESTORE, with or without the IB
    NIC; system_ds: the system datastore's BASE_PATH (its VM folder is the
    migration's DISK_TARGET_PATH), shared or not (TM_MAD shared or local)."""
    root = etree.parse(str(FIXTURES / f"opennebula/action-{name}.xml")).getroot()
    if not ib_nic:
        for nic in root.iterfind("VM/TEMPLATE/NIC"):
            if nic.findtext("BRIDGE") == "ib-sriov":
                nic.getparent().remove(nic)
    if system_ds is not None:
        root.find("DATASTORE/BASE_PATH").text = str(system_ds)
        target = root.find("DISK_TARGET_PATH")
        if target is not None:
            target.text = f"{system_ds}/{root.findtext('VM/ID')}"
    for tm in root.iterfind("DATASTORE/TM_MAD"):
        tm.text = "shared" if shared else "local"
    root.find("DATASTORE/TEMPLATE/SHARED").text = "YES" if shared else "NO"
    return etree.tostring(root, encoding="unicode")
