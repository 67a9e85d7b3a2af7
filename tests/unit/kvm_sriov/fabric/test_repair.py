"""``kvm-sriov partitions --repair`` (kvm_sriov/fabric/repair.py, run under the network
hook's lock by frontend/network_hook.repair): each drift kind ``--check`` finds is made
right through the partition manager, only what kvm-sriov made is changed, a second repair
changes nothing, and one failing place is reported while the others are repaired.

opensm: SM nodes as local folders, as in test_check.py; each push is the node's command
(it writes <node>/partitions.conf and counts itself in <node>/pushes). UFM: the stand-in of
tests/support/ufm_standin.py (never a real UFM)."""

import json
import os
import sys

import pytest

from kvm_sriov import cli, config, locks
from kvm_sriov.fabric import drift, manager
from kvm_sriov.fabric.repair import repair
from kvm_sriov.frontend import network_hook
from tests.support.ufm_standin import API
from tests.unit.kvm_sriov.fabric.test_check import (A, A1, A2, B, B1, READ, STORAGE, Oned, desired, install,
                                                     kinds, ufm_cfg, vnet)
from tests.unit.kvm_sriov.fabric.test_opensm import front_end, needs_opensm, reloads, sm_node

# One SM node's push: refuses as ssh would when <node>/down exists, else installs the file
# and counts the push.
PUSH = ("import sys, pathlib; d = pathlib.Path(sys.argv[1]); text = sys.stdin.read()\n"
        "if (d / 'down').exists():\n"
        "    print('ssh: connect to host ' + d.name + ' port 22: Connection refused'); sys.exit(255)\n"
        "(d / 'partitions.conf').write_text(text); open(d / 'pushes', 'a').write('p\\n')\n"
        "print('installed, opensm reloaded')")


def nodes(tmp_path, *names):
    names = names or ("sm1", "sm2")
    for node in names:
        (tmp_path / node).mkdir(exist_ok=True)
    return config.load(files=[], overrides={
        "pool": {"state_dir": str(tmp_path / "frontend")},
        "infiniband": {"sm_push_command": [sys.executable, "-c", PUSH, str(tmp_path / "{node}")],
                       "sm_push_seconds": 8},
        "fabric": {"sm_nodes": list(names), "sm_read_command": [sys.executable, "-c", READ, str(tmp_path), "{node}"]}})


def pushes(tmp_path, node):
    p = tmp_path / node / "pushes"
    return len(p.read_text().splitlines()) if p.exists() else 0


def run(cfg, *vnets):
    return network_hook.repair(cfg, manager.for_config(cfg), Oned(*vnets))


# -- opensm --------------------------------------------------------------------------------------
def test_a_standby_with_another_file_is_repaired_alone_and_a_second_repair_changes_nothing(tmp_path):
    cfg = nodes(tmp_path)
    good = desired(cfg, A, B)
    install(tmp_path, good, "sm1")
    install(tmp_path, (good
                       .replace(f"0x{A2},\n", f"0x{A2},\n    0x{B1},\n")        # extra_member
                       .replace("0x02000a0000000001,", "")                     # missing_member
                       .replace(f"0x{B1},", f"0x{B1}=full,")                   # membership
                       + "gone=0x9005, ipoib : 0x02000c0000000001 ;\n"),       # stale_pkey
            "sm2")
    done = run(cfg, A, B)
    assert kinds(done.before, "sm2") == [(drift.EXTRA, 0x1000, B1), (drift.MEMBERSHIP, 0x1001, B1),
                                         (drift.DISAGREE, None, None),
                                         (drift.MISSING_MEMBER, 0x1000, "02000a0000000001"),
                                         (drift.STALE, 0x1005, None)]
    assert [(c.place, c.ok) for c in done.changes] == [("sm2", True)]     # sm1 had no drift: not contacted
    assert (pushes(tmp_path, "sm1"), pushes(tmp_path, "sm2")) == (0, 1)
    assert (tmp_path / "sm2" / "partitions.conf").read_text() == good
    assert done.after.exit_code == 0 and done.exit_code == 0
    assert done.lines() == [
        "sm2: changed: installed, opensm reloaded (drift there before: extra_member 1, membership 1, "
        "nodes_disagree 1, missing_member 1, stale_pkey 1)",
        "no drift: sm1, sm2 enforce(s) what oned's networks need"]

    again = run(cfg, A, B)
    assert again.changes == [] and again.exit_code == 0
    assert again.lines() == ["nothing changed: no drift", "no drift: sm1, sm2 enforce(s) what oned's networks need"]
    assert (pushes(tmp_path, "sm1"), pushes(tmp_path, "sm2")) == (0, 1)


@needs_opensm
def test_a_standby_is_repaired_through_the_real_install_and_only_it_reloads(tmp_path):
    """Each node's file as the real ``kvm-sriov partitions --install - --reload`` writes it
    (the real opensm validating it first), read back as ``ssh <node> cat`` would."""
    sm1, sm2 = sm_node(tmp_path, "sm1"), sm_node(tmp_path, "sm2")
    cfg = front_end(tmp_path, ["sm1", "sm2"], sm_read_command=[sys.executable, "-c", READ, str(tmp_path), "{node}"])
    assert network_hook.run(cfg, None, Oned(A, B)).ok
    good = (sm1 / "partitions.conf").read_text()
    (sm2 / "partitions.conf").write_text(good.split("# network 2")[0])     # the standby lost network 2
    done = run(cfg, A, B)
    assert [(c.place, c.ok) for c in done.changes] == [("sm2", True)] and done.exit_code == 0, done.lines()
    assert (sm2 / "partitions.conf").read_text() == good
    assert (reloads(sm1), reloads(sm2)) == (1, 2)
    assert run(cfg, A, B).changes == [] and (reloads(sm1), reloads(sm2)) == (1, 2)


def test_a_missing_pkey_the_default_opened_to_all_and_a_node_without_a_file_are_repaired(tmp_path):
    cfg = nodes(tmp_path)
    head = desired(cfg, A, B).partition("# network 2")[0]
    install(tmp_path, head.replace("SELF=full, ALL_SWITCHES=full", "ALL=full"), "sm1")   # sm2: never got one
    done = run(cfg, A, B)
    assert kinds(done.before, "sm1") == [(drift.EXTRA, 0x7FFF, "ALL"), (drift.MISSING_PKEY, 0x1001, None),
                                         (drift.MISSING_MEMBER, 0x7FFF, "ALL_SWITCHES"),
                                         (drift.MISSING_MEMBER, 0x7FFF, "SELF")]
    assert kinds(done.before, "sm2") == [(drift.UNREADABLE, None, None)]
    assert [(c.place, c.ok) for c in done.changes] == [("sm1", True), ("sm2", True)]
    assert done.exit_code == 0, done.lines()
    for node in ("sm1", "sm2"):
        assert (tmp_path / node / "partitions.conf").read_text() == desired(cfg, A, B)


def test_a_port_in_more_pkeys_than_its_table_holds_is_repaired_by_removing_the_stale_ones(tmp_path):
    cfg = nodes(tmp_path)
    good = desired(cfg, A)
    install(tmp_path, good, "sm1")
    install(tmp_path, good + "".join(f"p{k}=0x{k:04x} : 0x{STORAGE} ;\n" for k in range(0x2000, 0x2080)), "sm2")
    done = run(cfg, A)
    assert done.before.places[1].counts[drift.TOO_MANY] == 1 and done.before.places[1].counts[drift.STALE] == 128
    assert [c.place for c in done.changes] == ["sm2"] and done.exit_code == 0


def test_one_failing_sm_node_is_reported_and_the_others_are_repaired(tmp_path):
    cfg = nodes(tmp_path, "sm1", "sm2", "sm3")
    stale = desired(cfg, A) + f"gone=0x1005 : 0x{A1} ;\n"
    install(tmp_path, stale, "sm1", "sm2", "sm3")
    (tmp_path / "sm2" / "down").touch()                   # its ssh is refused
    done = run(cfg, A)
    assert [(c.place, c.ok) for c in done.changes] == [("sm1", True), ("sm2", False), ("sm3", True)]
    assert "the SM node refused or could not be reached" in done.changes[1].message
    assert "Connection refused" in done.changes[1].message
    for node, text in (("sm1", desired(cfg, A)), ("sm2", stale), ("sm3", desired(cfg, A))):
        assert (tmp_path / node / "partitions.conf").read_text() == text
    assert done.exit_code == 1
    assert kinds(done.after) == [(drift.DISAGREE, None, None), (drift.STALE, 0x1005, None)]
    assert [p.place for p in done.after.places if p.counts] == ["sm2"]
    lines = done.lines()
    assert lines[1].startswith("sm2: FAILED: the SM node refused or could not be reached")
    assert lines[1].endswith("Connection refused (drift there before: stale_pkey 1)")
    assert "left:" in lines and all("\n" not in line for line in lines)
    (tmp_path / "sm2" / "down").unlink()                  # back: the next repair does it, and only it
    assert [c.place for c in run(cfg, A).changes] == ["sm2"]
    assert run(cfg, A).changes == [] and pushes(tmp_path, "sm1") == 1


def test_oned_that_cannot_be_read_changes_nothing(tmp_path):
    cfg = nodes(tmp_path)
    install(tmp_path, "Default=0x7fff : SELF=full ;\n")

    class Broken(Oned):
        def pool_xml(self):
            return "<html>not oned</html>"
    done = network_hook.repair(cfg, manager.for_config(cfg), Broken())
    assert done.changes == [] and done.exit_code == 2
    assert done.lines()[-1] == "cannot check oned"
    assert pushes(tmp_path, "sm1") == pushes(tmp_path, "sm2") == 0


def test_a_repair_waits_for_the_hooks_run_and_gives_up_in_one_line(tmp_path):
    """A hook run and a repair never send a file at once (the repair renders oned after it)."""
    cfg = nodes(tmp_path)._replace(lock_seconds=1)
    cfg.state_dir.mkdir(mode=0o700)
    held = network_hook._open_lock(cfg.state_dir / network_hook.RUN_LOCK)
    try:
        locks.acquire(held)
        with pytest.raises(locks.LockTimeout, match="the network hook's run lock stayed locked"):
            run(cfg, A)
    finally:
        os.close(held)
    assert pushes(tmp_path, "sm1") == 0


# -- UFM ------------------------------------------------------------------------------------------
def foreign(standin):
    """PKeys someone else made on UFM: storage (with one of network 1's ports in it) and
    the administrators' (one port, whose PKey table it nearly fills)."""
    standin.pkeys[0x1003] = {"partition": "storage", "ip_over_ib": True, "index0": False,
                             "guids": {STORAGE: {"membership": "full", "index0": False},
                                       "02000a0000000001": {"membership": "full", "index0": False}}}
    standin.pkeys[0x1004] = {"partition": "admins", "ip_over_ib": True, "index0": False,
                             "guids": {STORAGE: {"membership": "full", "index0": False}}}
    return {k: json.loads(json.dumps(standin.pkeys[k])) for k in (0x1003, 0x1004)}


def changing(standin):
    return [(m, p) for m, p, _, _ in standin.requests if m != "GET"]


def test_ufm_every_kind_is_repaired_and_what_others_made_is_left_alone(tmp_path, standin):
    cfg = ufm_cfg(tmp_path, standin.url)
    assert network_hook.run(cfg, None, Oned(A, B)).ok
    theirs = foreign(standin)
    standin.pkeys[0x1000]["guids"][STORAGE] = {"membership": "full", "index0": False}    # extra_member
    standin.pkeys[0x1000]["guids"][A1]["membership"] = "limited"                         # membership
    del standin.pkeys[0x1000]["guids"][A2]                                               # missing_member
    c = vnet(3, "0x1002", "02:00:0d:00:00:01", 1)                                        # missing_pkey
    taken = vnet(4, "0x1004", "02:00:0e:00:00:01", 1)                                    # pkey_taken
    done = run(cfg, A, c, taken)                                                         # B deleted: stale_pkey
    place = f"UFM {standin.url}"
    assert kinds(done.before) == [
        (drift.EXTRA, 0x1000, STORAGE), (drift.EXTRA, 0x1003, "02000a0000000001"),
        (drift.MEMBERSHIP, 0x1000, A1), (drift.TAKEN, 0x1004, None), (drift.MISSING_PKEY, 0x1002, None),
        (drift.MISSING_MEMBER, 0x1000, A2), (drift.STALE, 0x1001, None)]
    (change,) = done.changes
    assert change.place == place and not change.ok         # network 4's PKey is someone else's: said
    assert "PKey 0x1004 (one_vnet_4) is on UFM already and not kvm-sriov's: left out" in change.message
    assert "PKeys: 1 created, 1 removed; GUIDs: 4 added, 1 removed" in change.message
    assert standin.members(0x1000) == {A1: "full", A2: "full", "02000a0000000001": "full",
                                       "02000a0000000002": "full"}
    assert standin.members(0x1002) == {"02000d0008000001": "full", "02000d0000000001": "full"}
    assert 0x1001 not in standin.pkeys
    assert {k: standin.pkeys[k] for k in (0x1003, 0x1004)} == theirs       # never touched
    assert kinds(done.after) == [(drift.EXTRA, 0x1003, "02000a0000000001"), (drift.TAKEN, 0x1004, None)]
    assert done.exit_code == 1
    assert done.after.places == [drift.Place(place, "", {drift.EXTRA: 1, drift.TAKEN: 1}, 0)]

    standin.requests.clear()                              # nothing left that is kvm-sriov's: nothing sent
    again = run(cfg, A, c, taken)
    assert again.changes == [] and changing(standin) == [] and again.exit_code == 1
    assert again.lines()[0] == ("nothing changed: what drift there is is not kvm-sriov's to repair, or cannot "
                                "be read")
    assert {k: standin.pkeys[k] for k in (0x1003, 0x1004)} == theirs


def test_ufm_a_pkey_others_made_is_never_removed_even_when_no_network_has_it(tmp_path, standin):
    """Only the PKeys in kvm-sriov's record (ufm-pkeys.json) are its own: a PKey nobody's
    network has, with tenants' ports in it, is reported and left as it is."""
    cfg = ufm_cfg(tmp_path, standin.url)
    assert network_hook.run(cfg, None, Oned(A)).ok
    standin.pkeys[0x1007] = {"partition": "", "ip_over_ib": True, "index0": False,
                             "guids": {A1: {"membership": "full", "index0": False},
                                       B1: {"membership": "full", "index0": False}}}
    standin.requests.clear()
    done = run(cfg, A)
    assert done.changes == [] and changing(standin) == []
    assert standin.members(0x1007) == {A1: "full", B1: "full"}
    assert {f.kind for f in done.after.findings} == {drift.EXTRA}
    assert all("the hook never changes that PKey" in f.fix for f in done.after.findings)


def test_ufm_one_refused_call_is_reported_and_the_rest_is_repaired(tmp_path, standin):
    cfg = ufm_cfg(tmp_path, standin.url)
    assert network_hook.run(cfg, None, Oned(A, B)).ok
    del standin.pkeys[0x1000]["guids"][A2]

    def refuse_the_stale_pkeys_removal(method, path):
        if method == "DELETE" and path == f"{API}/0x1001":
            standin.faults.append(400)
    standin.before = refuse_the_stale_pkeys_removal
    done = run(cfg, A)                                    # B deleted: its PKey cannot be removed now
    (change,) = done.changes
    assert not change.ok and "PKey 0x1001 (no network has it now)" in change.message
    assert "refused DELETE /ufmRest/resources/pkeys/0x1001: HTTP 400" in change.message
    assert standin.members(0x1000)[A2] == "full"          # the rest was repaired
    assert kinds(done.after) == [(drift.STALE, 0x1001, None)] and done.exit_code == 1
    assert "\n" not in change.message

    standin.before = None                                 # UFM takes it now: kvm-sriov still knows it made it
    done = run(cfg, A)
    assert [c.ok for c in done.changes] == [True] and 0x1001 not in standin.pkeys and done.exit_code == 0


def test_ufm_that_cannot_be_read_is_not_sent_anything(tmp_path, standin):
    cfg = ufm_cfg(tmp_path, standin.url)
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "ufm-pkeys.json").write_text("[1, 2")          # kvm-sriov's record is not readable
    done = run(cfg, A)
    assert done.changes == [] and done.exit_code == 2 and changing(standin) == []


# -- the command ------------------------------------------------------------------------------------
class FromEnvironment:
    """cli's Oned.from_environment, giving these networks."""

    def __init__(self, *vnets):
        self.oned = Oned(*vnets)

    def from_environment(self, endpoint=None, session=None):
        return self.oned


def cli_config(tmp_path, **fabric):
    """The config, the SM nodes and the hook's state folder (made by its first run)."""
    for node in ("sm1", "sm2"):
        (tmp_path / node).mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(mode=0o700, exist_ok=True)
    fabric = {"sm_nodes": ["sm1", "sm2"],
              "sm_read_command": [sys.executable, "-c", READ, str(tmp_path), "{node}"], **fabric}
    (tmp_path / "c.toml").write_text(
        f'[pool]\nstate_dir = "{tmp_path / "state"}"\n[infiniband]\n'
        f'sm_push_command = {json.dumps([sys.executable, "-c", PUSH, str(tmp_path / "{node}")])}\n'
        f'[fabric]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fabric.items()))
    return ["--config", str(tmp_path / "c.toml"), "partitions", "--repair"]


def test_the_command_says_what_it_changed_and_what_is_left(tmp_path, capsys, monkeypatch):
    argv = cli_config(tmp_path)
    monkeypatch.setattr(cli, "Oned", FromEnvironment(A, B))
    cfg = config.load(files=[tmp_path / "c.toml"])
    install(tmp_path, desired(cfg, A, B), "sm1")
    install(tmp_path, desired(cfg, A), "sm2")
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        "sm2: changed: installed, opensm reloaded (drift there before: nodes_disagree 1, missing_pkey 1)",
        "no drift: sm1, sm2 enforce(s) what oned's networks need"]
    assert cli.main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {"places": [{"place": "sm1", "read": True, "error": "", "counts": {}},
                              {"place": "sm2", "read": True, "error": "", "counts": {}}],
                   "findings": [], "changed": []}

    install(tmp_path, desired(cfg, A), "sm2")
    (tmp_path / "sm2" / "down").touch()
    assert cli.main(argv + ["--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert [(c["place"], c["ok"], c["before"]) for c in got["changed"]] == [
        ("sm2", False, {"nodes_disagree": 1, "missing_pkey": 1})]
    assert got["places"][1]["counts"] == {"nodes_disagree": 1, "missing_pkey": 1}


@pytest.mark.parametrize("case, why", [
    ("no read-back", "fabric.sm_read_command is empty: set it to print an SM node's partitions file"),
    ("no urllib3", "missing python3-urllib3: apt-get install python3-urllib3"),
    ("from a file", "--repair goes alone"),
    ("with --check", "--repair goes alone"),
])
def test_a_missing_prerequisite_or_a_bad_combination_is_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch,
                                                                                    case, why):
    monkeypatch.setattr(cli, "Oned", FromEnvironment(A))
    argv = cli_config(tmp_path)
    if case == "no read-back":
        argv = cli_config(tmp_path, sm_read_command=[])
    elif case == "no urllib3":
        creds = tmp_path / "ufm-credentials"
        creds.write_text("admin:123456\n")
        creds.chmod(0o600)
        argv = cli_config(tmp_path, manager="ufm", ufm_url="https://ufm.example.org", ufm_credentials=str(creds))
        monkeypatch.setitem(sys.modules, "urllib3", None)
    elif case == "from a file":
        (tmp_path / "vnets.xml").write_text(Oned(A).pool_xml())
        argv += ["--from-xml", str(tmp_path / "vnets.xml")]
    else:
        argv += ["--check"]
    install(tmp_path, "Default=0x7fff : SELF=full ;\n")
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and why in err, err
    assert pushes(tmp_path, "sm1") == pushes(tmp_path, "sm2") == 0


def test_run_as_root_the_repair_runs_as_the_hooks_user(tmp_path, capsys, monkeypatch):
    """As --check: the SM nodes reached with oneadmin's ssh keys, UFM's record of the PKeys
    kvm-sriov made and the hook's lock kept oneadmin's."""
    argv = cli_config(tmp_path)
    monkeypatch.setattr(cli, "Oned", FromEnvironment(A))
    install(tmp_path, desired(config.load(files=[tmp_path / "c.toml"]), A))
    became = []
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "_as_state_owner", lambda cfg, command: became.append(command) or False)
    assert cli.main(argv) == 0 and became == ["partitions"]


def test_run_as_root_before_the_hook_ever_ran_it_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    """No state folder yet: root would make it, the hook's lock and UFM's record root's,
    and the hook (oneadmin) could not use them."""
    argv = cli_config(tmp_path)
    (tmp_path / "state").rmdir()
    monkeypatch.setattr(cli, "Oned", FromEnvironment(A))
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist: run --repair as the network hook's user (oneadmin)" in err
    assert not (tmp_path / "state").exists() and pushes(tmp_path, "sm1") == 0


def test_the_repair_module_alone_goes_only_where_there_is_drift(tmp_path):
    cfg = nodes(tmp_path)
    install(tmp_path, desired(cfg, A), "sm1")
    install(tmp_path, desired(cfg, A, B), "sm2")
    done = repair(manager.for_config(cfg), desired(cfg, A, B))
    assert [c.place for c in done.changes] == ["sm1"] and done.exit_code == 0
