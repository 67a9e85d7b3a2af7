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

--trace says where each setup's time goes: on every host the driver script
oned runs (vmm/kvm-sriov/<action>, vmm/kvm/<action>) and the stock script
that does the hypervisor work (vmm/kvm/<action>) are wrapped by a few lines
of bash that note when they start and end, and per operation and setup the
medians of four steps are printed: oned's dispatch (the call to the driver
script's start), the driver's own work before the stock script (0 for
stock), the stock script, and the rest (after the stock script: vnm
drivers, oned's state change, the 20 ms poll). The wrappers cost both
setups a few ms, kvm-sriov's a little more (two wrappers): judge ratios
without --trace.

    python3 bench/oned_actions_bench.py [--rounds 2] [--strict] [--samples] [--trace]
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
# the driver script oned runs for each operation (migrate: on the source host)
SCRIPTS = {"deploy": "deploy", "migrate": "migrate", "suspend": "save", "resume": "restore"}
STEPS = ("oned to driver", "driver before stock", "stock script", "after stock")
TRACE_LOG = "kvm-sriov-bench-trace.log"  # in the host's own /var/tmp
# bash's EPOCHREALTIME: no process started for the clock
TRACE_WRAPPER = """#!/bin/bash
# bench/oned_actions_bench.py --trace: when this script starts and ends
echo "{mark}-start $EPOCHREALTIME" >> /var/tmp/{log}
"$0.traced" "$@"
rc=$?
echo "{mark}-end $EPOCHREALTIME" >> /var/tmp/{log}
exit $rc
"""


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
        self.steps = {s: {op: [] for op in OPERATIONS} for s in SETUPS}  # --trace: per op, STEPS' seconds
        self.traced = False

    def wrap_scripts(self) -> None:
        """--trace: every host's driver and stock scripts noted at start and
        end (monitoring has copied the remotes to a host by the time it is MONITORED)."""
        for setup, hosts in HOSTS.items():
            for name in hosts:
                remotes = self.fe.host(name).root / "var-tmp" / "one" / "vmm"
                for action in SCRIPTS.values():
                    marks = [("kvm", "stock")] + ([("kvm-sriov", "driver")] if setup == "kvm-sriov" else [])
                    for driver, mark in marks:
                        script = remotes / driver / action
                        if not script.is_file():
                            raise RuntimeError(f"--trace: {script} is not on host {name} (remotes not synced?)")
                        script.rename(script.with_name(action + ".traced"))
                        script.write_text(TRACE_WRAPPER.format(mark=mark, log=TRACE_LOG))
                        script.chmod(0o755)
        self.traced = True

    def note_steps(self, setup: str, op: str, host: str, t0: float, seconds: float) -> None:
        """The four STEPS of one traced operation, from the host's log
        (wall clock: the host's clock is the front-end's)."""
        log = self.fe.host(host).root / "var-tmp" / TRACE_LOG
        marks = dict(line.split() for line in log.read_text().splitlines() if line.strip())
        log.unlink()
        started = float(marks.get("driver-start", marks["stock-start"]))
        stock, stock_end = float(marks["stock-start"]), float(marks["stock-end"])
        self.steps[setup][op].append((started - t0, stock - started, stock_end - stock, t0 + seconds - stock_end))

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
        runs_on = (self.fe.vm_host(vm) or src) if self.traced else src  # where the driver script runs
        wall, t0 = time.time(), time.perf_counter()
        if op == "deploy":
            self.call("deploy", vm, self.host_id[src], False, -1, "")
            seconds = self.wait(vm, "RUNNING", src, t0)
        elif op == "migrate":
            self.call("migrate", vm, self.host_id[dst], True, False, -1, 0)
            seconds = self.wait(vm, "RUNNING", dst, t0)
        else:
            self.call("action", op, vm)
            seconds = self.wait(vm, "SUSPENDED" if op == "suspend" else "RUNNING", None, t0)
        if self.traced:
            self.note_steps(setup, op, src if op == "deploy" else runs_on, wall, seconds)
        return seconds

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


def report_steps(steps, samples=False):
    """--trace: where each setup's time went, per operation (median ms of each step)."""
    if samples:
        for s in SETUPS:
            for op in OPERATIONS:
                print(f"  {s} {op} steps (ms): " + "; ".join(" ".join(f"{x * 1000:.0f}" for x in r)
                                                         for r in steps[s][op]))
    print("\nwhere the time goes (--trace; median ms per step; the rest: after the stock script)")
    print(f"  {'':8} {'':9}  " + "  ".join(f"{name:>19}" for name in STEPS))
    for op in OPERATIONS:
        for s in SETUPS:
            rows = steps[s][op]
            print(f"  {op:8} {s:9}  " + "  ".join(
                f"{statistics.median(r[i] for r in rows) * 1000:19.0f}" for i in range(len(STEPS))))


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
    ap.add_argument("--trace", action="store_true",
                    help="print where each setup's time goes (driver and stock scripts wrapped on the hosts)")
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
            if args.trace:
                bench.wrap_scripts()
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
    if args.trace:
        report_steps(bench.steps, args.samples)
    missed = misses(times)
    if missed is None:
        print(f"bench-oned-actions: every operation succeeded on both setups ({args.rounds} rounds: a smoke "
              f"check, no verdict on the ratios; the timing run, ./dev bench:oned-actions, judges them)")
        return 0
    print(f"target: each operation's median kvm-sriov/stock <= {TARGET}")
    return finish("bench-oned-actions", missed, args.strict)


if __name__ == "__main__":
    sys.exit(main())
