#!/usr/bin/python3
"""Rung 3: what a VF costs the actions that must take it off and give it
back, on real vfio-pci VFs. Runs INSIDE the nested SR-IOV host (rake
bench-hotplug boots it): a booted guest with one VF, then

  * unplug / plug of a settled guest's VF through detach_nic / attach_nic:
    the confirmed times the driver logs (request until the device is gone
    from / present in the live domain) and the scripts' wall time;
  * unplug right after a plug (what migrating back at once does): how often
    the guest ignored the first request and had to be asked again;
  * save and restore with the VF vs plain libvirt (virsh) on the same domain
    without it: the difference is the VF's price.

    /usr/bin/python3 bench/hotplug_bench.py [--rounds 3]
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simhost.guest_image import HOTPLUG_READY, ensure_guest_image, last_counter  # noqa: E402
from tests.support.driver_env import destroy_all, install_remotes, nested_host_driver, wait_for  # noqa: E402
from tests.support.runnable import interface_macs, runnable_deployment  # noqa: E402

URI = "qemu:///system"
PF = "0000:03:00.0"
UNPLUGGED = re.compile(r"unplugged in ([0-9.]+)s")
PLUGGED = re.compile(r"\bplugged in ([0-9.]+)s")  # not "unplugged in"


def ok(result, what):
    if result.code != 0:
        raise SystemExit(f"{what} failed: {result.reason}")
    return result


def logged(result, pattern):
    found = [float(m) for m in pattern.findall(result.stderr)]
    return found[-1] if found else 0.0


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def virsh(*args):
    subprocess.run(["virsh", "-q", "-c", URI, *args], check=True, capture_output=True)


def line(name, values, unit="s"):
    return (f"  {name:44} p50 {statistics.median(values):6.2f}{unit}  "
            f"min {min(values):6.2f}{unit}  max {max(values):6.2f}{unit}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        driver = nested_host_driver(install_remotes(tmp), tmp, PF, hotplug_seconds=90)
        uuid = str(uuidlib.uuid4())
        serial = tmp / "serial.log"
        xml = runnable_deployment("one-42", uuid, serial, ensure_guest_image(), ib_nics=1, memory_mib=128)
        mac = interface_macs(xml, "bridge")[0]
        nic = [uuid, mac, "ib-sriov", "-", "dummy", "one-42-1"]
        ckpt = driver.vm_file("checkpoint")   # OpenNebula's files live in the VM's datastore folder
        try:
            ok(driver("deploy", [driver.vm_file("deployment.0"), "host1"], stdin=xml), "deploy")
            if not wait_for(lambda: (last_counter(serial) or 0) >= HOTPLUG_READY, 600):
                raise SystemExit("the L2 guest did not boot")
            m = {k: [] for k in ("unplug", "plug", "detach_nic", "attach_nic", "quick unplug",
                                 "save+VF", "save", "restore+VF", "restore")}
            asked_again = 0
            for _ in range(args.rounds):
                wall, r = timed(lambda: ok(driver("detach_nic", [uuid, mac]), "detach_nic"))
                m["detach_nic"].append(wall)
                m["unplug"].append(logged(r, UNPLUGGED))
                time.sleep(5)
                # plain libvirt save/restore of the same domain, now without its VF
                m["save"].append(timed(lambda: virsh("save", uuid, ckpt))[0])
                m["restore"].append(timed(lambda: virsh("restore", ckpt))[0])
                wall, r = timed(lambda: ok(driver("attach_nic", nic), "attach_nic"))
                m["attach_nic"].append(wall)
                m["plug"].append(logged(r, PLUGGED))
                time.sleep(10)   # let the guest settle: the actions below start from a running VM with a VF
                m["save+VF"].append(timed(lambda: ok(driver("save", [uuid, ckpt, "host1"]), "save"))[0])
                m["restore+VF"].append(timed(lambda: ok(driver("restore", [ckpt, "host1", uuid]), "restore"))[0])
                # unplug at once after the plug the restore just did
                r = ok(driver("detach_nic", [uuid, mac]), "detach_nic right after a plug")
                m["quick unplug"].append(logged(r, UNPLUGGED))
                asked_again += "asking the guest again" in r.stderr
                ok(driver("attach_nic", nic), "attach_nic")
                time.sleep(10)
            ok(driver("shutdown", [uuid, "host1"]), "shutdown")
        finally:
            destroy_all(URI)
    n = args.rounds
    print(f"VF cost on rung 3 (real vfio-pci VFs, nested guest, 1 VF), {n} rounds")
    print(line("unplug, confirmed gone (driver log)", m["unplug"]))
    print(line("plug, confirmed present (driver log)", m["plug"]))
    print(line("detach_nic script (wall)", m["detach_nic"]))
    print(line("attach_nic script (wall)", m["attach_nic"]))
    print(line("unplug right after a plug (driver log)", m["quick unplug"]))
    print(f"  guest ignored the first unplug request right after a plug: {asked_again}/{n} "
          f"(asked again after timeouts.detach_retry_seconds)")
    for action in ("save", "restore"):
        with_vf, plain = statistics.median(m[action + "+VF"]), statistics.median(m[action])
        print(f"  {action:8} with its VF {with_vf:6.2f}s   plain libvirt without it {plain:6.2f}s   "
              f"VF share {with_vf - plain:+6.2f}s (ratio {with_vf / plain:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
