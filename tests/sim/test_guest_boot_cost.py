"""What the busybox guest costs to boot and to keep running. Under nested
emulation (an L2 guest in the nested host) each process it starts costs
seconds, so its running loop starts none and its boot skips work it has no
use for. The first tests need no VM; the last boots OpenNebula's own domain
layout (16 root ports and a pcie-to-pci-bridge) on a rung-2 libvirtd."""
import re
import uuid

import libvirt
import pytest

from simhost import guest_image
from simhost.guest_image import DEFAULT_CMDLINE, GUEST_INIT, POWER_BUTTON_ACTION, last_counter
from simhost.libvirt_host import LibvirtHost
from tests.sim.helpers import wait_for
from tests.support.runnable import runnable_deployment

# busybox ash builtins (and assignments) the loop may use: none starts a process
BUILTINS = {'set', '[', 'echo', 'read', ':', 'while', 'do', 'done'}


def _loop_body(init: str) -> list:
    body = init.split('while :; do', 1)[1].split('\ndone', 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith('#')]


def test_the_guest_s_once_a_second_loop_starts_no_process():
    for line in _loop_body(GUEST_INIT):
        command = line.split('||')[-1].split()[0]
        assert command in BUILTINS or re.fullmatch(r'\w+=.*', command), line


def _newc_entries(data: bytes) -> dict:
    """{name: (mode, content)} of an uncompressed newc cpio archive."""
    entries, at = {}, 0
    while True:
        assert data[at:at + 6] == b'070701', f'not a newc header at {at}'
        fields = [int(data[at + 6 + 8 * i:at + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, namesize = fields[1], fields[6], fields[11]
        name_at = at + 110
        name = data[name_at:name_at + namesize - 1].decode()
        body_at = (name_at + namesize + 3) & ~3
        if name == 'TRAILER!!!':
            return entries
        entries[name] = (mode, data[body_at:body_at + filesize])
        at = (body_at + filesize + 3) & ~3


def test_the_guest_archive_is_not_compressed_and_links_every_applet(tmp_path):
    kernel = guest_image.ensure_kernel()
    dest = guest_image.build_initramfs(tmp_path / 'initrd.img', GUEST_INIT, kernel.modules_dir,
                                       guest_image.GUEST_MODULES,
                                       {'etc/acpi/PWRF/00000080': (POWER_BUTTON_ACTION, 0o755)})
    entries = _newc_entries(dest.read_bytes())
    for applet in ('sleep', 'mount', 'insmod', 'acpid', 'mkfifo', 'poweroff', 'devmem'):
        mode, target = entries[f'bin/{applet}']
        assert mode & 0o170000 == 0o120000 and target == b'busybox', applet
    assert 'busybox --install' not in GUEST_INIT


def test_the_power_button_action_becomes_poweroff_without_another_process():
    lines = POWER_BUTTON_ACTION.strip().splitlines()
    assert lines[0] == '#!/bin/sh'
    assert lines[-1] == 'exec poweroff -f'


@pytest.mark.libvirt
def test_opennebula_s_domain_boots_without_the_shpchp_failure_and_counts_each_second(tmp_path, guest_image):
    """OpenNebula's q35 domain has a pcie-to-pci-bridge whose slots ACPI hot-plug
    (acpiphp) registers first: shpchp then fails ("Slot initialization failed")
    after its set-up; the guest's command line leaves shpchp out."""
    log = tmp_path / 'serial.log'
    xml = runnable_deployment('one-7', str(uuid.uuid4()), log, guest_image, ib_nics=0, memory_mib=128,
                              cmdline=DEFAULT_CMDLINE)
    assert 'model="pcie-to-pci-bridge"' in xml
    with LibvirtHost('h', tmp_path) as host:
        conn = libvirt.open(host.uri)
        try:
            dom = conn.createXML(xml, 0)
            wait_for(lambda: (last_counter(log) or 0) >= 4, 120, 'the guest counter')
            dom.shutdown()
            wait_for(lambda: dom.name() not in {d.name() for d in conn.listAllDomains()}, 30,
                     'the guest to power off')
        finally:
            conn.close()
    console = log.read_text(errors='replace')
    assert 'shpchp' not in console, console
    assert 'powering off' in console
