"""Rung 2: real libvirtd + QEMU (TCG) hosts from simhost.libvirt_host."""
import subprocess
from pathlib import Path

import libvirt
import pytest

from simhost.guest_image import domain_xml, last_counter
from simhost.libvirt_host import LibvirtHost, two_hosts
from tests.sim.helpers import wait_for

pytestmark = pytest.mark.libvirt

BOOT_TIMEOUT = 60  # the guest prints its first counter ~10 s after start under TCG


def active_names(conn):
    return {d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)}


def test_guest_counts_then_obeys_acpi_shutdown_and_destroy(tmp_path, guest_image):
    log = tmp_path / 'g1.log'
    with LibvirtHost('h', tmp_path) as host:
        conn = host.open()
        dom = conn.defineXML(domain_xml('g1', guest_image, log))
        dom.create()
        wait_for(lambda: (last_counter(log) or 0) >= 2, BOOT_TIMEOUT, 'the guest counter')

        dom.shutdown()  # ACPI power button
        wait_for(lambda: not dom.isActive(), 20, 'the guest to power off')
        assert 'powering off' in log.read_text()

        dom.create()
        dom.destroy()
        assert not dom.isActive()
        dom.undefine()
        assert conn.listAllDomains() == []


def test_live_migration_keeps_guest_state(tmp_path, guest_image):
    log = tmp_path / 'g1.log'
    with two_hosts(tmp_path) as (h1, h2):
        src, dst = h1.open(), h2.open()
        dom = src.createXML(domain_xml('g1', guest_image, log), 0)
        wait_for(lambda: (last_counter(log) or 0) >= 2, BOOT_TIMEOUT, 'the guest counter')
        before = last_counter(log)

        dom.migrateToURI3(h2.tcp_uri, {}, libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER)

        assert active_names(src) == set()
        assert active_names(dst) == {'g1'}
        # same file, appended to by the destination QEMU: the count goes on
        wait_for(lambda: last_counter(log) >= before + 3, 20, 'the counter on the destination')
        text = log.read_text()
        assert text.count('simhost-guest: up') == 1, 'the guest rebooted'


def test_offline_migration_moves_the_definition(tmp_path, guest_image):
    with two_hosts(tmp_path) as (h1, h2):
        src, dst = h1.open(), h2.open()
        dom = src.defineXML(domain_xml('g1', guest_image, tmp_path / 'g1.log'))
        flags = (libvirt.VIR_MIGRATE_OFFLINE | libvirt.VIR_MIGRATE_PEER2PEER
                 | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)
        dom.migrateToURI3(h2.tcp_uri, {}, flags)
        assert [d.name() for d in src.listAllDomains()] == []
        assert [d.name() for d in dst.listAllDomains()] == ['g1']


def test_stop_leaves_no_daemon_guest_or_namespace(tmp_path, guest_image):
    with two_hosts(tmp_path) as (h1, h2):
        h1.open().createXML(domain_xml('g1', guest_image, tmp_path / 'g1.log'), 0)
        pid_files = [h.root / 'run' / f'{d}.pid' for h in (h1, h2)
                     for d in ('libvirtd', 'virtlogd')]
        pid_files += list((h1.root / 'run' / 'qemu').glob('*.pid'))
        pids = [int(p.read_text()) for p in pid_files]
        netns = [h1.netns, h2.netns, h1._switch.netns]
    for pid in pids:
        stat = Path(f'/proc/{pid}/stat')
        assert not stat.exists() or stat.read_text().split(')')[-1].split()[0] == 'Z'
    for ns in netns:
        assert not Path('/run/netns', ns).exists()


def test_a_networked_host_has_its_name_its_hosts_file_and_its_binds(tmp_path):
    """What a real host has and OpenNebula's stock scripts use: a host name
    that resolves (sudo looks it up) and the remotes at their path."""
    (tmp_path / "remotes").mkdir()
    (tmp_path / "remotes" / "vgpu").write_text("stock\n")
    inside = tmp_path / "var" / "tmp" / "one"
    with LibvirtHost("h1", tmp_path, ip="10.99.0.1", binds={str(inside): tmp_path / "remotes"}) as h:
        p = subprocess.run(h.nsenter() + ["sh", "-c", f"hostname; getent hosts h1; cat {inside}/vgpu"],
                           capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["h1", "10.99.0.1", "h1", "stock"]
    assert not (tmp_path / "var").exists()        # the mount point made for it is gone again
