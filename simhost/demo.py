"""The kvm-sriov demo, run inside the nested SR-IOV host (``./dev demo``).

Inside the nested host (L1: one emulated SR-IOV PF, VFs 03:00.1-.4) two
simulated OpenNebula hosts, h1 and h2, each get a private libvirtd in its own
network namespace (simhost.libvirt_host.two_hosts) and their own kvm-sriov
config: h1's pool offers VFs .1-.3, h2's offers .4. The demo installs the
driver where `onehost sync` puts it (/var/tmp/one) and then plays OpenNebula:
the real action scripts, called exactly as OpenNebula 7.4's MAD calls them,

  1. deploy VM 100 (1 VF) and VM 101 (2 VFs) on h1,
  2. refuse VM 102 on h1 (its pool is empty; nothing changes),
  3. reboot VM 100,
  4. save VM 101 (VFs detached and given back) and restore it (new VFs),
  5. live-migrate VM 100 from h1 to h2 (a VF reserved on h2 first),
  6. shut both down (ACPI) - every VF is free again,
  7. deploy VMs 103 and 104 of one VM group with KVM_SRIOV_IVSHMEM on h1
     (1 VF each): one shared-memory region; 103's guest writes a word into
     it, 104's reads it; stop both - the last one removes the region,

and prints both hosts' VF pools (and shared-memory regions) after each step. Booted guests count on
their serial console: the counter going on shows a guest kept its state.
Any step that does not end as it should fails the demo (exit status 1).
While it waits (a guest booting, an action running) it says what for at
least every PROGRESS seconds; at the end it sums up each step (ok, what it
showed, seconds).

The guests boot the cached Debian kernel uncompressed, through its PVH entry
(simhost.guest_image): under TCG inside TCG, the bzImage's own xz
decompression took more than half of each boot.

    python3 -m simhost.demo [--only ivshmem]
    python3 -m simhost.demo --prepare

--only ivshmem (for development) runs step 7 alone, after step 0. --prepare
(outside the nested host, before the timed demo) builds what the demo caches:
the guest kernel and images, the nested host's initramfs; it says what that
cost, or that it was cached.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path

import libvirt
from lxml import etree

from simhost.guest_image import (CACHE_DIR, COUNTER_PREFIX, DEFAULT_CMDLINE, UP_LINE, GuestImage,
                                 ensure_guest_image, last_counter)
from simhost.libvirt_host import two_hosts
from simhost.nested import PF_ADDRESS, vf_addresses
from simhost import stock_kvm
from simhost.opennebula_call import Result, one_call
from simhost.prereq import MissingProgram

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvm_sriov import config as config_mod  # noqa: E402
from kvm_sriov.domain import domain_xml
from kvm_sriov.ivshmem import device as ivshmem, region as ivshmem_region, table as ivshmem_table  # noqa: E402
from kvm_sriov.node.host import Host  # noqa: E402
from tests.support.driver_env import (action_xml, cluster_config, node_env, running_hostdevs,  # noqa: E402
                                      wait_for)
from tests.support.runnable import runnable_deployment  # noqa: E402
from tests.ivshmem import guest as shm_guest, guest_tool  # noqa: E402

WORK = Path("/var/tmp/kvm-sriov-demo")          # the hosts' libvirt state, configs and pools
# each host's /var/tmp/one, where `onehost sync` puts OpenNebula's kvm driver and kvm-sriov
REMOTES = {name: WORK / f"remotes-{name}" / "var" / "tmp" / "one" for name in ("h1", "h2")}
DATASTORE = Path("/var/lib/one/datastores/0")   # the shared system datastore
VFS = vf_addresses(4)
OFFERS = {"h1": VFS[:3], "h2": VFS[3:]}
# an L2 guest under nested emulation needs minutes to boot, many more on a busy machine
# (a boot passed 600 s at load 35-60 on 2 cores)
BOOT_SECONDS = 1200
PROGRESS = 20          # a line at least this often (seconds) while the demo waits
SHM = ivshmem_region.SHM_DIR
VMGROUP, SHM_MB, SHM_VFS = 7, 4, 1          # step 7's VM group, region size, VFs per VM


class DemoFailed(Exception):
    pass


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def note(text: str) -> None:
    print(f"  {text}", flush=True)


def vf_driver(address: str) -> str:
    try:
        return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{address}/driver"))
    except OSError:
        return "-"


def short(address: str) -> str:
    return address[5:] if address.startswith("0000:") else address


class Progress:
    """Our stdout: notes when the last line went out, and a thread that says,
    when the demo has been quiet for `every` seconds, what it is waiting for."""

    def __init__(self, out, every: float = PROGRESS):
        self.out, self.every = out, every
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.what, self.since = None, self.last
        self.stop = threading.Event()

    def write(self, text: str) -> int:
        with self.lock:
            self.last = time.monotonic()
            return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    def __getattr__(self, name):
        return getattr(self.out, name)

    def doing(self, what):
        """Context: what the demo waits for now (text, or a callable giving it)."""
        progress = self

        class Doing:
            def __enter__(self):
                self.before = progress.what, progress.since
                progress.what, progress.since = what, time.monotonic()

            def __exit__(self, *exc):
                progress.what, progress.since = self.before
        return Doing()

    def tick(self) -> None:
        """One line if the demo has been quiet for `every` seconds."""
        now = time.monotonic()
        if now - self.last < self.every or self.what is None:
            return
        try:
            what = self.what() if callable(self.what) else self.what
        except Exception as exc:   # a half-written console file must not stop the line
            what = f"(state unreadable: {exc})"
        self.write(f"  ... {what} ({now - self.since:.0f}s)\n")
        self.flush()

    def run(self) -> None:
        while not self.stop.wait(min(1.0, self.every / 3)):
            self.tick()

    def start(self) -> "Progress":
        threading.Thread(target=self.run, daemon=True, name="demo-progress").start()
        return self


class Stages:
    """The closing summary: each step's outcome, one line on what it showed, seconds."""

    def __init__(self):
        self.rows = []     # [number, title, status, line, started, seconds]

    def begin(self, number: str, title: str) -> None:
        self.end()
        self.rows.append([number, title, None, "", time.monotonic(), None])
        if isinstance(sys.stdout, Progress):
            sys.stdout.what, sys.stdout.since = f"step {number}: {title}", time.monotonic()

    def shown(self, line: str) -> None:
        """What the current step showed (its line in the summary)."""
        self.rows[-1][3] = line

    def end(self, status: str = "ok") -> None:
        if self.rows and self.rows[-1][2] is None:
            row = self.rows[-1]
            row[2], row[5] = status, time.monotonic() - row[4]

    def summary(self, total: float) -> list:
        lines = []
        for number, title, status, line, _, seconds in self.rows:
            lines.append(f"  {status or 'not ended':6} {number:>2}. {line or title}  ({seconds or 0:.0f}s)")
        done = sum(1 for r in self.rows if r[2] == "ok")
        lines.append(f"  {done} of {len(self.rows)} steps ok, {total:.0f}s in the nested host")
        return lines


STAGES = Stages()


def doing(what):
    """Progress.doing on our stdout; nothing to say when stdout is not ours."""
    out = sys.stdout
    if isinstance(out, Progress):
        return out.doing(what)
    return Progress(out).doing(what)


_IMAGES = {}
# what --prepare built, for the run in the nested host: finding the kernel asks
# apt-cache, which takes seconds under emulation, each time
PREPARED = CACHE_DIR / "demo-images.json"


def images() -> dict:
    """The demo's two guest images ("plain", "ivshmem"), both with the uncompressed kernel."""
    if not _IMAGES:
        try:
            prepared = {kind: GuestImage(*map(Path, paths))
                        for kind, paths in json.loads(PREPARED.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            prepared = {}
        if set(prepared) == {"plain", "ivshmem"} and all(
                p.exists() for image in prepared.values() for p in (image.kernel, image.initrd)):
            _IMAGES.update(prepared)
        else:
            _IMAGES.update(plain=ensure_guest_image(), ivshmem=shm_guest.ensure_ivshmem_guest())
    return _IMAGES


def booted(console: str, boots: int) -> bool:
    """Whether the guest's `boots`-th boot is up: its init said so (acpid
    listens, so ACPI works; PCIe hot-plug is the kernel's) and counted once."""
    parts = console.split(UP_LINE)
    return len(parts) - 1 >= boots and COUNTER_PREFIX in parts[-1]


class Guest:
    """A VM as OpenNebula knows it: id, deploy id (the domain UUID), serial log."""

    def __init__(self, vmid: int, vfs: int, image=None, probe: str = "", ivshmem_mb: int = 0):
        """image, probe: another guest image and what its kernel command line
        adds (step 7's shared-memory probe); ivshmem_mb: the VM is a role of
        VM group VMGROUP and asks KVM_SRIOV_IVSHMEM = [ SIZE = ivshmem_mb ]."""
        self.vmid, self.vfs = vmid, vfs
        self.name = f"one-{vmid}"
        self.uuid = str(uuidlib.uuid4())
        self.dir = DATASTORE / str(vmid)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.serial = self.dir / "serial.log"
        self.deployment = self.dir / "deployment.0"
        self.checkpoint = self.dir / "checkpoint"
        xml = runnable_deployment(self.name, self.uuid, self.serial, image or images()["plain"], ib_nics=vfs,
                                  memory_mib=128, cmdline=f"{DEFAULT_CMDLINE} {probe}".strip())
        self.deployment.write_text(self._as_vm(self._with_disk(xml)))
        # (bridge, MAC) of each NIC as oned knows them: after deploy the file
        # on the host holds the <hostdev>s that replaced the VF NICs
        self.nics = [(i.find("source").get("bridge") if i.find("source") is not None else "br0",
                      i.find("mac").get("address"))
                     for i in etree.fromstring(self.deployment.read_bytes()).iterfind("devices/interface")]
        # as OpenNebula's MAD before every deploy: the <VM> next to the deployment file
        vm = etree.fromstring(self.action("deploy", "h1")).find("VM")
        if ivshmem_mb:
            # as oned writes them: the role's VM group in TEMPLATE, the
            # attribute oned does not know in USER_TEMPLATE
            group = etree.SubElement(vm.find("TEMPLATE"), "VMGROUP")
            etree.SubElement(group, "ROLE").text = etree.CDATA("ranks")
            etree.SubElement(group, "VMGROUP_ID").text = etree.CDATA(str(VMGROUP))
            attr = etree.SubElement(vm.find("USER_TEMPLATE"), ivshmem.ATTRIBUTE)
            etree.SubElement(attr, "SIZE").text = etree.CDATA(str(ivshmem_mb))
        (self.dir / "vm.xml").write_text(etree.tostring(vm, encoding="unicode") + "\n")

    def _with_disk(self, xml: str) -> str:
        """A disk.0 in the VM's folder, as every OpenNebula VM has (the stock deploy
        looks for them: xmllint says "XPath set is empty" when there is none). Read-only
        on the deployment's virtio-scsi controller: no PCI slot taken from the VFs, and
        libvirt lets a read-only disk migrate off this unshared folder."""
        disk = self.dir / "disk.0"
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        root = etree.fromstring(xml.encode())
        devices = root.find("devices")
        if devices.find("controller[@type='scsi']") is None:
            raise DemoFailed("the deployment file has no SCSI controller for the VM's disk")
        el = etree.fromstring(f"<disk type='file' device='disk'><driver name='qemu' type='raw'/>"
                              f"<source file='{disk}'/><target dev='sda' bus='scsi'/><readonly/></disk>")
        devices.insert(list(devices).index(devices.find("controller")), el)
        return etree.tostring(root, encoding="unicode")

    def _as_vm(self, xml: str) -> str:
        """The fixture is VM 42's deployment file: make it this VM's, with the
        MACs OpenNebula would give it (02:00 + the NIC's IP, 10.100.<n>.<vmid>)."""
        swaps = {"02:00:0a:00:00:2a": f"02:00:0a:00:00:{self.vmid:02x}",
                 "02:00:0a:64:00:2a": f"02:00:0a:64:00:{self.vmid:02x}",
                 "one-42-": f"one-{self.vmid}-", "ib-node-42": f"ib-node-{self.vmid}",
                 "datastores/0/42": f"datastores/0/{self.vmid}"}
        # runnable_deployment's extra IB NICs: 02:00:0a:64:01:<n>
        swaps.update({f"02:00:0a:64:01:{n:02x}": f"02:00:0a:64:{n:02x}:{self.vmid:02x}"
                      for n in range(1, self.vfs)})
        for old, new in swaps.items():
            xml = xml.replace(old, new)
        return xml

    def action(self, name: str, host: str, dest: str = "") -> str:
        """What OpenNebula sends on stdin with DEPLOY/SAVE/RESTORE/MIGRATE: the action
        XML (the stock restore and migrate read the datastore from it, ours the
        VM's NICs), made this VM's: its ids, hosts and the NICs of its deployment."""
        root = etree.fromstring(action_xml(name, ib_nic=True, system_ds=DATASTORE, shared=True))
        values = {"HOST": host, "DEPLOY_ID": self.uuid, "VM/ID": str(self.vmid),
                  "VM/DEPLOY_ID": self.uuid, "DISK_TARGET_PATH": str(self.dir)}
        if name == "migrate":
            values.update({"MIGR_HOST": dest,
                           "TM_COMMAND": f"MIGRATE shared {host} {dest} {self.dir} {self.vmid} 0"})
        else:
            values["CHECKPOINT_FILE"] = str(self.checkpoint)
        for tag, value in values.items():
            if root.find(tag) is not None:
                root.find(tag).text = value
        template = root.find("VM/TEMPLATE")
        models = {nic.findtext("BRIDGE"): nic for nic in template.findall("NIC")}  # br0, ib-sriov
        for old in models.values():
            template.remove(old)
        for nic_id, (bridge, mac) in enumerate(self.nics):
            nic = etree.SubElement(template, "NIC")
            for child in models[bridge]:
                etree.SubElement(nic, child.tag).text = child.text
            nic.find("NIC_ID").text = str(nic_id)
            nic.find("MAC").text = mac
            nic.find("TARGET").text = f"one-{self.vmid}-{nic_id}"
        return etree.tostring(root, encoding="unicode")

    @property
    def counter(self) -> int:
        return last_counter(self.serial) or 0

    def console(self) -> str:
        try:
            return self.serial.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def boots(self) -> int:
        return self.console().count(UP_LINE)

    def state(self, boots: int) -> str:
        """For a progress line: where the guest's `boots`-th boot is."""
        console = self.console()
        if console.count(UP_LINE) >= boots:
            return f"up, counter at {last_counter(self.serial)}"
        lines = console.splitlines()
        # the guest writes this file: shown bounded and printable only
        last = "".join(c for c in (lines[-1] if lines else "")[:80] if c.isprintable())
        return f"kernel and init booting (serial console: {len(lines)} lines{', last: ' + last if last else ''})"


class Cluster:
    """The two simulated hosts, their configs, and OpenNebula's calls to them."""

    def __init__(self, hosts: dict):
        self.hosts = hosts            # name -> LibvirtHost
        self.configs = {}             # name -> its kvm-sriov.toml, once written

    def write_configs(self) -> None:
        for name, h in self.hosts.items():
            # production: qemu+ssh://{host}/system and ssh {host}; here the
            # hosts are namespaces of one machine, reached by socket and env
            self.configs[name] = cluster_config(WORK, REMOTES[name], h, pool={
                "pfs": [PF_ADDRESS], "exclude_vfs": [vf for vf in VFS if vf not in OFFERS[name]]},
                timeouts={"hotplug_seconds": 60})
            note(f"{name}: libvirtd at {h.ip} ({h.uri}), config {self.configs[name]}:")
            for line in self.configs[name].read_text().splitlines():
                note(f"    {line}")

    def call(self, host: str, action: str, args: list, vm: Guest, stdin: str = "") -> Result:
        """The installed script on `host`, as OpenNebula's MAD runs it there."""
        shown = " ".join(str(a) for a in args)
        print(f"[{host}] $ {REMOTES[host]}/vmm/kvm-sriov/{action} {shown} {vm.vmid} {host}", flush=True)
        env = node_env(REMOTES[host], KVM_SRIOV_CONFIG=str(self.configs[host]))
        t = time.monotonic()
        # run inside the host, where kvmrc's qemu:///system is its libvirtd
        with doing(f"{action} of VM {vm.vmid} on {host} still running"):
            r = one_call(REMOTES[host], action, args, vm.vmid, host, stdin, env=env,
                         wrapper=self.hosts[host].nsenter())
        for line in r.stderr.splitlines():
            print(f"  | {line}")
        status = "SUCCESS" if r.code == 0 else "FAILURE"
        # as the MAD answers oned: a success carries stdout only (stderr went to the VM log above)
        info = r.stdout.strip() if r.code == 0 else r.reason
        print(f"  -> {action.upper()} {status} {vm.vmid} {info or '-'} "
              f"({time.monotonic() - t:.1f}s)", flush=True)
        return r

    def must(self, host: str, action: str, args: list, vm: Guest, stdin: str = "") -> Result:
        r = self.call(host, action, args, vm, stdin)
        if r.code != 0:
            raise DemoFailed(f"{action} of VM {vm.vmid} on {host} failed: {r.reason or r.stderr}")
        return r

    # -- what there is to see --------------------------------------------
    def pools(self) -> dict:
        """host -> (VFs it offers, {vf: Assignment})."""
        out = {}
        for name in self.hosts:
            host = Host(config_mod.load(files=[self.configs[name]]))
            try:
                offered = {vf.address for vf in host.inventory.vfs if vf.eligible}
                out[name] = (offered, {a.vf: a for a in host.assignments()})
            finally:
                host.close()
        return out

    def running(self, name: str) -> dict:
        """domain name -> its PCI hostdevs, for the domains running on a host."""
        return running_hostdevs(self.hosts[name].uri)

    def where(self, vm: Guest) -> list:
        return [name for name in self.hosts if vm.name in self.running(name)]

    def held(self) -> dict:
        """(host, vf) -> VM id, from both pools."""
        return {(name, vf): a.vm_id for name, (_, held) in self.pools().items() for vf, a in held.items()}

    def regions(self) -> dict:
        """host -> ({region: size MB}, [ivshmem_table.User]) from its pool database."""
        out = {}
        for name in self.hosts:
            db_path = config_mod.load(files=[self.configs[name]]).pool_db
            if not db_path.exists():
                out[name] = ({}, [])
                continue
            db = sqlite3.connect(db_path)
            try:
                # only look: the driver makes the tables at a host's first region
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ivshmem_user'").fetchone() is None:
                    out[name] = ({}, [])
                    continue
                out[name] = (ivshmem_table.regions(db), ivshmem_table.users(db))
            finally:
                db.close()
        return out

    def shmem(self, vm: "Guest") -> list:
        """The live domain's <shmem> devices: (region name, MiB, PCI address)."""
        conn = libvirt.open(self.hosts[self.where(vm)[0]].uri)
        try:
            root = domain_xml.parse(conn.lookupByUUIDString(vm.uuid).XMLDesc(0))
        finally:
            conn.close()
        out = []
        for s in root.findall("devices/shmem"):
            a = s.find("address")
            where = (f"{int(a.get('bus'), 0):02x}:{int(a.get('slot'), 0):02x}.{int(a.get('function'), 0)}"
                     if a is not None else "?")
            out.append((s.get("name"), s.findtext("size"), where))
        return out

    def show(self) -> None:
        pools = self.pools()
        note(f"{'VF':14} {'pool':5} {'host driver':12} {'VM':4} {'NIC MAC':18} state")
        for vf in VFS:
            owners = [name for name, (offered, _) in pools.items() if vf in offered]
            holders = [(name, held[vf]) for name, (_, held) in pools.items() if vf in held]
            if holders:
                name, a = holders[0]
                vm, mac, state = str(a.vm_id), a.mac, a.state
            else:
                name, vm, mac, state = (owners[0] if owners else "-"), "-", "-", "free"
            if not owners:
                state = "offered by no host"
            print(f"  {vf:14} {name:5} {vf_driver(vf):12} {vm:4} {mac:18} {state}")
        for name in self.hosts:
            doms = self.running(name)
            shown = ", ".join(f"{d} [{' '.join(short(v) for v in vfs) or 'no VF'}]"
                              for d, vfs in sorted(doms.items())) or "nothing"
            note(f"{name} runs: {shown}")
        for name, (regions, users) in self.regions().items():
            for region, size in regions.items():
                vms = " ".join(f"{u.vm_id} ({u.state})" for u in users if u.region == region)
                on_disk = "in /dev/shm" if (SHM / region).exists() else "NOT in /dev/shm"
                note(f"{name} shared memory: {region} {size} MB, {on_disk}, used by VM {vms or '-'}")
        sys.stdout.flush()


def wait_up(vm: Guest, boots: int) -> None:
    """Until the guest's `boots`-th boot is up (booted): what ACPI and hot-plug need."""
    t = time.monotonic()
    with doing(lambda: f"waiting for VM {vm.vmid}'s boot #{boots}: {vm.state(boots)}"):
        up = wait_for(lambda: booted(vm.console(), boots), BOOT_SECONDS, step=1)
    if not up:
        raise DemoFailed(f"VM {vm.vmid}'s boot #{boots} was not up within {BOOT_SECONDS}s "
                         f"(boots seen: {vm.boots}, {vm.state(boots)}); see {vm.serial}")
    note(f"VM {vm.vmid}: boot #{vm.boots} up, counter at {vm.counter} "
         f"(waited {time.monotonic() - t:.0f}s)")


POWERING_OFF = "power button, powering off"   # the guest's acpid action (guest_image)


def powered_itself_off(console: str) -> bool:
    """Whether the guest's last boot ended in its own ACPI power-off, not in the
    stock shutdown's destroy after its timeout."""
    return POWERING_OFF in console.split(UP_LINE)[-1]


def acpi_said(vm: Guest) -> bool:
    said = powered_itself_off(vm.console())
    note(f"VM {vm.vmid}'s guest " + ("powered itself off (its console: power button, powering off)" if said else
                                     "did not power itself off: the stock shutdown destroyed it after its timeout"))
    return said


def kept_running(vm: Guest, frozen: int, boots: int) -> None:
    """The counter goes on from where it was, and the guest did not boot again."""
    with doing(f"waiting for VM {vm.vmid} to count on from {frozen}"):
        going = wait_for(lambda: vm.counter > frozen + 1, 120, step=1)
    if not going:
        raise DemoFailed(f"VM {vm.vmid} stopped counting at {frozen}: its state was lost")
    if vm.boots != boots:
        raise DemoFailed(f"VM {vm.vmid} booted again ({vm.boots} boots, expected {boots})")
    note(f"VM {vm.vmid}: counter went on {frozen} -> {vm.counter}, still boot #{boots}: "
         f"the guest kept its memory and CPU state")


def show_region(name: str):
    """Print a region file and the host's header in it; (header, first data
    word) or None if the file is not there."""
    path = SHM / name
    try:
        st = path.stat()
        with open(path, "rb") as f:
            data = f.read(ivshmem_region.HEADER_BYTES + 4)
    except FileNotFoundError:
        note(f"{path}: not there")
        return None
    h = ivshmem_region.read_header(data)
    word = struct.unpack_from("<I", data, ivshmem_region.HEADER_BYTES)[0]
    note(f"{path}: {st.st_size >> 20} MiB, mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}")
    note(f"  host header: KSRIVSHM v{h['version']}, generation {h['generation']}, owner uid {h['uid']}, "
         f"VM group {h['vmgroup']}, {h['size'] >> 20} MiB, VMs {h['vms']}")
    note(f"  data at offset {ivshmem_region.HEADER_BYTES}: 0x{word:08X}")
    return h, word


def expect_region(name: str, vms: list):
    state = show_region(name)
    if state is None or state[0]["vms"] != vms:
        raise DemoFailed(f"region {name}: header lists {state and state[0]['vms']}, expected {vms}")
    return state


def tool_view(name: str, vm: "Guest", peers: list) -> None:
    """What the guest tool would publish in this VM (run here on the region
    file: the busybox guest has no python3)."""
    try:
        pub = guest_tool.published(SHM / name, vm.vmid)
    except RuntimeError as exc:
        raise DemoFailed(str(exc)) from None
    got = [int(v) for v in pub["peers"].split()]
    note(f"  VM {vm.vmid}: /run/ivshmem/0/vms: {' '.join(pub['vms'].split())}, "
         f"peers: {' '.join(pub['peers'].split()) or '(none)'}; /run/ivshmem/env: {pub['env'].splitlines()[-1]}")
    if got != peers:
        raise DemoFailed(f"the guest tool in VM {vm.vmid} would publish peers {got}, expected {peers}")


def shared_memory(cluster: Cluster) -> None:
    """Step 7: two VMs of one VM group share a region on h1."""
    name = ivshmem.Request(0, VMGROUP, SHM_MB).name   # owner uid 0: the deployment file's <one:uid>
    banner(f"7. shared memory: deploy VMs 103 and 104 (1 IB NIC each), roles of VM group {VMGROUP} "
           f"with KVM_SRIOV_IVSHMEM = [ SIZE = \"{SHM_MB}\" ], on h1")
    STAGES.begin("7", "shared memory between two VMs of a VM group")
    image = images()["ivshmem"]
    writer = Guest(103, SHM_VFS, image, shm_guest.writes(), SHM_MB)
    reader = Guest(104, SHM_VFS, image, shm_guest.reads(), SHM_MB)
    note(f"vm.xml of each (as oned writes it): TEMPLATE/VMGROUP [ VMGROUP_ID = {VMGROUP}, ROLE = ranks ],")
    note(f"USER_TEMPLATE/KVM_SRIOV_IVSHMEM [ SIZE = {SHM_MB} ]; owner uid 0 and group {VMGROUP}: region {name}")
    note(f"the test guests' probe: 103's kernel command line has {shm_guest.writes()} (busybox devmem")
    note(f"writes it at offset 4096 of BAR2), 104's {shm_guest.reads()} (polls there until it reads it)")
    if (SHM / name).exists():
        raise DemoFailed(f"{SHM / name} exists before any VM of the group runs")
    for vm, users in ((writer, [103]), (reader, [103, 104])):
        cluster.must("h1", "deploy", [vm.deployment, "h1"], vm, vm.deployment.read_text())
        expect_region(name, users)
    for vm in (writer, reader):
        devices = cluster.shmem(vm)
        note(f"{vm.name} live XML: " + ", ".join(f"<shmem name='{n}'> ivshmem-plain {s} MiB at {a}"
                                                for n, s, a in devices))
        if [n for n, _, _ in devices] != [name] or len(cluster.running("h1").get(vm.name, [])) != SHM_VFS:
            raise DemoFailed(f"VM {vm.vmid} runs without its region device or its VF")
    cluster.show()

    banner(f"   the guests boot: 103's writes 0x{shm_guest.PATTERN:08X} into the region, 104's reads it")
    t = time.monotonic()
    with doing(lambda: f"waiting for VM 104's guest to read the pattern: VM 103 {writer.state(1)}, "
                       f"VM 104 {reader.state(1)}"):
        read = wait_for(lambda: shm_guest.has_read(reader.console()), BOOT_SECONDS, step=1)
    if not read:
        raise DemoFailed(f"VM 104's guest did not read the pattern within {BOOT_SECONDS}s; see {reader.serial}")
    note(f"waited {time.monotonic() - t:.0f}s")
    for vm in (writer, reader):
        note(f"VM {vm.vmid}'s view (its serial console):")
        for line in shm_guest.view(vm.console()):
            note(f"    {line}")
    if f"wrote 0x{shm_guest.PATTERN:08X}" not in writer.console():
        raise DemoFailed("VM 103's guest did not say it wrote the pattern")
    _, word = expect_region(name, [103, 104])
    if word != shm_guest.PATTERN:
        raise DemoFailed(f"the region file holds 0x{word:08X} at offset 4096, not the guest's pattern")
    note("what the guest tool (contextualization/ivshmem/kvm-sriov-ivshmem publish) makes of this")
    note("header in each VM, run here on the region file (the busybox guest has no python3):")
    tool_view(name, writer, [104])
    tool_view(name, reader, [103])

    banner("   stop both: cancel 103 (onevm terminate --hard), the region stays for 104; "
           "shut 104 down: the last user removes it")
    cluster.must("h1", "cancel", [writer.uuid, "h1"], writer)
    expect_region(name, [104])
    tool_view(name, reader, [])
    cluster.must("h1", "shutdown", [reader.uuid, "h1"], reader)
    if show_region(name) is not None:
        raise DemoFailed(f"{SHM / name} is still there after the group's last VM stopped")
    left = sorted(f.name for f in SHM.glob(f"{ivshmem.PREFIX}-*"))
    note(f"$ ls /dev/shm/{ivshmem.PREFIX}-*: {' '.join(left) or 'nothing'}")
    cluster.show()
    if left or any(regions or users for regions, users in cluster.regions().values()):
        raise DemoFailed("a region file or a region row is left after the group's VMs stopped")
    if cluster.held() or any(cluster.running(n) for n in cluster.hosts):
        raise DemoFailed("VFs still held or domains still running after step 7")
    STAGES.shown(f"VMs 103, 104 shared {name} ({SHM_MB} MB): 103's guest wrote 0x{shm_guest.PATTERN:08X}, "
                 f"104's read it; the last stop removed the region")


def demo(cluster: Cluster) -> None:
    note("The emulated PF is QEMU's NVMe controller, not a ConnectX: the driver notes that")
    note("its VFs have no InfiniBand GUID to set; everything else is the production path.")
    cluster.show()
    vm100, vm101 = Guest(100, 1), Guest(101, 2)

    banner("1. deploy VM 100 (1 IB NIC) and VM 101 (2 IB NICs, BRIDGE=ib-sriov) on h1")
    STAGES.begin("1", "deploy VMs 100 and 101 on h1")
    for vm in (vm100, vm101):
        cluster.must("h1", "deploy", [vm.deployment, "h1"], vm, vm.deployment.read_text())
        cluster.show()
    running = cluster.running("h1")
    STAGES.shown(f"deploy: VM 100 got {' '.join(short(v) for v in running.get(vm100.name, []))}, "
                 f"VM 101 got {' '.join(short(v) for v in running.get(vm101.name, []))} on h1")

    banner("2. deploy VM 102 (1 IB NIC) on h1, whose 3 VFs are all taken: refused, nothing changes")
    STAGES.begin("2", "deploy VM 102 on a full h1: refused")
    vm102 = Guest(102, 1)
    before = cluster.held()
    r = cluster.call("h1", "deploy", [vm102.deployment, "h1"], vm102, vm102.deployment.read_text())
    if r.code == 0:
        raise DemoFailed("VM 102 was deployed on a host without a free VF")
    if cluster.held() != before or cluster.where(vm102):
        raise DemoFailed("the refused deploy of VM 102 changed the pool or left a domain behind")
    note("In OpenNebula this deploy ends in BOOT_FAILURE with the reason above, and nothing")
    note("reschedules it. The scheduler avoids it (it places VMs only where the probe reports")
    note("a free VF: SCHED_REQUIREMENTS KVM_SRIOV_FREE_VFS > 0, or the kvm-sriov placer); it")
    note("happens when VFs were taken since the last probe. The operator then either frees a")
    note("VF on h1 and runs `onevm recover --retry 102` (deploy again, same host), or runs")
    note("`onevm recover --recreate 102`: back to PENDING, and the scheduler places it on a")
    note("host with a free VF (here h2).")
    cluster.show()
    STAGES.shown(f"deploy of VM 102 on a full h1 refused ({(r.reason or r.stderr).strip().split(':')[0][:80]}), "
                 f"pools unchanged")

    banner("3. wait for VM 100 to boot (nested emulation: slow), then reboot it")
    STAGES.begin("3", "reboot VM 100")
    wait_up(vm100, boots=1)
    cluster.must("h1", "reboot", [vm100.uuid, "h1"], vm100)
    note("VM 100 reboots (ACPI) and keeps its VF; its boot #2 is checked before step 5")
    cluster.show()
    STAGES.shown(f"reboot: VM 100 rebooted on h1 with its VF {short(OFFERS['h1'][0])} "
                 f"(boot #2 checked in step 5)")

    banner("4. save VM 101: its 2 VFs are detached (the guest lets go), the pool takes them back")
    STAGES.begin("4", "save and restore VM 101")
    wait_up(vm101, boots=1)   # booted: the guest can let go of its VFs
    boots = vm101.boots
    cluster.must("h1", "save", [vm101.uuid, vm101.checkpoint, "h1"], vm101, vm101.action("save", "h1"))
    if cluster.where(vm101) or any(v == 101 for v in cluster.held().values()):
        raise DemoFailed("VM 101 still runs or still holds VFs after save")
    frozen = vm101.counter
    size = vm101.checkpoint.stat().st_size / 2**20
    note(f"VM 101 is stopped at counter {frozen}; checkpoint {vm101.checkpoint} ({size:.0f} MiB)")
    cluster.show()

    banner("   restore VM 101 on h1: 2 VFs allocated again and hot-plugged into the resumed guest")
    cluster.must("h1", "restore", [vm101.checkpoint, "h1", vm101.uuid], vm101,
                 vm101.action("restore", "h1"))
    if len(cluster.running("h1").get(vm101.name, [])) != 2:
        raise DemoFailed("VM 101 was restored without its 2 VFs")
    kept_running(vm101, frozen, boots)
    cluster.show()
    STAGES.shown(f"save/restore: VM 101's 2 VFs back in h1's pool at save, 2 hot-plugged at restore, "
                 f"counter went on from {frozen}")

    banner("5. live-migrate VM 100 h1 -> h2: VF reserved on h2, detached on h1, migrate, attached on h2")
    STAGES.begin("5", "live-migrate VM 100 h1 -> h2")
    wait_up(vm100, boots=2)   # the rebooted guest must be up to let go of its VF
    frozen, boots = vm100.counter, vm100.boots
    cluster.must("h1", "migrate", [vm100.uuid, "h2", "h1"], vm100, vm100.action("migrate", "h1", "h2"))
    if cluster.where(vm100) != ["h2"]:
        raise DemoFailed(f"VM 100 runs on {cluster.where(vm100)} after migrating to h2")
    if cluster.running("h2")[vm100.name] != OFFERS["h2"]:
        raise DemoFailed("VM 100 arrived on h2 without h2's VF")
    kept_running(vm100, frozen, boots)
    cluster.show()
    STAGES.shown(f"live migration: VM 100 (boot #2 up) moved h1 -> h2 with h2's VF {short(OFFERS['h2'][0])}, "
                 f"counter went on from {frozen}")

    banner("6. shut both down (ACPI): the guests power off, their VFs go back to the pools")
    STAGES.begin("6", "shut VMs 100 and 101 down")
    cluster.must("h2", "shutdown", [vm100.uuid, "h2"], vm100)
    by_acpi = [acpi_said(vm100)]
    cluster.must("h1", "shutdown", [vm101.uuid, "h1"], vm101)
    by_acpi.append(acpi_said(vm101))
    cluster.show()
    if cluster.held() or any(cluster.running(name) for name in cluster.hosts):
        raise DemoFailed("VFs still held or domains still running after both shutdowns")
    how = "powered off" if all(by_acpi) else "stopped (not every guest by ACPI: see above)"
    STAGES.shown(f"shutdown (ACPI): VMs 100 and 101 {how}, every VF free in both pools")

    shared_memory(cluster)


INSTALLED = WORK / "installed-outside"   # --install's mark, read in the nested host


def install_remotes() -> None:
    """Each host's /var/tmp/one as `onehost sync` leaves it: OpenNebula's kvm driver and `rake install`."""
    for remotes in REMOTES.values():
        print(f"$ (OpenNebula's kvm driver from its source) + rake install REMOTES={remotes}", flush=True)
        stock_kvm.install(remotes)
        subprocess.run(["rake", "install", f"REMOTES={remotes}"], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)


def install_outside() -> int:
    """Outside the nested host (./dev demo, at the start of the timed run): the
    front-end's install, into a fresh WORK that the nested host sees through its
    root. In there, Ruby and rake under emulation took ~1.5 min per host."""
    t = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    try:
        install_remotes()
    except (OSError, subprocess.CalledProcessError, MissingProgram) as exc:
        print(f"demo: installing the driver failed: {exc}", flush=True)
        return 1
    INSTALLED.write_text(f"{time.monotonic() - t:.1f}\n")
    print(f"installed the driver for h1 and h2 in {time.monotonic() - t:.0f}s", flush=True)
    return 0


def prepare() -> int:
    """Outside the nested host, before the timed demo: build what it caches
    (kernel download, guest images, the nested host's initramfs) and say what that cost."""
    from simhost.nested import ensure_l1_initrd
    t = time.monotonic()
    before = set(CACHE_DIR.iterdir()) if CACHE_DIR.exists() else set()
    try:
        _IMAGES.clear()
        PREPARED.unlink(missing_ok=True)
        built = images()
        ensure_l1_initrd()
    except MissingProgram as exc:
        print(f"demo: {exc}", flush=True)
        return 1
    PREPARED.write_text(json.dumps({kind: [str(image.kernel), str(image.initrd), str(image.modules_dir)]
                                    for kind, image in built.items()}) + "\n")
    built = sorted(p.name for p in set(CACHE_DIR.iterdir()) - before - {PREPARED} if not p.name.startswith("."))
    if built:
        print(f"first run: {time.monotonic() - t:.0f}s to download and build {', '.join(built)} "
              f"(cached for next time)", flush=True)
    else:
        print(f"first run: nothing to do, the kernel, guest images and nested host's initramfs are cached "
              f"(checked in {time.monotonic() - t:.1f}s)", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m simhost.demo")
    parser.add_argument("--only", choices=["ivshmem"], help="development: step 0, then only this step")
    parser.add_argument("--prepare", action="store_true",
                        help="outside the nested host: build and cache what the demo boots, say what it cost")
    parser.add_argument("--install", action="store_true",
                        help="outside the nested host: install the driver into each host's remotes in a fresh "
                             f"{WORK} (else the demo installs it inside)")
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare()
    if args.install:
        return install_outside()
    t0 = time.monotonic()
    if not Path(f"/sys/bus/pci/devices/{PF_ADDRESS}/sriov_numvfs").exists():
        print(f"no SR-IOV PF at {PF_ADDRESS}: run the demo with ./dev demo (inside the nested host)")
        return 1
    sys.stdout = Progress(sys.stdout).start()
    try:
        with open("/proc/uptime") as f:
            note(f"the nested host's kernel has been up {float(f.read().split()[0]):.0f}s (its clock)")
    except OSError:
        pass
    banner("0. install the driver as `onehost sync` leaves it on every host, start two hosts")
    STAGES.begin("0", "install the driver on two hosts and start them")
    failed = None
    try:
        if INSTALLED.exists():
            note(f"the driver was installed outside the nested host, by the demo's start "
                 f"(stock kvm + rake install, {INSTALLED.read_text().strip()}s), into:")
            for remotes in REMOTES.values():
                note(f"  {remotes}: {', '.join(sorted(p.name for p in (remotes / 'vmm').iterdir()))} in vmm/")
        else:
            install_remotes()
        images()
        WORK.mkdir(parents=True, exist_ok=True)
        DATASTORE.mkdir(parents=True, exist_ok=True)
        # each host's remotes where `onehost sync` puts them (the stock scripts call /var/tmp/one/vgpu)
        with doing("starting h1 and h2 (a libvirtd each, in its own network namespace)"), \
                two_hosts(WORK, binds={name: {"/var/tmp/one": remotes} for name, remotes in REMOTES.items()}) as (h1, h2):
            cluster = Cluster({"h1": h1, "h2": h2})
            cluster.write_configs()
            STAGES.shown("install: stock kvm + kvm-sriov in h1's and h2's /var/tmp/one, "
                         "a libvirtd each (h1 offers 3 VFs, h2 1)")
            if args.only == "ivshmem":
                cluster.show()
                shared_memory(cluster)
            else:
                demo(cluster)
            STAGES.end()
    except (DemoFailed, MissingProgram) as exc:
        failed = exc
        STAGES.end("FAILED")
    banner("summary")
    for line in STAGES.summary(time.monotonic() - t0):
        print(line, flush=True)
    if failed is not None:
        print(f"\nDEMO FAILED: {failed}", flush=True)
        return 1
    banner(f"done in {time.monotonic() - t0:.0f}s: every step as expected, every VF free again, "
           f"no shared-memory region left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
