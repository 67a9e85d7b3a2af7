#!/usr/bin/python3
"""Regenerate tests/sched/fixtures/ from a real OpenNebula 7.4 front-end.

    /usr/bin/python3 -m tests.sched.make_fixtures [WORKDIR]

A front-end (simhost.frontend: real oned, monitord, one_sched) with three
simulated hosts whose kvm-sriov probes read fake sysfs trees, SCHED_MAD set to
the kvm-sriov placer with KVM_SRIOV_PLACEMENT_TRACE on and rank's MAX_HOST
raised to 4 (so one window can put several VMs on one host). VMs are
instantiated in bursts; every scheduling window's documents (the input oned
sent, the ledger before it, what rank got and answered, the final plan and
messages) are kept, and the windows of each scenario are copied to
tests/sched/fixtures/<scenario>-<n>/. Deploys on these hosts fail (a fake VF
cannot be passed through): the placements, not the VMs, are what we keep.
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import REPO
from tests.sched.sched_frontend import SchedFrontEnd, fake_host

FIXTURES = REPO / "tests" / "sched" / "fixtures"

# host -> PFs (address, netdev, ibdev, NUMA node, VFs)
HOSTS = {
    "h1": [("0000:03:00.0", "ib0", "mlx5_0", 0, 3), ("0000:81:00.0", "ib1", "mlx5_1", 1, 2)],
    "h2": [("0000:03:00.0", "ib0", "mlx5_0", 0, 2)],
    "h3": [("0000:03:00.0", "ib0", "mlx5_0", 0, 1)],
}


def templates(fe, image):
    ib = fe.create("vnet", 'NAME = "ib"\nVN_MAD = "dummy"\nBRIDGE = "ib-sriov"\nVLAN_ID = "0x8001"\n'
                           'AR = [ TYPE = "ETHER", SIZE = "200" ]\n')
    ib1 = fe.create("vnet", 'NAME = "ib-on-ib1"\nVN_MAD = "dummy"\nBRIDGE = "ib-sriov:ib1"\n'
                            'VLAN_ID = "0x8002"\nAR = [ TYPE = "ETHER", SIZE = "200" ]\n')
    eth = fe.create("vnet", 'NAME = "eth"\nVN_MAD = "dummy"\nBRIDGE = "br0"\n'
                            'AR = [ TYPE = "ETHER", SIZE = "200" ]\n')
    base = (f'CPU = "0.1"\nVCPU = "1"\nMEMORY = "64"\n{fe.guest_os()}DISK = [ IMAGE_ID = "{image}" ]\n'
            'SCHED_REQUIREMENTS = "KVM_SRIOV_FREE_VFS > 0"\n')
    # in <metadata>: oned 7.4 validates RAW DATA against libvirt's domain schema
    raw = ('RAW = [ TYPE = "kvm", DATA = "<metadata><sriov:options xmlns:sriov=\'urn:kvm-sriov:metadata:1\' '
           'hpc=\'yes\' numa=\'require\'/></metadata>" ]\n')
    out = {
        "one-nic": f'NAME = "one-nic"\n{base}NIC = [ NETWORK_ID = "{eth}" ]\nNIC = [ NETWORK_ID = "{ib}" ]\n',
        "two-nic": f'NAME = "two-nic"\n{base}NIC = [ NETWORK_ID = "{ib}" ]\nNIC = [ NETWORK_ID = "{ib}" ]\n',
        "pinned": f'NAME = "pinned"\n{base}NIC = [ NETWORK_ID = "{ib1}" ]\n',
        "numa-require": f'NAME = "numa-require"\n{base}{raw}NIC = [ NETWORK_ID = "{ib}" ]\n'
                        f'NIC = [ NETWORK_ID = "{ib}" ]\nNIC = [ NETWORK_ID = "{ib}" ]\n',
        "hpc-prefer": f'NAME = "hpc-prefer"\n{base}KVM_SRIOV_HPC = "YES"\nNIC = [ NETWORK_ID = "{ib}" ]\n',
        "numa-attr": f'NAME = "numa-attr"\n{base}KVM_SRIOV_HPC = "YES"\nKVM_SRIOV_NUMA = "require"\n'
                     f'NIC = [ NETWORK_ID = "{ib}" ]\nNIC = [ NETWORK_ID = "{ib}" ]\n',
        "too-big": f'NAME = "too-big"\n{base}' + f'NIC = [ NETWORK_ID = "{ib}" ]\n' * 6,   # h1 has 5
    }
    return {name: fe.create("template", text) for name, text in out.items()}


def burst(fe, tids, names):
    """Instantiate on hold, then release all at once: one scheduling window."""
    vms = [int(fe.cli("onetemplate", "instantiate", tids[n], "--hold", "--name", f"{n}-{i}")
               .stdout.split("ID:")[1].split()[0]) for i, n in enumerate(names)]
    fe.cli("onevm", "release", ",".join(map(str, vms)))
    return vms


def wait_windows(trace: Path, after: float, quiet: float = 25.0, timeout: float = 240.0) -> list[str]:
    """Stamps of the windows traced after `after`, once no new one came for `quiet` s."""
    deadline = time.time() + timeout
    last, seen = time.time(), set()
    while time.time() < deadline:
        now = {p.name.split("-")[0] for p in trace.glob("*-input.xml") if float(p.name.split("-")[0]) > after}
        if now != seen:
            seen, last = now, time.time()
        elif seen and time.time() - last > quiet:
            break
        time.sleep(0.5)
    return sorted(seen, key=float)


def keep(trace: Path, stamps, scenario: str) -> None:
    for n, stamp in enumerate(stamps, 1):
        dst = FIXTURES / f"{scenario}-{n}"
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for f in trace.glob(f"{stamp}-*"):
            shutil.copy(f, dst / f.name.split("-", 1)[1])
        (dst / "time.txt").write_text(stamp + "\n")   # when the window ran (ledger ages)
        print(f"kept {dst.relative_to(REPO)}")


def main(workdir: Path) -> int:
    trace = workdir / "trace"
    os.environ["KVM_SRIOV_PLACEMENT_TRACE"] = str(trace)   # oned's environment, passed to one_sched
    config = {h: {"sysfs": {"root": str(fake_host(workdir / "sysfs" / h, pfs))}} for h, pfs in HOSTS.items()}
    with SchedFrontEnd(workdir / "fe", list(HOSTS), host_config=config, max_host=4) as fe:
        tids = templates(fe, fe.tiny_image())
        scenarios = [
            ("burst", ["one-nic"] * 7 + ["two-nic"] * 2),
            ("shapes", ["pinned", "pinned", "pinned", "numa-require", "hpc-prefer", "too-big"]),
            ("options", ["numa-attr", "numa-attr"]),   # per-VM options as template attributes
        ]
        for scenario, names in scenarios:
            start = time.time()
            vms = burst(fe, tids, names)
            keep(trace, wait_windows(trace, start), scenario)
            # the next scenario starts from hosts without these VMs and their bookings
            fe.cli("onevm", "recover", "--delete", ",".join(map(str, vms)), check=False)
            while any(h.find("VMS/ID") is not None for h in fe.xml("onehost", "list").iter("HOST")):
                time.sleep(1)
            time.sleep(max(0.0, 61 - (time.time() - start)))   # placement.Ledger's grace
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sched-fixtures-"))))
