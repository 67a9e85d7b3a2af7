"""kvm-sriov qualify's fabric checks (kvm_sriov/node/qualify.py): the
subnet manager (sminfo), whether it serves VF ports (opensm virt_enabled 2),
on the fixture hosts of tests/fixtures/qualify (rung 1, no ConnectX here).

Where the formats come from:
- sminfo's line, ``sminfo: sm lid %d sm guid 0x%PRIx64, activity count %u
  priority %d state %d %s`` with SMINFO_NOTACT/DISCOVER/STANDBY/MASTER:
  infiniband-diags' sminfo.c (rdma-core); ``sminfo -C <ca> -P <port>``
  queries the SM the port's SM LID names, and with a second argument (a
  modifier) it *sets* SMInfo: qualify never passes one.
- A VF's own IB device (a VF mlx5_core holds on the host) has the same
  ``ports/<n>/{state,gids/0}`` as a PF's (drivers/infiniband/core/sysfs.c);
  the port GUID is a GID's last 64 bits. A VF port that the SM does not
  virtualise stays down (``1: DOWN``/``2: INIT``) with GUID 0: "opensm must
  run with virt_enabled 2 for VF ports to come up"
  (/work/shared/notes/sriov-sysfs-and-libvirt.md).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from kvm_sriov.node import qualify
from tests.unit.kvm_sriov.node import test_qualify as base
from tests.unit.kvm_sriov.node.test_qualify import FIXTURES, by_name

fake_qemu, host = base.fake_qemu, base.host   # test_qualify's fixture hosts

PF = "0000:41:00.0"
SM = "IB port mlx5_0/1 subnet manager"
VF_PORTS = f"PF {PF} VF ports (SM virtualisation)"


def spec_with(name="connectx7", **pf_changes) -> dict:
    """The fixture's top-level keys with its first PF changed (for host(**changes))."""
    spec = json.loads((FIXTURES / f"{name}.json").read_text())
    spec["pfs"][0].update(pf_changes)
    return {"pfs": spec["pfs"]}


def test_the_sm_as_sminfo_reports_it_read_only(host, fake_qemu):
    got = by_name(qualify.run(host("connectx7")))
    assert (got[SM].status, got[SM].detail) == ("PASS", "SM at LID 1 (GUID 0x98039b0300a1b2c3), priority 14, MASTER")
    args = (fake_qemu.parent / "sminfo.args").read_text().split()
    assert args == ["-C", "mlx5_0", "-P", "1", "-t", "1000"]   # no modifier: that would SET SMInfo
    assert got[VF_PORTS].status == "PASS" and "0x946dae0300f10a02" in got[VF_PORTS].detail


def test_without_infiniband_diags_the_sm_is_a_warn_naming_the_package(host, fake_qemu):
    cfg = host("connectx7")
    (fake_qemu.parent / "sminfo").unlink()
    got = by_name(qualify.run(cfg))[SM]
    assert got.status == "WARN" and "SM LID 0x1 (sysfs)" in got.detail
    assert got.fix.startswith("apt-get install infiniband-diags")


def test_a_standby_sm_is_a_warn(host, fake_qemu):
    cfg = host("connectx7", sminfo="sminfo: sm lid 7 sm guid 0x98039b0300a1b2c4, activity count 12 priority 3 "
                                   "state 2 SMINFO_STANDBY")
    got = by_name(qualify.run(cfg))[SM]
    assert got.status == "WARN" and "STANDBY: the SM this port names is not the master" in got.detail


@pytest.mark.parametrize("script, said", [
    ("echo 'ibwarn: [123] mad_rpc_open_port: can not open UMAD port'; exit 255", "exited 255"),
    ("echo 'sminfo: sm lid 1 sm guid 0x1, activity count 1 priority 99 state 3 SMINFO_MASTER'", "something else"),
    ("echo 'sminfo: sm lid 1 sm guid 0x1, activity count 1 priority 1 state 3 SMINFO_MASTER; rm -rf /'",
     "something else"),
    ("head -c 1000000 /dev/zero | tr '\\0' x", "no answer within"),
    ("sleep 60", "no answer within"),
])
def test_a_hostile_or_failing_sminfo_is_one_warn_never_a_hang(host, fake_qemu, monkeypatch, script, said):
    cfg = host("connectx7")
    tool = fake_qemu.parent / "sminfo"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    monkeypatch.setattr(qualify, "TOOL_SECONDS", 2)
    started = time.monotonic()
    got = by_name(qualify.run(cfg))[SM]
    assert time.monotonic() - started < 30   # not a speed: the sleep 60 was killed
    assert got.status == "WARN" and said in got.detail, got


def test_vf_ports_down_with_guid_0_is_the_virt_enabled_failure(host):
    cfg = host("connectx7", **spec_with(vf_ports=[{"vf": 0, "ibdev": "mlx5_1", "state": "2: INIT",
                                                   "node_guid": "0000:0000:0000:0000", "policy": "Follow"}]))
    sys_dir = cfg.sysfs_root / "sys"
    gid = next(sys_dir.glob("devices/*/*/infiniband/mlx5_1/ports/1/gids/0"))
    gid.write_text("fe80:0000:0000:0000:0000:0000:0000:0000\n")
    got = by_name(qualify.run(cfg))[VF_PORTS]
    assert got.status == "FAIL"
    assert "is INIT with GUID 0" in got.detail and "virt_enabled is not 2" in got.detail
    assert "'virt_enabled 2' in opensm.conf" in got.fix and "UFM" in got.fix


def test_a_vf_port_down_by_its_own_policy_proves_nothing(host):
    """mlx5's sriov/<n>/policy Down keeps the VF's port down whatever the SM does."""
    cfg = host("connectx7", **spec_with(vf_ports=[{"vf": 0, "ibdev": "mlx5_1", "state": "1: DOWN",
                                                   "node_guid": "946d:ae03:00f1:0a01", "policy": "Down"}]))
    got = by_name(qualify.run(cfg))[VF_PORTS]
    assert got.status == "WARN" and "have policy Down" in got.detail
    assert got.fix.startswith(f"on one free VF: echo Follow > /sys/bus/pci/devices/{PF}/sriov/<n>/policy")


def test_vfs_nobody_holds_cannot_prove_virtualisation_and_say_so(host):
    cfg = host("connectx7", **spec_with(vf_ports=[]))
    got = by_name(qualify.run(cfg))[VF_PORTS]
    assert got.status == "WARN" and got.detail.startswith("not proven")
    assert "0 GUID(s) set, 4 unset" in got.detail          # fake_sysfs's mlx5 sriov/<n>/port files: all-F
    assert "mlx5_core/bind" in got.fix and "virt_enabled 2" in got.fix


def test_no_vf_port_check_while_the_pf_port_is_down(host, tmp_path):
    cfg = host("connectx7")
    port = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")
    got = by_name(qualify.run(cfg))
    assert VF_PORTS not in got and SM not in got   # the port's own FAIL says what to do first


def test_hostile_vf_guid_files_are_no_traceback(host, tmp_path):
    cfg = host("connectx7", **spec_with(vf_ports=[]))
    sriov = tmp_path / "root/sys/devices/pci0000:00/0000:41:00.0/sriov"
    (sriov / "0/port").write_bytes(b"\xff\xfe garbage")
    (sriov / "1/port").unlink()
    os.mkfifo(sriov / "1/port")
    got = by_name(qualify.run(cfg))[VF_PORTS]
    assert got.status == "WARN" and "0 GUID(s) set, 4 unset" in got.detail


# -- the SM's partitions ------------------------------------------------------------------
# tests/fixtures/qualify/partitions.conf is what `kvm-sriov partitions` renders for two
# networks (kvm_sriov/ib/partitions.render, opensm's partition-config grammar), read back
# from each SM node through fabric.sm_read_command as the host fixture configures it.
def parts(checks) -> dict:
    return {c.name: c for c in checks if c.name.startswith("SM partitions")}


def test_partitions_read_back_from_every_sm_node(host, fake_qemu):
    got = parts(qualify.run(host("connectx7")))
    assert set(got) == {"SM partitions on sm1", "SM partitions on sm2"}
    for check in got.values():
        assert check.status == "PASS"
        assert check.detail.startswith("2 partition(s) besides Default: 0x0010, 0x0011; each OpenNebula network's "
                                       "own partition is checked on the front-end")
        assert "kvm-sriov partitions --check)" in check.detail
    assert sorted((fake_qemu.parent / "sm-read.args").read_text().split()) == ["sm1", "sm2"]


def test_without_a_way_to_the_sm_it_is_a_warn_pointing_at_the_front_end(host):
    cfg = host("connectx7")._replace(sm_nodes=(), sm_read_command=(), sm_push_command=())
    got = parts(qualify.run(cfg))
    assert list(got) == ["SM partitions"]
    assert got["SM partitions"].status == "WARN" and "not visible from this host" in got["SM partitions"].detail
    assert "checked on the front-end" in got["SM partitions"].fix and "partitions --check" in got["SM partitions"].fix


def test_sm_nodes_enforcing_different_partitions_fail(host, fake_qemu):
    cfg = host("connectx7")
    text = (FIXTURES / "partitions.conf").read_text()
    tool = fake_qemu.parent / "sm-read"
    tool.write_text(f"#!/bin/sh\nif [ \"$1\" = sm2 ]; then cat <<'EOF'\n{text.split('# network 13')[0]}\nEOF\n"
                    f"else cat <<'EOF'\n{text}\nEOF\nfi\n")
    got = parts(qualify.run(cfg))
    assert got["SM partitions on sm2"].detail.startswith("1 partition(s) besides Default: 0x0010;")
    assert got["SM partitions"].status == "FAIL" and "different partitions (sm1, sm2)" in got["SM partitions"].detail
    assert "network-hook --resync" in got["SM partitions"].fix


def test_a_default_partition_open_to_all_fails(host, tmp_path):
    """opensm's own default file (no partitions.conf) is 'Default=0x7FFF, ipoib : ALL=full ;'."""
    local = tmp_path / "sm/partitions.conf"
    local.parent.mkdir()
    local.write_text("Default=0x7fff, ipoib : ALL=full ;\n")
    cfg = host("connectx7")._replace(partitions_file=local)
    got = parts(qualify.run(cfg))
    assert list(got) == [f"SM partitions on {local} (this host)"]   # this host is the SM node: its file
    check = got[f"SM partitions on {local} (this host)"]
    assert check.status == "FAIL" and "makes ALL full members" in check.detail
    assert "default_partition_members" in check.fix


@pytest.mark.parametrize("script, said", [
    ("echo 'ssh: connect to host sm2 port 22: No route to host'; exit 255", "failed (exit 255)"),
    ("echo 'Default=0x7fff : SELF=full'", "has no closing ';'"),
    ("sleep 60", "did not answer"),
])
def test_an_sm_node_that_cannot_be_read_is_a_warn(host, fake_qemu, script, said):
    cfg = host("connectx7")._replace(sm_push_seconds=2)
    (fake_qemu.parent / "sm-read").write_text(f"#!/bin/sh\n{script}\n")
    got = parts(qualify.run(cfg))
    assert got["SM partitions on sm1"].status == "WARN" and said in got["SM partitions on sm1"].detail, got


def test_a_planted_partitions_file_is_a_line_never_a_hang(host, tmp_path):
    local = tmp_path / "sm/partitions.conf"
    local.parent.mkdir()
    os.mkfifo(local)
    cfg = host("connectx7")._replace(partitions_file=local)
    got = by_name(qualify.run(cfg))
    assert got[f"file {local}"].status == "FAIL" and "FIFO" in got[f"file {local}"].detail
    assert got["SM partitions on sm1"].status == "PASS"      # the SM nodes' copies are still read


def test_opensm_on_this_host_without_virt_enabled_is_doctors_fail(host, tmp_path):
    conf = tmp_path / "opensm.conf"
    conf.write_text("# opensm.conf\nvirt_enabled 0\npartition_config_file /etc/opensm/partitions.conf\n")
    cfg = host("connectx7")._replace(sm_config=conf)
    got = by_name(qualify.run(cfg))
    assert got["opensm virtualization"].status == "FAIL" and "virt_enabled 2" in got["opensm virtualization"].fix
    conf.unlink()
    os.mkfifo(conf)                                            # doctor reads it whole: not handed to it
    got = by_name(qualify.run(cfg))
    assert "opensm virtualization" not in got and got[f"file {conf}"].status == "FAIL"
