"""Rung 1: ``kvm-sriov metrics --textfile-dir DIR`` (kvm_sriov/metrics/__init__.py
and the CLI): one file replaced whole, names as Prometheus wants them, one line
when something is missing, and nothing of it on the action path."""

import os
import stat
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvm_sriov import cli, metrics
from tests.conftest import REPO


@pytest.fixture
def config_file(fake_host, tmp_path):
    path = tmp_path / "kvm-sriov.toml"
    path.write_text(f'[sysfs]\nroot = "{fake_host["root"]}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def run_cli(config_file, *args):
    return cli.main(["--config", str(config_file), "metrics", *args])


def test_the_file_is_written_whole_with_prometheus_names(config_file, tmp_path, capsys):
    out = tmp_path / "textfile"
    out.mkdir()
    assert run_cli(config_file, "--textfile-dir", str(out)) == 0
    assert capsys.readouterr() == ("", "")     # a timer runs it: silent when it worked
    assert os.listdir(out) == ["kvm_sriov.prom"]
    families = list(text_string_to_metric_families((out / "kvm_sriov.prom").read_text()))
    names = {f.name for f in families}
    assert {"kvm_sriov_build_info", "kvm_sriov_vfs", "kvm_sriov_vfs_left_assigned", "kvm_sriov_operations_in_flight",
            "kvm_sriov_ivshmem_regions", "kvm_sriov_ivshmem_used_bytes", "kvm_sriov_ivshmem_budget_bytes"} <= names
    for f in families:
        assert f.name.startswith("kvm_sriov_") and f.documentation
        for s in f.samples:
            assert not s.name.endswith("_total") or f.type == "counter"
            assert not s.name.endswith(("_seconds", "_bytes")) or f.type in ("gauge", "counter")
    # a pool-less host: every usable VF free
    free = sum(s.value for f in families if f.name == "kvm_sriov_vfs" for s in f.samples if s.labels["state"] == "free")
    assert free == 6


def test_the_front_end_part_comes_with_the_hooks_status_file(config_file, tmp_path):
    from kvm_sriov import config
    from kvm_sriov.frontend import network_hook
    from tests.unit.kvm_sriov.metrics.test_frontend import NETWORKS, Oned
    cfg = config.load(files=[config_file])
    assert network_hook.run(cfg, None, Oned(*NETWORKS), lambda cfg, text: "sent").ok
    out = tmp_path / "textfile"
    out.mkdir()
    assert run_cli(config_file, "--textfile-dir", str(out)) == 0
    text = (out / "kvm_sriov.prom").read_text()
    assert "kvm_sriov_network_hook_runs_total 1.0" in text
    assert 'kvm_sriov_partition_members{pkey="0x1000"} 10.0' in text


def test_node_exporter_can_read_the_file_whatever_the_umask(config_file, tmp_path):
    out = tmp_path / "textfile"
    out.mkdir()
    old = os.umask(0o077)
    try:
        assert run_cli(config_file, "--textfile-dir", str(out)) == 0
        assert os.umask(0o077) == 0o077     # the caller's umask is back
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / "kvm_sriov.prom").stat().st_mode) == 0o644


def test_a_missing_folder_is_one_line_and_leaves_nothing(config_file, tmp_path, capsys):
    assert run_cli(config_file, "--textfile-dir", str(tmp_path / "missing")) == 1
    err = capsys.readouterr().err
    assert err == f"kvm-sriov metrics: cannot write {tmp_path / 'missing' / 'kvm_sriov.prom'}: " \
                  f"No such file or directory\n"


def test_a_failed_rename_leaves_no_temporary_file(config_file, tmp_path, capsys):
    out = tmp_path / "textfile"
    (out / "kvm_sriov.prom").mkdir(parents=True)     # rename(2) cannot replace a folder
    assert run_cli(config_file, "--textfile-dir", str(out)) == 1
    assert "kvm-sriov metrics: cannot write" in capsys.readouterr().err
    assert os.listdir(out) == ["kvm_sriov.prom"]


def test_a_missing_prometheus_client_says_what_to_install(config_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)   # import prometheus_client: ImportError
    assert run_cli(config_file, "--textfile-dir", str(tmp_path)) == 1
    assert capsys.readouterr().err == ("kvm-sriov metrics: missing python3-prometheus-client: "
                                       "apt-get install python3-prometheus-client\n")
    assert metrics.MISSING.endswith("apt-get install python3-prometheus-client")


def test_the_textfile_dir_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["metrics"])
    assert exc.value.code == 2 and "--textfile-dir" in capsys.readouterr().err


def test_no_action_imports_the_metrics_or_prometheus_client():
    """Every action module, as the action scripts load them: neither the metrics
    package nor python3-prometheus-client is paid for by an action."""
    code = ("import pkgutil, importlib, sys, kvm_sriov.actions as a\n"
            "for m in pkgutil.walk_packages(a.__path__, 'kvm_sriov.actions.'):\n"
            "    importlib.import_module(m.name)\n"
            "import kvm_sriov.node.probe, kvm_sriov.scheduler.placement_program\n"
            "print(sorted(n for n in sys.modules if n.startswith(('prometheus_client', 'kvm_sriov.metrics'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
