"""Rung 4: a VM's InfiniBand traffic reaches OpenNebula's VM monitoring.

A plain VM runs on host1; the test gives it a (fake) VF the way the driver
records one (an attached row in host1's pool: the VF exists only in the fake
sysfs, no VF can really be passed through here) and makes host1's `ip`
answer `ip -s -j link show dev ib0` from a file. The packaged probe
(im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py, synced to the host by oned) is
run by the host's monitord client with the stock vm/monitor probes; its
attributes must reach one.vm.info's MONITORING beside the stock ones, grow
by what the VF counted, and show in `onevm show`."""

import json
import re
import shlex
import shutil
import time
from pathlib import Path

from kvm_sriov.vf.pool import VfPool
from tests.opennebula.conftest import PF, instantiate, terminate

VF = "0000:03:00.1"                       # VF 0 of host1's PF (tests/opennebula/conftest.py)
ATTRS = ("IB_RX_BYTES", "IB_TX_BYTES", "IB_RX_PACKETS", "IB_TX_PACKETS")
WAIT = 150                                # MONITOR_VM every 30 s (monitord.conf), twice, and slack


def set_counters(path: Path, rx: int, tx: int, rxp: int, txp: int) -> None:
    vf = {"vf": 0, "link_type": "infiniband",
          "stats": {"rx": {"bytes": rx, "packets": rxp, "multicast": 0, "broadcast": 0},
                    "tx": {"tx_bytes": tx, "tx_packets": txp}}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"ifindex": 5, "ifname": "ib0", "vfinfo_list": [vf]}]))
    tmp.replace(path)                     # the probe never reads half a file


def ib_monitoring(frontend, vm: int) -> dict:
    mon = frontend.info("vm", vm).find("MONITORING")
    return {a: int(mon.findtext(a)) for a in ATTRS if mon is not None and mon.findtext(a) is not None}


def wait_monitoring(frontend, vm: int, want: dict) -> dict:
    deadline = time.monotonic() + WAIT
    while True:
        got = ib_monitoring(frontend, vm)
        if got == want:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"VM {vm}: MONITORING has {got}, not {want} after {WAIT} s")
        time.sleep(2)


def test_vf_traffic_reaches_the_vms_monitoring(frontend, plain_template):
    host = frontend.host("host1")
    work = host.root / "vf-traffic"
    work.mkdir(exist_ok=True)
    counters = work / "ip-s-j-link-show-ib0.json"
    set_counters(counters, 5000, 4000, 50, 40)             # an earlier holder's traffic
    ip = work / "ip"                                       # this one call from the file, the rest the real ip
    ip.write_text("#!/bin/sh\n"
                  f'[ "$*" = "-s -j link show dev ib0" ] && exec cat {shlex.quote(str(counters))}\n'
                  f'exec {shlex.quote(shutil.which("ip") or "/usr/sbin/ip")} "$@"\n')
    ip.chmod(0o755)
    net = Path(host.sections["sysfs"]["root"]) / "sys" / "bus" / "pci" / "devices" / PF / "net" / "ib0"
    for name in ("ifindex", "iflink"):                     # what every real netdev has
        (net / name).write_text("5\n")
    config = host.config_path.read_text()
    assert "[infiniband]" not in config
    vm = instantiate(frontend, plain_template, "ib-traffic", host="host1")
    pool = VfPool(host.state_dir / "pool.sqlite3")
    try:
        frontend.wait_vm(vm, "RUNNING", host="host1")
        host.config_path.write_text(config + f"[infiniband]\nip_command = {json.dumps(str(ip))}\n")
        with pool.transaction() as txn:                    # as deploy records a VF in the guest
            txn.add(VF, PF, vm, f"one-{vm}", "", "attached", "test")

        # first sight: the VF's past is not the VM's
        wait_monitoring(frontend, vm, dict(zip(ATTRS, (0, 0, 0, 0))))
        set_counters(counters, 5000 + 123456, 4000 + 65432, 50 + 100, 40 + 60)
        wait_monitoring(frontend, vm, dict(zip(ATTRS, (123456, 65432, 100, 60))))

        mon = frontend.info("vm", vm).find("MONITORING")
        assert mon.findtext("CPU") is not None and mon.findtext("NETRX") is not None  # poll.rb's, kept
        shown = frontend.cli("onevm", "show", vm).stdout
        # every monitoring attribute onevm_helper.rb has no row for: "KEY<padding>: value"
        assert re.search(r"^IB_RX_BYTES\s*: 123456$", shown, re.M), shown
    finally:
        with pool.transaction() as txn:
            txn.release([VF])
        pool.close()
        host.config_path.write_text(config)
        terminate(frontend, vm)
