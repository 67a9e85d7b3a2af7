"""Rung 3 live migration, run INSIDE the nested SR-IOV host: two libvirt
hosts in their own network namespaces share the nested host's four real VFs
(h1 offers .1/.2, h2 offers .3/.4). A booted guest with a VF moves h1 -> h2:
its VF is detached (confirmed) on h1, a VF reserved beforehand on h2 is
attached there, the guest keeps counting; the VM's InfiniBand outage (VF
unplug on h1 until the VF is plugged on h2) is in its log line and in h1's
state folder, and is printed. Then the same move is killed at every step and
reconcile must converge on both hosts."""

import json
import os
import subprocess
import uuid as uuidlib
from pathlib import Path

import pytest

from simhost.guest_image import HOTPLUG_READY, ensure_guest_image, last_counter
from kvm_sriov.node import outage
from simhost.libvirt_host import two_hosts
from tests.conftest import REPO
from tests.support.driver_env import (DriverOnHost, action_xml, cluster_config, install_remotes, pool_rows,
                                      running_hostdevs, wait_for)
from tests.support.runnable import runnable_deployment

pytestmark = pytest.mark.vfio

PF = "0000:03:00.0"
OFFERS = {"h1": ["0000:03:00.1", "0000:03:00.2"], "h2": ["0000:03:00.3", "0000:03:00.4"]}
ALL = OFFERS["h1"] + OFFERS["h2"]
KILLED = 128 + 9


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    with two_hosts(work) as (h1, h2):
        hosts = {"h1": h1, "h2": h2}
        drivers = {}
        for name, h in hosts.items():
            remotes = install_remotes(work / name)  # each host its own, run inside it (stock scripts)
            cfg = cluster_config(work, remotes, h, pool={
                "pfs": [PF], "exclude_vfs": [vf for vf in ALL if vf not in OFFERS[name]]},
                timeouts={"hotplug_seconds": 60})
            drivers[name] = DriverOnHost(remotes, cfg, name, wrapper=h.nsenter())
            drivers[name].state = work / name / "state"
        yield {"hosts": hosts, "drivers": drivers, "work": work}


def hostdevs(host):
    """The VFs of the running one-42 on a host, or None where it does not run."""
    return running_hostdevs(host.uri).get("one-42")


def rows(driver):
    return pool_rows(driver.state)


def converged(cluster, where):
    """reconcile on both hosts; then each pool == what its libvirt runs."""
    for name in ("h1", "h2"):
        d = cluster["drivers"][name]
        p = subprocess.run(["/usr/bin/python3", str(REPO / "bin" / "kvm-sriov"), "reconcile"],
                           env=dict(os.environ, KVM_SRIOV_CONFIG=str(d.config)), capture_output=True, text=True)
        assert p.returncode == 0, f"{where} {name}: {p.stderr}"
    for name in ("h1", "h2"):
        live = hostdevs(cluster["hosts"][name]) or []
        assert rows(cluster["drivers"][name]) == [(vf, 42, "attached") for vf in live], \
            f"{where}: {name} pool {rows(cluster['drivers'][name])} != libvirt {live}"


def migrate_xml(driver) -> str:
    """OpenNebula's MIGRATE action XML (the stock migrate reads the VM and its
    system datastore from it): the IB NIC, the host's datastore, shared."""
    return action_xml("migrate", ib_nic=True, system_ds=Path(driver.vm_file("x")).parents[1])


def test_live_migration_moves_the_vf_and_survives_kills(cluster, tmp_path):
    h1, h2 = cluster["hosts"]["h1"], cluster["hosts"]["h2"]
    d1 = cluster["drivers"]["h1"]
    uuid = str(uuidlib.uuid4())
    serial = tmp_path / "serial.log"
    xml = runnable_deployment("one-42", uuid, serial, ensure_guest_image(), ib_nics=1, memory_mib=128)
    r = d1("deploy", [d1.vm_file("deployment.0"), "h1"], stdin=xml)
    assert r.code == 0, r.stderr
    assert wait_for(lambda: (last_counter(serial) or 0) >= HOTPLUG_READY, 600), "L2 guest did not boot"
    assert hostdevs(h1) == ["0000:03:00.1"]

    # kill points first: each must leave the guest where it was, or let reconcile finish the job
    tried = 0
    for point in ("begin", "reserved-remote", "detaching"):
        r = d1("migrate", [uuid, "h2", "h1"], stdin=migrate_xml(d1),
               extra_env={"KVM_SRIOV_KILL_AT": f"migrate:{point}"})
        assert r.code == KILLED, (point, r.stderr)
        converged(cluster, f"migrate:{point}")
        assert hostdevs(h1) == ["0000:03:00.1"] and rows(cluster["drivers"]["h2"]) == []
        tried += 1

    frozen = last_counter(serial)
    r = d1("migrate", [uuid, "h2", "h1"], stdin=migrate_xml(d1))
    assert r.code == 0, r.stderr
    assert hostdevs(h1) is None
    moved = hostdevs(h2)
    assert moved and moved[0] in OFFERS["h2"]
    assert rows(cluster["drivers"]["h2"]) == [(moved[0], 42, "attached")] and rows(d1) == []
    assert wait_for(lambda: last_counter(serial) > frozen + 1, 120), "guest state lost in migration"
    assert serial.read_text().count("simhost-guest: up") == 1
    # the IB outage the source recorded (kvm_sriov/node/outage.py), and the VM log's line of it
    record = json.loads((d1.state / outage.FOLDER / "vm-42.json").read_text())
    assert (record["outcome"], record["source"], record["destination"]) == ("migrated", "h1", "h2")
    assert all(record[f"{p}_seconds"] >= 0 for p in ("outage", *outage.PHASES))
    assert f"INFO: {outage.line(record)}" in r.stderr
    print(f"\nh1 -> h2: {outage.line(record)}; on h2: GUIDs {record.get('destination_guid_seconds')} s, "
          f"hot-plug {record.get('destination_hotplug_seconds')} s; "
          f"pre-warm before the outage {record.get('destination_prewarm_seconds')} s")

    # and back, killed after the move but before the VF was attached there
    d2 = cluster["drivers"]["h2"]
    r = d2("migrate", [uuid, "h1", "h2"], stdin=migrate_xml(d2),
           extra_env={"KVM_SRIOV_KILL_AT": "migrate:migrated"})
    assert r.code == KILLED, r.stderr
    converged(cluster, "migrate:migrated")
    tried += 1
    assert hostdevs(h1) == [] and hostdevs(h2) is None   # on h1, without a VF, nothing leaked
    print(f"\nmigration kill points: {tried} tried, {tried} converged")
