"""Rung 4: one real OpenNebula 7.4 front-end per session (simhost.frontend)
with two simulated KVM hosts, reused by every test. Each host's kvm-sriov
reads a fake sysfs with one mlx5 PF (host1: 2 VFs, host2: 1), enough for
monitoring and placement; no VF there can really be passed through."""

import re
import shutil
import time
from typing import Optional

import pytest

from simhost.frontend import FrontEnd
from simhost.guest_image import UP_LINE
from tests.conftest import REPO
from tests.sched.sched_frontend import running
from tests.support.fake_sysfs import FakeSysfs

LOG_DIR = REPO / "build" / "test-logs" / "opennebula"
HOST_VFS = {"host1": 2, "host2": 1}
PF = "0000:03:00.0"
# kvmrc of every host (the stock driver's settings, read by the stock scripts
# kvm-sriov runs). A short shutdown timeout: a guest ignoring ACPI is
# destroyed (FORCE_DESTROY=yes, stock default) after it, not after 180 s.
SHUTDOWN_TIMEOUT = 20
# UEFI variables with Microsoft's keys (Debian's ovmf), unlike libvirt's own
# template OVMF_VARS.fd: an NVRAM holding them came from kvmrc via deploy
OVMF_NVRAM = "/usr/share/OVMF/OVMF_VARS.ms.fd"
KVMRC = {
    # a "shared" datastore here is a local folder: libvirt calls migrating off it
    # unsafe; the kvmrc option OpenNebula offers for that
    "MIGRATE_OPTIONS": "--unsafe",
    "SHUTDOWN_TIMEOUT": SHUTDOWN_TIMEOUT,
    "OVMF_NVRAM": OVMF_NVRAM,
}


def fake_sysfs(root, vfs: int):
    fs = FakeSysfs(root)
    fs.add_numa_node(0, "0-1")
    fs.add_pf(PF, numa=0, num_vfs=vfs, total_vfs=8)
    return root


def simulated_frontend(work) -> FrontEnd:
    """A front-end (not started) over the two simulated hosts of HOST_VFS, in a
    fresh folder `work`: not pytest's tmp_path, which other pytest runs on this
    machine prune while the front-end still lives."""
    shutil.rmtree(work, ignore_errors=True)
    config = {name: {"sysfs": {"root": str(fake_sysfs(work / "sysfs" / name, vfs))}}
              for name, vfs in HOST_VFS.items()}
    return FrontEnd(work / "fe", list(HOST_VFS), host_config=config, kvmrc=KVMRC)


@pytest.fixture(scope="session")
def frontend(request):
    with running(simulated_frontend(REPO / "build" / "rung4"), LOG_DIR,
                 lambda: request.session.testsfailed) as fe:
        yield fe


@pytest.fixture(scope="session")
def ib_network(frontend):
    """The InfiniBand partition network, straight from templates/network/."""
    return frontend.create("vnet", str(REPO / "templates" / "network" / "ib-partition.tmpl"))


def vm_template(frontend, name: str, image_id=None, extra: str = "", os_attrs: str = None,
                memory_mb: int = 160) -> int:
    """A small VM booting simhost's busybox guest (kernel + initrd), with one
    registered disk if image_id; extra: more template lines; os_attrs: OS and
    CPU lines instead of frontend.guest_os()."""
    disk = f'DISK = [ IMAGE_ID = "{image_id}" ]\n' if image_id is not None else ""
    return frontend.create("template", f'NAME = "{name}"\nCPU = "0.1"\nVCPU = "1"\nMEMORY = "{memory_mb}"\n'
                                       f'{os_attrs or frontend.guest_os()}{disk}{extra}')


@pytest.fixture(scope="session")
def plain_template(frontend):
    """No VF NIC, its disk on the default (TM_MAD local) datastores."""
    return vm_template(frontend, "tiny-local", frontend.tiny_image("tiny-local", "default"))


@pytest.fixture(scope="session")
def shared_datastores(frontend):
    """A shared system datastore and a shared image datastore (TM_MAD shared):
    folders under the front-end's datastores, which every host sees as is."""
    system = frontend.create("datastore", 'NAME = "shared-system"\nTYPE = "SYSTEM_DS"\nTM_MAD = "shared"\n')
    images = frontend.create("datastore", 'NAME = "shared-images"\nDS_MAD = "fs"\nTM_MAD = "shared"\n')
    return system, images


@pytest.fixture(scope="session")
def shared_template(frontend, shared_datastores):
    _system, images = shared_datastores
    return vm_template(frontend, "tiny-shared", frontend.tiny_image("tiny-shared", str(images)))


def instantiate(frontend, template_id: int, name: str, host: str = None, datastore: int = None) -> int:
    """onetemplate instantiate (with a serial console, see guest_counter); with
    a host, on hold and then `onevm deploy` there."""
    args = ["onetemplate", "instantiate", template_id, "--name", name, "--raw", frontend.console_raw(name)]
    if host:
        args.append("--hold")
    vm = int(frontend.cli(*args).stdout.split("ID:")[1].split()[0])
    if host:
        deploy = ["onevm", "deploy", vm, frontend.host(host).one_name]
        if datastore is not None:
            deploy.append(datastore)
        frontend.cli(*deploy)
    return vm


def running_domains(frontend, host: str) -> set:
    import libvirt
    conn = libvirt.open(frontend.host(host).libvirt.uri)
    try:
        return {d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)}
    finally:
        conn.close()


def terminate(frontend, vm: int, hard: bool = False) -> None:
    frontend.cli("onevm", "terminate", *(["--hard"] if hard else []), vm)
    frontend.wait_vm(vm, "DONE", timeout=180)


def guest_counter(frontend, host: str, name: str, above: int = -1, timeout: float = 120,
                  boots_before: Optional[int] = None) -> int:
    """Wait until the guest on host is up (its acpid listens) and its counter
    is past `above`; returns the counter. A counter going on after a
    suspend/resume or a migration shows the guest kept its state.
    boots_before: the guest was restarted (power off and on) after the
    console showed that many boots; only the next boot counts (the console
    file is appended to, the old boot's counters are still in it)."""
    deadline = time.monotonic() + timeout
    while True:
        text = frontend.host(host).console(name)
        if boots_before is not None:
            text = "".join(text.split(UP_LINE)[boots_before + 1:])  # after the next boot's "up"
        counters = [int(n) for n in re.findall(r"simhost-counter (\d+)", text)]
        up = above >= 0 or boots_before is not None or UP_LINE in text  # after a migration "up" is on the source's console
        if up and counters and counters[-1] > above:
            return counters[-1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"guest {name} on {host}: no counter above {above}; console:\n{text[-500:]}")
        time.sleep(0.5)
