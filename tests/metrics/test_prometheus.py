"""The metrics, the dashboard and the alert rules against the real Prometheus
(Debian's prometheus 2.42 and prometheus-node-exporter 1.5), on loopback.

A simulated host (the rung-1 fake sysfs, a VF pool holding every usable VF: a VM
libvirt runs holds all but one, the last is held for a VM libvirt does not run,
whose deploy died; one shared-memory region; the outage records of VMs that
migrated away: one over the budget, one left without its VFs, one two days old;
the VM traffic probe's state: the running VM's totals, which grow between two
writes, and a VM gone from here) and a front-end whose network hook ran (a push
the SM node took, one it refused, one run with oned down). libvirt is its test
driver, with the running VM in a node file. ``kvm-sriov metrics``
writes kvm_sriov.prom as the packaged timer does: into its own folder, which
node exporter's textfile folder links to (docs/metrics.md, section 3). Then
node exporter serves it, Prometheus scrapes it every second and evaluates the
shipped rules every second; every expression of the dashboard and of the rules
must return series, and the "VFs left assigned", "migration outage over budget"
and "VM left without its VFs" alerts must fire.
"""

import os
import re
import subprocess
import time

import pytest
import yaml

from kvm_sriov import config
from kvm_sriov.errors import DriverError
from kvm_sriov.files import atomic_write
from kvm_sriov.frontend import network_hook
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.ivshmem.device import Request
from kvm_sriov.node import outage, traffic
from kvm_sriov.vf import availability, intents
from kvm_sriov.vf.pool import VfPool
from tests.conftest import REPO
from tests.support.prometheus import RULES, WAIT, Prometheus, dashboard_exprs, require_programs, wait_for

HOST_ID = "0"                       # the label OpenNebula's scrape configuration gives a host's node exporter
DAY = 24 * 3600


def vnet(vid, pkey, mac, size):
    return (f"<VNET><ID>{vid}</ID><UID>1</UID><GID>1</GID><NAME>net{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
            f"<VLAN_ID>{pkey}</VLAN_ID><TEMPLATE></TEMPLATE><AR_POOL><AR><AR_ID>0</AR_ID><MAC>{mac}</MAC>"
            f"<SIZE>{size}</SIZE></AR></AR_POOL></VNET>")


class Oned:
    def __init__(self, down=False):
        self.down = down

    def pool_xml(self):
        if self.down:
            raise DriverError("cannot reach OpenNebula at http://localhost:2633/RPC2: Connection refused")
        return ("<VNET_POOL>" + vnet(1, "0x1000", "02:00:0a:00:01:01", 4) + vnet(2, "0x1001", "02:00:0a:00:02:01", 2)
                + "</VNET_POOL>")

    def merge(self, vid, template):
        raise AssertionError("the networks have their keys")


def migrated_away(cfg, vm_id, outcome, destination, ago, phases):
    """The record the source keeps of a VM's last migration (node/outage.py's own writer)."""
    unplug, migration, plug = phases
    outage.keep(cfg.state_dir, vm_id, {
        "vm_id": vm_id, "outcome": outcome, "source": "kvm1", "destination": destination,
        "ended": round(time.time() - ago, 3), "outage_seconds": round(unplug + migration + plug, 3),
        "unplug_seconds": unplug, "migration_seconds": migration, "plug_seconds": plug})


def probe_counted(cfg, vm5_total, vf):
    """The VM traffic probe's state file, as it writes it (node/traffic.py's dump_state, 0600):
    VM 5 holds ``vf``; VM 9 left this host (its total stays in the file, not in the metrics)."""
    vms = {5: traffic.VmEntry(vm5_total, {vf: (100.0, (1, 1, 1, 1))}, time.time()),
           9: traffic.VmEntry((9, 9, 9, 9), {}, time.time() - 3600)}
    atomic_write(os.path.join(cfg.state_dir, traffic.STATE_FILE), traffic.dump_state(traffic.State(vms, {})),
                 mode=0o600)


def refused(cfg, text):
    raise DriverError("the SM node refused or could not be reached (ssh sm1 kvm-sriov partitions --install -, "
                      "exit 255): Connection timed out")


def domain_xml(name, vfs):
    hostdevs = "".join(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{}' bus='0x{}' slot='0x{}' "
        "function='0x{}'/></source></hostdev>".format(*re.split(r"[:.]", vf)) for vf in vfs)
    return (f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os>"
            f"<devices>{hostdevs}</devices></domain>")


@pytest.fixture
def programs():
    require_programs()


@pytest.fixture
def site(fake_host, tmp_path):
    """The simulated host and front-end: its config file and its config."""
    node = tmp_path / "libvirt-node.xml"
    path = tmp_path / "kvm-sriov.toml"
    path.write_text(f'[sysfs]\nroot = "{fake_host["root"]}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[libvirt]\nuri = "test://{node}"\n')
    cfg = config.load(files=[path])
    usable = [v for v in availability.scan(cfg).usable()]
    left, running = usable[-1], usable[:-1]      # VM 7's deploy died; VM 5 runs with the others
    node.write_text("<node>" + domain_xml("one-5", [v.address for v in running]) + "</node>")
    pool = VfPool(cfg.pool_db)
    with pool.transaction() as txn:
        for n, vf in enumerate(running):
            txn.add(vf.address, vf.pf, 5, "one-5", f"02:00:0a:00:01:{n + 1:02x}", "attached", "deploy")
        txn.add(left.address, left.pf, 7, "one-7", "02:00:0a:00:01:09", "attached", "deploy")
        intents.record(txn, 7, "deploy", "attached", {})        # no VM lock: abandoned
        ivshmem_table.add_user(txn.db, Request(1, 4, 64), 5, "one-5")
    pool.close()
    migrated_away(cfg, 11, "migrated", "kvm2", 60, (0.6, 12.9, 0.7))         # over the 10 s budget
    migrated_away(cfg, 12, "without-vfs", "kvm3", 30, (0.5, 1.2, 40.0))      # its VFs could not be given back
    migrated_away(cfg, 13, "migrated", "kvm2", 2 * DAY, (0.4, 1.5, 0.4))     # older than the metrics' bound
    probe_counted(cfg, (10 ** 9, 2 * 10 ** 9, 10 ** 6, 2 * 10 ** 6), running[0].address)
    assert network_hook.run(cfg, None, Oned(), lambda cfg, text: "sent to the SM node").ok
    assert not network_hook.run(cfg, None, Oned(), refused).ok
    return {"config_file": path, "cfg": cfg, "left": left, "running": running, "tmp": tmp_path}


def write_metrics(site, folder):
    done = subprocess.run([str(REPO / "bin" / "kvm-sriov"), "--config", str(site["config_file"]), "metrics",
                           "--textfile-dir", str(folder)], capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done


def rule_exprs():
    return [(r["alert"], r["expr"]) for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_accepts_the_rules(programs):
    done = subprocess.run(["/usr/bin/promtool", "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=WAIT)
    assert done.returncode == 0 and "SUCCESS: 6 rules found" in done.stdout, done


def test_the_dashboard_and_the_alerts_on_the_real_prometheus(programs, site):
    tmp = site["tmp"]
    metrics_dir, textfile_dir = tmp / "kvm-sriov-metrics", tmp / "node-exporter"
    metrics_dir.mkdir()
    textfile_dir.mkdir()
    (textfile_dir / "kvm_sriov.prom").symlink_to(metrics_dir / "kvm_sriov.prom")   # what the package links
    write_metrics(site, metrics_dir)
    assert os.listdir(metrics_dir) == ["kvm_sriov.prom"]

    with Prometheus(tmp, {HOST_ID: textfile_dir}) as prom:
        def scraped(value):
            return lambda: prom.value("kvm_sriov_network_hook_failures_total") == value
        wait_for("the first scrape of kvm_sriov.prom", scraped(1))
        # another failed run (oned down), VM 5's traffic, and the timer's next write: the counters grow
        assert not network_hook.run(site["cfg"], None, Oned(down=True), refused).ok
        probe_counted(site["cfg"], (3 * 10 ** 9, 5 * 10 ** 9, 3 * 10 ** 6, 5 * 10 ** 6), site["running"][0].address)
        write_metrics(site, metrics_dir)
        wait_for("the second write scraped", scraped(2))

        # the real node exporter parsed the file through the link, without an error
        assert [r["value"][1] for r in prom.query("node_textfile_scrape_error")] == ["0"]
        # what the simulated state must give
        left = prom.query("kvm_sriov_vfs_left_assigned > 0")
        assert [(r["metric"]["pf"], r["value"][1]) for r in left] == [(site["left"].pf, "1")]
        assert prom.query('sum(kvm_sriov_vfs{state="free"})')[0]["value"][1] == "0"
        assert prom.query('kvm_sriov_operations_in_flight{state="abandoned"}')[0]["value"][1] == "1"
        assert prom.query("kvm_sriov_network_hook_runs_total")[0]["value"][1] == "3"
        assert prom.query('kvm_sriov_partition_members{pkey="0x1000"}')[0]["value"][1] == "8"
        assert prom.api("label/one_host_id/values", **{"match[]": "kvm_sriov_vfs"}) == [HOST_ID]
        outages = prom.query("kvm_sriov_migration_outage_seconds")
        assert sorted((r["metric"]["vm"], r["metric"]["outcome"], r["value"][1]) for r in outages) == \
            [("11", "migrated", "14.2"), ("12", "without-vfs", "41.7")]     # not VM 13's, two days old
        phases = prom.query('kvm_sriov_migration_outage_phase_seconds{vm="11"}')
        assert sorted((r["metric"]["phase"], r["value"][1]) for r in phases) == \
            [("migration", "12.9"), ("plug", "0.7"), ("unplug", "0.6")]
        received = prom.query("kvm_sriov_vm_ib_receive_bytes_total")
        assert [(r["metric"]["vm"], r["value"][1]) for r in received] == [("5", "3000000000")]   # not VM 9's
        assert prom.query('increase(kvm_sriov_vm_ib_transmit_bytes_total{vm="5"}[5m]) > 0')

        empty = [(title, e) for title, e in dashboard_exprs(HOST_ID) + rule_exprs() if not prom.query(e)]
        assert empty == [], f"expressions without series: {empty}"
        assert len(dashboard_exprs(HOST_ID)) >= 23 and len(rule_exprs()) == 6

        [alert] = wait_for("KvmSriovVfsLeftAssigned to fire (for: 1m)", prom.firing("KvmSriovVfsLeftAssigned"),
                           timeout=WAIT + 60)
        assert alert["labels"]["pf"] == site["left"].pf and alert["labels"]["one_host_id"] == HOST_ID
        # an event each: they fire at once, VM 11's over the budget, VM 12's left without its VFs (not both)
        [alert] = wait_for("KvmSriovMigrationOutageOverBudget to fire", prom.firing("KvmSriovMigrationOutageOverBudget"))
        assert (alert["labels"]["vm"], alert["labels"]["severity"], alert["labels"]["one_host_id"]) == \
            ("11", "warning", HOST_ID)
        [alert] = wait_for("KvmSriovMigrationLeftVmWithoutVfs to fire", prom.firing("KvmSriovMigrationLeftVmWithoutVfs"))
        assert (alert["labels"]["vm"], alert["labels"]["destination"], alert["labels"]["severity"]) == \
            ("12", "kvm3", "critical")
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in rules) == sorted(name for name, _ in rule_exprs())
        assert {r["health"] for r in rules} == {"ok"}, rules
