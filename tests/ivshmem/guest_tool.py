"""The guest tool (contextualization/ivshmem/kvm-sriov-ivshmem) run outside a
guest: a fake sysfs whose ivshmem device's resource2 is a region file stands
for the guest's BAR2 (mmap works the same), so the tool's view of a header
the host driver wrote can be checked where python3 is (the busybox test
guest has none)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "contextualization" / "ivshmem" / "kvm-sriov-ivshmem"
IVSHMEM_IDS = ("0x1af4", "0x1110")


def fake_device(sysfs: Path, address: str, region: Path, ids=IVSHMEM_IDS) -> Path:
    """A PCI device folder whose resource2 is a link to `region`: the host's
    later rewrites show, and removing the region is not held up by it."""
    dev = sysfs / "bus" / "pci" / "devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(ids[0] + "\n")
    (dev / "device").write_text(ids[1] + "\n")
    (dev / "enable").write_text("0\n")
    (dev / "resource2").symlink_to(region)
    return dev


def run(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", str(TOOL), *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def published(region: Path, vmid: int) -> dict:
    """What `kvm-sriov-ivshmem publish` writes for device 0 in a guest whose
    VMID is `vmid` and whose only ivshmem device is `region`: file name ->
    content (and "env": /run/ivshmem/env). Raises RuntimeError if it fails."""
    with tempfile.TemporaryDirectory(prefix="ivshmem-tool-") as tmp:
        sysfs, runs = Path(tmp) / "sys", Path(tmp) / "run"
        fake_device(sysfs, "0000:01:00.0", region)
        r = run("publish", "--sysfs", str(sysfs), "--run", str(runs), "--vmid", str(vmid))
        if r.returncode != 0:
            raise RuntimeError(f"kvm-sriov-ivshmem publish: exit {r.returncode}: {r.stderr.strip()}")
        out = {f.name: f.read_text() for f in (runs / "ivshmem" / "0").iterdir() if f.is_file()}
        out["env"] = (runs / "ivshmem" / "env").read_text()
        return out
