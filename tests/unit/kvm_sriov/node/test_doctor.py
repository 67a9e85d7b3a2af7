"""Rung 1: doctor's GPUDirect RDMA checks (ACS on the PCIe switch ports
between a GPU and an HCA, ATS on the HCA), on GPU servers as fake sysfs
trees (tests/support/gpu_hosts.py) whose devices get config-space bytes
laid out as the PCIe spec lays them out: extended capabilities chained
from offset 0x100, ACS (id 0x000D) and ATS (id 0x000F) with their
capability and control words."""

import os

import pytest

from kvm_sriov.node import doctor
from kvm_sriov.vf.discovery import discover
from kvm_sriov.vf.sysfs import Sysfs
from tests.support.fake_sysfs import standard_host
from tests.support.gpu_hosts import dgx_a100, two_socket

SV, RR, CR, UF, DT = 0x01, 0x04, 0x08, 0x10, 0x40
KERNEL_ACS = SV | RR | CR | UF          # what Linux turns on at a switch downstream port
ACS_ALL = 0x7F                          # a port that offers every ACS control
# DGX A100 fixture: per switch a root port <rb>:01.1, the upstream port <rb+1>:00.0
# and one downstream port <rb+2>:<slot>.0 per device (GPUs first, then HCAs)
SWITCHES = (0x00, 0x40, 0x80, 0xa0)
DOWN_PORTS = [f"0000:{rb + 2:02x}:{slot:02x}.0" for rb in SWITCHES for slot in range(4)]
HCAS = ["0000:0c:00.0", "0000:12:00.0", "0000:4b:00.0", "0000:54:00.0",
        "0000:8d:00.0", "0000:94:00.0", "0000:ba:00.0", "0000:cc:00.0"]


def config_space(caps=(), size=4096):
    """A PCIe function's config space: extended capabilities (id, capability
    word, control word) chained from 0x100, version 1."""
    data = bytearray(size)
    offset = 0x100
    for n, (cap_id, cap, ctrl) in enumerate(caps):
        following = offset + 0x40 if n + 1 < len(caps) else 0
        data[offset:offset + 8] = ((cap_id | 1 << 16 | following << 20).to_bytes(4, "little")
                                   + cap.to_bytes(2, "little") + ctrl.to_bytes(2, "little"))
        offset = following
    return bytes(data)


def acs(ctrl, cap=ACS_ALL):
    return (doctor.ACS_ID, cap, ctrl)


ATS = (doctor.ATS_ID, 0x0020, 0x0000)    # offered, not enabled (the IOMMU enables it for a VM)
AER = (0x0001, 0, 0)


class Host:
    def __init__(self, root, build=dgx_a100):
        self.fs = build(root)
        self.sysfs = Sysfs(root)

    def config(self, address, data):
        (self.fs.dev(address) / "config").write_bytes(data)

    def ports(self, ctrl, cap=ACS_ALL, ports=DOWN_PORTS):
        for port in ports:
            self.config(port, config_space([AER, acs(ctrl, cap)]))

    def hcas(self, *caps, hcas=HCAS):
        for hca in hcas:
            self.config(hca, config_space(caps))

    def check(self):
        return doctor.check_gpudirect(self.sysfs, discover(self.sysfs))


def lines(results):
    return {r.name: r for r in results}


def test_a_switch_that_redirects_peer_traffic_is_named_with_its_fix(tmp_path):
    host = Host(tmp_path)
    host.ports(KERNEL_ACS)
    host.hcas(AER, ATS)
    got = lines(host.check())
    acs_line = got["GPUDirect RDMA: ACS"]
    assert acs_line.level == "WARN"
    assert acs_line.message.startswith("PCIe switch port(s) 0000:02:00.0, 0000:02:01.0, 0000:02:02.0, ")
    assert acs_line.message.endswith("and 8 more between GPUs and HCAs send peer traffic to the root complex "
                                     "(ACS P2P redirect on, Direct Translated P2P off)")
    # one line: every port in the kernel parameter, and why not disable_acs_redir
    assert "pci=config_acs=" + ";".join(f"1xxxxxx@{p}" for p in DOWN_PORTS) + " (Linux 6.11+" in acs_line.fix
    assert "not pci=disable_acs_redir (it joins the GPU and the HCA's VFs in one IOMMU group)" in acs_line.fix
    assert "\n" not in acs_line.fix and "\n" not in acs_line.message
    assert got["GPUDirect RDMA: ATS"].level == "OK"


def test_direct_translated_p2p_on_and_ats_offered_is_ok(tmp_path):
    host = Host(tmp_path)
    host.ports(KERNEL_ACS | DT)
    host.hcas(ATS)
    got = lines(host.check())
    assert got["GPUDirect RDMA: ACS"].level == "OK"
    assert "the 16 PCIe switch port(s) between GPUs and HCAs pass peer traffic" in got["GPUDirect RDMA: ACS"].message
    assert got["GPUDirect RDMA: ATS"].level == "OK" and got["GPUDirect RDMA: ATS"].fix is None


def test_ports_without_acs_or_redirect_pass_peer_traffic(tmp_path):
    host = Host(tmp_path)
    host.ports(SV | UF)                                    # ACS, redirects off
    for port in DOWN_PORTS[:4]:
        host.config(port, config_space([AER]))             # no ACS capability at all
    host.hcas(ATS)
    assert lines(host.check())["GPUDirect RDMA: ACS"].level == "OK"


def test_a_port_that_cannot_pass_translated_requests_says_so(tmp_path):
    host = Host(tmp_path)
    host.ports(KERNEL_ACS | DT)
    host.ports(KERNEL_ACS, cap=ACS_ALL & ~DT, ports=["0000:82:02.0"])
    host.hcas(ATS)
    results = host.check()
    acs_lines = [r for r in results if r.name == "GPUDirect RDMA: ACS"]
    assert len(acs_lines) == 1 and acs_lines[0].level == "WARN"
    assert "0000:82:02.0" in acs_lines[0].message and "no Direct Translated P2P" in acs_lines[0].message
    assert "none that keeps each VF assignable on its own" in acs_lines[0].fix


def test_an_hca_without_ats_gets_the_mlxconfig_line(tmp_path):
    host = Host(tmp_path)
    host.ports(KERNEL_ACS | DT)
    host.hcas(ATS)
    host.hcas(AER, hcas=["0000:8d:00.0", "0000:94:00.0"])
    ats = lines(host.check())["GPUDirect RDMA: ATS"]
    assert ats.level == "WARN" and "HCA(s) 0000:8d:00.0, 0000:94:00.0 behind a GPU's switch offer no ATS" in ats.message
    assert ats.fix == ("mlxconfig -d <pci> set ATS_ENABLED=true for 0000:8d:00.0, 0000:94:00.0, "
                       "then a cold reboot")


def test_without_root_the_extended_config_space_is_not_shown(tmp_path):
    """The kernel gives anyone but root the first 64 bytes only."""
    host = Host(tmp_path)
    for device in [*DOWN_PORTS, *HCAS]:
        host.config(device, config_space(size=64))
    results = host.check()
    assert [(r.name, r.level, r.fix) for r in results] == [
        ("GPUDirect RDMA config space", "INFO", "run kvm-sriov doctor as root")]


@pytest.mark.parametrize("header", [
    (doctor.EXT_CAPS << 20) | 0x0001,      # points at itself
    (0x0ff << 20) | 0x0001,                # points below 0x100
    (0xffc << 20) | 0x0001,                # points at the last dword: no room for the words
    0xFFFFFFFF,                            # what an absent device reads as
], ids=["loop", "below", "end", "all-ones"])
def test_capability_lists_that_loop_or_leave_the_space_end_the_walk(header):
    data = bytearray(4096)
    data[0x100:0x104] = header.to_bytes(4, "little")
    assert doctor._ext_capability(bytes(data), doctor.ACS_ID) is None
    assert doctor._ext_capability(b"", doctor.ACS_ID) is None


def test_a_long_chain_is_walked_once_per_dword():
    data = bytearray(4096)
    for offset in range(0x100, 4096, 4):    # every dword a capability pointing at the next
        following = offset + 4 if offset + 4 < 4096 else 0x100
        data[offset:offset + 4] = (0x0001 | following << 20).to_bytes(4, "little")
    assert doctor._ext_capability(bytes(data), doctor.ACS_ID) is None


@pytest.mark.parametrize("plant", ["fifo", "link", "dir"])
def test_a_config_file_that_is_no_file_is_a_line_not_a_hang(tmp_path, plant):
    host = Host(tmp_path)
    host.ports(KERNEL_ACS | DT)
    host.hcas(ATS)
    target = host.fs.dev("0000:82:02.0") / "config"
    target.unlink()
    if plant == "fifo":
        os.mkfifo(target)
    elif plant == "link":
        target.symlink_to(host.fs.dev("0000:82:03.0") / "config")
    else:
        target.mkdir()
    results = lines(host.check())
    unread = results["GPUDirect RDMA config space"]
    assert unread.level == "WARN" and "cannot read the config space of 0000:82:02.0" in unread.message


def test_nothing_on_a_host_without_gpus_and_no_config_space_read(tmp_path, monkeypatch):
    info = standard_host(tmp_path)
    monkeypatch.setattr(doctor, "_config_space", lambda *a: pytest.fail("config space read"))
    sysfs = Sysfs(tmp_path)
    assert doctor.check_gpudirect(sysfs, discover(sysfs)) == []
    assert info["fs"]


def test_gpus_and_hcas_on_different_sockets_get_one_info_line(tmp_path, monkeypatch):
    host = Host(tmp_path, two_socket)
    monkeypatch.setattr(doctor, "_config_space", lambda *a: pytest.fail("config space read"))
    results = host.check()
    assert [(r.name, r.level) for r in results] == [("GPUDirect RDMA", "INFO")]
    assert "none behind a PCIe switch with an HCA of the pool" in results[0].message


def test_doctor_runs_the_checks(tmp_path, make_config):
    host = Host(tmp_path / "root")
    host.ports(KERNEL_ACS)
    host.hcas(ATS)
    names = [r.name for r in doctor.run_checks(make_config(tmp_path / "root"), libvirt_check=False)]
    assert names.index("vfio-pci") < names.index("GPUDirect RDMA: ACS") < names.index("GPUDirect RDMA: ATS")


@pytest.fixture
def as_root(tmp_path, make_config, monkeypatch):
    """kvm-sriov doctor run by root on the DGX A100 tree: the CLI becomes
    the pool's owner (stood in for), after which the kernel shows each
    config space's first 64 bytes only."""
    from kvm_sriov import cli
    host = Host(tmp_path / "root")
    host.ports(KERNEL_ACS)
    host.hcas(ATS)
    cfg = make_config(tmp_path / "root")
    switched = []
    real = doctor._config_space

    def as_the_kernel_shows_it(sysfs, address):
        data, why = real(sysfs, address)
        return (data[:64] if switched and data else data), why
    monkeypatch.setattr(doctor, "_config_space", as_the_kernel_shows_it)
    monkeypatch.setattr(cli, "_load_config", lambda args, remotes: cfg)
    monkeypatch.setattr(cli, "_as_state_owner", lambda cfg, command: switched.append(command) or True)
    return cli, switched


def test_run_by_root_doctor_reads_the_config_space_before_it_becomes_the_pools_owner(as_root, monkeypatch,
                                                                                      capsys):
    cli, switched = as_root
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    cli.main(["doctor", "--no-libvirt"])
    out = capsys.readouterr().out
    assert switched == ["doctor"]
    assert "[WARN] GPUDirect RDMA: ACS" in out and "fix: turn on Direct Translated P2P there" in out
    assert "[OK  ] GPUDirect RDMA: ATS" in out and "as root" not in out


def test_run_by_another_user_doctor_asks_for_root(as_root, monkeypatch, capsys):
    cli, switched = as_root
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    switched.append("not root")             # the kernel shows this user 64 bytes
    cli.main(["doctor", "--no-libvirt"])
    out = capsys.readouterr().out
    assert "[INFO] GPUDirect RDMA config space" in out and "fix: run kvm-sriov doctor as root" in out
    assert "GPUDirect RDMA: ACS" not in out


def test_a_pf_held_whole_is_not_told_to_enable_its_vfs(fake_host, make_config):
    """A PF passed through whole has its VFs off by design: doctor names its VM instead of telling the
    operator to write sriov_numvfs under it."""
    from kvm_sriov.vf.pool import VfPool
    cfg = make_config(fake_host["root"])
    name = next(r.name for r in doctor.run_checks(cfg, libvirt_check=False) if "0000:04:00.0" in r.name)
    before = next(r for r in doctor.run_checks(cfg, libvirt_check=False) if r.name == name)
    assert before.level == "FAIL" and "sriov_numvfs" in before.fix
    p = VfPool(cfg.pool_db, cfg.lock_seconds)
    with p.transaction() as txn:
        txn.add_pf("0000:04:00.0", 44, "one-44", "02:00:00:00:00:2c", "attached", "deploy", num_vfs=2)
    p.close()
    after = next(r for r in doctor.run_checks(cfg, libvirt_check=False) if r.name == name)
    assert (after.level, after.fix) == ("OK", None) and "passed through whole to VM 44" in after.message
