"""The front-end's network hook: keys written into oned, the partitions file
judged by the real opensm, serialised runs, the last good file kept."""

import re
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from kvm_sriov import cli, config
from kvm_sriov.errors import DriverError
from kvm_sriov.ib import opensm_check, pkey
from kvm_sriov.node import doctor
from kvm_sriov.frontend import network_hook

needs_opensm = pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")


class FakeOned:
    """one.vnpool.info and one.vn.update (merge) over an in-memory pool; as oned, a
    merge into a network that is gone or locked is refused."""

    def __init__(self):
        self.vnets, self.updates, self.lock = {}, [], threading.Lock()
        self.locked, self.reads = set(), 0

    def add(self, vid, bridge="ib-sriov", vlan=None, auto=False, mac="02:00:0a:00:00:01", size=2, parent=None,
            uid=1, gid=1):
        t = f"<VNET><ID>{vid}</ID><UID>{uid}</UID><GID>{gid}</GID><NAME>net{vid}</NAME><BRIDGE>{bridge}</BRIDGE>"
        t += f"<PARENT_NETWORK_ID>{parent}</PARENT_NETWORK_ID>" if parent is not None else ""
        t += f"<VLAN_ID>{vlan}</VLAN_ID>" if vlan else ""
        t += f"<TEMPLATE>{'<KVM_SRIOV_PKEY>AUTO</KVM_SRIOV_PKEY>' if auto else ''}</TEMPLATE>"
        t += f"<AR_POOL><AR><AR_ID>0</AR_ID><MAC>{mac}</MAC><SIZE>{size}</SIZE></AR></AR_POOL></VNET>"
        with self.lock:
            self.vnets[vid] = ET.fromstring(t)

    def delete(self, vid):
        with self.lock:
            del self.vnets[vid]

    def pool_xml(self):
        with self.lock:
            self.reads += 1
            return "<VNET_POOL>" + "".join(ET.tostring(v, encoding="unicode") for v in self.vnets.values()) \
                + "</VNET_POOL>"

    def merge(self, vid, template):
        with self.lock:
            if vid not in self.vnets:
                raise DriverError(f"OpenNebula refused one.vn.update: [one.vn.update] Error getting "
                                  f"virtual network [{vid}].")
            if vid in self.locked:
                raise DriverError(f"OpenNebula refused one.vn.update: [one.vn.update] NET is locked. [{vid}]")
            self.updates.append((vid, template))
            v = self.vnets[vid]
            for key, value in re.findall(r'(\w+) = "((?:[^"\\]|\\.)*)"', template):
                el = v.find(f"TEMPLATE/{key}")
                if el is None:
                    el = ET.SubElement(v.find("TEMPLATE"), key)
                el.text = value
                if key == "VLAN_ID":
                    top = v.find("VLAN_ID")
                    if top is None:
                        top = ET.SubElement(v, "VLAN_ID")
                    top.text = value

    def vlan(self, vid):
        return self.vnets[vid].findtext("VLAN_ID")


def cfg_for(tmp_path, **ib):
    ib = {"partitions_file": str(tmp_path / "sm" / "partitions.conf"), "pkey_range": "0x1000-0x1001",
          "sm_reload_command": [sys.executable, "-c", "open(%r, 'a').write('reload\\n')" % str(tmp_path / "reloads")],
          **ib}
    return config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")}, "infiniband": ib})


def reloads(tmp_path):
    p = tmp_path / "reloads"
    return len(p.read_text().splitlines()) if p.exists() else 0


def call(method, *ids, ok=True):
    return pkey.Call(method, ok, tuple(ids))


@needs_opensm
def test_a_new_auto_network_gets_a_key_and_its_partition_reaches_opensm_once(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, auto=True)
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned)
    assert out.ok, out.message
    assert oned.vlan(1) == "0x1000"
    text = cfg.partitions_file.read_text()
    assert "one_vnet_1=0x9000" in text and reloads(tmp_path) == 1
    assert opensm_check.check_text(text).accepted
    again = network_hook.run(cfg, call("one.vn.update", 1), oned)   # unchanged: no push, no reload
    assert again.ok and "unchanged" in again.message and reloads(tmp_path) == 1
    assert doctor.check_network_hook(cfg)[0].level == "OK"


@needs_opensm
def test_two_networks_two_keys_exhausted_range_and_a_deleted_networks_key_reused(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    for vid in (1, 2, 3):
        oned.add(vid, auto=True, mac=f"02:00:0a:00:0{vid}:01")
    out = network_hook.run(cfg, call("one.vn.allocate", 3), oned)
    assert not out.ok and "network 3: no PKey: every PKey of infiniband.pkey_range 0x1000-0x1001" in out.message
    assert (oned.vlan(1), oned.vlan(2), oned.vlan(3)) == ("0x1000", "0x1001", None)
    assert "every PKey" in oned.vnets[3].findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR")
    assert "one_vnet_1=0x9000" in cfg.partitions_file.read_text()   # the others' partitions still go out
    assert "one_vnet_3" not in cfg.partitions_file.read_text()
    oned.delete(1)
    out = network_hook.run(cfg, call("one.vn.delete", 1), oned)
    assert out.ok, out.message
    assert oned.vlan(3) == "0x1000" and oned.vnets[3].findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") == ""
    text = cfg.partitions_file.read_text()
    assert "one_vnet_1=" not in text and "one_vnet_3=0x9000" in text


def test_failed_calls_and_other_networks_do_nothing(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    pushed = []
    oned.add(1, vlan="0x1000")
    oned.add(2, bridge="br0", auto=True)
    assert network_hook.run(cfg, call("one.vn.update", 1, ok=False), oned, lambda c, t: pushed.append(t)).ok
    assert pushed == [] and not (cfg.state_dir / network_hook.STATUS).exists()
    assert network_hook.run(cfg, call("one.vn.update", 1), oned, lambda c, t: pushed.append(t) or "pushed").ok
    assert len(pushed) == 1
    out = network_hook.run(cfg, call("one.vn.update", 2), oned, lambda c, t: pushed.append(t) or "pushed")
    assert out.ok and "not InfiniBand" in out.message and len(pushed) == 1 and oned.vlan(2) is None


def test_a_call_on_another_network_still_sends_what_changed_meanwhile(tmp_path):
    """The run a burst of calls left their changes to may itself be for a network that
    is not InfiniBand (seen on rung 4: two services deleted at once, the IB network's
    delete and DONE runs found a DONE run of the other network waiting, and that run
    said 'not InfiniBand' without sending the file: the deleted network's partition
    stayed)."""
    cfg, oned = cfg_for(tmp_path), FakeOned()
    pushed = []
    oned.add(1, vlan="0x1000")
    oned.add(2, bridge="br0")
    assert network_hook.run(cfg, None, oned, lambda c, t: pushed.append(t) or "pushed").ok
    assert "one_vnet_1=" in pushed[-1]
    oned.delete(1)          # its own runs found this one waiting and left it the change
    out = network_hook.run(cfg, call("one.vn.update", 2), oned, lambda c, t: pushed.append(t) or "pushed")
    assert out.ok and "not InfiniBand" not in out.message, out.message
    assert len(pushed) == 2 and "one_vnet_1=" not in pushed[-1]


@needs_opensm
def test_a_file_opensm_rejects_is_never_installed_and_the_failure_is_recorded(tmp_path, monkeypatch):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, vlan="0x1000")
    assert network_hook.run(cfg, None, oned).ok
    good = cfg.partitions_file.read_text()
    from kvm_sriov.ib import partitions
    real = partitions.render
    monkeypatch.setattr(partitions, "render", lambda *a, **k: real(*a, **k) + "broken=0x9001 : garbage ;;\n")
    oned.add(2, vlan="0x1001", mac="02:00:0b:00:00:01")
    out = network_hook.run(cfg, call("one.vn.allocate", 2), oned)
    assert not out.ok and "opensm rejects" in out.message and "last good file kept" in out.message
    assert cfg.partitions_file.read_text() == good and reloads(tmp_path) == 1
    (check,) = doctor.check_network_hook(cfg)
    assert check.level == "FAIL" and "opensm rejects" in check.message
    monkeypatch.setattr(partitions, "render", real)
    out = network_hook.run(cfg, call("one.vn.update", 2), oned)  # after a failure, always pushed again
    assert out.ok and "one_vnet_2" in cfg.partitions_file.read_text()
    assert doctor.check_network_hook(cfg)[0].level == "OK"


@pytest.mark.parametrize("command, why", [
    (["false"], "exit 1"),
    ([sys.executable, "-c", "import time; time.sleep(30)"], "did not answer in 1 s"),
    (["/nonexistent/ssh"], "No such file"),
])
def test_an_unreachable_sm_node_keeps_its_file_and_fails_visibly(tmp_path, command, why):
    cfg, oned = cfg_for(tmp_path, sm_push_command=command, sm_push_seconds=1), FakeOned()
    oned.add(1, auto=True)
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned)
    assert not out.ok and why in out.message and "\n" not in out.message
    assert oned.vlan(1) == "0x1000"          # the key stays: the next run or the resync sends it
    assert not cfg.partitions_file.exists()
    assert doctor.check_network_hook(cfg)[0].level == "FAIL"


def test_the_push_command_gets_the_file_on_stdin(tmp_path):
    got = tmp_path / "got"
    cfg = cfg_for(tmp_path, sm_push_command=[sys.executable, "-c",
                                             f"import sys; open({str(got)!r}, 'w').write(sys.stdin.read())"])
    oned = FakeOned()
    oned.add(1, vlan="0x1000")
    assert network_hook.run(cfg, None, oned).ok
    assert "one_vnet_1=0x9000" in got.read_text()


def test_a_burst_is_serialised_and_ends_with_the_last_state(tmp_path):
    cfg, oned = cfg_for(tmp_path, pkey_range="0x1000-0x10ff"), FakeOned()
    active, pushed, overlaps = [], [], []

    def pusher(c, text):
        active.append(1)
        if len(active) > 1:
            overlaps.append(text)
        time.sleep(0.4)
        pushed.append(text)
        active.pop()
        return "pushed"

    oned.add(1, auto=True)
    first = threading.Thread(target=network_hook.run, args=(cfg, call("one.vn.allocate", 1), oned, pusher))
    first.start()
    time.sleep(0.15)
    threads = []
    for vid in range(2, 7):  # a burst while the first run pushes
        oned.add(vid, auto=True, mac=f"02:00:0a:00:{vid:02x}:01")
        t = threading.Thread(target=network_hook.run, args=(cfg, call("one.vn.allocate", vid), oned, pusher))
        t.start()
        threads.append(t)
    for t in [first] + threads:
        t.join(30)
    assert overlaps == [] and 2 <= len(pushed) <= 3
    assert all(f"one_vnet_{vid}=" in pushed[-1] for vid in range(1, 7))
    assert sorted(oned.vlan(v) for v in range(1, 7)) == [f"0x{k:04x}" for k in range(0x1000, 0x1006)]


def test_the_cli_refuses_bad_stdin_with_one_line_and_no_traceback(tmp_path, monkeypatch, capsys):
    import io
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one.vn.update !!!")))
    monkeypatch.setenv("KVM_SRIOV_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text(f'[pool]\nstate_dir = "{tmp_path / "state"}"\n')
    assert cli.main(["network-hook", "--session", "a:b", "--endpoint", "http://127.0.0.1:9/RPC2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "base64" in err


def test_hooks_are_registered_once_and_updated_when_they_differ():
    class Hooks:
        def __init__(self):
            self.hooks, self.calls = {}, []

        def call(self, method, *args):
            self.calls.append(method)
            if method == "one.hookpool.info":
                return "<HOOK_POOL>" + "".join(
                    f"<HOOK><ID>{i}</ID><NAME>{n}</NAME><TEMPLATE><COMMAND>{c}</COMMAND>"
                    f"<ARGUMENTS>{a}</ARGUMENTS><ARGUMENTS_STDIN>YES</ARGUMENTS_STDIN></TEMPLATE></HOOK>"
                    for i, (n, c, a) in self.hooks.items()) + "</HOOK_POOL>"
            tmpl = dict(re.findall(r'(\w+) = "([^"]*)"', args[-2] if method == "one.hook.update" else args[0]))
            hid = args[0] if method == "one.hook.update" else len(self.hooks)
            self.hooks[hid] = (tmpl["NAME"], tmpl["COMMAND"], tmpl["ARGUMENTS"])
            return hid

        text = call

    h = Hooks()
    command = "/opt/kvm-sriov/bin/kvm-sriov network-hook"
    done = network_hook.register(h, command)
    assert len(h.hooks) == len(pkey.NETWORK_CALLS) + 2 == sum(d.startswith("created") for d in done)
    assert {a.split()[0] for _n, _c, a in h.hooks.values()} == set(pkey.NETWORK_CALLS) | set(pkey.STATE_HOOKS)
    assert all(d.endswith("up to date") for d in network_hook.register(h, command))
    done = network_hook.register(h, "/opt/kvm-sriov network-hook")
    assert all(d.startswith("updated") for d in done) and len(h.hooks) == len(pkey.NETWORK_CALLS) + 2


def test_doctor_says_nothing_off_the_front_end(tmp_path):
    assert doctor.check_network_hook(cfg_for(tmp_path)) == []



@needs_opensm
def test_a_network_without_address_ranges_yet_does_not_make_opensm_refuse_the_file(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, auto=True)
    oned.vnets[1].remove(oned.vnets[1].find("AR_POOL"))   # its AR comes later (one.vn.add_ar)
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned)
    assert out.ok, out.message
    assert "one_vnet_1=0x9000" in cfg.partitions_file.read_text()


def test_a_network_still_being_created_gets_its_key_and_the_ready_hook_sends_the_file(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    pushed = []
    oned.add(1, auto=True)
    ET.SubElement(oned.vnets[1], "STATE").text = "2"    # LOCK_CREATE
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned, lambda c, t: pushed.append(t) or "pushed")
    assert out.ok and "being created" in out.message and oned.vlan(1) == "0x1000" and pushed == []
    oned.vnets[1].find("STATE").text = "1"
    out = network_hook.run(cfg, call(pkey.READY, 1), oned, lambda c, t: pushed.append(t) or "pushed")
    assert out.ok and len(pushed) == 1 and "one_vnet_1=0x9000" in pushed[0]


def test_a_network_being_deleted_leaves_the_file_at_once_and_frees_its_key_when_done(tmp_path):
    cfg, oned = cfg_for(tmp_path, pkey_range="0x1000-0x1000"), FakeOned()
    pushed = []
    oned.add(1, vlan="0x1000")
    oned.add(2, auto=True, mac="02:00:0b:00:00:01")
    state = ET.SubElement(oned.vnets[1], "STATE")
    state.text = "3"                                      # LOCK_DELETE: one.vn.delete returned
    out = network_hook.run(cfg, call("one.vn.delete", 1), oned, lambda c, t: pushed.append(t) or "pushed")
    assert not out.ok and "every PKey" in out.message     # its key is not free yet
    assert "one_vnet_1=" not in pushed[-1]
    state.text = "4"                                      # DONE: the NET/DONE state hook
    out = network_hook.run(cfg, call(pkey.DONE, 1), oned, lambda c, t: pushed.append(t) or "pushed")
    assert out.ok and oned.vlan(2) == "0x1000" and "one_vnet_2=0x9000" in pushed[-1]


# -- a network oned will not let the hook write --------------------------------------------
def recorder(pushed):
    return lambda c, text: pushed.append(text) or "pushed"


def test_a_locked_network_goes_without_and_every_other_network_still_follows(tmp_path):
    cfg, oned, pushed = cfg_for(tmp_path, pkey_range=""), FakeOned(), []
    oned.add(1, auto=True)
    oned.add(3, vlan="0x1003", mac="02:00:0c:00:00:01")
    assert not network_hook.run(cfg, None, oned, recorder(pushed)).ok   # no range yet: network 1 waits
    oned.locked.add(1)          # its owner locks it (MANAGE is enough): oned refuses even oneadmin
    cfg = cfg._replace(pkey_range=(0x1000, 0x1003))
    oned.add(2, auto=True, mac="02:00:0b:00:00:01")
    oned.delete(3)
    out = network_hook.run(cfg, call("one.vn.allocate", 2), oned, recorder(pushed))
    assert not out.ok and "network 1: not updated" in out.message and "locked" in out.message
    assert oned.vlan(2) == "0x1001" and "one_vnet_2=0x9001" in pushed[-1]
    assert "one_vnet_3=" not in pushed[-1] and "one_vnet_1=" not in pushed[-1]   # the deleted one's goes
    (check,) = doctor.check_network_hook(cfg)
    assert check.level == "FAIL" and "network 1: not updated" in check.message and "onevnet unlock" in check.fix
    oned.locked.discard(1)      # unlocked: the next run writes it
    out = network_hook.run(cfg, call("one.vn.update", 1), oned, recorder(pushed))
    assert out.ok, out.message
    assert oned.vlan(1) == "0x1000" and "one_vnet_1=0x9000" in pushed[-1]
    assert doctor.check_network_hook(cfg)[0].level == "OK"


def test_a_network_deleted_between_the_read_and_the_write_is_no_failure(tmp_path):
    cfg, pushed = cfg_for(tmp_path, pkey_range="0x1000-0x1003"), []

    class Vanishing(FakeOned):
        def merge(self, vid, template):
            if vid == 1:
                self.delete(1)   # its owner deleted it meanwhile
            return super().merge(vid, template)

    oned = Vanishing()
    oned.add(1, auto=True)
    oned.add(2, auto=True, mac="02:00:0b:00:00:01")
    out = network_hook.run(cfg, call("one.vn.allocate", 2), oned, recorder(pushed))
    assert out.ok and "network 1" not in out.message, out.message
    assert oned.vlan(2) == "0x1001" and "one_vnet_2=0x9001" in pushed[-1]
    assert doctor.check_network_hook(cfg)[0].level == "OK"


def test_a_failure_before_the_file_is_recorded_for_doctor(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, vlan="0x1000")
    assert network_hook.run(cfg, None, oned, recorder([])).ok
    oned.pool_xml = lambda: "<html>not oned</html>"
    out = network_hook.run(cfg, None, oned, recorder([]))
    assert not out.ok and "VNET_POOL" in out.message
    (check,) = doctor.check_network_hook(cfg)
    assert check.level == "FAIL" and "VNET_POOL" in check.message


# -- quotas ----------------------------------------------------------------------------------
def test_an_owner_over_its_quota_is_told_in_its_network_and_the_others_get_keys(tmp_path):
    cfg, oned, pushed = cfg_for(tmp_path, pkey_range="0x1000-0x10ff", pkeys_per_user=2), FakeOned(), []
    for vid in (1, 2, 3):
        oned.add(vid, auto=True, uid=7, mac=f"02:00:0a:00:0{vid}:01")
    oned.add(4, auto=True, uid=8, mac="02:00:0b:00:00:01")
    out = network_hook.run(cfg, call("one.vn.allocate", 4), oned, recorder(pushed))
    assert out.ok and "network 3: no PKey" in out.message, out.message   # the tenant's limit, not a failure
    assert [oned.vlan(v) for v in (1, 2, 3, 4)] == ["0x1000", "0x1001", None, "0x1002"]
    assert "pkeys_per_user" in oned.vnets[3].findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR")
    assert all(oned.vnets[v].findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") is None for v in (1, 2, 4))
    assert "one_vnet_4=0x9002" in pushed[-1] and "one_vnet_3" not in pushed[-1]
    oned.delete(1)              # the tenant lets one go: its waiting network gets that key
    assert network_hook.run(cfg, call(pkey.DONE, 1), oned, recorder(pushed)).ok
    assert oned.vlan(3) == "0x1000" and oned.vnets[3].findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") == ""


# -- the hook's own writes do not run it again and again ------------------------------------
def update_call(vid, template, kind="1"):
    info = ("<CALL_INFO><RESULT>1</RESULT><PARAMETERS>" + "".join(
        f"<PARAMETER><POSITION>{i}</POSITION><TYPE>IN</TYPE><VALUE>{v}</VALUE></PARAMETER>"
        for i, v in enumerate(("****", vid, template, kind), 1))
        + "<PARAMETER><POSITION>1</POSITION><TYPE>OUT</TYPE><VALUE>true</VALUE></PARAMETER>"
        + f"<PARAMETER><POSITION>2</POSITION><TYPE>OUT</TYPE><VALUE>{vid}</VALUE></PARAMETER>"
        + "</PARAMETERS><EXTRA></EXTRA></CALL_INFO>")
    return pkey.parse_call_info("one.vn.update", info)


def test_a_network_waiting_for_a_key_is_told_once_not_at_every_run(tmp_path):
    cfg, oned, pushed = cfg_for(tmp_path, pkey_range="0x1000-0x1000"), FakeOned(), []
    oned.add(1, auto=True)
    oned.add(2, auto=True, mac="02:00:0b:00:00:01")
    assert not network_hook.run(cfg, call("one.vn.allocate", 2), oned, recorder(pushed)).ok
    written = list(oned.updates)
    assert [vid for vid, _t in written] == [1, 2]
    for _ in range(3):   # what oned's update events of those writes, and any other call, run
        assert not network_hook.run(cfg, call("one.vn.update", 2), oned, recorder(pushed)).ok
    assert oned.updates == written


def test_an_update_event_of_the_hooks_own_write_is_not_followed_but_an_operators_key_is(tmp_path):
    cfg, oned, pushed = cfg_for(tmp_path, pkey_range="0x1000-0x1001"), FakeOned(), []
    oned.add(1, auto=True)
    oned.add(2, auto=True, mac="02:00:0b:00:00:01")
    oned.add(3, auto=True, mac="02:00:0c:00:00:01")
    network_hook.run(cfg, call("one.vn.allocate", 3), oned, recorder(pushed))
    reads, sent = oned.reads, len(pushed)
    for vid, template in oned.updates:    # the events of the hook's own three writes
        out = network_hook.run(cfg, update_call(vid, template), oned, recorder(pushed))
        assert out.ok and "nothing to do" in out.message, out.message
    assert (oned.reads, len(pushed)) == (reads, sent)
    oned.merge(2, 'VLAN_ID = "0x1005"')   # the operator gives network 2 another key
    out = network_hook.run(cfg, update_call(2, 'VLAN_ID = "0x1005"'), oned, recorder(pushed))
    assert out.ok and len(pushed) == sent + 1 and "one_vnet_2=0x9005" in pushed[-1]
    assert oned.vlan(3) == "0x1001"       # and its old key went to the network that waited
    oned.merge(3, 'PKEY_MEMBERSHIP = "limited"')  # anything else the hook follows as before
    out = network_hook.run(cfg, update_call(3, 'VLAN_ID = "0x1001"', kind="0"), oned, recorder(pushed))
    assert out.ok and "defmember=limited" in pushed[-1]


# -- the file on the SM node changed behind the hook's back --------------------------------
@needs_opensm
def test_a_resync_repairs_a_partitions_file_changed_behind_its_back(tmp_path):
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, vlan="0x1000")
    assert network_hook.run(cfg, None, oned).ok
    good = cfg.partitions_file.read_text()
    cfg.partitions_file.write_text("Default=0x7fff, ipoib : ALL=full ;\n")   # e.g. a configuration manager
    out = network_hook.run(cfg, None, oned)
    assert out.ok and "written" in out.message, out.message
    assert cfg.partitions_file.read_text() == good and reloads(tmp_path) == 2


# -- oned or the SM node answering garbage, or not at all -----------------------------------
class Garbage:
    """An XML-RPC endpoint answering with what it is given (None: never)."""

    def __init__(self, body):
        import http.server
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                if outer.body is None:
                    outer.gone.wait(60)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *a):
                pass

        self.body, self.gone = body, threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/RPC2"

    def close(self):
        self.gone.set()
        self.server.shutdown()
        self.server.server_close()


def reply(*values):
    import xmlrpc.client
    return xmlrpc.client.dumps((list(values),), methodresponse=True).encode()


def private_config(tmp_path) -> str:
    """A config whose state and partitions file are the test's own (never /etc/opensm)."""
    (tmp_path / "c.toml").write_text(f'[pool]\nstate_dir = "{tmp_path / "state"}"\n[infiniband]\n'
                                     f'partitions_file = "{tmp_path / "partitions.conf"}"\n'
                                     f'sm_reload_command = ["true"]\n')
    return str(tmp_path / "c.toml")


ONED_GARBAGE = {
    "not XML": (b"<html><body>502 Bad Gateway", "cannot reach OpenNebula"),
    "entity bomb": (b'<?xml version="1.0"?><!DOCTYPE b [<!ENTITY a "' + b"a" * 100 + b'">'
                    + b"".join(b'<!ENTITY a%d "&a%s;&a%s;">' % (i, b"" if i == 1 else b"%d" % (i - 1),
                                                                 b"" if i == 1 else b"%d" % (i - 1))
                               for i in range(1, 30))
                    + b"]><methodResponse><params><param><value><string>&a29;</string></value></param>"
                      b"</params></methodResponse>", "DOCTYPE"),
    "reply not a list": (b"<?xml version='1.0'?><methodResponse><params><param><value><int>5</int></value>"
                         b"</param></params></methodResponse>", "not [success, result"),
    "reply[1] not a string": (reply(True, 5, 0), "not text"),
    "a boolean that is not one": (b"<?xml version='1.0'?><methodResponse><params><param><value><boolean>2</boolean>"
                               b"</value></param></params></methodResponse>", "cannot reach OpenNebula"),
    "a struct member without a name": (b"<?xml version='1.0'?><methodResponse><params><param><value><struct>"
                                       b"<member><value><int>1</int></value></member></struct></value></param>"
                                       b"</params></methodResponse>", "cannot reach OpenNebula"),
    "not a network pool": (reply(True, "<USER_POOL/>", 0), "VNET_POOL"),
    "a refusal that is not text": (reply(False, ["x"] * 3, 0), "refused one.vnpool.info"),
}


@pytest.mark.parametrize("command", [["network-hook", "--resync"], ["partitions"]])
@pytest.mark.parametrize("case", sorted(ONED_GARBAGE))
def test_garbage_from_oned_is_one_line_and_a_failure(tmp_path, capsys, command, case):
    body, why = ONED_GARBAGE[case]
    server = Garbage(body)
    try:
        code = cli.main(["--config", private_config(tmp_path), *command, "--endpoint", server.url,
                         "--session", "a:b"])
    finally:
        server.close()
    err = capsys.readouterr().err
    if case == "not a network pool" and command == ["partitions"]:
        why = "neither a VNET_POOL"
    assert code == 1 and err.count("\n") == 1 and why in err, err
    if command[0] == "network-hook":
        assert doctor.check_network_hook(config.load(files=[tmp_path / "c.toml"]))[0].level == "FAIL"


@pytest.mark.parametrize("command", [["network-hook", "--resync"], ["partitions"]])
def test_an_oned_that_never_answers_is_given_up_on(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setattr(network_hook, "ONED_SECONDS", 1, raising=False)   # a hook without it waits forever
    server = Garbage(None)
    done = []
    t = threading.Thread(target=lambda: done.append(cli.main(
        ["--config", private_config(tmp_path), *command, "--endpoint", server.url, "--session", "a:b"])),
        daemon=True)
    t.start()
    t.join(20)
    server.close()
    assert done == [1], "still waiting for oned after 20 s"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not answer one.vnpool.info in 1 s" in err, err


@pytest.mark.parametrize("content, why", [(b"x" * (1024 * 1024), "larger than"), (b"\n\n", "empty")],
                         ids=["1 MiB", "empty"])
def test_one_auth_is_read_within_a_bound(tmp_path, monkeypatch, capsys, content, why):
    (tmp_path / "auth").write_bytes(content)
    monkeypatch.setenv("ONE_AUTH", str(tmp_path / "auth"))
    assert cli.main(["--config", private_config(tmp_path), "partitions", "--endpoint", "http://127.0.0.1:9/RPC2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ONE_AUTH" in err and why in err, err


@pytest.mark.parametrize("script, why", [
    ("import sys; sys.stdout.write('x' * (2 * 1024 * 1024))", "more than 64 KiB"),
    ("import sys; sys.stdin.read(); sys.stderr.buffer.write(b'\\xff\\xfe\\x00 garbage\\n'); sys.exit(3)",
     "exit 3"),
], ids=["2 MiB", "not UTF-8"])
def test_an_sm_node_answering_garbage_is_a_one_line_failure(tmp_path, script, why):
    cfg = cfg_for(tmp_path, sm_push_command=[sys.executable, "-c", script], sm_push_seconds=20)
    oned = FakeOned()
    oned.add(1, vlan="0x1000")
    out = network_hook.run(cfg, None, oned)
    assert not out.ok and why in out.message and "\n" not in out.message and len(out.message) < 2000
    assert doctor.check_network_hook(cfg)[0].level == "FAIL"


def test_the_status_of_a_large_cloud_is_read_back(tmp_path):
    cfg, oned, pushed = cfg_for(tmp_path), FakeOned(), []
    for vid in range(4000):
        oned.add(vid, vlan=f"0x{0x1000 + vid:04x}", mac=f"02:00:{vid >> 8:02x}:{vid & 0xff:02x}:00:01", size=1)
    assert network_hook.run(cfg, None, oned, recorder(pushed)).ok
    assert doctor.check_network_hook(cfg)[0].level == "OK"
    out = network_hook.run(cfg, call("one.vn.update", 7), oned, recorder(pushed))
    assert out.ok and "unchanged" in out.message and len(pushed) == 1


# -- drift checked after a run that changed the partitions ------------------------------------
def writer(cfg, sent=None):
    """A push that installs the file on this machine, the SM node (``sent``: what it
    installs instead, e.g. an SM that keeps an older file)."""
    def push(c, text):
        cfg.partitions_file.parent.mkdir(exist_ok=True)
        cfg.partitions_file.write_text(sent(text) if sent else text)
        return "written"
    return push


def status(cfg):
    return network_hook.read_status(cfg.state_dir)


def test_after_a_run_that_changed_the_partitions_drift_is_checked_and_recorded_for_doctor(tmp_path, monkeypatch):
    from kvm_sriov.fabric import drift
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, vlan="0x1000")
    checks = []
    real = drift.check
    monkeypatch.setattr(drift, "check", lambda *a: checks.append(1) or real(*a))
    out = network_hook.run(cfg, call("one.vn.allocate", 1), oned, writer(cfg))
    assert out.ok and "drift" not in out.message, out.message
    assert status(cfg)["drift"]["exit_code"] == 0 and status(cfg)["drift"]["counts"] == {"the SM node": {}}
    assert len(checks) == 1

    oned.add(2, vlan="0x1001", mac="02:00:0b:00:00:01")     # the SM node keeps the file without network 2
    out = network_hook.run(cfg, call("one.vn.allocate", 2), oned,
                           writer(cfg, lambda text: text.split("# network 2")[0]))
    assert out.ok, out.message                               # the run itself did what it does
    assert "; drift after the run: the SM node: missing_pkey 1 (kvm-sriov partitions --check, --repair)" \
        in out.message
    recorded = status(cfg)
    assert recorded["ok"] is True and recorded["drift"]["exit_code"] == 1
    assert recorded["drift"]["counts"] == {"the SM node": {"missing_pkey": 1}}
    (line,) = doctor.check_network_hook(cfg)
    assert line.level == "WARN" and "drift after the run: the SM node: missing_pkey 1" in line.message
    assert "kvm-sriov partitions --repair" in line.fix

    out = network_hook.run(cfg, call("one.vn.update", 2), oned, writer(cfg))   # unchanged: no push, no check
    assert out.ok and "unchanged" in out.message and len(checks) == 2
    assert status(cfg)["drift"] == recorded["drift"]         # the last check's, kept until the next


def test_a_drift_check_that_fails_never_fails_the_run(tmp_path, monkeypatch):
    from kvm_sriov.fabric import drift
    cfg, oned = cfg_for(tmp_path), FakeOned()
    oned.add(1, vlan="0x1000")
    out = network_hook.run(cfg, None, oned, recorder([]))   # sent nowhere: this machine's file cannot be read
    assert out.ok and "drift not checked at the SM node: " in out.message and "\n" not in out.message
    assert status(cfg)["drift"]["exit_code"] == 2 and doctor.check_network_hook(cfg)[0].level == "OK"

    def broken(*a):
        raise RuntimeError("the check fell over")
    monkeypatch.setattr(drift, "check", broken)
    oned.add(2, vlan="0x1001", mac="02:00:0b:00:00:01")
    out = network_hook.run(cfg, call("one.vn.allocate", 2), oned, writer(cfg))
    assert out.ok and "written; drift not checked: the check fell over (" in out.message, out.message
    assert status(cfg)["ok"] is True and status(cfg)["drift"]["exit_code"] is None


def test_without_a_way_to_read_the_sm_node_back_nothing_is_checked_or_said(tmp_path):
    got = tmp_path / "got"
    cfg = cfg_for(tmp_path, sm_push_command=[sys.executable, "-c",
                                             f"import sys; open({str(got)!r}, 'w').write(sys.stdin.read())"])
    oned = FakeOned()
    oned.add(1, vlan="0x1000")
    out = network_hook.run(cfg, None, oned)
    assert out.ok and "drift" not in out.message, out.message
    recorded = status(cfg)["drift"]
    assert recorded["exit_code"] is None and "fabric.sm_read_command is empty" in recorded["why"]


def test_a_locked_network_still_goes_without_and_the_others_are_checked(tmp_path):
    """The check comes after what the hook did and changes none of it: a locked network
    and an owner over its quota stop no other network, and the run says so as before."""
    cfg, oned = cfg_for(tmp_path, pkey_range="0x1000-0x10ff", pkeys_per_user=1), FakeOned()
    oned.add(1, auto=True)
    oned.add(2, auto=True, uid=7, mac="02:00:0b:00:00:01")
    oned.add(3, auto=True, uid=7, mac="02:00:0c:00:00:01")
    oned.locked.add(1)
    out = network_hook.run(cfg, call("one.vn.allocate", 3), oned, writer(cfg))
    assert not out.ok and "network 1: not updated" in out.message and "network 3: no PKey" in out.message
    assert oned.vlan(2) == "0x1001" and "one_vnet_2=0x9001" in cfg.partitions_file.read_text()
    assert status(cfg)["drift"]["exit_code"] == 0 and "drift" not in out.message
    assert doctor.check_network_hook(cfg)[0].level == "FAIL"


def test_with_ufm_a_tenants_port_in_a_pkey_of_others_is_said_after_the_run(tmp_path):
    """The hook never changes a PKey it did not make; the check after its run says that one
    joins a tenant's port with others."""
    from tests.support.ufm_standin import UFMStandin
    standin = UFMStandin()
    try:
        creds = tmp_path / "ufm-credentials"
        creds.write_text("admin:123456\n")
        creds.chmod(0o600)
        cfg = config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")}, "fabric": {
            "manager": "ufm", "ufm_url": standin.url, "ufm_credentials": str(creds), "ufm_retries": 0}})
        standin.pkeys[0x1003] = {"partition": "storage", "ip_over_ib": True, "index0": False,
                                 "guids": {"0002c903000e0b72": {"membership": "full", "index0": False},
                                           "02000a0004000001": {"membership": "full", "index0": False}}}
        oned = FakeOned()
        oned.add(1, vlan="0x1000")
        out = network_hook.run(cfg, None, oned)
        assert out.ok, out.message
        assert f"drift after the run: UFM {standin.url}: extra_member 1" in out.message
        assert standin.members(0x1003) == {"0002c903000e0b72": "full", "02000a0004000001": "full"}
    finally:
        standin.close()
