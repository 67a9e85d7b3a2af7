"""Rung 3, run INSIDE the nested host (see rakelib/driver.rake, test:driver-vfio):
real SR-IOV VFs (QEMU's NVMe PF 0000:03:00.0, VFs .1-.4), real vfio-pci,
real libvirt managed hostdevs, driven through the installed scripts."""

import os
import uuid as uuidlib

import libvirt
from pathlib import Path

import pytest

from kvm_sriov.domain import domain_xml
from tests.support.driver_env import destroy_all, domain_active, pool_rows, vf_driver, wait_for
from tests.support.runnable import runnable_deployment

pytestmark = pytest.mark.vfio

URI = "qemu:///system"
PF = "0000:03:00.0"
HOTPLUG_SECONDS = 20  # the bound on unplug/plug waits (conftest.driver)
VFS = [f"0000:03:00.{i}" for i in range(1, 5)]


def admin_cli(driver, *args):
    import json
    import subprocess
    from tests.conftest import REPO
    p = subprocess.run(["/usr/bin/python3", str(REPO / "bin" / "kvm-sriov"), *args], capture_output=True,
                       text=True, env=dict(os.environ, KVM_SRIOV_CONFIG=str(driver.config)))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) if "--json" in args else p.stdout


def live_hostdevs(uuid):
    conn = libvirt.open(URI)
    try:
        return sorted(domain_xml.pci_hostdevs(domain_xml.parse(conn.lookupByUUIDString(uuid).XMLDesc(0))))
    finally:
        conn.close()


def new_vm(driver, vmid, nics, image=None):
    uuid = str(uuidlib.uuid4())
    serial = driver.tmp / f"serial-{vmid}.log"
    return uuid, serial, runnable_deployment(f"one-{vmid}", uuid, serial, image, ib_nics=nics,
                                             memory_mib=128)


@pytest.mark.parametrize("nics", [1, 2])
def test_deploy_gives_real_vfio_vfs_and_cancel_gives_them_back(driver, nics):
    uuid, _, xml = new_vm(driver, 42, nics)
    r = driver("deploy", [driver.vm_file("deployment.0"), "host1"], stdin=xml)
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == uuid
    held = [vf for vf, _, _ in pool_rows(driver.state)]
    assert len(held) == nics and set(held) <= set(VFS)
    assert live_hostdevs(uuid) == held
    assert all(vf_driver(vf) == "vfio-pci" for vf in held)
    status = admin_cli(driver, "status", "--json")      # the admin CLI on the real host
    assert [(a["vf"], a["vm"], a["state"]) for a in status["assignments"]] == [(vf, 42, "attached") for vf in held]
    assert status["pfs"][0]["pf"] == PF and status["pfs"][0]["free"] == 4 - nics

    r = driver("cancel", [uuid, "host1"])
    assert r.code == 0, r.stderr
    assert pool_rows(driver.state) == []
    assert not domain_active(URI, uuid)
    assert wait_for(lambda: all(vf_driver(vf) != "vfio-pci" for vf in held), 30)


def test_exhaustion_fails_deploy_and_changes_nothing(driver):
    uuid_a, _, xml_a = new_vm(driver, 1, 3)
    assert driver("deploy", [driver.vm_file("deployment.0", 1), "host1"], vmid=1, stdin=xml_a).code == 0
    before = pool_rows(driver.state)
    uuid_b, _, xml_b = new_vm(driver, 2, 2)
    r = driver("deploy", [driver.vm_file("deployment.0", 2), "host1"], vmid=2, stdin=xml_b)
    assert r.code != 0
    assert "not enough free SR-IOV VFs on this host: the VM needs 2" in r.reason
    assert "free: 1 on 0000:03:00.0" in r.reason
    assert pool_rows(driver.state) == before
    assert not domain_active(URI, uuid_b)
    free = (set(VFS) - {vf for vf, _, _ in before}).pop()
    assert vf_driver(free) != "vfio-pci"


def test_detach_reported_but_not_done_is_caught(driver):
    """A guest with no OS never lets go of the VF: libvirt says the detach
    went out, the device stays. save must notice, fail, and keep the VM."""
    uuid, _, xml = new_vm(driver, 42, 1)
    assert driver("deploy", [driver.vm_file("deployment.0"), "host1"], stdin=xml).code == 0
    before = pool_rows(driver.state)
    ckpt = Path(driver.vm_file("checkpoint"))
    r = driver("save", [uuid, str(ckpt), "host1"])
    assert r.code != 0
    assert "did not release VF" in r.reason
    assert domain_active(URI, uuid)
    assert live_hostdevs(uuid) == [before[0][0]]
    assert pool_rows(driver.state) == before
    assert not ckpt.exists()


# -- a whole PF (BRIDGE = "ib-pf", docs/gpu.md section 8) --------------------------------------
def num_vfs(pf=PF):
    return int(Path(f"/sys/bus/pci/devices/{pf}/sriov_numvfs").read_text())


def whole_rows(state):
    import sqlite3
    db = Path(state) / "pool.sqlite3"
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT pf, vm_id, state, num_vfs FROM pf_assignment ORDER BY pf").fetchall()


def test_a_whole_pf_vm_deploys_saves_restores_and_its_pf_ends_with_its_vfs(driver):
    """The NVMe PF itself as a VM's NIC: its 4 VFs switched off while the VM
    has it (the pool's row records them), libvirt moves it to vfio-pci; save
    unplugs it (confirmed) and gives it its VFs back; restore takes it again
    and plugs it into the resumed guest; cancel: the PF on nvme with its 4
    VFs, nothing held."""
    try:
        _whole_pf_round_trip(driver)
    finally:  # a failure must not leave the PF without its VFs for the tests after it
        destroy_all(URI)
        if num_vfs() == 0:
            admin_cli(driver, "reconcile")


def _whole_pf_round_trip(driver):
    from simhost.guest_image import HOTPLUG_READY, ensure_guest_image, last_counter

    # whole PFs are off by default (pool.whole_pfs); this NVMe PF carries no fabric
    cfg = Path(driver.config)
    cfg.write_text(cfg.read_text().replace("[pool]\n", "[pool]\nwhole_pfs = true\n", 1))
    uuid, serial = str(uuidlib.uuid4()), driver.tmp / "serial-42.log"
    xml = runnable_deployment("one-42", uuid, serial, ensure_guest_image(), ib_nics=1, bridge="ib-pf",
                              memory_mib=128)
    r = driver("deploy", [driver.vm_file("deployment.0"), "host1"], stdin=xml)
    assert r.code == 0, r.stderr
    assert "-> PF 0000:03:00.0 (whole)" in r.stderr
    assert live_hostdevs(uuid) == [PF] and vf_driver(PF) == "vfio-pci"
    assert num_vfs() == 0 and not any(os.path.lexists(f"/sys/bus/pci/devices/{vf}") for vf in VFS)
    assert whole_rows(driver.state) == [(PF, 42, "attached", 4)] and pool_rows(driver.state) == []
    assert wait_for(lambda: (last_counter(serial) or 0) >= HOTPLUG_READY, 600), "L2 guest did not boot"

    ckpt = Path(driver.vm_file("checkpoint"))
    r = driver("save", [uuid, str(ckpt), "host1"])
    assert r.code == 0, r.stderr
    assert not domain_active(URI, uuid) and whole_rows(driver.state) == []
    assert num_vfs() == 4 and vf_driver(PF) == "nvme"
    frozen = last_counter(serial)

    r = driver("restore", [str(ckpt), "host1", uuid])   # the image's record names BRIDGE ib-pf
    assert r.code == 0, r.stderr
    assert live_hostdevs(uuid) == [PF] and num_vfs() == 0
    assert whole_rows(driver.state) == [(PF, 42, "attached", 4)]
    assert wait_for(lambda: last_counter(serial) > frozen + 1, 120), "guest did not resume"

    assert driver("cancel", [uuid, "host1"]).code == 0
    assert whole_rows(driver.state) == [] and pool_rows(driver.state) == []
    assert num_vfs() == 4 and vf_driver(PF) == "nvme"
    assert all(os.path.lexists(f"/sys/bus/pci/devices/{vf}") for vf in VFS)


# -- kvm-sriov qualify on this host (docs/qualify.md): read-only, then --vm ----------------
QUALIFY_VM_DOMAIN = "one-2147483647"   # qualify_vm.DOMAIN: OpenNebula VM 2^31-1, never a tenant's


def running(name):
    conn = libvirt.open(URI)
    try:
        return name in [d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)]
    finally:
        conn.close()


def qualify_cli(driver, tmp_path, *args):
    """kvm-sriov qualify as the operator runs it here (root), this test's
    config, the installed remotes named, both reports written."""
    import json
    import subprocess
    from tests.conftest import REPO
    from tests.support.driver_env import node_env
    json_path, text_path = tmp_path / "qualify.json", tmp_path / "qualify.txt"
    p = subprocess.run(["/usr/bin/python3", str(REPO / "bin" / "kvm-sriov"), "qualify", "--remotes",
                        str(driver.remotes), "--json", str(json_path), "--text", str(text_path), *args],
                       capture_output=True, text=True, timeout=1200,
                       env=node_env(driver.remotes, KVM_SRIOV_CONFIG=str(driver.config)))
    assert "Traceback" not in p.stderr, p.stderr
    report = json.loads(json_path.read_text())
    assert text_path.read_text() == p.stdout
    return p, report, {c["name"]: c for c in report["checks"]}


def test_qualify_read_only_on_the_nested_host(driver, tmp_path):
    """Every InfiniBand check says plainly that an emulated NVMe PF is not
    InfiniBand hardware (WARN or SKIP), the rest passes (hugepages: skipped,
    hpc.profile is off); nothing is taken or changed."""
    import time
    (driver.remotes / "VERSION").write_text("7.4.0\n")   # what onehost sync leaves beside the drivers
    began = time.monotonic()
    p, report, checks = qualify_cli(driver, tmp_path)
    print(f"kvm-sriov qualify: {time.monotonic() - began:.0f} s")
    assert p.returncode == 0 and report["qualified"] is True, p.stdout
    not_ib = {n for n, c in checks.items() if "not InfiniBand hardware" in c["detail"]}
    assert {f"PF {PF} hardware", f"PF {PF} driver", f"PF {PF} InfiniBand ports", "SM partitions"} <= not_ib
    assert all(checks[n]["status"] in ("WARN", "SKIP") for n in not_ib)
    rest = {n: c["status"] for n, c in checks.items() if n not in not_ib and c["status"] != "PASS"}
    assert rest == {"hugepages": "SKIP"}, p.stdout
    for name in (f"PF {PF} SR-IOV", f"PF {PF} VF IOMMU groups", "IOMMU units", "vfio-pci", "libvirt", "QEMU",
                 "OpenNebula"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert p.stdout.endswith(": QUALIFIED\n")
    assert pool_rows(driver.state) == [] and not running(QUALIFY_VM_DOMAIN)


def test_qualify_vm_deploys_through_the_scripts_and_gives_the_vf_back(driver, tmp_path, monkeypatch):
    """qualify's VM test on the nested host (in-process: the command line
    and the read-only checks are the test above's): the installed deploy
    gives the VM a real VF (vfio-pci), the guest report shows it on the
    console, cancel ends it and the VF is free again; no InfiniBand here:
    the IB checks and --peer's perftest say so in one line each. The guest
    is the simhost kernel with an initramfs whose init runs the guest report,
    quiet as the simhost guest boots: without quiet the kernel's PCI scan
    showed the VF, 138 s after the deploy (240 s in all, over this suite's
    budget, with the whole boot log on the nested console)."""
    import time
    from kvm_sriov import config
    from kvm_sriov.node import qualify, qualify_vm
    from simhost import stock_kvm
    from simhost.guest_image import DEFAULT_CMDLINE, build_initramfs, ensure_guest_image
    began = time.monotonic()
    guest = ensure_guest_image()
    init = ("#!/bin/busybox sh\nmount -t proc proc /proc\nmount -t sysfs sysfs /sys\n"
            "mount -t devtmpfs devtmpfs /dev\nexec </dev/console >/dev/console 2>&1\nexec sh /qualify-report\n")
    initrd = build_initramfs(tmp_path / "qualify-initrd.img", init, guest.modules_dir, (),
                             {"qualify-report": (qualify_vm.GUEST_REPORT, 0o755)})
    datastores = tmp_path / "datastores"
    datastores.mkdir()
    with open(driver.config, "a") as f:
        f.write(f'[opennebula]\ndatastore_location = "{datastores}"\n')
    cfg = config.load(files=[driver.config])
    for name, value in stock_kvm.environment(stock_kvm.ruby_lib(driver.remotes)).items():
        monkeypatch.setenv(name, value)   # what a node's packages give the stock scripts
    append = " ".join(w for w in DEFAULT_CMDLINE.split() if w not in ("console=ttyS0", "panic=-1"))
    opts = qualify_vm.VmOptions(image=guest.kernel, initrd=initrd, append=append, seconds=300,
                                remotes=driver.remotes, config=driver.config, peer="h2")
    pfs = qualify.check_pfs(qualify.BoundedSysfs(cfg.sysfs_root), cfg)[1]
    prepared = time.monotonic()
    vm = {c.name: (c.status, c.detail) for c in qualify_vm.run(opts, cfg, pfs)}
    print(f"qualify --vm: image {prepared - began:.0f} s, VM test {time.monotonic() - prepared:.0f} s: {vm}")
    assert [n for n in vm if vm[n][0] == "PASS"] == ["VM deploy", "VM VF in the guest", "VM end",
                                                     "VM VF back in the pool"], vm
    vf = vm["VM deploy"][1].split(" with VF ")[1].split()[0]
    assert vf in VFS and "(1b36:0010): the guest report, " in vm["VM VF in the guest"][1]
    for name in ("VM IB port", "VM PKey", "perftest"):
        assert vm[name][0] == "SKIP" and "not InfiniBand hardware" in vm[name][1]
    assert not running(QUALIFY_VM_DOMAIN) and pool_rows(driver.state) == []
    assert not (datastores / "2147483647").exists()
    assert wait_for(lambda: vf_driver(vf) != "vfio-pci", 30)
