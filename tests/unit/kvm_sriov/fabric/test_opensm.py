"""opensm as the partition manager on a fabric with standby SMs: the file goes to every
SM node (fabric.sm_nodes), each push reported, one failing node stops no other.

Each SM node is a local folder standing in for an ssh target: the push command is the
real CLI with that node's own config (``kvm-sriov --config <node>.toml partitions
--install - --reload``, what ``ssh <node> kvm-sriov partitions --install - --reload``
runs there), so the real opensm validates the file before each node installs it."""

import json
import sys
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError, InputError
from kvm_sriov.fabric import base, manager
from kvm_sriov.fabric.opensm import OpenSM
from kvm_sriov.frontend import network_hook
from kvm_sriov.ib import opensm_check, partitions, pkey
from kvm_sriov.node import doctor

REPO = Path(__file__).resolve().parents[4]
CLI = REPO / "bin" / "kvm-sriov"
needs_opensm = pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")


class Oned:
    """oned with one IB network that has its key: the hook only reads the pool."""

    def pool_xml(self):
        return ("<VNET_POOL><VNET><ID>1</ID><UID>1</UID><GID>1</GID><NAME>net1</NAME><BRIDGE>ib-sriov</BRIDGE>"
                "<VLAN_ID>0x1000</VLAN_ID><TEMPLATE/><AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:00:00:01</MAC>"
                "<SIZE>2</SIZE></AR></AR_POOL></VNET></VNET_POOL>")

    def merge(self, vid, template):
        raise AssertionError(f"nothing to write into network {vid}")


def call(method, *ids):
    return pkey.Call(method, True, tuple(ids))


def sm_node(tmp_path, name):
    """An SM node's own config: its partitions file and a reload that leaves a mark."""
    d = tmp_path / name
    d.mkdir()
    (d / "node.toml").write_text(
        f'[pool]\nstate_dir = "{d / "state"}"\n[infiniband]\npartitions_file = "{d / "partitions.conf"}"\n'
        f'sm_reload_command = ["{sys.executable}", "-c", "open({str(d / "reloads")!r}, \'a\').write(\'r\\\\n\')"]\n')
    return d


def front_end(tmp_path, nodes, **fabric):
    """The front-end's config: each node reached by the real CLI with that node's config."""
    push = [sys.executable, str(CLI), "--config", str(tmp_path / "{node}" / "node.toml"),
            "partitions", "--install", "-", "--reload"]
    return config.load(files=[], overrides={
        "pool": {"state_dir": str(tmp_path / "frontend")},
        "infiniband": {"sm_push_command": push, "sm_push_seconds": 60, "pkey_range": "0x1000-0x10ff"},
        "fabric": {"sm_nodes": list(nodes), **fabric}})


def reloads(d):
    return len((d / "reloads").read_text().splitlines()) if (d / "reloads").exists() else 0


@needs_opensm
def test_every_sm_node_gets_the_file_and_one_failing_stops_no_other(tmp_path):
    sm1, sm2 = sm_node(tmp_path, "sm1"), sm_node(tmp_path, "sm2")
    (sm2 / "node.toml").rename(sm2 / "away.toml")       # sm2 cannot take it (as an unreachable node)
    cfg, oned = front_end(tmp_path, ["sm1", "sm2"]), Oned()
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned)
    assert not out.ok and "\n" not in out.message
    assert out.message.startswith("1 of 2 failed (sm2): sm2: the SM node refused or could not be reached"), out.message
    assert "; sm1: asked opensm to reload" in out.message and "last good file kept" in out.message
    text = (sm1 / "partitions.conf").read_text()
    assert "one_vnet_1=0x9000" in text and reloads(sm1) == 1 and opensm_check.check_text(text).accepted
    assert not (sm2 / "partitions.conf").exists()
    (check,) = doctor.check_network_hook(cfg)
    assert check.level == "FAIL" and "sm2" in check.message and "fabric.sm_nodes" in check.fix

    (sm2 / "away.toml").rename(sm2 / "node.toml")       # sm2 back: the next run sends it again
    out = network_hook.run(cfg, call("one.vn.update", 1), oned)
    assert out.ok, out.message
    assert f"sm1: {sm1 / 'partitions.conf'}: unchanged; sm2: asked opensm to reload" in out.message, out.message
    assert (sm2 / "partitions.conf").read_text() == text and reloads(sm2) == 1 and reloads(sm1) == 1
    assert doctor.check_network_hook(cfg)[0].level == "OK"
    readings = OpenSM(cfg).enforced()
    assert [r.error for r in readings] == ["fabric.sm_read_command is empty: the file on sm1 cannot be read back",
                                           "fabric.sm_read_command is empty: the file on sm2 cannot be read back"]


def test_the_pushes_run_side_by_side_and_a_slow_node_is_given_up_on_alone(tmp_path):
    """Each node's command waits until every other answering node's has started: in a
    row, the first would wait for ever (and be given up on)."""
    script = ("import sys, time, pathlib; node = sys.argv[1]; data = sys.stdin.read()\n"
              f"d = pathlib.Path({str(tmp_path)!r}); (d / ('started-' + node)).touch()\n"
              "if node == 'slow': time.sleep(60)\n"
              "while len(list(d.glob('started-sm*'))) < 3: time.sleep(0.05)\n"
              "(d / node).write_text(data); print(node, 'took it')")
    cfg = config.load(files=[], overrides={
        "pool": {"state_dir": str(tmp_path / "frontend")},
        "infiniband": {"sm_push_command": [sys.executable, "-c", script, "{node}"], "sm_push_seconds": 20},
        "fabric": {"sm_nodes": ["sm1", "slow", "sm2", "sm3"]}})
    reports = OpenSM(cfg).enforce("Default=0x7fff, ipoib : SELF=full ;\n")
    assert [(r.where, r.ok) for r in reports] == [("sm1", True), ("slow", False), ("sm2", True), ("sm3", True)]
    assert reports[0].message == "sm1 took it" and "did not answer in 20 s" in reports[1].message
    assert (tmp_path / "sm3").read_text() == "Default=0x7fff, ipoib : SELF=full ;\n"
    assert not (tmp_path / "slow").exists()
    line = manager.summary(reports)
    assert line.startswith("1 of 4 failed (slow): slow: the SM node did not answer in 20 s"), line
    assert "; sm1: sm1 took it; sm2: sm2 took it; sm3: sm3 took it" in line


def test_one_sm_node_without_sm_nodes_is_as_before(tmp_path):
    """No fabric.sm_nodes: the one node's own message, no name before it (the hook's
    tests in tests/unit/kvm_sriov/frontend/test_network_hook.py hold the rest)."""
    got = tmp_path / "got"
    cfg = config.load(files=[], overrides={"infiniband": {"sm_push_command": [
        sys.executable, "-c", f"import sys; open({str(got)!r}, 'w').write(sys.stdin.read()); print('done there')"]}})
    assert manager.enforce(cfg, "x ;\n") == "done there" and got.read_text() == "x ;\n"
    assert OpenSM(cfg).targets() == [("", cfg.sm_push_command)]


def test_what_each_node_enforces_is_read_back(tmp_path):
    networks = partitions.networks_from_xml(
        "<VNET_POOL><VNET><ID>3</ID><UID>1</UID><NAME>a</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>0x8001</VLAN_ID>"
        "<TEMPLATE/><AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:64:00:01</MAC><SIZE>2</SIZE></AR></AR_POOL></VNET>"
        "</VNET_POOL>")
    text = partitions.render(networks)
    for node in ("sm1", "sm2"):
        (tmp_path / node).mkdir()
        (tmp_path / node / "partitions.conf").write_text(text if node == "sm1" else "broken")
    cfg = config.load(files=[], overrides={
        "infiniband": {"sm_push_command": ["ssh", "--", "{node}", "kvm-sriov", "partitions", "--install", "-"]},
        "fabric": {"sm_nodes": ["sm1", "sm2"], "sm_read_command": [
            sys.executable, "-c", f"import sys; print(open({str(tmp_path)!r} + '/' + sys.argv[1] + "
                                  f"'/partitions.conf').read())", "{node}"]}})
    sm1, sm2 = OpenSM(cfg).enforced()
    assert sm1.where == "sm1" and sm1.partitions == base.parse(text)
    assert sm2.partitions is None and "has no closing ';'" in sm2.error
    here = OpenSM(config.load(files=[], overrides={"infiniband": {"partitions_file": str(tmp_path / "sm1" /
                                                                                         "partitions.conf")}}))
    (reading,) = here.enforced()
    assert reading.where == "" and reading.partitions == sm1.partitions


def test_the_file_kvm_sriov_writes_parses_into_its_networks_partitions():
    networks = partitions.networks_from_xml(
        "<VNET_POOL>"
        "<VNET><ID>3</ID><UID>1</UID><NAME>a # ; : x</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>0x8001</VLAN_ID>"
        "<TEMPLATE/><AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:64:00:01</MAC><SIZE>2</SIZE></AR></AR_POOL></VNET>"
        "<VNET><ID>4</ID><UID>1</UID><NAME>b</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>2</VLAN_ID>"
        "<TEMPLATE><PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP></TEMPLATE><AR_POOL/></VNET>"
        "</VNET_POOL>")
    default, a, b = base.parse(partitions.render(networks))
    assert default == base.Partition("Default", 0x7FFF, "limited", True,
                                     (base.Member("SELF", "full"), base.Member("ALL_SWITCHES", "full")))
    assert (a.name, a.pkey, a.membership, a.ipoib) == ("one_vnet_3", 1, "full", True)
    assert a.guids() == {"02000a0008640001": "full", "02000a0008640002": "full",
                         "02000a0000640001": "full", "02000a0000640002": "full"}
    assert (b.name, b.pkey, b.membership, b.members) == ("one_vnet_4", 2, "limited", ())


@pytest.mark.parametrize("text, why", [
    ("Default=0x7fff : ALL=full", "no closing ';'"),
    ("no key here : 0x1 ;", "is not Name=PKey"),
    ("a=0x1 : 0x1 ; b=0x8001 : ;", "given twice"),
    ("a=0x1 : mgid=ff12:401b::1 ;", "is not a GUID"),
    ("a=0x1 : 0xzz ;", "is not a GUID"),
])
def test_a_file_kvm_sriov_does_not_write_is_one_line(text, why):
    with pytest.raises(InputError, match=why) as got:
        base.parse(text)
    assert "\n" not in str(got.value)


@pytest.mark.parametrize("fabric, ib, why", [
    ({"sm_nodes": ["sm1"]}, {"sm_push_command": ["ssh", "sm1", "kvm-sriov"]}, "needs infiniband.sm_push_command"),
    ({"sm_nodes": ["sm1"]}, {}, "needs infiniband.sm_push_command"),
    ({"sm_nodes": ["-oProxyCommand=touch /tmp/x"]}, {"sm_push_command": ["ssh", "{node}"]}, "not a host name"),
    ({"sm_nodes": ["sm1 sm2"]}, {"sm_push_command": ["ssh", "{node}"]}, "not a host name"),
    ({"sm_nodes": ["sm1", "sm1"]}, {"sm_push_command": ["ssh", "{node}"]}, "twice"),
    ({"sm_nodes": ["sm1"], "sm_read_command": ["cat", "/x"]}, {"sm_push_command": ["ssh", "{node}"]},
     "sm_read_command needs {node}"),
    ({"manager": "bgp"}, {}, "fabric.manager must be one of"),
    ({}, {"sm_push_command": ["ssh", "{node}"]}, "fabric.sm_nodes names no node"),
])
def test_a_bad_fabric_section_is_refused_in_one_line(fabric, ib, why):
    with pytest.raises(ConfigError, match=why):
        config.load(files=[], overrides={"fabric": fabric, "infiniband": ib})


def test_the_cli_enforces_through_the_manager_and_says_each_nodes_result(tmp_path, capsys):
    from kvm_sriov import cli
    script = tmp_path / "ssh"
    script.write_text("import sys\nnode = sys.argv[1]\nsys.stdin.read()\nif node == 'sm2':\n"
                      "    print('ssh: connect to host sm2 port 22: Connection refused')\n    sys.exit(255)\n"
                      "print('written there')\n")
    (tmp_path / "vnets.xml").write_text("<VNET_POOL/>")
    (tmp_path / "c.toml").write_text(
        f'[pool]\nstate_dir = "{tmp_path / "state"}"\n[infiniband]\n'
        f'sm_push_command = {json.dumps([sys.executable, str(script), "{node}"])}\n'
        f'[fabric]\nsm_nodes = ["sm1", "sm2"]\n')
    code = cli.main(["--config", str(tmp_path / "c.toml"), "partitions", "--from-xml", str(tmp_path / "vnets.xml"),
                     "--enforce"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err == ["kvm-sriov partitions: sm1: written there",
                   "kvm-sriov partitions: sm2: FAILED: the SM node refused or could not be reached "
                   f"({sys.executable} {script} sm2, exit 255): ssh: connect to host sm2 port 22: "
                   "Connection refused"]

