"""``kvm-sriov partitions --check`` (kvm_sriov/fabric/drift.py): what each place enforces,
compared with what oned's networks need as the network hook renders it. Read only.

opensm: two SM nodes as local folders, each node's file read back through
fabric.sm_read_command (a script printing <node>/partitions.conf, what ``ssh <node> cat
...`` does). UFM: the stand-in of tests/support/ufm_standin.py (never a real UFM)."""

import json
import sys

import pytest

from kvm_sriov import cli, config
from kvm_sriov.fabric import drift, manager, opensm
from kvm_sriov.frontend import network_hook
from tests.unit.kvm_sriov.fabric.test_opensm import front_end, needs_opensm, sm_node


def vnet(vid, vlan, mac, size, membership="full"):
    limited = "<PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP>" if membership == "limited" else ""
    ar = f"<AR><AR_ID>0</AR_ID><MAC>{mac}</MAC><SIZE>{size}</SIZE></AR>" if size else ""
    return (f"<VNET><ID>{vid}</ID><UID>{vid}</UID><GID>1</GID><NAME>net{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
            f"<VLAN_ID>{vlan}</VLAN_ID><TEMPLATE>{limited}</TEMPLATE><AR_POOL>{ar}</AR_POOL></VNET>")


A = vnet(1, "0x1000", "02:00:0a:00:00:01", 2)
B = vnet(2, "0x1001", "02:00:0b:00:00:01", 1, membership="limited")
A1, A2 = "02000a0004000001", "02000a0004000002"            # network 1's port GUIDs (its ID in them)
B1 = "02000b0006000001"
STORAGE = "0002c903000e0b72"                               # a port no network has


class Oned:
    """oned's networks, as the hook reads them (every key given: nothing is written)."""

    def __init__(self, *vnets):
        self.vnets = list(vnets)

    def pool_xml(self):
        return "<VNET_POOL>" + "".join(self.vnets) + "</VNET_POOL>"

    def merge(self, vid, template):
        raise AssertionError(f"nothing to write into network {vid}")


def desired(cfg, *vnets):
    return network_hook.desired(cfg, Oned(*vnets).pool_xml())[1]


# -- opensm: two SM nodes --------------------------------------------------------------------
READ = ("import sys; sys.stdout.write(open(sys.argv[1] + '/' + sys.argv[2] + '/partitions.conf', "
        "errors='replace').read())")
PUSH = ("import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.stdin.read()); print('written there')")


def two_nodes(tmp_path, read=None, seconds=8):
    for node in ("sm1", "sm2"):
        (tmp_path / node).mkdir(exist_ok=True)
    return config.load(files=[], overrides={
        "pool": {"state_dir": str(tmp_path / "frontend")},
        "infiniband": {"sm_push_command": [sys.executable, "-c", PUSH, str(tmp_path / "{node}" / "partitions.conf")],
                       "sm_push_seconds": seconds},
        "fabric": {"sm_nodes": ["sm1", "sm2"],
                   "sm_read_command": read or [sys.executable, "-c", READ, str(tmp_path), "{node}"]}})


def install(tmp_path, text, *nodes):
    for node in nodes or ("sm1", "sm2"):
        (tmp_path / node / "partitions.conf").write_text(text)


def check(cfg, *vnets):
    return drift.check(manager.for_config(cfg), desired(cfg, *vnets))


def kinds(result, place=None):
    """(kind, PKey, GUID) in the order they are said: the most serious first."""
    return [(f.kind, f.pkey, f.guid) for f in result.findings if place is None or f.place == place]


def test_no_drift_after_a_hook_run_on_every_sm_node(tmp_path):
    cfg, oned = two_nodes(tmp_path), Oned(A, B)
    out = network_hook.run(cfg, None, oned)
    assert out.ok, out.message
    result = check(cfg, A, B)
    assert result.exit_code == 0 and result.findings == []
    assert [(p.place, p.error, p.counts) for p in result.places] == [("sm1", "", {}), ("sm2", "", {})]
    assert result.lines() == ["no drift: sm1, sm2 enforce(s) what oned's networks need"]


@needs_opensm
def test_no_drift_after_a_hook_run_through_the_real_install_on_each_node(tmp_path):
    """Each node's file as the real ``kvm-sriov partitions --install - --reload`` writes it
    (the real opensm validating it first), read back as ``ssh <node> cat`` would."""
    sm_node(tmp_path, "sm1"), sm_node(tmp_path, "sm2")
    cfg = front_end(tmp_path, ["sm1", "sm2"], sm_read_command=[sys.executable, "-c", READ, str(tmp_path), "{node}"])
    out = network_hook.run(cfg, None, Oned(A, B))
    assert out.ok, out.message
    result = check(cfg, A, B)
    assert result.exit_code == 0, result.lines()
    out = network_hook.run(cfg, None, Oned(A))                      # network 2 deleted: the hook follows
    assert out.ok, out.message
    assert check(cfg, A).exit_code == 0
    assert kinds(check(cfg, A, B)) == [(drift.MISSING_PKEY, 0x1001, None)] * 2   # oned has it again, not the SM


def test_what_the_file_format_makes_equivalent_is_no_drift(tmp_path):
    """Order, hex case, the full/limited bit of the PKey, whitespace, comments and names."""
    cfg = two_nodes(tmp_path)
    install(tmp_path, desired(cfg, A, B), "sm1")
    install(tmp_path, "# written by hand, same partitions\n"
                      f"other_b = 0x1001 , defmember=limited, ipoib: 0x{B1.upper()} ,0x02000B0000000001 ;"
                      "\n\tDefault=0x7FFF,ipoib:ALL_SWITCHES=full,SELF=full;   # the default\n"
                      f"a=0x1000,ipoib,defmember=full:0x02000a0000000002=full,0x{A2},\n 0x{A1}, 0x02000a0000000001;\n",
            "sm2")
    result = check(cfg, A, B)
    assert result.exit_code == 0, result.lines()


def test_every_drift_kind_on_opensm_with_its_fix(tmp_path):
    cfg = two_nodes(tmp_path)
    good = desired(cfg, A, B)
    install(tmp_path, good, "sm1")
    install(tmp_path, (good
                       .replace(f"0x{A2},\n", f"0x{A2},\n    0x{B1},\n")        # B's port in A's partition
                       .replace("0x02000a0000000001,", "")                     # one of A's GUIDs gone
                       .replace(f"0x{B1},", f"0x{B1}=full,")                   # limited network, full member
                       + "gone=0x9005, ipoib : 0x02000c0000000001 ;\n"),       # a deleted network's PKey
            "sm2")
    result = check(cfg, A, B)
    assert result.exit_code == 1
    assert kinds(result, "sm1") == []
    assert kinds(result, "sm2") == [
        (drift.EXTRA, 0x1000, B1),
        (drift.MEMBERSHIP, 0x1001, B1),
        (drift.DISAGREE, None, None),
        (drift.MISSING_MEMBER, 0x1000, "02000a0000000001"),
        (drift.STALE, 0x1005, None)]
    first = result.findings[0]                      # the serious one first
    assert first.kind == drift.EXTRA and first.place == "sm2"
    assert "02000b0006000001 is a full member of PKey 0x1000 (one_vnet_1), which its network does not list " \
           "(02000b0006000001 is a port of PKey 0x1001)" in first.message
    assert "network-hook --resync" in first.fix
    disagree = next(f for f in result.findings if f.kind == drift.DISAGREE)
    assert "enforces other partitions than sm1: 3 PKey(s) differ (0x1000, 0x1001, 0x1005)" in disagree.message
    assert "fabric.sm_nodes must list every SM node" in disagree.fix
    for line in result.lines():
        assert "\n" not in line
    assert all("; fix: " in line for line in result.lines()[:-1])
    assert result.lines()[-1] == "5 finding(s) at 1 of 2 place(s)"


def test_a_missing_pkey_and_the_default_partition_opened_to_all(tmp_path):
    cfg = two_nodes(tmp_path)
    text = desired(cfg, A, B)
    head, _, _ = text.partition("# network 2")
    install(tmp_path, head.replace("SELF=full, ALL_SWITCHES=full", "ALL=full"))
    result = check(cfg, A, B)
    assert result.exit_code == 1
    assert kinds(result, "sm1") == [(drift.EXTRA, 0x7FFF, "ALL"), (drift.MISSING_PKEY, 0x1001, None),
                                    (drift.MISSING_MEMBER, 0x7FFF, "ALL_SWITCHES"),
                                    (drift.MISSING_MEMBER, 0x7FFF, "SELF")]
    missing = next(f for f in result.findings if f.kind == drift.MISSING_PKEY)
    assert missing.message == ("PKey 0x1001 (one_vnet_2) (2 member(s)) is not enforced: its network's VMs cannot "
                               "reach each other")


def test_a_stale_pkey_joining_two_networks_ports_exposes_both(tmp_path):
    """A deleted network's PKey holding only one network's ports reaches nobody new; one
    holding ports of two networks joins them."""
    cfg = two_nodes(tmp_path)
    good = desired(cfg, A, B)
    install(tmp_path, good + f"old=0x1005 : 0x{A1}, 0x{A2} ;\n", "sm1")
    install(tmp_path, good + f"old=0x1005 : 0x{A1}, 0x{B1} ;\n", "sm2")
    result = check(cfg, A, B)
    assert kinds(result, "sm1") == [(drift.STALE, 0x1005, None)]
    assert kinds(result, "sm2") == [(drift.EXTRA, 0x1005, A1), (drift.EXTRA, 0x1005, B1),
                                    (drift.DISAGREE, None, None), (drift.STALE, 0x1005, None)]
    exposed = next(f for f in result.findings if f.guid == A1)
    assert "02000a0004000001, a port of PKey 0x1000, is a limited member of PKey 0x1005 (no network has it) " \
           "with ports of other partitions" in exposed.message


def test_every_port_in_a_pkey_no_network_has_is_the_serious_kind(tmp_path):
    cfg = two_nodes(tmp_path)
    install(tmp_path, desired(cfg, A) + "old=0x1006 : ALL=full ;\n")
    result = check(cfg, A)
    assert kinds(result, "sm1") == [(drift.EXTRA, 0x1006, "ALL"), (drift.STALE, 0x1006, None)]
    assert result.findings[0].message == "ALL (every port, each tenant's) is a full member of PKey 0x1006 " \
                                         "(no network has it)"


def test_a_port_in_more_pkeys_than_its_table_holds(tmp_path):
    cfg = two_nodes(tmp_path)
    good = desired(cfg, A)
    extra = "".join(f"p{k}=0x{k:04x} : 0x{STORAGE} ;\n" for k in range(0x2000, 0x2000 + drift.PKEY_TABLE - 1))
    install(tmp_path, good + extra, "sm1")                                  # 127 + the Default: fits
    install(tmp_path, good + extra + f"one_more=0x3000 : 0x{STORAGE} ;\n", "sm2")
    result = check(cfg, A)
    assert drift.TOO_MANY not in result.places[0].counts
    assert result.places[1].counts[drift.TOO_MANY] == 1
    too_many = next(f for f in result.findings if f.kind == drift.TOO_MANY)
    assert (too_many.place, too_many.guid) == ("sm2", STORAGE)
    assert "is in 129 PKeys with the Default one; a ConnectX port's PKey table holds 128" in too_many.message


def test_many_findings_are_counted_all_and_listed_bounded(tmp_path):
    cfg = two_nodes(tmp_path)
    big = vnet(1, "0x1000", "02:00:0a:00:00:01", 300)                     # 600 GUIDs with the MAC-only ones
    install(tmp_path, desired(cfg, vnet(1, "0x1000", "02:00:0a:00:00:01", 0)))
    result = check(cfg, big)
    assert [p.counts for p in result.places] == [{drift.MISSING_MEMBER: 600}] * 2
    assert sum(f.kind == drift.MISSING_MEMBER for f in result.findings) == 2 * drift.MAX_LISTED
    assert "sm1: missing_member: 500 more not listed (--json has the counts)" in result.lines()


# -- places that cannot be read, hostile answers -----------------------------------------------
def test_a_node_that_cannot_be_read_is_exit_2_and_named_and_the_others_still_checked(tmp_path):
    cfg = two_nodes(tmp_path)
    install(tmp_path, desired(cfg, A).replace(f"0x{A2},", f"0x{A2},\n    0x{STORAGE},"), "sm1")   # sm2: no file
    result = check(cfg, A)
    assert result.exit_code == 2
    assert kinds(result) == [(drift.EXTRA, 0x1000, STORAGE), (drift.UNREADABLE, None, None)]
    (unreadable,) = [f for f in result.findings if f.kind == drift.UNREADABLE]
    assert unreadable.place == "sm2" and "failed (exit 1)" in unreadable.message and "No such file" in \
        unreadable.message
    assert result.lines()[-1] == "cannot check sm2; 1 other finding(s)"


@pytest.mark.parametrize("case, why", [
    ("garbage", "has no closing ';'"),
    ("binary", "has no closing ';'"),
    ("endless", "said more than 64 KiB"),
    ("silent", "did not answer in 1 s"),
])
def test_a_hostile_answer_is_bounded_and_one_line(tmp_path, monkeypatch, case, why):
    monkeypatch.setattr(opensm, "MAX_FILE_BYTES", 64 * 1024)
    read = {"endless": [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)", "{node}"],
            "silent": [sys.executable, "-c", "import time; time.sleep(60)", "{node}"]}.get(case)
    cfg = two_nodes(tmp_path, read=read, seconds=1)
    install(tmp_path, desired(cfg, A), "sm1")
    (tmp_path / "sm2" / "partitions.conf").write_bytes({
        "garbage": b"Default=0x7fff : ALL=full",
        "binary": bytes(range(256)) * 16 + b";",
    }.get(case, b""))
    result = check(cfg, A)
    assert result.exit_code == 2
    bad = [f for f in result.findings if f.place == "sm2" or (read and f.place == "sm1")]
    assert bad and all(f.kind == drift.UNREADABLE for f in bad)
    assert any(why in f.message for f in bad), [f.message for f in bad]
    assert all("\n" not in f.message and len(f.message) <= 400 for f in result.findings)


def test_a_huge_local_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(opensm, "MAX_FILE_BYTES", 4096)
    here = tmp_path / "partitions.conf"
    cfg = config.load(files=[], overrides={"infiniband": {"partitions_file": str(here)}})
    here.write_text(desired(cfg, A) + "#" * 5000 + "\n")
    result = check(cfg, A)
    assert result.exit_code == 2 and result.findings[0].place == "the SM node"
    assert f"{here} is larger than" in result.findings[0].message


# -- UFM, through the stand-in ------------------------------------------------------------------
def ufm_cfg(tmp_path, url, **fabric):
    creds = tmp_path / "ufm-credentials"
    creds.write_text("admin:123456\n")
    creds.chmod(0o600)
    return config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")}, "fabric": {
        "manager": "ufm", "ufm_url": url, "ufm_credentials": str(creds), "ufm_retries": 1, "ufm_seconds": 5,
        **fabric}})


def test_ufm_no_drift_after_a_hook_run_then_every_kind(tmp_path, standin):
    cfg = ufm_cfg(tmp_path, standin.url)
    out = network_hook.run(cfg, None, Oned(A, B))
    assert out.ok, out.message
    result = check(cfg, A, B)
    assert result.exit_code == 0, result.lines()          # UFM's own 0x7fff is not compared
    place = f"UFM {standin.url}"
    assert result.places == [drift.Place(place, "", {})]

    standin.pkeys[0x1000]["guids"][STORAGE] = {"membership": "full", "index0": False}    # a stranger in A
    standin.pkeys[0x1000]["guids"][A1]["membership"] = "limited"
    del standin.pkeys[0x1000]["guids"][A2]
    standin.pkeys[0x1003] = {"partition": "storage", "ip_over_ib": True, "index0": False,     # not kvm-sriov's:
                             "guids": {STORAGE: {"membership": "full", "index0": False},     # A's port in it
                                       "02000a0000000001": {"membership": "full", "index0": False}}}
    standin.pkeys[0x1004] = {"partition": "admins", "ip_over_ib": True, "index0": False,      # not ours, no
                             "guids": {STORAGE: {"membership": "full", "index0": False}}}      # tenant: fine
    result = check(cfg, A)                                 # network 2 deleted: its PKey is stale
    assert result.exit_code == 1
    assert kinds(result) == [(drift.EXTRA, 0x1000, STORAGE), (drift.EXTRA, 0x1003, "02000a0000000001"),
                             (drift.MEMBERSHIP, 0x1000, A1), (drift.MISSING_MEMBER, 0x1000, A2),
                             (drift.STALE, 0x1001, None)]
    foreign = next(f for f in result.findings if f.pkey == 0x1003)
    assert "(not kvm-sriov's) with ports of other partitions" in foreign.message
    assert foreign.fix == "remove it from PKey 0x1003 there (the hook never changes that PKey)"

    del standin.pkeys[0x1001]
    result = check(cfg, A, B, vnet(3, "0x1004", "02:00:0d:00:00:01", 1))
    assert (drift.MISSING_PKEY, 0x1001, None) in kinds(result)
    taken = next(f for f in result.findings if f.kind == drift.TAKEN)
    assert taken.pkey == 0x1004 and "network partition one_vnet_3 is not enforced" in taken.message
    assert "another VLAN_ID" in taken.fix


@pytest.mark.parametrize("case, why", [
    ("unreachable", "cannot be reached"),
    ("garbage", "with something that is not JSON"),
    ("state", "is not the list of PKeys kvm-sriov made on UFM"),
])
def test_ufm_that_cannot_be_read_is_exit_2(tmp_path, standin, case, why):
    cfg = ufm_cfg(tmp_path, "http://127.0.0.1:9" if case == "unreachable" else standin.url)
    if case == "garbage":
        standin.raw = b"<html>502 Bad Gateway" * 1000
    if case == "state":
        (tmp_path / "state").mkdir(mode=0o700)
        (tmp_path / "state" / "ufm-pkeys.json").write_text("[1, 2")
    result = check(cfg, A)
    assert result.exit_code == 2
    (finding,) = result.findings
    assert finding.kind == drift.UNREADABLE and why in finding.message and "\n" not in finding.message


# -- the command -----------------------------------------------------------------------------------
def cli_config(tmp_path):
    for node in ("sm1", "sm2"):
        (tmp_path / node).mkdir(exist_ok=True)
    (tmp_path / "c.toml").write_text(
        f'[pool]\nstate_dir = "{tmp_path / "state"}"\n[infiniband]\n'
        f'sm_push_command = ["ssh", "--", "{{node}}", "kvm-sriov", "partitions", "--install", "-"]\n'
        f'[fabric]\nsm_nodes = ["sm1", "sm2"]\n'
        f'sm_read_command = {json.dumps([sys.executable, "-c", READ, str(tmp_path), "{node}"])}\n')
    (tmp_path / "vnets.xml").write_text(Oned(A, B).pool_xml())
    return ["--config", str(tmp_path / "c.toml"), "partitions", "--from-xml", str(tmp_path / "vnets.xml"), "--check"]


def test_the_command_says_each_finding_in_one_line_and_exits_0_1_2(tmp_path, capsys):
    argv = cli_config(tmp_path)
    cfg = config.load(files=[tmp_path / "c.toml"])
    good = desired(cfg, A, B)
    install(tmp_path, good)
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == "no drift: sm1, sm2 enforce(s) what oned's networks need\n"

    install(tmp_path, good.replace(f"0x{A2},", f"0x{A2},\n    0x{STORAGE},"), "sm2")
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"sm2: extra_member: {STORAGE} is a full member of PKey 0x1000 (one_vnet_1), which its "
                      f"network does not list: it reaches that network's VMs; fix: kvm-sriov network-hook --resync "
                      f"(sends oned's partitions to every place again)")
    assert cli.main(argv + ["--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["places"] == [{"place": "sm1", "read": True, "error": "", "counts": {}},
                             {"place": "sm2", "read": True, "error": "",
                              "counts": {"extra_member": 1, "nodes_disagree": 1}}]
    assert got["findings"][0] == {"kind": "extra_member", "place": "sm2", "pkey": "0x1000", "guid": STORAGE,
                                  "message": got["findings"][0]["message"], "fix": got["findings"][0]["fix"]}

    (tmp_path / "sm1" / "partitions.conf").unlink()
    assert cli.main(argv) == 2
    assert "sm1: unreadable: " in capsys.readouterr().out


def test_networks_that_cannot_be_read_are_exit_2_in_one_line(tmp_path, capsys):
    argv = cli_config(tmp_path)
    (tmp_path / "vnets.xml").write_text("<HTML>not oned</HTML>")
    assert cli.main(argv + ["--json"]) == 2
    got = json.loads(capsys.readouterr().out)
    (finding,) = got["findings"]
    assert finding["kind"] == "unreadable" and finding["place"] == str(tmp_path / "vnets.xml")
    assert "neither a VNET_POOL nor a VNET" in finding["message"]


def test_the_check_writes_nothing_anywhere(tmp_path, capsys):
    argv = cli_config(tmp_path)
    install(tmp_path, "Default=0x7fff : SELF=full ;\n")
    before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    assert cli.main(argv) == 1
    assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "state").exists()


def test_json_without_check_and_the_file_check_of_output_stay_apart(tmp_path, capsys):
    argv = cli_config(tmp_path)[:-1]
    assert cli.main(argv + ["--json"]) == 1
    assert "--json goes with --check" in capsys.readouterr().err
    out = tmp_path / "out.conf"
    out.write_text("old\n")
    assert cli.main(argv + ["--check", "--output", str(out)]) == 1          # that file, byte for byte, as before
    assert capsys.readouterr().out == f"{out} is OUT OF DATE\n"


def test_run_as_root_the_check_reads_as_the_hooks_user(tmp_path, capsys, monkeypatch):
    """Root becomes the owner of the state folder (oneadmin), as for the pool commands: the
    SM nodes are read with its ssh keys, UFM with its credentials (0600, its own)."""
    argv = cli_config(tmp_path)
    install(tmp_path, desired(config.load(files=[tmp_path / "c.toml"]), A, B))
    became = []
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "_as_state_owner", lambda cfg, command: became.append(command) or False)
    assert cli.main(argv) == 0 and capsys.readouterr().out.startswith("no drift: sm1, sm2")
    assert cli.main(argv[:-1]) == 0 and capsys.readouterr().out.startswith("# opensm partition configuration")
    assert became == ["partitions"]                     # printing the file stays as it was
