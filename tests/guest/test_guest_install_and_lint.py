"""Installer, self-extracting context bundle, shellcheck."""
import shutil
import subprocess

import pytest

from guest_helpers import CTX, ROOT

SCRIPTS = [CTX / "loc-16-kvm-sriov-ib", CTX / "net-16-kvm-sriov-ib", CTX / "net-90-kvm-sriov-sm",
           CTX / "kvm-sriov-ib.d" / "functions.sh", CTX / "kvm-sriov-ib.d" / "kvm-sriov-ib-hotplug",
           CTX / "sm" / "kvm-sriov-opensm",
           CTX / "install.sh", CTX / "make-bundle.sh", ROOT / "templates" / "cluster" / "create-cluster.sh",
           CTX / "hostfile" / "net-95-kvm-sriov-hostfile", ROOT / "templates" / "oneflow" / "create-ib-mpi-cluster.sh"]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    r = subprocess.run(["shellcheck", "-x", "-P", str(script.parent), str(script)],
                       capture_output=True, text=True, cwd=script.parent)
    assert r.returncode == 0, r.stdout


INSTALLED = ["etc/one-context.d/loc-16-kvm-sriov-ib", "etc/one-context.d/net-16-kvm-sriov-ib",
             "etc/one-context.d/net-90-kvm-sriov-sm", "etc/one-context.d/kvm-sriov-ib.d/functions.sh",
             "etc/one-context.d/kvm-sriov-ib.d/kvm-sriov-opensm",
             "etc/one-context.d/kvm-sriov-ib.d/kvm-sriov-ib-hotplug", "etc/udev/rules.d/90-kvm-sriov-ib.rules",
             "etc/one-context.d/loc-17-kvm-sriov-ivshmem", "etc/one-context.d/kvm-sriov-ivshmem.d/kvm-sriov-ivshmem"]


def test_bundle_installs_the_one_context_layout(tmp_path):
    bundle = tmp_path / "kvm-sriov-ib-context.sh"
    subprocess.run([str(CTX / "make-bundle.sh"), str(bundle)], check=True, capture_output=True)
    root = tmp_path / "image"
    r = subprocess.run([str(bundle), "--root", str(root), "--sm-host"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for rel in INSTALLED + ["usr/local/sbin/kvm-sriov-opensm", "etc/default/kvm-sriov-opensm"]:
        assert (root / rel).is_file(), rel
    for rel in INSTALLED:
        if "/loc-" in rel or "/net-" in rel:
            assert (root / rel).stat().st_mode & 0o111
    # one-contextd runs regular files at depth 1 of /etc/one-context.d only:
    # the library directory is not run as a script
    ctxd = root / "etc/one-context.d"
    assert sorted(p.name for p in ctxd.iterdir() if p.is_file()) == [
        "loc-16-kvm-sriov-ib", "loc-17-kvm-sriov-ivshmem", "net-16-kvm-sriov-ib", "net-90-kvm-sriov-sm"]
    # re-running changes nothing
    r = subprocess.run([str(bundle), "--root", str(root), "--sm-host"], capture_output=True, text=True)
    assert r.returncode == 0 and "installed" not in r.stdout


def test_installed_hooks_find_their_library(tmp_path):
    root = tmp_path / "image"
    subprocess.run([str(CTX / "install.sh"), "--root", str(root)], check=True, capture_output=True)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "IB_SYSFS_ROOT": str(tmp_path / "nosys"),
           "IB_SYSLOG": "NO", "IB_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([str(root / "etc/one-context.d/loc-16-kvm-sriov-ib"), "local"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "no InfiniBand device" in r.stdout
