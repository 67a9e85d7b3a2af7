"""Rung 1: the probe's fast scan of the SR-IOV PFs (availability.sriov_pfs) on
the fake sysfs."""

import os

from kvm_sriov.vf import availability, discovery
from kvm_sriov.vf.sysfs import Sysfs


def test_fast_scan_finds_the_pfs_without_looking_at_their_vfs(fake_host, monkeypatch):
    """The probe's scan (availability.sriov_pfs) lists the same PFs as
    discovery, and skips the VFs of a PF it has found instead of checking
    each for sriov_totalvfs: a host has hundreds of VFs, each a syscall."""
    root = fake_host["root"]
    devices = root / "sys/bus/pci/devices"
    vfs = {a for a in os.listdir(devices) if (devices / a / "physfn").exists()}
    assert len(vfs) > 8
    expected = discovery.sriov_pfs(Sysfs(root))
    looked = []
    exists = os.path.exists
    monkeypatch.setattr(availability.os.path, "exists", lambda p: looked.append(str(p)) or exists(p))
    addresses = {}
    found = availability.sriov_pfs(str(root), Sysfs(root), addresses)
    assert found == expected
    assert {os.path.basename(os.path.dirname(p)) for p in looked}.isdisjoint(vfs)
    assert {a for pf_vfs in addresses.values() for a in pf_vfs} == vfs
