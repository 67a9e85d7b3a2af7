"""kvm-sriov qualify (kvm_sriov/node/qualify.py) on fake hosts built from
tests/fixtures/qualify/*.json (facts and sources: its README.md): rung 1,
nothing under the real /sys is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvm_sriov.node import qualify
from kvm_sriov.vf import discovery
from kvm_sriov.vf.sysfs import Sysfs
from tests.conftest import FIXTURES as ALL_FIXTURES, REPO
from tests.support.fake_sysfs import FakeSysfs

FIXTURES = ALL_FIXTURES / "qualify"


def build_host(root: Path, name: str, **changes) -> dict:
    """The fixture host ``name`` under root; ``changes`` replace its top-level keys."""
    spec = json.loads((FIXTURES / f"{name}.json").read_text())
    spec.update(changes)
    fs = FakeSysfs(root)
    for pf in spec["pfs"]:
        fs.add_pf(pf["address"], vendor=pf.get("vendor", "15b3"), device=pf["device"], vf_device=pf["vf_device"],
                  cls=int(pf["class"], 16), numa=pf["numa"], total_vfs=pf["total_vfs"], num_vfs=pf["num_vfs"],
                  netdev=pf["netdev"], ibdev=pf["ibdev"])
        if pf.get("driver"):
            fs.bind(pf["address"], pf["driver"])
        if pf["ibdev"]:
            port = fs.sys / "class/infiniband" / pf["ibdev"] / "ports/1"
            for attr in ("rate", "state", "phys_state", "link_layer", "sm_lid"):
                if attr in pf:
                    (port / attr).write_text(pf[attr] + "\n")
        for vf_port in pf.get("vf_ports", []):  # a VF mlx5_core holds on the host: its own IB device
            vf = fs.dev(pf["address"]) / f"virtfn{vf_port['vf']}"
            vf_address = os.path.basename(os.readlink(vf))
            fs.bind(vf_address, "mlx5_core")
            fs.add_ib_device(vf_address, vf_port["ibdev"], state=vf_port["state"], node_guid=vf_port["node_guid"])
            (fs.dev(pf["address"]) / "sriov" / str(vf_port["vf"]) / "policy").write_text(vf_port["policy"] + "\n")
    for unit in spec["iommu_units"]:
        (fs.sys / "class/iommu" / unit).mkdir(parents=True)
    (fs.sys / "module/vfio_pci").mkdir(parents=True)
    for node, cpus in spec["numa"].items():
        fs.add_numa_node(int(node), cpus)
    size = spec["hugepage_kib"]
    for node, pages in spec["hugepages"].items():
        d = fs.sys / f"devices/system/node/node{node}/hugepages/hugepages-{size}kB"
        d.mkdir(parents=True)
        (d / "nr_hugepages").write_text(f"{pages}\n")
        (d / "free_hugepages").write_text(f"{pages}\n")
    proc = root / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "cmdline").write_text(spec["cmdline"] + "\n")
    (proc / "sys/kernel/osrelease").write_text(spec["osrelease"] + "\n")
    (proc / "meminfo").write_text(f"MemTotal:       527958016 kB\nHugepagesize:       {size} kB\n")
    if spec.get("opennebula"):  # what onehost sync leaves on a host: /var/tmp/one/VERSION
        (root / "var/tmp/one").mkdir(parents=True)
        (root / "var/tmp/one/VERSION").write_text(spec["opennebula"] + "\n")
    return {"fs": fs, "spec": spec}


@pytest.fixture
def fake_qemu(tmp_path, monkeypatch):
    """A qemu-system binary on PATH that prints what QEMU 8.2 prints."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qemu = bin_dir / f"qemu-system-{os.uname().machine}"
    qemu.write_text("#!/bin/sh\necho 'QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)'\n"
                    "echo 'Copyright (c) 2003-2023 Fabrice Bellard and the QEMU Project developers'\n")
    qemu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return qemu


def fake_tool(bin_dir: Path, name: str, output: str) -> Path:
    """A program on PATH that prints output (the real tool's line, README.md
    says where its format comes from) and records its arguments."""
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {bin_dir}/{name}.args\ncat <<'EOF'\n{output}\nEOF\n")
    tool.chmod(0o755)
    return tool


@pytest.fixture
def host(tmp_path, make_config, fake_qemu):
    """(build(name, **changes) -> config): a fixture host and the config that reads it."""
    def build(name="connectx7", hpc=True, **changes):
        info = build_host(tmp_path / "root", name, **changes)
        if info["spec"].get("sminfo"):
            fake_tool(fake_qemu.parent, "sminfo", info["spec"]["sminfo"])
        # two SM nodes whose partitions files the cluster-wide config reads back (fabric.sm_read_command)
        sm_read = fake_tool(fake_qemu.parent, "sm-read", (FIXTURES / "partitions.conf").read_text())
        pool = {"pfs": info["spec"].get("pool_pfs", [])}
        return make_config(tmp_path / "root", pool=pool, libvirt={"uri": "test:///default"},
                           hpc={"profile": hpc},
                           infiniband={"partitions_file": str(tmp_path / "no-sm-here/partitions.conf"),
                                       "sm_push_command": ["false", "{node}"]},
                           fabric={"sm_nodes": ["sm1", "sm2"], "sm_read_command": [str(sm_read), "{node}"]})
    return build


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def statuses(checks) -> set:
    return {c.status for c in checks}


def test_a_good_connectx7_host_passes_every_check(host):
    checks = qualify.run(host("connectx7"))
    assert [c for c in checks if c.status != "PASS"] == []
    got = by_name(checks)
    assert got["PF 0000:41:00.0 hardware"].detail == "ConnectX-7 (15b3:1021, class 0x020700, InfiniBand)"
    assert got["IB port mlx5_0/1 state"].detail == "ACTIVE, LinkUp, 400 Gb/sec (4X NDR)"
    assert got["PF 0000:41:00.0 SR-IOV"].detail == "4 of 16 VFs enabled"
    assert got["hugepages on NUMA node 0"].detail.startswith("16384 pages of 2048 kB (32.0 GiB)")
    assert "hugepages on NUMA node 1" not in got  # only the PFs' nodes: the HPC profile pins VMs there
    assert got["kernel"].detail == "Linux 6.8.0-49-generic"
    assert got["QEMU"].detail.startswith("QEMU emulator version 8.2.2")
    assert got["IOMMU units"].detail == "dmar0, dmar1"


def test_a_good_connectx6_host_passes_every_check(host):
    checks = qualify.run(host("connectx6"))
    assert [c for c in checks if c.status != "PASS"] == []
    got = by_name(checks)
    assert got["PF 0000:c1:00.0 hardware"].detail == "ConnectX-6 (15b3:101b, class 0x020700, InfiniBand)"
    assert got["IB port mlx5_0/1 state"].detail == "ACTIVE, LinkUp, 200 Gb/sec (4X HDR)"
    assert "hugepages on NUMA node 1" in got and "hugepages on NUMA node 0" not in got


def test_iommu_off_fails_with_the_fix(host, tmp_path):
    cfg = host("connectx7", iommu_units=[], cmdline="BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro")
    sys_dir = tmp_path / "root/sys"
    for link in sys_dir.glob("bus/pci/devices/*/iommu_group"):
        link.unlink()
    for group in (sys_dir / "kernel/iommu_groups").iterdir():
        for member in (group / "devices").iterdir():
            member.unlink()
        (group / "devices").rmdir()
        group.rmdir()
    got = by_name(qualify.run(cfg))
    assert got["IOMMU units"].status == "FAIL"
    assert "intel_iommu=on" in got["IOMMU units"].fix and "VT-d" in got["IOMMU units"].fix
    assert got["IOMMU active"].status == "FAIL"   # doctor's check, reused
    assert got["IOMMU on the kernel command line"].status == "WARN"
    vf_groups = got["PF 0000:41:00.0 VF IOMMU groups"]
    assert vf_groups.status == "FAIL" and "no IOMMU group" in vf_groups.detail and "VT-d" in vf_groups.fix


def test_totalvfs_0_fails_naming_mlxconfig(host, tmp_path):
    cfg = host("connectx7")
    pf = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0"
    (pf / "sriov_totalvfs").write_text("0\n")
    (pf / "sriov_numvfs").write_text("0\n")
    got = by_name(qualify.run(cfg))["PF 0000:41:00.0 SR-IOV"]
    assert got.status == "FAIL" and "sriov_totalvfs is 0" in got.detail
    assert got.fix.startswith("mlxconfig -d 0000:41:00.0 set SRIOV_EN=1 NUM_OF_VFS=<n>")


def test_vfs_not_enabled_fail_with_the_echo(host, tmp_path):
    cfg = host("connectx7")
    (tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/sriov_numvfs").write_text("0\n")
    got = by_name(qualify.run(cfg))["PF 0000:41:00.0 SR-IOV"]
    assert got.status == "FAIL"
    assert got.fix.startswith("echo 16 > /sys/bus/pci/devices/0000:41:00.0/sriov_numvfs")


def test_vfs_sharing_an_iommu_group(host):
    cfg = host("connectx7")
    fs = FakeSysfs(cfg.sysfs_root)
    fs.groups = {}  # a fresh builder: give two VFs one group, with a bridge in it too
    fs.add_device("0000:40:01.0", numa=0, group=77)
    fs.set_group("0000:41:00.1", 77)
    fs.set_group("0000:41:00.2", 77)
    got = by_name(qualify.run(cfg))["PF 0000:41:00.0 VF IOMMU groups"]
    assert got.status == "WARN"   # two of four VFs are still usable
    assert got.detail.startswith("2 of 4 VFs share their IOMMU group and are never offered")
    assert "0000:41:00.1 shares group 77 with 0000:40:01.0, 0000:41:00.2" in got.detail
    assert "ACS" in got.fix


def test_every_vf_sharing_its_group_fails(host):
    cfg = host("connectx7")
    fs = FakeSysfs(cfg.sysfs_root)
    fs.groups = {}
    for vf in ("0000:41:00.1", "0000:41:00.2", "0000:41:00.3", "0000:41:00.4"):
        fs.set_group(vf, 88)
    assert by_name(qualify.run(cfg))["PF 0000:41:00.0 VF IOMMU groups"].status == "FAIL"


def test_an_ethernet_link_layer_fails_with_link_type(host, tmp_path):
    cfg = host("connectx7")
    (tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1/link_layer") \
        .write_text("Ethernet\n")
    got = by_name(qualify.run(cfg))
    layer = got["IB port mlx5_0/1 link layer"]
    assert layer.status == "FAIL" and layer.detail.startswith("Ethernet (RoCE)")
    assert layer.fix == "mlxconfig -d 0000:41:00.0 set LINK_TYPE_P1=1 (1 = IB, 2 = ETH), then reboot"
    assert got["IB port mlx5_0/1 state"].status == "SKIP"


def test_a_port_down_fails_with_the_cable_fix(host, tmp_path):
    cfg = host("connectx7")
    port = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")
    got = by_name(qualify.run(cfg))["IB port mlx5_0/1 state"]
    assert (got.status, got.detail) == ("FAIL", "DOWN, physical state Polling: no link")
    assert "cable" in got.fix


def test_a_port_without_subnet_manager_fails_naming_opensm(host, tmp_path):
    cfg = host("connectx7")
    (tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1/state").write_text("2: INIT\n")
    got = by_name(qualify.run(cfg))["IB port mlx5_0/1 state"]
    assert got.status == "FAIL" and "no subnet manager" in got.detail and "virt_enabled 2" in got.fix


@pytest.mark.parametrize("name, pf", [("nested-nvme", "0000:03:00.0"), ("emulated-igb", "0000:01:00.0")])
def test_an_emulated_pf_is_not_infiniband_hardware_and_nothing_fails(host, name, pf):
    checks = qualify.run(host(name, hpc=False))
    assert "FAIL" not in statuses(checks), [c for c in checks if c.status == "FAIL"]
    got = by_name(checks)
    for check in (f"PF {pf} hardware", f"PF {pf} driver", f"PF {pf} InfiniBand ports"):
        assert got[check].status in ("WARN", "SKIP") and "not InfiniBand hardware" in got[check].detail
    assert got[f"PF {pf} SR-IOV"].status == "PASS"
    assert got[f"PF {pf} VF IOMMU groups"].status == "PASS"
    assert got[f"PF {pf} NUMA node"].status == "PASS"   # -1, but one node: nothing to choose
    assert not any(c.name.startswith("IB port") for c in checks)


def test_hostile_files_give_one_line_each_and_no_hang(host, tmp_path):
    cfg = host("connectx7")
    pf = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0"
    big = pf / "numa_node"
    big.unlink()
    with open(big, "wb") as fh:  # 100 MB, sparse
        fh.truncate(100 << 20)
    (pf / "sriov_totalvfs").unlink()
    os.mkfifo(pf / "sriov_totalvfs")                       # a read of it would wait for a writer forever
    layer = pf / "infiniband/mlx5_0/ports/1/link_layer"
    layer.unlink()
    os.symlink("loop_b", pf / "infiniband/mlx5_0/ports/1/loop_a")
    os.symlink("loop_a", pf / "infiniband/mlx5_0/ports/1/loop_b")
    os.symlink("loop_a", layer)                            # a loop of links
    (tmp_path / "root/proc/cmdline").unlink()
    os.mkfifo(tmp_path / "root/proc/cmdline")              # doctor would read this one whole
    (tmp_path / "root/sys/devices/system/node/node0/cpulist").write_text("0-4000000000\n")  # never expanded
    modules = tmp_path / "root/lib/modules" / os.uname().release
    modules.mkdir(parents=True)
    os.mkfifo(modules / "modules.dep")                     # doctor's vfio check reads it whole
    (tmp_path / "root/sys/module/vfio_pci").rmdir()        # ... when vfio-pci is not loaded
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            f"from kvm_sriov import config\nfrom kvm_sriov.node import qualify\n"
            f"cfg = config.load(files=[], overrides={{'sysfs': {{'root': {str(cfg.sysfs_root)!r}}}}})\n"
            f"for c in qualify.run(cfg, libvirt_check=False):\n    print(c.status, c.name, '|', c.detail)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    odd = [line for line in lines if line.startswith("FAIL file ")]
    assert len(odd) == 5, done.stdout
    assert any("0000:41:00.0/numa_node |" in line and "more than 64 KiB" in line for line in odd)
    assert any("0000:41:00.0/sriov_totalvfs |" in line and "is a FIFO" in line for line in odd)
    assert any("ports/1/link_layer |" in line and "symbolic link" in line for line in odd)
    assert any("proc/cmdline |" in line and "is a FIFO" in line for line in odd)
    assert any("modules.dep |" in line and "not a plain file" in line for line in odd)
    assert any(line.startswith("WARN IB port mlx5_0/1 link layer | unreadable") for line in lines)


def test_a_missing_attribute_is_a_line_not_a_traceback(host, tmp_path):
    cfg = host("connectx7")
    port = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1"
    (port / "state").unlink()
    (port / "phys_state").unlink()
    (tmp_path / "root/proc/sys/kernel/osrelease").unlink()
    got = by_name(qualify.run(cfg))
    assert (got["IB port mlx5_0/1 state"].status, got["IB port mlx5_0/1 state"].detail) == \
        ("FAIL", "?, physical state ?: no link")
    assert got["kernel"].detail.startswith(f"Linux {os.uname().release} (os.uname")


def test_hugepages_missing_on_the_pfs_node_fail(host, tmp_path):
    cfg = host("connectx7", hugepages={"0": 0, "1": 512})
    got = by_name(qualify.run(cfg))["hugepages on NUMA node 0"]
    assert got.status == "FAIL" and got.detail.startswith("0 pages of 2048 kB")
    assert got.fix.startswith("echo <n> > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")


def test_hugepages_are_skipped_without_the_hpc_profile(host):
    got = by_name(qualify.run(host("connectx7", hpc=False)))
    assert got["hugepages"].status == "SKIP"


def test_an_unknown_numa_node_on_a_two_node_host_warns(host, tmp_path):
    cfg = host("connectx7")
    (tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/numa_node").write_text("-1\n")
    got = by_name(qualify.run(cfg))
    assert got["PF 0000:41:00.0 NUMA node"].status == "WARN"
    pf = discovery.read_pf(Sysfs(cfg.sysfs_root), "0000:41:00.0")
    assert qualify.check_numa(pf, 2, "require").status == "FAIL"   # such VMs would be refused
    assert qualify.check_numa(pf, 1, "require").status == "PASS"   # one node: nothing to choose


def test_missing_qemu_and_libvirt_warn_never_a_traceback(host, monkeypatch, tmp_path):
    cfg = host("connectx7")._replace(libvirt_uri="qemu+unix:///system?socket=/nonexistent/sock")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(qualify, "QEMU_OFF_PATH", ())
    got = by_name(qualify.run(cfg))
    assert got["QEMU"].status == "WARN" and "apt-get install qemu-system-x86" in got["QEMU"].fix
    assert got["libvirt"].status == "WARN"


def test_json_report_schema_is_stable(host, tmp_path, capsys):
    cfg = host("connectx7")
    out_json, out_text = tmp_path / "report.json", tmp_path / "report.txt"
    args = qualify_args(["--json", str(out_json), "--text", str(out_text)])
    assert qualify.run_command(cfg, args) == 0
    report = json.loads(out_json.read_text())
    assert set(report) == {"schema", "tool", "version", "host", "time", "sysfs_root", "qualified", "summary",
                           "checks"}
    assert report["schema"] == 1 and report["tool"] == "kvm-sriov qualify" and report["qualified"] is True
    assert set(report["summary"]) == {"PASS", "WARN", "FAIL", "SKIP"}
    assert report["summary"]["PASS"] == len(report["checks"])
    for check in report["checks"]:
        assert list(check) == ["name", "status", "detail", "fix"]
        assert check["status"] in qualify.STATUSES and isinstance(check["detail"], str)
    text = out_text.read_text()
    assert text == capsys.readouterr().out
    assert text.rstrip().endswith("QUALIFIED") and "[PASS] IB port mlx5_0/1 state" in text


def qualify_args(argv):
    import argparse
    p = argparse.ArgumentParser()
    qualify.add_arguments(p)
    return p.parse_args(argv)


def test_exit_codes(host, tmp_path, capsys):
    cfg = host("connectx7")
    assert qualify.run_command(cfg, qualify_args([])) == 0
    (tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/sriov_numvfs").write_text("0\n")
    assert qualify.run_command(cfg, qualify_args([])) == 1
    out = capsys.readouterr().out
    assert "[FAIL] PF 0000:41:00.0 SR-IOV" in out and "fix: echo 16 >" in out and "NOT QUALIFIED" in out


def test_main_reads_the_sysfs_root_it_is_given(tmp_path, fake_qemu, capsys):
    build_host(tmp_path / "root", "connectx7")
    code = qualify.main(["--sysfs-root", str(tmp_path / "root"), "--no-libvirt",
                         "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "[PASS] PF 0000:41:00.0 hardware" in out
    assert json.loads((tmp_path / "r.json").read_text())["sysfs_root"] == str(tmp_path / "root")
    assert code in (0, 1)  # the real host's config (hpc, pool.pfs) decides the rest


def test_a_report_that_cannot_be_written_is_one_line_and_exit_1(host, tmp_path, capsys):
    cfg = host("connectx7")
    assert qualify.run_command(cfg, qualify_args(["--json", str(tmp_path / "no/such/dir/r.json")])) == 1
    assert "kvm-sriov qualify: cannot write" in capsys.readouterr().err


def test_a_sysfs_root_without_sys_is_one_line_and_exit_1(tmp_path, capsys, make_config):
    cfg = make_config(tmp_path / "nothing")
    assert qualify.run_command(cfg, qualify_args(["--sysfs-root", str(tmp_path / "nothing")])) == 1
    assert capsys.readouterr().err == f"kvm-sriov qualify: {tmp_path}/nothing/sys is not a directory: " \
                                      f"not a sysfs root\n"


def test_kvm_sriov_qualify_on_the_command_line(tmp_path, fake_qemu):
    info = build_host(tmp_path / "root", "connectx7")
    conf = tmp_path / "kvm-sriov.toml"
    conf.write_text(f'[sysfs]\nroot = "{tmp_path / "root"}"\n[pool]\npfs = {json.dumps(info["spec"].get("pool_pfs", []))}\n'
                    f'[hpc]\nprofile = false\n')
    conf.chmod(0o644)
    done = subprocess.run([sys.executable, str(REPO / "bin" / "kvm-sriov"), "qualify", "--no-libvirt",
                           "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[PASS] PF 0000:41:00.0 hardware" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["qualified"] is True


def test_sysfs_reads_are_bounded_for_every_caller(tmp_path):
    """Discovery, doctor and the probe read through Sysfs.read: a FIFO or a
    huge file planted in a fixture root never blocks or fills memory."""
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge", "wb") as fh:
        fh.truncate(100 * 1024 * 1024)
    assert Sysfs.read(tmp_path / "fifo") is None and Sysfs.read(tmp_path / "huge") is None


# -- versions: minimums from docs/install.md ("Minimum versions") ------------------------
def test_versions_pass_at_or_above_the_minimums(host):
    got = by_name(qualify.run(host("connectx7")))
    assert got["kernel"].status == "PASS"
    assert (got["libvirt version"].status, got["libvirt version"].detail) == ("PASS", "libvirt 9.0.0, TEST 0.0.2")
    assert got["QEMU"].status == "PASS"
    assert got["OpenNebula"].status == "PASS"
    assert got["OpenNebula"].detail == "the remotes in /var/tmp/one are OpenNebula 7.4.0 (tested: 7.4)"


def test_a_kernel_below_the_minimum_warns(host, tmp_path):
    cfg = host("connectx7", osrelease="4.4.0-210-generic")
    got = by_name(qualify.run(cfg))["kernel"]
    assert got.status == "WARN" and "older than 4.6" in got.detail and got.fix.startswith("a kernel >= 4.6")


def test_qemu_below_the_minimum_warns(host, fake_qemu):
    cfg = host("connectx7")
    fake_qemu.write_text("#!/bin/sh\necho 'QEMU emulator version 2.5.0 (Debian 1:2.5+dfsg-5ubuntu10)'\n")
    got = by_name(qualify.run(cfg))["QEMU"]
    assert got.status == "WARN" and "older than 2.6" in got.detail and got.fix == "QEMU >= 2.6"


def test_libvirt_below_the_minimum_warns_and_no_libvirt_is_doctors_line_alone(host, monkeypatch):
    cfg = host("connectx7")
    monkeypatch.setattr(qualify, "libvirt_versions", lambda cfg: (1003001, "QEMU", 2005000))
    got = by_name(qualify.run(cfg))["libvirt version"]
    assert got.status == "WARN" and got.detail.startswith("libvirt 1.3.1, QEMU 2.5.0: older than 2.5")
    monkeypatch.setattr(qualify, "libvirt_versions", lambda cfg: None)
    assert "libvirt version" not in by_name(qualify.run(cfg))


@pytest.mark.parametrize("version, status, said", [
    (None, "WARN", "no OpenNebula remotes here"),
    ("6.10.0", "WARN", "OpenNebula 6.10.0; kvm-sriov is tested with 7.4 only"),
    ("7.4.1", "PASS", "OpenNebula 7.4.1"),
    ("seven point four", "WARN", "not a version"),
])
def test_the_opennebula_release_of_the_remotes(host, version, status, said):
    got = by_name(qualify.run(host("connectx7", opennebula=version)))["OpenNebula"]
    assert got.status == status and said in got.detail, got


def test_a_planted_remotes_version_file_is_a_line_never_a_hang(host, tmp_path):
    cfg = host("connectx7")
    version = tmp_path / "root/var/tmp/one/VERSION"
    version.unlink()
    os.mkfifo(version)                                             # oneadmin's folder; qualify runs as root
    (tmp_path / "root/var/lib/one/remotes").mkdir(parents=True)
    os.symlink("/etc/shadow", tmp_path / "root/var/lib/one/remotes/VERSION")
    got = by_name(qualify.run(cfg))
    assert got[f"file {version}"].status == "FAIL" and "FIFO" in got[f"file {version}"].detail
    assert got[f"file {tmp_path}/root/var/lib/one/remotes/VERSION"].status == "FAIL"
    assert got["OpenNebula"].status == "WARN"


def test_hugepages_all_in_use_on_the_pfs_node_warn(host, tmp_path):
    """free_hugepages per node: kernel Documentation/admin-guide/mm/hugetlbpage.rst."""
    cfg = host("connectx7")
    (tmp_path / "root/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages").write_text("0\n")
    got = by_name(qualify.run(cfg))["hugepages on NUMA node 0"]
    assert got.status == "WARN" and got.detail == ("16384 pages of 2048 kB, none free: the next HPC VM pinned "
                                                   "to this node cannot start")
    assert "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages" in got.fix


@pytest.mark.parametrize("name", ["nested-nvme", "emulated-igb"])
def test_on_an_emulated_pf_what_is_not_pass_says_not_infiniband_hardware(host, name):
    """The nested test host's run, read-only: the InfiniBand checks say so
    plainly (SM partitions included: no SM serves an emulated PF); the rest
    passes, but for hugepages, which the HPC profile being off skips."""
    checks = qualify.run(host(name, hpc=False))
    odd = [c for c in checks if c.status != "PASS" and "not InfiniBand hardware" not in c.detail]
    assert [(c.name, c.status) for c in odd] == [("hugepages", "SKIP")], odd
    assert by_name(checks)["SM partitions"].status == "SKIP"


def test_remotes_named_on_the_command_line_give_the_opennebula_release(host, tmp_path, capsys):
    cfg = host("connectx7")
    remotes = tmp_path / "one"
    remotes.mkdir()
    (remotes / "VERSION").write_text("7.2.0\n")
    assert qualify.run_command(cfg, qualify_args(["--remotes", str(remotes)])) == 0
    out = capsys.readouterr().out
    assert f"the remotes in {remotes} are OpenNebula 7.2.0" in out
    (remotes / "VERSION").unlink()
    assert "no OpenNebula remotes here (" + str(remotes) + ")" in by_name(
        qualify.run(cfg, remotes=remotes))["OpenNebula"].detail
