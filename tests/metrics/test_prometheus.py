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

import json
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request

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

RULES = REPO / "monitoring" / "prometheus" / "kvm-sriov.rules.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "kvm-sriov.json"
PROGRAMS = {"/usr/bin/prometheus": "prometheus", "/usr/bin/promtool": "prometheus",
            "/usr/bin/prometheus-node-exporter": "prometheus-node-exporter"}
HOST_ID = "0"                       # the label OpenNebula's scrape configuration gives a host's node exporter
RATE_INTERVAL = "1m"                # Grafana's $__rate_interval, for a 1 s scrape interval
WAIT = 120                          # seconds any one wait may take on a loaded 2-core machine
DAY = 24 * 3600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port, path, **params):
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]


def query(port, expr):
    return api(port, "query", query=expr)["result"]


def wait_for(what, check, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}", pytrace=False)
        time.sleep(0.5)


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
    for path, package in PROGRAMS.items():
        if not os.access(path, os.X_OK):
            pytest.fail(f"missing {path}: apt-get install {package}", pytrace=False)


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


def started(args, log):
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def dashboard_exprs():
    """Every target expression of the dashboard, Grafana's variables as a host's
    values (one_host_id the one OpenNebula's scrape configuration sets)."""
    exprs = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            exprs.extend((p["title"], t["expr"]) for t in p.get("targets", []))
    walk(json.loads(DASHBOARD.read_text())["panels"])
    return [(title, e.replace("$one_host_id", HOST_ID).replace("$__rate_interval", RATE_INTERVAL))
            for title, e in exprs]


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

    exporter_port, prometheus_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "node_exporter", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"one_host_id": HOST_ID}}]}]}))
    log = open(tmp / "daemons.log", "w")
    daemons = [
        started(["/usr/bin/prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{exporter_port}",
                 "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={textfile_dir}"], log),
        started(["/usr/bin/prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prometheus_port}"], log)]
    try:
        def scraped(value):
            def check():
                try:
                    got = query(prometheus_port, "kvm_sriov_network_hook_failures_total")
                except OSError:       # not listening yet
                    return False
                return got and float(got[0]["value"][1]) == value
            return check
        wait_for("the first scrape of kvm_sriov.prom", scraped(1))
        # another failed run (oned down), VM 5's traffic, and the timer's next write: the counters grow
        assert not network_hook.run(site["cfg"], None, Oned(down=True), refused).ok
        probe_counted(site["cfg"], (3 * 10 ** 9, 5 * 10 ** 9, 3 * 10 ** 6, 5 * 10 ** 6), site["running"][0].address)
        write_metrics(site, metrics_dir)
        wait_for("the second write scraped", scraped(2))

        # the real node exporter parsed the file through the link, without an error
        assert [r["value"][1] for r in query(prometheus_port, "node_textfile_scrape_error")] == ["0"]
        # what the simulated state must give
        left = query(prometheus_port, "kvm_sriov_vfs_left_assigned > 0")
        assert [(r["metric"]["pf"], r["value"][1]) for r in left] == [(site["left"].pf, "1")]
        assert query(prometheus_port, 'sum(kvm_sriov_vfs{state="free"})')[0]["value"][1] == "0"
        assert query(prometheus_port, 'kvm_sriov_operations_in_flight{state="abandoned"}')[0]["value"][1] == "1"
        assert query(prometheus_port, "kvm_sriov_network_hook_runs_total")[0]["value"][1] == "3"
        assert query(prometheus_port, 'kvm_sriov_partition_members{pkey="0x1000"}')[0]["value"][1] == "8"
        assert api(prometheus_port, "label/one_host_id/values", **{"match[]": "kvm_sriov_vfs"}) == [HOST_ID]
        outages = query(prometheus_port, "kvm_sriov_migration_outage_seconds")
        assert sorted((r["metric"]["vm"], r["metric"]["outcome"], r["value"][1]) for r in outages) == \
            [("11", "migrated", "14.2"), ("12", "without-vfs", "41.7")]     # not VM 13's, two days old
        phases = query(prometheus_port, 'kvm_sriov_migration_outage_phase_seconds{vm="11"}')
        assert sorted((r["metric"]["phase"], r["value"][1]) for r in phases) == \
            [("migration", "12.9"), ("plug", "0.7"), ("unplug", "0.6")]
        received = query(prometheus_port, "kvm_sriov_vm_ib_receive_bytes_total")
        assert [(r["metric"]["vm"], r["value"][1]) for r in received] == [("5", "3000000000")]   # not VM 9's
        assert query(prometheus_port, 'increase(kvm_sriov_vm_ib_transmit_bytes_total{vm="5"}[5m]) > 0')

        empty = [(title, e) for title, e in dashboard_exprs() + rule_exprs() if not query(prometheus_port, e)]
        assert empty == [], f"expressions without series: {empty}"
        assert len(dashboard_exprs()) >= 23 and len(rule_exprs()) == 6

        def firing(name):
            def check():
                alerts = api(prometheus_port, "alerts")["alerts"]
                return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]
            return check
        [alert] = wait_for("KvmSriovVfsLeftAssigned to fire (for: 1m)", firing("KvmSriovVfsLeftAssigned"),
                           timeout=WAIT + 60)
        assert alert["labels"]["pf"] == site["left"].pf and alert["labels"]["one_host_id"] == HOST_ID
        # an event each: they fire at once, VM 11's over the budget, VM 12's left without its VFs (not both)
        [alert] = wait_for("KvmSriovMigrationOutageOverBudget to fire", firing("KvmSriovMigrationOutageOverBudget"))
        assert (alert["labels"]["vm"], alert["labels"]["severity"], alert["labels"]["one_host_id"]) == \
            ("11", "warning", HOST_ID)
        [alert] = wait_for("KvmSriovMigrationLeftVmWithoutVfs to fire", firing("KvmSriovMigrationLeftVmWithoutVfs"))
        assert (alert["labels"]["vm"], alert["labels"]["destination"], alert["labels"]["severity"]) == \
            ("12", "kvm3", "critical")
        rules = [r for g in api(prometheus_port, "rules")["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in rules) == sorted(name for name, _ in rule_exprs())
        assert {r["health"] for r in rules} == {"ok"}, rules
    finally:
        for d in daemons:
            d.terminate()
        for d in daemons:
            try:
                d.wait(30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        log.close()     # tmp/daemons.log: what node exporter and Prometheus said
