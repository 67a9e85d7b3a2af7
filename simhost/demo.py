"""The kvm-sriov demo, run inside the nested SR-IOV host (``./dev demo``).

It installs the driver where `onehost sync` puts it (/var/tmp/one), writes
the host config where Puppet would (/etc/kvm-sriov/kvm-sriov.toml), and then
plays OpenNebula: the real action scripts, called exactly as OpenNebula 7.4's
MAD calls them, deploy VMs with VFs, reboot one, refuse one that asks for
more VFs than are free, and shut them down — printing the pool after each step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path

from simhost.guest_image import ensure_guest_image, last_counter
from simhost.nested import PF_ADDRESS
from simhost.opennebula_call import one_call

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvm_sriov import config as config_mod  # noqa: E402
from kvm_sriov.host import Host  # noqa: E402
from tests.support.runnable import runnable_deployment  # noqa: E402

REMOTES = Path("/var/tmp/one")
HOST_CONFIG = Path("/etc/kvm-sriov/kvm-sriov.toml")
WORK = Path("/var/lib/one/datastores/0")


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def vf_driver(address: str) -> str:
    try:
        return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{address}/driver"))
    except OSError:
        return "-"


def show_pool() -> None:
    host = Host(config_mod.load(REMOTES))
    try:
        held = {a.vf: a for a in host.assignments()}
        print(f"  {'VF':14} {'PF':14} {'host driver':12} {'VM':5} {'NIC MAC':18} state")
        for vf in host.inventory.vfs:
            a = held.get(vf.address)
            vm, mac, state = (str(a.vm_id), a.mac, a.state) if a else ("-", "-", "free")
            if not vf.eligible:
                state = "not offered: " + "; ".join(vf.problems)
            print(f"  {vf.address:14} {vf.pf:14} {vf_driver(vf.address):12} {vm:5} {mac:18} {state}")
    finally:
        host.close()


def opennebula(action: str, args: list, vmid: int, stdin: str = "") -> bool:
    shown = " ".join(str(a) for a in args)
    print(f"$ {REMOTES}/vmm/kvm-sriov/{action} {shown} {vmid} host1", flush=True)
    t = time.monotonic()
    r = one_call(REMOTES, action, args, vmid, "host1", stdin)
    for line in r.stderr.splitlines():
        print(f"  | {line}")
    status = "SUCCESS" if r.code == 0 else "FAILURE"
    print(f"  -> {action.upper()} {status} {vmid} {r.stdout.strip() or r.reason or '-'} "
          f"({time.monotonic() - t:.1f}s)", flush=True)
    return r.code == 0


def main() -> int:
    banner("install the driver as `onehost sync` leaves it, configure the host")
    subprocess.run(["rake", "install", f"REMOTES={REMOTES}"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    HOST_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    # QEMU's emulated NVMe PF stands in for a ConnectX: not class InfiniBand,
    # so the pool names it explicitly.
    HOST_CONFIG.write_text(f'[pool]\npfs = ["{PF_ADDRESS}"]\n[timeouts]\nshutdown_seconds = 240\n')
    print(HOST_CONFIG.read_text().rstrip())
    show_pool()

    image = ensure_guest_image()
    WORK.mkdir(parents=True, exist_ok=True)
    vms = {}
    for vmid, nics in ((100, 1), (101, 2)):
        uuid = str(uuidlib.uuid4())
        serial = WORK / f"serial-{vmid}.log"
        xml = runnable_deployment(f"one-{vmid}", uuid, serial, image, ib_nics=nics, memory_mib=128)
        banner(f"deploy VM {vmid} with {nics} IB NIC(s) on network BRIDGE=ib-sriov")
        if not opennebula("deploy", [f"{WORK}/{vmid}/deployment.0", "host1"], vmid, xml):
            return 1
        vms[vmid] = (uuid, serial)
        show_pool()

    banner("deploy VM 102 asking for 2 VFs while 1 is free: refused, nothing changes")
    uuid = str(uuidlib.uuid4())
    xml = runnable_deployment("one-102", uuid, WORK / "serial-102.log", image, ib_nics=2, memory_mib=128)
    if opennebula("deploy", [f"{WORK}/102/deployment.0", "host1"], 102, xml):
        return 1
    show_pool()

    banner("wait for the guests to boot far enough to honour ACPI (slow: nested emulation)")
    deadline = time.monotonic() + 600
    while any((last_counter(s) or 0) < 5 for _, s in vms.values()):
        if time.monotonic() > deadline:
            print("guests did not boot")
            return 1
        time.sleep(5)
    print("  both guests are up and counting")

    banner("reboot VM 100: the guest restarts, its VF stays")
    if not opennebula("reboot", [vms[100][0], "host1"], 100):
        return 1
    show_pool()

    for vmid in (100, 101):
        banner(f"shutdown VM {vmid} (ACPI): the guest powers off, its VFs go back to the pool")
        if not opennebula("shutdown", [vms[vmid][0], "host1"], vmid):
            return 1
        show_pool()
    banner("done: every VF is free again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
