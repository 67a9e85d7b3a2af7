"""The metrics, the dashboard and the alert rules against the real Prometheus
(Debian's prometheus 2.42 and prometheus-node-exporter 1.5), on loopback.

A simulated host (the rung-1 fake sysfs, a VF pool holding every usable VF: a VM
libvirt runs holds all but one, the last is held for a VM libvirt does not run,
whose deploy died; one shared-memory region) and a front-end whose network hook
ran (a push the SM node took, one it refused, one run with oned down). libvirt
is its test driver, with the running VM in a node file. ``kvm-sriov metrics``
writes kvm_sriov.prom as the packaged timer does: into its own folder, which
node exporter's textfile folder links to (docs/metrics.md, section 3). Then
node exporter serves it, Prometheus scrapes it every second and evaluates the
shipped rules every second; every expression of the dashboard and of the rules
must return series, and the "VFs left assigned" alert must fire.
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
from kvm_sriov.frontend import network_hook
from kvm_sriov.ivshmem import table as ivshmem_table
from kvm_sriov.ivshmem.device import Request
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
    assert network_hook.run(cfg, None, Oned(), lambda cfg, text: "sent to the SM node").ok
    assert not network_hook.run(cfg, None, Oned(), refused).ok
    return {"config_file": path, "cfg": cfg, "left": left, "tmp": tmp_path}


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
    assert done.returncode == 0 and "SUCCESS: 4 rules found" in done.stdout, done


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
        # another failed run (oned down), and the timer's next write: the failures counter grows
        assert not network_hook.run(site["cfg"], None, Oned(down=True), refused).ok
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

        empty = [(title, e) for title, e in dashboard_exprs() + rule_exprs() if not query(prometheus_port, e)]
        assert empty == [], f"expressions without series: {empty}"
        assert len(dashboard_exprs()) >= 20 and len(rule_exprs()) == 4

        def firing():
            alerts = api(prometheus_port, "alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "KvmSriovVfsLeftAssigned"
                    and a["state"] == "firing"]
        [alert] = wait_for("KvmSriovVfsLeftAssigned to fire (for: 1m)", firing, timeout=WAIT + 60)
        assert alert["labels"]["pf"] == site["left"].pf and alert["labels"]["one_host_id"] == HOST_ID
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
