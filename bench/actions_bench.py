#!/usr/bin/python3
"""Driver overhead on rung 2, where VF handling is a no-op: each action's wall
time divided by the same libvirt operation on the same domain done the way
OpenNebula's own kvm driver does it (`virsh ...`), measured alternately in
one run on two private libvirtd hosts. Target: ratio <= 1.10 (--strict makes
a miss exit 1; every action must succeed either way).

    /usr/bin/python3 bench/actions_bench.py [--rounds 3] [--strict]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simhost.guest_image import ensure_guest_image  # noqa: E402
from simhost.libvirt_host import two_hosts  # noqa: E402
from tests.support.driver_env import DriverOnHost, install_remotes, write_config  # noqa: E402
from tests.support.runnable import runnable_deployment  # noqa: E402

TARGET = 1.10


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def check(result):
    if result.code != 0:
        raise SystemExit(f"action failed: {result.reason}")


def virsh(uri, *args):
    subprocess.run(["virsh", "-q", "-c", uri, *args], check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a ratio is above the target")
    args = ap.parse_args()
    image = ensure_guest_image()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, two_hosts(Path(tmp)) as (h1, h2):
        tmp = Path(tmp)
        remotes = install_remotes(tmp)
        sock = str(tmp / "{host}" / "run" / "libvirt-sock")
        drivers = {}
        for h in (h1, h2):
            cfg = write_config(tmp / f"{h.name}.toml", {
                "pool": {"state_dir": str(tmp / h.name / "state")},
                "libvirt": {"uri": h.uri},
                "migration": {"dest_uri": "qemu+unix:///system?socket=" + sock,
                              "peer_command": ["/usr/bin/env", f"KVM_SRIOV_CONFIG={tmp}/{{host}}.toml"],
                              "peer_remotes": str(remotes)}})
            drivers[h.name] = DriverOnHost(remotes, cfg, h.name)
        d1 = drivers["h1"]
        uuid = str(uuidlib.uuid4())
        xml = runnable_deployment("one-42", uuid, tmp / "serial.log", image, ib_nics=0)
        (tmp / "deployment.0").write_text(xml)
        ckpt = tmp / "checkpoint"

        def add(name, ours, plain):
            results.setdefault(name, ([], []))
            results[name][0].append(ours)
            results[name][1].append(plain)

        for _ in range(args.rounds):
            # deploy vs virsh create (then cancel vs virsh destroy)
            ours = timed(lambda: check(d1("deploy", [str(tmp / "deployment.0"), "h1"], stdin=xml)))
            ours_cancel = timed(lambda: check(d1("cancel", [uuid, "h1"])))
            plain = timed(lambda: virsh(h1.uri, "create", str(tmp / "deployment.0")))
            plain_cancel = timed(lambda: virsh(h1.uri, "destroy", uuid))
            add("deploy", ours, plain)
            add("cancel", ours_cancel, plain_cancel)
            # save / restore
            check(d1("deploy", [str(tmp / "deployment.0"), "h1"], stdin=xml))
            time.sleep(1)
            ours_save = timed(lambda: check(d1("save", [uuid, str(ckpt), "h1"])))
            ours_restore = timed(lambda: check(d1("restore", [str(ckpt), "h1", uuid])))
            plain_save = timed(lambda: virsh(h1.uri, "save", uuid, str(ckpt)))
            plain_restore = timed(lambda: virsh(h1.uri, "restore", str(ckpt)))
            add("save", ours_save, plain_save)
            add("restore", ours_restore, plain_restore)
            # live migration h1 -> h2 (ours) and back (virsh), same domain
            add("migrate", timed(lambda: check(d1("migrate", [uuid, "h2", "h1"]))),
                timed(lambda: virsh(h2.uri, "migrate", "--live", uuid,
                                    "qemu+unix:///system?socket=" + sock.replace("{host}", "h1"))))
            virsh(h1.uri, "destroy", uuid)
            ckpt.unlink(missing_ok=True)
        for h in (h1, h2):
            subprocess.run(["virsh", "-c", h.uri, "destroy", uuid], capture_output=True)

    worst = 0.0
    print(f"driver overhead on rung 2 (no VFs), {args.rounds} rounds, medians; "
          f"baseline = the same operation through virsh, as OpenNebula's kvm driver runs it")
    for name, (ours, plain) in results.items():
        o, p = statistics.median(ours), statistics.median(plain)
        worst = max(worst, o / p)
        print(f"  {name:8} kvm-sriov {o:6.3f}s   virsh {p:6.3f}s   ratio {o / p:5.2f}")
    print(f"  worst ratio {worst:.2f} (target <= {TARGET:.2f}): {'ok' if worst <= TARGET else 'ABOVE TARGET'}")
    return 0 if worst <= TARGET or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
