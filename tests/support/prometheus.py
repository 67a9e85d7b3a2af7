"""Debian's real Prometheus and node exporter on loopback, for the suites that
check kvm-sriov's metrics, dashboard and alert rules against them.

    with Prometheus(work, {"0": host_dir, None: frontend_dir}) as prom:   # a node exporter each
        prom.wait_for("a scrape", lambda: prom.query("kvm_sriov_vfs"))

The configuration is written as JSON (YAML's subset: Prometheus reads it and
no YAML library is needed). Scrape and rule evaluation every second.
"""

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

RULES = REPO / "monitoring" / "prometheus" / "kvm-sriov.rules.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "kvm-sriov.json"
PROGRAMS = {"/usr/bin/prometheus": "prometheus", "/usr/bin/promtool": "prometheus",
            "/usr/bin/prometheus-node-exporter": "prometheus-node-exporter"}
RATE_INTERVAL = "1m"                # Grafana's $__rate_interval, for a 1 s scrape interval
WAIT = 120                          # seconds any one wait may take on a loaded 2-core machine


def require_programs() -> None:
    """A missing program is the suite's failure, in one line (its packages declare them)."""
    for path, package in PROGRAMS.items():
        if not os.access(path, os.X_OK):
            pytest.fail(f"missing {path}: apt-get install {package}", pytrace=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}", pytrace=False)
        time.sleep(0.5)


def dashboard_exprs(host_id: str):
    """(panel title, expression) of every dashboard target, Grafana's variables
    as a host's values (one_host_id the one OpenNebula's scrape configuration sets)."""
    exprs = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            exprs.extend((p["title"], t["expr"]) for t in p.get("targets", []))
    walk(json.loads(DASHBOARD.read_text())["panels"])
    return [(title, e.replace("$one_host_id", host_id).replace("$__rate_interval", RATE_INTERVAL))
            for title, e in exprs]


class Prometheus:
    """A node exporter per textfile folder, labelled one_host_id as OpenNebula's
    scrape configuration labels a host's (None: no label, as it leaves the
    front-end's), and Prometheus scraping them with the shipped rules; what
    they print goes to work/daemons.log."""

    def __init__(self, work: Path, textfile_dirs: dict):
        self.work, self.textfile_dirs = Path(work), textfile_dirs
        self.port = free_port()
        self.daemons = []

    def __enter__(self):
        require_programs()
        targets, log = [], open(self.work / "daemons.log", "w")
        self.log = log
        try:
            for host_id, folder in self.textfile_dirs.items():
                port = free_port()
                labels = {} if host_id is None else {"one_host_id": str(host_id)}
                targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
                self._start(["/usr/bin/prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
                             "--collector.disable-defaults", "--collector.textfile",
                             f"--collector.textfile.directory={folder}"])
            (self.work / "prometheus.yml").write_text(json.dumps({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [{"job_name": "node_exporter", "static_configs": targets}]}))
            self._start(["/usr/bin/prometheus", f"--config.file={self.work / 'prometheus.yml'}",
                         f"--storage.tsdb.path={self.work / 'data'}",
                         f"--web.listen-address=127.0.0.1:{self.port}"])
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, args) -> None:
        self.daemons.append(subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL))

    def __exit__(self, *exc):
        for d in self.daemons:
            d.terminate()
        for d in self.daemons:
            try:
                d.wait(30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        self.log.close()

    def api(self, path, **params):
        url = (f"http://127.0.0.1:{self.port}/api/v1/{path}"
               + ("?" + urllib.parse.urlencode(params) if params else ""))
        with urllib.request.urlopen(url, timeout=30) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def value(self, expr):
        """The single series' value of expr as a float; None before the first
        scrape (nothing listening yet, or no such series)."""
        try:
            got = self.query(expr)
        except OSError:
            return None
        return float(got[0]["value"][1]) if got else None

    def firing(self, name):
        """A check for wait_for: the alerts called name that fire."""
        def check():
            return [a for a in self.api("alerts")["alerts"]
                    if a["labels"]["alertname"] == name and a["state"] == "firing"]
        return check
