"""Rung 1: the migration destination's attach (kvm_sriov/actions/peer.py)
answers how long its GUID programming and its hot-plug took there, timed on
its own monotonic clock: durations only, which the source keeps beside its
own figures of the VM's InfiniBand outage (actions/migrate.py)."""

import time

from kvm_sriov.actions import peer
from kvm_sriov.domain import hotplug

STEP = 0.02


def test_attach_answers_its_guid_and_hotplug_durations(run, monkeypatch):
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds: time.sleep(STEP))
    answer = peer._attach(run.host(), 42, "test")  # the test driver's running domain
    assert set(answer) == {"guid_seconds", "hotplug_seconds"}
    assert answer["guid_seconds"] >= 0 and answer["hotplug_seconds"] >= STEP - 0.001


def test_the_answer_is_the_peers_one_json_document(run, monkeypatch, capsys):
    monkeypatch.setattr(peer, "_attach", lambda host, vm_id, domain: {"guid_seconds": 0.001,
                                                                       "hotplug_seconds": 0.5})
    monkeypatch.setattr(peer, "Host", lambda cfg: run.host())
    monkeypatch.setattr(peer.config_mod, "load", lambda remotes: None)
    assert peer.main(["attach", "42", "one-42"]) == 0
    assert capsys.readouterr().out == '{"guid_seconds": 0.001, "hotplug_seconds": 0.5}\n'


def test_the_source_gets_the_answer_and_an_older_destinations_null(tmp_path):
    """node/peer.py's Peer.attach returns what kvm-sriov-peer printed there."""
    import stat

    from kvm_sriov import config
    from kvm_sriov.node.peer import Peer
    script = tmp_path / "remotes" / "vmm" / "kvm-sriov" / "kvm-sriov-peer"
    script.parent.mkdir(parents=True)
    cfg = config.load(files=[], overrides={"migration": {
        "peer_command": ["/usr/bin/env"], "peer_remotes": str(tmp_path / "remotes")}})
    for printed, answer in (('{"guid_seconds": 0.001, "hotplug_seconds": 0.5}',
                             {"guid_seconds": 0.001, "hotplug_seconds": 0.5}), ("null", None)):
        script.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{printed}'\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        assert Peer(cfg, "h2").attach(42, "one-42") == answer
