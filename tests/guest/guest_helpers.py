"""Fixtures for the guest-side tests.

The context scripts run for real: bash, the real `ip` inside a network
namespace created per test (dummy links, or veth where the kernel has no
dummy driver, stand in for ib0), and a fake sysfs tree (class/infiniband,
class/net, module, bus/pci) that IB_SYSFS_ROOT points at. IPoIB itself cannot
load here, so the IPoIB-only attributes (mode, pkey, create_child, the 20-byte
hardware address) live in the fake tree while address and MTU go to the real
links.
"""
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CTX = ROOT / "contextualization"
# a copy of the shared OpenNebula fixture (a real oned deploy action)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
_ns_counter = itertools.count()


def mac_to_port_guid(mac: str) -> str:
    """The conventions.md rule, written independently of the shell code."""
    b = mac.lower().split(":")
    return "".join(b[0:3] + ["00", "00"] + b[3:6])


def guid_to_gid(guid: str) -> str:
    full = "fe800000000000" + "00" + guid
    return ":".join(full[i:i + 4] for i in range(0, 32, 4))


def guid_to_ipoib_hwaddr(guid: str, qpn: str = "00000048") -> str:
    raw = qpn + "fe800000000000" + "00" + guid
    return ":".join(raw[i:i + 2] for i in range(0, 40, 2))


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _sudo():
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    pytest.skip("network namespaces need root (or password-less sudo)")


class Guest:
    """A fake guest: sysfs tree + a network namespace with real links."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.sys = tmp / "sys"
        self.state = tmp / "state"
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.sudo = _sudo()
        self.ns = f"kvmsriov-g{os.getpid()}-{next(_ns_counter)}"
        self._ip("netns", "add", self.ns)
        self._peer = itertools.count()
        (self.sys / "class" / "infiniband").mkdir(parents=True)
        (self.sys / "class" / "net").mkdir(parents=True)
        (self.sys / "module").mkdir(parents=True)
        (self.sys / "bus" / "pci" / "devices").mkdir(parents=True)
        self.env = {}
        self.started = []

    # ------------------------------------------------------------ helpers
    def _ip(self, *args, check=True):
        return subprocess.run(self.sudo + ["ip", *args], capture_output=True, text=True, check=check)

    def close(self):
        for p in self.started:      # a test that failed half-way leaves nothing running
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._ip("netns", "del", self.ns, check=False)

    def real_link(self, name: str) -> None:
        r = self._ip("-n", self.ns, "link", "add", name, "type", "dummy", check=False)
        if r.returncode != 0:  # kernels without the dummy driver
            self._ip("-n", self.ns, "link", "add", name, "type", "veth",
                     "peer", "name", f"kp{next(self._peer)}")

    def link(self, name: str) -> dict:
        out = self._ip("-n", self.ns, "-j", "addr", "show", "dev", name).stdout
        return json.loads(out)[0]

    def addrs(self, name: str, family="inet"):
        return sorted(f"{a['local']}/{a['prefixlen']}" for a in self.link(name)["addr_info"]
                      if a["family"] == family and a.get("scope") == "global")

    # ------------------------------------------------------------ fake tree
    def module(self, *names):
        for n in names:
            (self.sys / "module" / n).mkdir(parents=True, exist_ok=True)

    def pci(self, addr="0000:00:05.0", device="0x101e", vendor="0x15b3"):
        d = self.sys / "bus" / "pci" / "devices" / addr
        _w(d / "vendor", vendor)
        _w(d / "device", device)
        return d

    def ethernet(self, name: str, mac: str, real=True):
        d = self.sys / "class" / "net" / name
        _w(d / "type", "1")
        _w(d / "address", mac.lower())
        if real:
            self.real_link(name)

    def ib_port(self, dev="mlx5_0", port=1, mac=None, guid=None, netdev="ib0", pkey="0xffff",
                mode="datagram", state="4: ACTIVE", phys="5: LinkUp", lid="0x5", sm_lid="0x1",
                rate="100 Gb/sec (4X EDR)", device_id="0x101e", real=True):
        guid = guid or mac_to_port_guid(mac)
        p = self.sys / "class" / "infiniband" / dev / "ports" / str(port)
        _w(p / "gids" / "0", guid_to_gid(guid))
        _w(p / "state", state)
        _w(p / "phys_state", phys)
        _w(p / "lid", lid)
        _w(p / "sm_lid", sm_lid)
        _w(p / "rate", rate)
        _w(p / "link_layer", "InfiniBand")
        _w(self.sys / "class" / "infiniband" / dev / "device" / "device", device_id)
        if netdev:
            n = self.sys / "class" / "net" / netdev
            _w(n / "type", "32")
            _w(n / "address", guid_to_ipoib_hwaddr(guid))
            _w(n / "mode", mode)
            _w(n / "pkey", pkey)
            _w(n / "create_child", "")
            _w(n / "dev_port", str(port - 1))
            link = self.sys / "class" / "infiniband" / dev / "device" / "net" / netdev
            _w(link / "dev_port", str(port - 1))
            if real:
                self.real_link(netdev)
        return guid

    def ib_child(self, parent="ib0", pkey="0x8001", mode="datagram"):
        name = f"{parent}.{int(pkey, 16) | 0x8000:04x}"
        par = self.sys / "class" / "net" / parent
        n = self.sys / "class" / "net" / name
        _w(n / "type", "32")
        _w(n / "address", (par / "address").read_text().strip())
        _w(n / "mode", mode)
        _w(n / "pkey", f"0x{int(pkey, 16) | 0x8000:04x}")
        self.real_link(name)
        return name

    def remove_ib(self, dev="mlx5_0", netdev="ib0", pci=None):
        """What the kernel takes away when the VF is hot-unplugged: the IB
        device, its IPoIB netdev and that netdev's PKey children, the PCI function."""
        shutil.rmtree(self.sys / "class" / "infiniband" / dev)
        for n in sorted((self.sys / "class" / "net").iterdir()):
            if n.name == netdev or n.name.startswith(netdev + "."):
                shutil.rmtree(n)
                self._ip("-n", self.ns, "link", "del", n.name, check=False)
        if pci:
            shutil.rmtree(self.sys / "bus" / "pci" / "devices" / pci)

    def read(self, rel: str) -> str:
        return (self.sys / rel).read_text().strip()

    def recorder(self, name: str, rc: int = 0, script: str = "") -> Path:
        """A stand-in command that appends its argv to <tmp>/<name>.calls."""
        p = self.bin / name
        log = self.tmp / f"{name}.calls"
        p.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{script}\nexit {rc}\n')
        p.chmod(0o755)
        return log

    def calls(self, name: str):
        log = self.tmp / f"{name}.calls"
        return log.read_text().splitlines() if log.exists() else []

    # ------------------------------------------------------------ running
    def run(self, script: str, stage: str = "local", env=None, path_extra=True, timeout=60, args=()):
        cmd = self._command(script, stage, env, args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def start(self, script: str, stage: str, env=None, args=()) -> subprocess.Popen:
        """As run, without waiting (communicate() for the output); in its own
        process group, killed with whatever it started when the test ends."""
        p = subprocess.Popen(self._command(script, stage, env, args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(p)
        return p

    def _command(self, script, stage, env, args):
        e = {
            "PATH": f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "IB_SYSFS_ROOT": str(self.sys),
            "IB_STATE_DIR": str(self.state),
            "IB_SYSLOG": "NO",
            "IB_CHILD_WAIT": "1",
            "IB_MODPROBE": str(self.bin / "modprobe"),
            # no OneGate unless a test writes one (never this machine's own one_env)
            "IB_ONE_ENV": str(self.tmp / "one_env"),
            "LC_ALL": "C",
        }
        if not (self.bin / "modprobe").exists():
            self.recorder("modprobe")
        e.update(self.env)
        e.update(env or {})
        return self.sudo + ["ip", "netns", "exec", self.ns, "env", "-i",
                            *[f"{k}={v}" for k, v in e.items()], str(script), stage, *args]


def context_from_fixture(name="action-deploy.xml"):
    """CONTEXT variables of the real OpenNebula VM XML fixture."""
    import xml.etree.ElementTree as ET
    path = FIXTURES / name
    root = ET.parse(path).getroot()
    ctx = root.find("./VM/TEMPLATE/CONTEXT")
    return {c.tag: (c.text or "") for c in ctx}
