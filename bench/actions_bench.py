#!/usr/bin/python3
"""What kvm-sriov costs a VM without VFs, against OpenNebula's own kvm driver:
each action through remotes/vmm/kvm-sriov/<action> divided by the stock
remotes/vmm/kvm/<action> (installed from OpenNebula's source beside it), on
the same VM, on the same rung-2 host (private libvirtd + QEMU), in pairs that
run back to back: the action through one driver, then at once through the
other, on the VM in the same state (one operation's time drifts +-30 % over
minutes here, which pairing cancels). Who goes first alternates, and going
first or second itself moves a ratio by up to +-5 % (deploy: 1.15 first, 1.05
second in one run), so two consecutive rounds make one crossover ratio (the
geometric mean of their two) and the ratio printed is the median of those,
with its distribution-free 95 % interval. Target: <= 1.05. While a median is
over it, whole rounds are added (up to --max-rounds): a few pairs cannot tell
+-25 % noise from a cost. A miss is an
action whose whole interval is over the target; --strict makes a miss exit 1
(every action must succeed either way). The VF share is
bench/hotplug_bench.py's (rung 3).

Both sides run the way OpenNebula runs an action on a host (a `bash -s`
stream, inside the host, here without the ssh), on a guest that has finished
booting. The fixed cost of a call that hands straight over to the stock
script is printed next to the stock script alone.

    /usr/bin/python3 bench/actions_bench.py [--rounds 12] [--max-rounds 20] [--calls 15] [--samples] [--strict]
"""

import argparse
import math
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)
from kvm_sriov.actions import ACTIONS  # noqa: E402
from simhost.guest_image import counted_since, ensure_guest_image, serial_size  # noqa: E402
from simhost.libvirt_host import two_hosts  # noqa: E402
from simhost.opennebula_call import one_call  # noqa: E402
from tests.support.driver_env import cluster_config, install_remotes, node_env, wait_for  # noqa: E402
from tests.support.runnable import runnable_deployment  # noqa: E402

TARGET = 1.05
DRIVERS = ("kvm-sriov", "kvm")


def by_crossover(per_round, combine):
    """One value per two consecutive rounds, kvm-sriov first in one and
    second in the other, so what going first or second does to an action
    (the state the one before left) cancels out. A last round without its
    partner is left out (one round alone is its own value)."""
    return [combine(per_round[i], per_round[i + 1]) for i in range(0, len(per_round) - 1, 2)] or per_round


def crossover_ratios(ours, stock):
    """The geometric mean of each crossover's two pairs' ratios."""
    return by_crossover([o / s for o, s in zip(ours, stock)], lambda a, b: math.sqrt(a * b))


def median_ratio(ours, stock):
    """The median of the crossover ratios and its distribution-free 95 %
    interval: order statistics k and n+1-k, k the largest with
    P(Binomial(n, 1/2) < k) <= 2.5 % ((None, None) below 6 crossovers,
    i.e. 12 rounds)."""
    ratios = sorted(crossover_ratios(ours, stock))
    n, k, below = len(ratios), 0, 0.0
    while below + math.comb(n, k) / 2 ** n <= 0.025:
        below += math.comb(n, k) / 2 ** n
        k += 1
    interval = (ratios[k - 1], ratios[n - k]) if k else (None, None)
    return statistics.median(ratios), interval


def over_target(results) -> bool:
    return any(median_ratio(by["kvm-sriov"], by["kvm"])[0] > TARGET for by in results.values())


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Hosts:
    """Both drivers on both hosts; call(driver, host, action, args)."""

    def __init__(self, work: Path, hosts):
        self.hosts = {h.name: h for h in hosts}
        self.remotes = {h.name: install_remotes(work / h.name) for h in hosts}  # each host its own
        self.configs = {h.name: cluster_config(work, self.remotes[h.name], h) for h in hosts}
        self.action_xml = {}  # action -> stdin (the VM's action XML), like oned sends

    def call(self, driver, on, action, args, stdin="", env=None):
        r = one_call(self.remotes[on], action, args, 42, on, stdin,
                     env=node_env(self.remotes[on], KVM_SRIOV_CONFIG=str(self.configs[on]), **(env or {})),
                     wrapper=self.hosts[on].nsenter(), driver=driver)
        if r.code != 0 and action != "domstate":
            raise SystemExit(f"{driver} {action} on {on} failed ({r.code}): {r.stderr.strip()}")
        return r


def oned_xml(action: str, system_ds: Path) -> str:
    """The action XML oned sends on every action's stdin (one_vmm_exec.rb),
    for this VM: the fixture's, without its IB NIC, with our datastore."""
    from lxml import etree
    root = etree.parse(str(Path(__file__).resolve().parents[1] / f"tests/fixtures/opennebula/action-{action}.xml"))
    root = root.getroot()
    for nic in root.iterfind("VM/TEMPLATE/NIC"):
        if nic.findtext("BRIDGE") == "ib-sriov":
            nic.getparent().remove(nic)
    for path, value in (("DATASTORE/BASE_PATH", system_ds), ("DISK_TARGET_PATH", system_ds / "42"),
                        ("CHECKPOINT_FILE", system_ds / "42" / "checkpoint")):
        if root.find(path) is not None:
            root.find(path).text = str(value)
    return etree.tostring(root, encoding="unicode")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12, help="pairs of each action (an interval needs 12)")
    ap.add_argument("--max-rounds", type=int, default=0,
                    help="go on, a round at a time, while a median ratio is over the target (up to this many)")
    ap.add_argument("--max-seconds", type=float, default=900, help="no round added after this long")
    ap.add_argument("--samples", action="store_true", help="print every sample, in order")
    ap.add_argument("--calls", type=int, default=15, help="rounds of the one-call fixed cost (kvm-sriov, stock)")
    add_strict(ap)
    args = ap.parse_args()
    image = ensure_guest_image()
    results = {}  # action -> {driver: [seconds]}
    with tempfile.TemporaryDirectory() as tmp, two_hosts(Path(tmp)) as (h1, h2):
        tmp = Path(tmp)
        hosts = Hosts(tmp, (h1, h2))
        ds = tmp / "shared" / "0"  # a shared system datastore (outside the hosts' own datastores)
        vm_dir = ds / "42"
        uuid = str(uuidlib.uuid4())
        serial = tmp / "serial.log"
        xml = runnable_deployment("one-42", uuid, serial, image, ib_nics=0)
        sent = {a: oned_xml(a, ds) for a in ("reboot", "save", "restore", "migrate", "cancel")}

        def settled(fn):
            """fn, then wait for the guest to count again: it is up, not booting."""
            mark = serial_size(serial)
            t = timed(fn)
            if not wait_for(lambda: counted_since(serial, mark), 300, 0.1):
                raise SystemExit("the guest did not come back")
            return t

        def run_round(a, b):
            """One round: each action through a, then at once through b, on the
            VM in the same state (the stock driver does the steps in between
            that are not measured). Returns {action: {driver: seconds}}."""
            c, ckpt, out = hosts.call, str(vm_dir / "checkpoint"), {}

            def deploy(drv):
                return settled(lambda: c(drv, "h1", "deploy", [str(vm_dir / "deployment.0"), "h1"], xml))

            def cancel(drv):
                return timed(lambda: c(drv, "h1", "cancel", [uuid, "h1"], sent["cancel"]))

            def save_restore(drv):
                return (timed(lambda: c(drv, "h1", "save", [uuid, ckpt, "h1"], sent["save"])),
                        settled(lambda: c(drv, "h1", "restore", [ckpt, "h1", uuid], sent["restore"])))

            def put(action, drv, seconds):
                out.setdefault(action, {})[drv] = seconds

            put("deploy", a, deploy(a))
            cancel("kvm")
            put("deploy", b, deploy(b))
            for drv in (a, b):
                put("reboot", drv, settled(lambda: c(drv, "h1", "reboot", [uuid, "h1"], sent["reboot"])))
            for drv in (a, b):
                saved, restored = save_restore(drv)
                put("save", drv, saved)
                put("restore", drv, restored)
            for drv in (a, b):
                put("migrate", drv, settled(lambda: c(drv, "h1", "migrate", [uuid, "h2", "h1"], sent["migrate"])))
                put("migrate back", drv, settled(lambda: c(drv, "h2", "migrate", [uuid, "h1", "h2"], sent["migrate"])))
            put("cancel", a, cancel(a))
            deploy("kvm")
            save_restore("kvm")  # its memory written in full again, as before a's cancel
            put("cancel", b, cancel(b))
            return out

        rounds, started = 0, time.monotonic()
        while rounds < args.rounds or (rounds < args.max_rounds and over_target(results)
                                       and time.monotonic() - started < args.max_seconds):
            print(f"round {rounds + 1} ({time.monotonic() - started:.0f} s in)", file=sys.stderr, flush=True)
            for action, by in run_round(*(DRIVERS if rounds % 2 == 0 else DRIVERS[::-1])).items():
                for drv, seconds in by.items():
                    results.setdefault(action, {d: [] for d in DRIVERS})[drv].append(seconds)
            rounds += 1

        def no_op(driver):  # a VM without VFs whose domain does not exist: straight to stock
            return timed(lambda: hosts.call(driver, "h1", "cancel", [str(uuidlib.uuid4()), "h1"]))
        samples = {driver: [] for driver in DRIVERS}
        for _ in range(args.calls):  # interleaved: each round's calls see the same machine
            for driver in DRIVERS:
                samples[driver].append(no_op(driver))
        fixed = {driver: statistics.median(v) for driver, v in samples.items()}
        added = statistics.median(o - s for o, s in zip(samples["kvm-sriov"], samples["kvm"]))

    print(f"kvm-sriov vs OpenNebula's kvm driver on a VM without VFs (rung 2), {rounds} back-to-back "
          f"pairs per action, alternating who goes first; ratio = median over two rounds each (kvm-sriov first "
          f"in one, second in the other) of their pairs' ratios' geometric mean, with its 95 % interval (sign "
          f"test){'; rounds added while a median was over the target' if rounds > args.rounds else ''}")
    worst, significant = 0.0, []
    for name, by in results.items():
        ours, stock = by["kvm-sriov"], by["kvm"]
        ratio, (low, high) = median_ratio(ours, stock)
        extra = statistics.median(by_crossover([o - s for o, s in zip(ours, stock)], lambda a, b: (a + b) / 2))
        worst = max(worst, ratio)
        interval = f"[{low:.2f}, {high:.2f}]" if low is not None else "[n/a: too few rounds]"
        print(f"  {name:12} kvm-sriov {statistics.median(ours):6.3f}s   kvm {statistics.median(stock):6.3f}s"
              f"   ratio {ratio:5.2f} {interval:>14}   {extra * 1000:+5.0f} ms   ({len(ours)} pairs)")
        if args.samples:
            for side in DRIVERS:
                print(f"    {side:9} " + " ".join(f"{v:.3f}" for v in by[side]))
        if low is not None and low > TARGET:
            print(f"  {name}: median {ratio:.2f} over the target; the whole interval is")
            significant.append(f"{name} ratio {ratio:.2f}, 95 % interval [{low:.2f}, {high:.2f}] > {TARGET:.2f}")
        elif ratio > TARGET:
            print(f"  {name}: median {ratio:.2f} over the target, " + ("too few rounds to tell it from noise"
                  if low is None else "inside this run's noise (the interval reaches the target)"))
    print(f"  one call handed straight to the stock script (cancel of an unknown domain): "
          f"kvm-sriov {fixed['kvm-sriov'] * 1000:.1f} ms, stock kvm alone {fixed['kvm'] * 1000:.1f} ms; added to the "
          f"stock script, median of {args.calls} interleaved rounds: {added * 1000:+.1f} ms")
    print("  what that fixed cost alone makes of each action (1 + extra / stock median): " + ", ".join(
        f"{name} {1 + added / statistics.median(by['kvm']):.2f}" for name, by in results.items()
        if name.split()[0] in ACTIONS) + " (the others exec the stock script: no Python)")
    print(f"  worst median ratio {worst:.2f} (target <= {TARGET:.2f}); a miss is one whose whole 95 % interval "
          f"is over the target (one operation here varies by +-25 % from run to run)")
    return finish("bench-actions", significant, args.strict)


if __name__ == "__main__":
    sys.exit(main())
