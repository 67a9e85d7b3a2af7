#!/usr/bin/python3
"""What a user waits for, through a real OpenNebula 7.4 oned (rung 4,
simhost.frontend): `onevm deploy` to RUNNING, `onevm migrate --live` to
RUNNING on the other host, `onevm suspend` to SUSPENDED and `onevm resume`
to RUNNING, side by side on two kvm-sriov hosts and two stock kvm hosts
(VM_MAD qemu: OpenNebula's own kvm scripts, TCG domains as ours here), the
same VM template everywhere (no VF: a stock host cannot run one).

Each setup has its own VM per round; one operation is done on both VMs one
after the other before the next operation begins, who goes first
alternating from round to round. Each time runs from the XML-RPC call the
CLI makes (its Ruby start-up, the same for every setup, left out: it would
only dilute the ratios) to oned answering with the new state, polled every
20 ms.

Printed: per operation the median time of each setup, and the median of the
per-round ratios kvm-sriov/stock with a distribution-free 95 % interval
(order statistics; none below 6 values), and every operation's ratios pooled.
Gate, judged only with at least 6 rounds (the timing run has 12): each
operation's median ratio <= 1.02; a miss is any operation's median over it
(--strict makes a miss exit 1), to be explained or removed. The pooled
ratio is printed, not judged: a cheap deploy and migrate (tens of seconds)
would hide a suspend 100 ms slower. Fewer rounds (./dev test runs 2) are a
smoke check: every operation must succeed on both setups, and the ratios
are printed without a verdict on them (2 ratios per operation cannot tell
10 % from noise).

    python3 bench/oned_actions_bench.py [--rounds 2] [--strict] [--samples]
"""

import argparse
import math
import statistics
import sys
import tempfile
import time
import xmlrpc.client
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simhost.frontend import FrontEnd, OpenNebulaMissing  # noqa: E402
from simhost.guest_image import UP_LINE  # noqa: E402
from verdict import add_strict, finish  # noqa: E402  (bench/ is the script's dir)

TARGET = 1.02
SETUPS = ("kvm-sriov", "stock")
HOSTS = {"kvm-sriov": ("s1", "s2"), "stock": ("k1", "k2")}
OPERATIONS = ("deploy", "migrate", "suspend", "resume")
JUDGED_ROUNDS = 6  # the fewest with an interval; below it a run is a smoke check
POLL = 0.02
TIMEOUT = 900  # one operation on a loaded shared machine: a restore took over 5 minutes


def median_interval(values):
    """The median and its distribution-free 95 % interval: order statistics
    k and n+1-k, k the largest with P(Binomial(n, 1/2) < k) <= 2.5 %
    ((None, None) below 6 values)."""
    xs = sorted(values)
    n, k, below = len(xs), 0, 0.0
    while below + math.comb(n, k) / 2 ** n <= 0.025:
        below += math.comb(n, k) / 2 ** n
        k += 1
    return statistics.median(xs), ((xs[k - 1], xs[n - k]) if k else (None, None))


class Bench:
    def __init__(self, fe: FrontEnd):
        self.fe = fe
        self.rpc = xmlrpc.client.ServerProxy(fe.endpoint)
        self.host_id = {name: h.id for name, h in fe.hosts.items()}

    def call(self, method, *args):
        ok, body = getattr(self.rpc.one.vm, method)(self.fe.session, *args)[:2]
        if not ok:
            raise RuntimeError(f"one.vm.{method}{args}: {body}")

    def wait(self, vm, want, host=None, t0=None, timeout=TIMEOUT):
        """Seconds from t0 until the VM is in state `want` (on host)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.fe.vm_state(vm)
            if state == want and (host is None or self.fe._runs_on(vm, host)):
                return time.perf_counter() - t0 if t0 else 0.0
            if state.endswith("FAILURE") or state == "UNKNOWN" or time.monotonic() > deadline:
                raise RuntimeError(f"VM {vm} is {state} waiting for {want}: {self.fe.vm_error(vm)}\n"
                                   f"--- vm.log ---\n{self.fe.vm_log(vm)[-3000:]}")
            time.sleep(POLL)

    def operation(self, setup, op, vm):
        """One timed operation on the setup's VM."""
        src, dst = HOSTS[setup]
        t0 = time.perf_counter()
        if op == "deploy":
            self.call("deploy", vm, self.host_id[src], False, -1, "")
            return self.wait(vm, "RUNNING", src, t0)
        if op == "migrate":
            self.call("migrate", vm, self.host_id[dst], True, False, -1, 0)
            return self.wait(vm, "RUNNING", dst, t0)
        self.call("action", op, vm)
        return self.wait(vm, "SUSPENDED" if op == "suspend" else "RUNNING", None, t0)

    def guest_up(self, setup, name, timeout=180):
        deadline = time.monotonic() + timeout
        while UP_LINE not in self.fe.host(HOSTS[setup][0]).console(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"guest {name} ({setup}) did not come up")
            time.sleep(0.2)

    def round(self, r, template, times):
        order = SETUPS if r % 2 == 0 else SETUPS[::-1]
        vms = {}
        for s in order:
            name = f"r{r}-{s}"
            out = self.fe.cli("onetemplate", "instantiate", template, "--name", name, "--hold",
                              "--raw", self.fe.console_raw(name)).stdout
            vms[s] = (int(out.split("ID:")[1].split()[0]), name)
        try:
            for op in OPERATIONS:
                for s in order:
                    times[s][op].append(self.operation(s, op, vms[s][0]))
                if op == "deploy":  # migrate a guest that has booted: no boot's CPU in the next times
                    for s in order:
                        self.guest_up(s, vms[s][1])
        finally:  # a VM an operation left midway cannot be terminated: recover --delete
            for vm, _ in vms.values():
                if not self.rpc.one.vm.action(self.fe.session, "terminate-hard", vm)[0]:
                    self.rpc.one.vm.recover(self.fe.session, vm, 3)
            for vm, _ in vms.values():
                self.wait(vm, "DONE")
        print(f"round {r + 1} ({' '.join(order)}): " + "; ".join(
            f"{op} " + " ".join(f"{s} {times[s][op][-1]:.2f}" for s in SETUPS) for op in OPERATIONS), flush=True)


def ratios(times, a, b, ops=OPERATIONS):
    return [x / y for op in ops for x, y in zip(times[a][op], times[b][op])]


def fmt(m, iv):
    return f"{m:.3f} " + (f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv[0] is not None else "[n/a: < 6 values]")


def report(times):
    rounds = len(times["stock"]["deploy"])
    print(f"\n{rounds} rounds; seconds, median per setup; ratio: median of per-round ratios [95 % interval]")
    for op in OPERATIONS:
        med = {s: statistics.median(times[s][op]) for s in SETUPS}
        spread = {s: (min(times[s][op]), max(times[s][op])) for s in SETUPS}
        print(f"  {op:8} " + "  ".join(f"{s} {med[s]:.3f} ({spread[s][0]:.2f}-{spread[s][1]:.2f})" for s in SETUPS))
        m, iv = median_interval(ratios(times, *SETUPS, (op,)))
        d = statistics.median(x - y for x, y in zip(times["kvm-sriov"][op], times["stock"][op]))
        print(f"           kvm-sriov/stock {fmt(m, iv)}  median difference {d * 1000:+.0f} ms")
    pooled = median_interval(ratios(times, *SETUPS))
    print(f"  every operation pooled: kvm-sriov/stock {fmt(*pooled)} ({rounds * len(OPERATIONS)} ratios)")


def misses(times):
    """Each operation whose median kvm-sriov/stock ratio is over the target;
    None when there are too few rounds to judge (a smoke check)."""
    if len(times["stock"]["deploy"]) < JUDGED_ROUNDS:
        return None
    out = []
    for op in OPERATIONS:
        m, iv = median_interval(ratios(times, *SETUPS, (op,)))
        if m > TARGET:
            d = statistics.median(x - y for x, y in zip(times["kvm-sriov"][op], times["stock"][op]))
            out.append(f"{op}: median kvm-sriov/stock {fmt(m, iv)} > {TARGET} ({d * 1000:+.0f} ms)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (each: every operation on every setup)")
    ap.add_argument("--samples", action="store_true", help="print every time")
    add_strict(ap)
    args = ap.parse_args()
    times = {s: {op: [] for op in OPERATIONS} for s in SETUPS}
    with tempfile.TemporaryDirectory(prefix="bench-oned-", dir=REPO / "build", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        fe = FrontEnd(work / "fe", ["s1", "s2"])
        try:
            fe.start()
            for name in ("k1", "k2"):
                fe.add_host(name, vmm="qemu")  # the stock kvm scripts, TCG domains (no KVM here)
        except OpenNebulaMissing as exc:
            fe.stop()
            print(f"bench-oned-actions: cannot run without OpenNebula: {exc}")
            return 1
        except BaseException:
            fe.stop()
            raise
        try:
            bench = Bench(fe)
            template = fe.create("template", f'NAME = "bench"\nCPU = "0.1"\nVCPU = "1"\nMEMORY = "160"\n'
                                             f'{fe.guest_os()}DISK = [ IMAGE_ID = "{fe.tiny_image("bench")}" ]\n')
            for r in range(args.rounds):
                bench.round(r, template, times)
        except Exception as exc:
            print(f"bench-oned-actions: an operation failed: {exc}")
            fe.collect_logs(REPO / "build" / "test-logs" / "bench-oned-actions-fe")
            return finish("bench-oned-actions", [], args.strict, [str(exc).splitlines()[0]])
        finally:
            fe.stop()
    if args.samples:
        for s in SETUPS:
            for op in OPERATIONS:
                print(f"  {s} {op}: " + " ".join(f"{t:.3f}" for t in times[s][op]))
    report(times)
    missed = misses(times)
    if missed is None:
        print(f"bench-oned-actions: every operation succeeded on both setups ({args.rounds} rounds: a smoke "
              f"check, no verdict on the ratios; the timing run, ./dev bench:oned-actions, judges them)")
        return 0
    print(f"target: each operation's median kvm-sriov/stock <= {TARGET}")
    return finish("bench-oned-actions", missed, args.strict)


if __name__ == "__main__":
    sys.exit(main())
