"""Stock kvm features through the real oned under kvm-sriov, each on a VM
without VFs (where kvm-sriov must do exactly what the stock kvm driver does):
UEFI NVRAM from kvmrc's OVMF_NVRAM, system snapshots kept across
suspend/resume and a live migration, the per-VM MIGRATE_AUTO_CONVERGE
reaching `virsh migrate`, a guest that ignores ACPI settling after kvmrc's
SHUTDOWN_TIMEOUT, and `onevm exec` without a guest agent. The last two also
run on a host of the stock driver (VM_MAD "qemu": OpenNebula's kvm scripts,
TCG) on the same front-end, and the outcomes are compared."""

import re
import subprocess
import time
from pathlib import Path

import pytest

from simhost.guest_image import DEFAULT_CMDLINE, UP_LINE
from tests.opennebula.conftest import (OVMF_NVRAM, SHUTDOWN_TIMEOUT, guest_counter, instantiate,
                                       running_domains, terminate, vm_template)

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE.fd"  # in the stock OVMF_UEFIS list
# kvmrc's OVMF_NVRAM here holds Microsoft's keys, which libvirt's own
# template (OVMF_VARS.fd) does not: an NVRAM holding them was made by deploy
MS_KEY_MARK = b"Microsoft Corporation"  # in the DER certificates


def domain_xml(frontend, host: str, vm: int) -> str:
    import libvirt
    conn = libvirt.open(frontend.host(host).libvirt.uri)
    try:
        return conn.lookupByName(f"one-{vm}").XMLDesc(0)
    finally:
        conn.close()


def qcow2_image(frontend, name: str, datastore: str) -> int:
    """A small qcow2 disk (internal snapshots need qcow2), READY in datastore."""
    path = Path("/var/tmp") / f"{frontend.tag}-{name}.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "8M"], check=True)
    frontend._tmp_files.append(path)
    ds = int(frontend.xml("onedatastore", "show", datastore).findtext("ID"))
    deadline = time.monotonic() + 60
    while int(frontend.info("datastore", ds).findtext("FREE_MB") or 0) < 8 and time.monotonic() < deadline:
        time.sleep(1)  # not monitored yet: oned refuses the image ("Not enough space")
    out = frontend.cli("oneimage", "create", "-d", datastore, "--name", name, "--path", path,
                       "--type", "DATABLOCK", "--format", "qcow2").stdout
    image = int(re.search(r"ID:\s*(\d+)", out).group(1))
    deadline = time.monotonic() + 120
    while frontend.info("image", image).findtext("STATE") != "1":  # READY
        assert frontend.info("image", image).findtext("STATE") != "5", f"image {name} in ERROR"
        assert time.monotonic() < deadline, f"image {name} not READY"
        time.sleep(0.5)
    return image


def no_driver_error(frontend, vm: int, action: str) -> None:
    """oned puts a VM back in RUNNING after a failed snapshot action: the
    failure shows only in vm.log and the VM's ERROR."""
    failed = [line for line in frontend.vm_log(vm).splitlines() if f"{action}: " in line and "][E]" in line]
    assert not failed, "\n".join(failed)


# --- UEFI -------------------------------------------------------------------------

def nvram_file(frontend, host: str, vm: int, name: str) -> Path:
    """The VM's NVRAM as oned names it (<system ds>/<vm id>/<vm name>_VARS.fd) in the host's own datastore."""
    return frontend.host(host).root / "datastores-0" / str(vm) / f"{name}_VARS.fd"


def test_uefi_vm_gets_its_nvram_from_kvmrc_and_keeps_it(frontend):
    assert Path(OVMF_CODE).exists() and Path(OVMF_NVRAM).exists(), "Debian's ovmf package is not installed"
    assert MS_KEY_MARK in Path(OVMF_NVRAM).read_bytes()
    name = "uefi"
    os_attrs = frontend.guest_os(uefi=True).replace("OS = [ ", f'OS = [ FIRMWARE = "{OVMF_CODE}", ', 1)
    assert "FIRMWARE" in os_attrs
    # OVMF loading the kernel itself crashes (#GP) with 160 MB; 512 MB boots
    tmpl = vm_template(frontend, name, frontend.tiny_image(name, "default"), os_attrs=os_attrs, memory_mb=512)
    vm = instantiate(frontend, tmpl, name, host="host1")
    try:
        frontend.wait_vm(vm, "RUNNING")
        xml = domain_xml(frontend, "host1", vm)
        assert f">{OVMF_CODE}</loader>" in xml
        nvram = nvram_file(frontend, "host1", vm, name)
        shown = re.search(r"<nvram[^>]*>([^<]+)</nvram>", xml)
        assert shown and Path(shown.group(1)) == frontend.one_location / "var/datastores/0" / str(vm) / nvram.name
        assert MS_KEY_MARK in nvram.read_bytes(), "the NVRAM was not made from kvmrc's OVMF_NVRAM"
        count = guest_counter(frontend, "host1", name, timeout=240)  # OVMF under TCG boots slowly

        # power off and on: the same NVRAM file, not a new copy
        inode = nvram.stat().st_ino
        frontend.cli("onevm", "poweroff", "--hard", vm)
        frontend.wait_vm(vm, "POWEROFF")
        assert nvram.exists() and nvram.stat().st_ino == inode
        boots = frontend.host("host1").console(name).count(UP_LINE)
        frontend.cli("onevm", "resume", vm)
        frontend.wait_vm(vm, "RUNNING")
        assert nvram.stat().st_ino == inode and MS_KEY_MARK in nvram.read_bytes()
        # the new boot seen through: a migration 1 s into OVMF's boot crashed the guest
        count = guest_counter(frontend, "host1", name, timeout=240, boots_before=boots)

        # live migration on the local datastore: the NVRAM goes with the VM
        frontend.cli("onevm", "migrate", "--live", vm, frontend.host("host2").one_name)
        frontend.wait_vm(vm, "RUNNING", host="host2")
        assert f"one-{vm}" in running_domains(frontend, "host2")
        assert MS_KEY_MARK in nvram_file(frontend, "host2", vm, name).read_bytes()
        guest_counter(frontend, "host2", name, above=count)
    finally:
        terminate(frontend, vm, hard=True)


# --- system snapshots and auto-converge --------------------------------------------

def qmp_log_on(frontend, host: str) -> Path:
    """Have the host's libvirtd log every QEMU monitor command (what it
    really asked QEMU to do) to a file of its own; returns that file."""
    frontend.host(host).ssh("virt-admin daemon-log-filters '1:qemu.qemu_monitor' && virt-admin "
                            "daemon-log-outputs '3:file:/var/log/libvirt/libvirtd.log "
                            "1:file:/var/log/libvirt/qmp.log'")
    return frontend.host(host).libvirt.root / "log" / "qmp.log"


def revert_and_see_it(frontend, vm: int, host: str, name: str, at_snapshot: int) -> None:
    """onevm snapshot-revert 0 and check the guest went back in time: its
    counter (printed every second, read just after the snapshot) starts again
    from where the snapshot was."""
    guest_counter(frontend, host, name, above=at_snapshot + 3)  # well past the snapshot
    start = len(frontend.host(host).console(name))
    frontend.cli("onevm", "snapshot-revert", vm, 0)
    deadline = time.monotonic() + 120
    while not any(int(n) <= at_snapshot + 1
                  for n in re.findall(r"simhost-counter (\d+)", frontend.host(host).console(name)[start:])):
        no_driver_error(frontend, vm, "SNAPSHOTREVERT")
        assert time.monotonic() < deadline, f"the guest's counter never went back to {at_snapshot}"
        time.sleep(0.5)
    frontend.wait_vm(vm, "RUNNING")
    no_driver_error(frontend, vm, "SNAPSHOTREVERT")


def test_system_snapshot_survives_suspend_resume_and_live_migration_with_auto_converge(
        frontend, shared_datastores):
    system, images = shared_datastores
    name = "snapshots"
    # FEATURES/MIGRATE_AUTO_CONVERGE = "initial,increment" (percent), read by the stock migrate
    tmpl = vm_template(frontend, name, qcow2_image(frontend, name, str(images)),
                       'FEATURES = [ MIGRATE_AUTO_CONVERGE = "37,13" ]\n')
    vm = instantiate(frontend, tmpl, name, host="host1", datastore=system)
    try:
        frontend.wait_vm(vm, "RUNNING")
        guest_counter(frontend, "host1", name)
        frontend.cli("onevm", "snapshot-create", vm, "s0")
        frontend.wait_vm(vm, "RUNNING")
        no_driver_error(frontend, vm, "SNAPSHOTCREATE")
        snap = frontend.info("vm", vm).find("TEMPLATE/SNAPSHOT")
        assert snap is not None and snap.findtext("HYPERVISOR_ID") == "snap-0"
        at_snapshot = guest_counter(frontend, "host1", name)

        # save/restore (KEEP_SNAPSHOTS = "yes" in the VM_MAD stanza: oned keeps them)
        frontend.cli("onevm", "suspend", vm)
        frontend.wait_vm(vm, "SUSPENDED")
        frontend.cli("onevm", "resume", vm)
        frontend.wait_vm(vm, "RUNNING")
        revert_and_see_it(frontend, vm, "host1", name, at_snapshot)

        # live migration (shared datastore: the qcow2 holding the snapshot stays)
        qmp = qmp_log_on(frontend, "host1")
        frontend.cli("onevm", "migrate", "--live", vm, frontend.host("host2").one_name)
        frontend.wait_vm(vm, "RUNNING", host="host2")
        assert f"one-{vm}" in running_domains(frontend, "host2")
        asked = qmp.read_text(errors="replace")
        assert re.search(r'"capability":"auto-converge","state":true', asked), \
            "libvirt did not enable auto-converge on the source QEMU"
        assert re.search(r'"cpu-throttle-initial":37\b', asked) and re.search(r'"cpu-throttle-increment":13\b', asked)
        revert_and_see_it(frontend, vm, "host2", name, at_snapshot)
    finally:
        terminate(frontend, vm, hard=True)


# --- the same scenario on kvm-sriov and on the stock driver ------------------------

@pytest.fixture(scope="module")
def stock_host(frontend):
    """A third host under OpenNebula's own kvm driver (VM_MAD "qemu" of the
    stock oned.conf: the kvm scripts, TCG domains, as our stanza makes them);
    disabled afterwards so no later test is placed there."""
    if "stock" not in frontend.hosts:
        frontend.add_host("stock", vmm="qemu")
    yield "stock"
    frontend.cli("onehost", "disable", frontend.host("stock").one_name, check=False)


def exec_outcome(frontend, vm: int) -> tuple:
    """QEMU_GA_EXEC/STATUS once oned settled it, and the driver's EXEC error
    line from vm.log with the VM's own names taken out."""
    deadline = time.monotonic() + 120
    while True:
        status = frontend.info("vm", vm).findtext("TEMPLATE/QEMU_GA_EXEC/STATUS")
        if status and status != "PENDING" and frontend.vm_state(vm) == "RUNNING":
            break
        assert time.monotonic() < deadline, f"exec on VM {vm}: still {status}"
        time.sleep(1)
    errors = [re.sub(r"^.*?\]\[VMM\]\[E\]: ", "", line) for line in frontend.vm_log(vm).splitlines()
              if "[VMM][E]: EXEC" in line]
    return status, [re.sub(rf"one-{vm}\b|\b{vm}\b", "<vm>", e) for e in errors]


def test_acpi_ignoring_guest_and_exec_as_under_the_stock_driver(frontend, stock_host):
    # acpi=off: the guest kernel never sees the power button libvirt presses
    os_attrs = frontend.guest_os().replace(DEFAULT_CMDLINE, DEFAULT_CMDLINE + " acpi=off")
    assert "acpi=off" in os_attrs
    tmpl = vm_template(frontend, "no-acpi", os_attrs=os_attrs)
    vms = {"host1": instantiate(frontend, tmpl, "no-acpi-sriov", host="host1"),
           stock_host: instantiate(frontend, tmpl, "no-acpi-stock", host=stock_host)}
    names = {"host1": "no-acpi-sriov", stock_host: "no-acpi-stock"}
    try:
        for host, vm in vms.items():
            frontend.wait_vm(vm, "RUNNING")
            guest_counter(frontend, host, names[host])

        # onevm exec: needs the QEMU guest agent, which the busybox guest lacks
        for vm in vms.values():
            frontend.cli("onevm", "exec", vm, "echo hello")
        outcomes = {host: exec_outcome(frontend, vm) for host, vm in vms.items()}
        assert outcomes["host1"] == outcomes[stock_host], outcomes
        status, errors = outcomes["host1"]
        assert status == "ERROR" and errors and "guest agent" in errors[-1].lower(), outcomes

        # ACPI power-off the guest ignores: kvmrc's SHUTDOWN_TIMEOUT, then FORCE_DESTROY
        started = time.monotonic()
        for vm in vms.values():
            frontend.cli("onevm", "poweroff", vm)
        took = {}
        for host, vm in vms.items():
            frontend.wait_vm(vm, "POWEROFF", timeout=SHUTDOWN_TIMEOUT + 180)
            took[host] = time.monotonic() - started
            assert f"one-{vm}" not in running_domains(frontend, host)
            assert "power button" not in frontend.host(host).console(names[host])
        for host in vms:
            assert took[host] >= SHUTDOWN_TIMEOUT, took  # it waited for the guest, then destroyed it
    finally:
        for vm in vms.values():
            terminate(frontend, vm, hard=True)
