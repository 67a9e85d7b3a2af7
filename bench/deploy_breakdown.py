#!/usr/bin/python3
"""Where kvm-sriov's extra deploy time goes, for a VM without VFs (rung 2).

One deploy varies by +-25 % here, so actions_bench.py's ratio for deploy
moves between about 1.02 and 1.09 from run to run. This splits the extra
in two parts that can be told apart: the time until the stock deploy
script starts (kvm-sriov's own work, low noise) and the stock script's own
run, up to and inside `virsh create` (which kvm-sriov must not change).
The stock deploy on the rung-2 host gets timestamps (bash's
$EPOCHREALTIME: no process started) at its start and around `virsh create`;
each round runs it directly and through kvm-sriov, in an alternating
order, with the VM cancelled (stock) after each.

    /usr/bin/python3 bench/deploy_breakdown.py [--rounds 24]

Diagnostic only (not in ./dev test): prints medians, and per part the median
of the pair differences against the direct call with how many were positive.
"""

import argparse
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actions_bench import Hosts, oned_xml  # noqa: E402  (bench/ is the script's dir)
from simhost.guest_image import counted_since, ensure_guest_image, serial_size  # noqa: E402
from simhost.libvirt_host import two_hosts  # noqa: E402
from tests.support.driver_env import wait_for  # noqa: E402
from tests.support.runnable import runnable_deployment  # noqa: E402

ARMS = {"stock": "kvm", "kvm-sriov": "kvm-sriov"}
PARTS = ("to the stock script", "stock, before virsh create", "virsh create", "stock, after it", "total")
CREATE = "DATA=`virsh --connect $LIBVIRT_URI create $DEP_FILE`"


def stamped(script: Path, log: Path) -> None:
    """The stock deploy, writing start / create0 / create1 / end to log."""
    def stamp(name):
        return f'printf "{name} %s\\n" "$EPOCHREALTIME" >> {log}'
    text = script.read_text()
    lines = text.split("\n")
    if CREATE not in text or not lines[0].startswith("#!"):
        raise SystemExit(f"{script}: not the stock deploy this knows (no `{CREATE}`)")
    text = "\n".join([lines[0], stamp("start"), *lines[1:]])
    text = text.replace(CREATE, f"{stamp('create0')}\n{CREATE}\n{stamp('create1')}") + f"\n{stamp('end')}\n"
    script.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=24)
    args = ap.parse_args()
    image = ensure_guest_image()
    with tempfile.TemporaryDirectory() as tmp, two_hosts(Path(tmp)) as (h1, h2):
        tmp = Path(tmp)
        hosts = Hosts(tmp, (h1, h2))
        log = tmp / "stamps"
        stamped(hosts.remotes["h1"] / "vmm" / "kvm" / "deploy", log)
        vm_dir, uuid, serial = tmp / "shared" / "0" / "42", str(uuidlib.uuid4()), tmp / "serial.log"
        xml = runnable_deployment("one-42", uuid, serial, image, ib_nics=0)
        cancel = oned_xml("cancel", tmp / "shared" / "0")
        parts = {arm: [] for arm in ARMS}
        names = list(ARMS)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for arm in order if r % (2 * len(names)) < len(names) else order[::-1]:
                log.write_text("")
                mark = serial_size(serial)
                t0 = time.time()
                hosts.call(ARMS[arm], "h1", "deploy", [str(vm_dir / "deployment.0"), "h1"], xml)
                total = time.time() - t0
                at = {k: float(v) - t0 for k, v in (line.split() for line in log.read_text().splitlines())}
                parts[arm].append([1000 * x for x in (at["start"], at["create0"] - at["start"],
                                                      at["create1"] - at["create0"], at["end"] - at["create1"], total)])
                if not wait_for(lambda: counted_since(serial, mark), 300, 0.1):
                    raise SystemExit("the guest did not boot")
                hosts.call("kvm", "h1", "cancel", [uuid, "h1"], cancel)
            print(f"round {r + 1}", file=sys.stderr, flush=True)
    print(f"deploy of a VM without VFs on a rung-2 host, {args.rounds} rounds, ms (median)")
    print(f"  {'':28}" + "".join(f"{arm:>10}" for arm in ARMS))
    for i, part in enumerate(PARTS):
        print(f"  {part:28}" + "".join(f"{statistics.median(s[i] for s in parts[arm]):10.1f}" for arm in ARMS))
    for arm in names[1:]:
        print(f"  {arm} - stock, median of the {args.rounds} round differences (rounds where it was positive):")
        for i, part in enumerate(PARTS):
            d = [a[i] - b[i] for a, b in zip(parts[arm], parts["stock"])]
            print(f"    {part:28} {statistics.median(d):+7.1f}   ({sum(x > 0 for x in d)}/{len(d)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
