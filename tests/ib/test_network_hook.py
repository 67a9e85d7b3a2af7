"""The front-end's network hook: keys written into oned, the partitions file
judged by the real opensm, serialised runs, the last good file kept."""

import re
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from kvm_sriov import cli, config
from kvm_sriov.ib import opensm_check, pkey
from kvm_sriov.node import doctor
from kvm_sriov.oned import network_hook

needs_opensm = pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")


class FakeOned:
    """one.vnpool.info and one.vn.update (merge) over an in-memory pool."""

    def __init__(self):
        self.vnets, self.updates, self.lock = {}, [], threading.Lock()

    def add(self, vid, bridge="ib-sriov", vlan=None, auto=False, mac="02:00:0a:00:00:01", size=2, parent=None):
        t = f"<VNET><ID>{vid}</ID><NAME>net{vid}</NAME><BRIDGE>{bridge}</BRIDGE>"
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
            return "<VNET_POOL>" + "".join(ET.tostring(v, encoding="unicode") for v in self.vnets.values()) \
                + "</VNET_POOL>"

    def merge(self, vid, template):
        with self.lock:
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
