"""A fabric with a standby SM keeps every tenant's partitions after a failover, with real
parts: two opensm daemons on one ibsim fabric (tests/support/opensm_sim.py, ``Fabric``),
master and standby by priority, each SM node with its own partitions file. kvm-sriov's
network hook pushes a network change through the opensm partition manager
(``fabric.sm_nodes``): each SM node is a local folder standing in for an ssh target, reached
by the real ``kvm-sriov partitions --install - --reload`` with that node's config, its reload
a SIGHUP to that node's opensm. The master is killed; the standby takes over (sminfo says
MASTER, smpquery that every port's SM is now the standby), and every port's PKey table,
read from the fabric, is what oned's networks need. The control: pushed to the master
alone, the standby enforces its stale file after the failover and the tables no longer
match.

No sleep stands for a state: each step waits for what it needs (an SM's state over the
fabric, the PKey tables, the ports' SM) with a deadline only a hang reaches."""

import json
import sys
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.fabric import base
from kvm_sriov.frontend import network_hook
from kvm_sriov.ib import opensm_check, partitions, pkey
from tests.support import opensm_sim

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "kvm-sriov"
pytestmark = pytest.mark.skipif(not (opensm_sim.available() and opensm_check.available()
                                     and opensm_sim.shutil.which("sminfo")),
                                reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")


def vnet(vid, pkey_hex, mac, size):
    return (f"<VNET><ID>{vid}</ID><UID>1</UID><GID>1</GID><NAME>net{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
            f"<VLAN_ID>{pkey_hex}</VLAN_ID><TEMPLATE/><AR_POOL><AR><AR_ID>0</AR_ID><MAC>{mac}</MAC>"
            f"<SIZE>{size}</SIZE></AR></AR_POOL></VNET>")


# the change: network 1 shrinks to one lease (a VM's ports leave its partition), network 2 is new
BEFORE = "<VNET_POOL>" + vnet(1, "0x1000", "02:00:0a:00:00:01", 2) + "</VNET_POOL>"
AFTER = ("<VNET_POOL>" + vnet(1, "0x1000", "02:00:0a:00:00:01", 1) + vnet(2, "0x1001", "02:00:0a:00:00:05", 1)
         + "</VNET_POOL>")
STRANGER = 0x02000A00FFFF0001   # a port in no network


class Oned:
    def __init__(self, pool):
        self.pool = pool

    def pool_xml(self):
        return self.pool

    def merge(self, vid, template):
        raise AssertionError(f"nothing to write into network {vid}")


def rendered(pool):
    return partitions.render(partitions.networks_from_xml(pool))


def tables(text, ports):
    """port GUID -> the PKey table opensm gives its port from this file (the membership bit
    set for full members); kvm-sriov's Default partition leaves each CA port a limited 0x7fff."""
    want = {g: {base.DEFAULT_PKEY} for g in ports}
    for part in base.parse(text):
        for guid, membership in part.guids().items():
            want[int(guid, 16)].add(part.pkey | (0x8000 if membership == "full" else 0))
    return {g: sorted(keys) for g, keys in want.items()}


def sm_node_config(fabric, sm):
    """SM node sm's own kvm-sriov config: its partitions file, its opensm reloaded."""
    d = fabric.folder(sm)
    (d / "node.toml").write_text(   # JSON's strings and lists are TOML's too
        f"[pool]\nstate_dir = {json.dumps(str(d / 'state'))}\n[infiniband]\n"
        f"partitions_file = {json.dumps(str(d / 'partitions.conf'))}\n"
        f"sm_reload_command = {json.dumps(fabric.reload_command(sm))}\n")


def front_end(workdir):
    """The front-end: fabric.sm_nodes, each reached by the real CLI with that node's config."""
    push = [sys.executable, str(CLI), "--config", str(workdir / "{node}" / "node.toml"),
            "partitions", "--install", "-", "--reload"]
    return config.load(files=[], overrides={
        "pool": {"state_dir": str(workdir / "frontend")},
        "infiniband": {"sm_push_command": push, "sm_push_seconds": 120, "pkey_range": "0x1000-0x10ff"},
        "fabric": {"sm_nodes": ["sm1", "sm2"]}})


def failover(workdir, push_to):
    """Both SM nodes start with BEFORE's file; AFTER goes through the hook to the nodes
    push_to (the others cannot be reached); the master dies. -> (the tables the networks
    need, the tables once the standby has swept as master)."""
    before, after = rendered(BEFORE), rendered(AFTER)
    ports = sorted({int(g, 16) for text in (before, after) for p in base.parse(text) for g in p.guids()}
                   | {STRANGER})
    need = tables(after, ports)
    assert need != tables(before, ports)
    with opensm_sim.Fabric(workdir, ["sm1", "sm2"], ports) as fabric:
        def states():
            return {sm: fabric.sm_state(sm) for sm in ("sm1", "sm2")}

        def logs(*sms):
            return {sm: fabric.log(sm)[-2000:] for sm in sms}

        for sm in ("sm1", "sm2"):
            (fabric.folder(sm) / "partitions.conf").write_text(before)
        fabric.start_sm("sm1", priority=10)
        sm_node_config(fabric, "sm1")
        opensm_sim.wait_for(lambda: fabric.pkeys() == tables(before, ports), "the first master enforcing its file",
                            lambda: (states(), fabric.pkeys(), logs("sm1")))
        fabric.start_sm("sm2", priority=5)
        sm_node_config(fabric, "sm2")
        opensm_sim.wait_for(lambda: fabric.standby_ready("sm2"),
                            "sm2 STANDBY with its master's answer to its first poll",
                            lambda: (states(), logs("sm1", "sm2")))
        assert fabric.sm_state("sm1") == "MASTER"

        # the front-end cannot reach the nodes left out: their node config is not there
        for sm in {"sm1", "sm2"} - set(push_to):
            (fabric.folder(sm) / "node.toml").unlink()
        out = network_hook.run(front_end(workdir), pkey.Call("one.vn.allocate", True, (2,)),
                               Oned(AFTER))
        assert out.ok == (len(push_to) == 2), out.message
        assert out.ok or out.message.startswith("1 of 2 failed (sm2)"), out.message
        for sm in ("sm1", "sm2"):
            assert (fabric.folder(sm) / "partitions.conf").read_text() == (after if sm in push_to else before)
        opensm_sim.wait_for(lambda: fabric.pkeys() == need, "the master enforcing the change",
                            lambda: (states(), fabric.pkeys(), logs("sm1")))

        # sm2 has nothing unanswered at sm1 (its one poll was answered): no MAD of it dies with
        # sm1, which umad2sim would never time out (opensm_sim's docstring); then it polls the dead
        fabric.kill_sm("sm1")
        fabric.poll_master_often("sm2")

        def standby_swept():
            lid = fabric.sm_lid("sm2")
            return lid and fabric.sm_state("sm2") == "MASTER" and set(fabric.sm_lids().values()) == {lid}
        # the new master programs PKeys before it gives each port its own LID as SM LID
        # (osm_state_mgr.c, do_sweep), each step waited for: every port on sm2 means its PKeys are in
        opensm_sim.wait_for(standby_swept, "sm2 master and every port's SM",
                            lambda: (fabric.sm_state("sm2"), fabric.sm_lid("sm2"), fabric.sm_lids(), logs("sm2")))
        return need, fabric.pkeys()


def test_after_a_failover_the_standby_enforces_the_change_pushed_to_every_sm_node(tmp_path):
    need, got = failover(tmp_path, ["sm1", "sm2"])
    assert got == need


def test_pushed_to_the_master_alone_the_standby_undoes_the_change_after_a_failover(tmp_path):
    need, got = failover(tmp_path, ["sm1"])
    before = tables(rendered(BEFORE), list(need))
    assert got == before and got != need   # network 2's port lost its key, the one that left network 1 is back
