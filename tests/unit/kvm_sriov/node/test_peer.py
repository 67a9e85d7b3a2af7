"""The source's side of the peer protocol: what the destination logs reaches
the migrating VM's log; its failures become the action's reason."""

import stat

import pytest

from kvm_sriov import config
from kvm_sriov.errors import DriverError
from kvm_sriov.node.peer import Peer


def fake_peer(tmp_path, body):
    script = tmp_path / "remotes" / "vmm" / "kvm-sriov" / "kvm-sriov-peer"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\ncat >/dev/null\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return config.load(files=[], overrides={"migration": {
        "peer_command": ["/usr/bin/env"], "peer_remotes": str(tmp_path / "remotes")}})


def test_destination_log_lines_are_relayed_with_the_host_name(tmp_path, capsys):
    cfg = fake_peer(tmp_path, "echo 'INFO: one-42: VF 0000:03:00.4 plugged in 0.8s' >&2\n"
                              "echo 'a line that is not a log line' >&2\necho null\n")
    Peer(cfg, "h2").attach(42, "one-42")
    err = capsys.readouterr().err
    assert "INFO: h2: one-42: VF 0000:03:00.4 plugged in 0.8s" in err
    assert "not a log line" not in err


def test_destination_failure_is_the_reason_and_its_log_still_shows(tmp_path, capsys):
    cfg = fake_peer(tmp_path, "echo 'WARN: pool busy' >&2\necho 'not enough free SR-IOV VFs' >&2\nexit 1\n")
    with pytest.raises(DriverError, match="on h2: not enough free SR-IOV VFs"):
        Peer(cfg, "h2").release(42)
    assert "WARN: h2: pool busy" in capsys.readouterr().err


def test_the_guid_networks_go_in_each_nic_entry_only_when_given(monkeypatch):
    """The destination sets the GUIDs at reserve from them (node/prewarm.py);
    a call without them sends what an older source sent."""
    from kvm_sriov.domain.domain_xml import NicRecord
    sent = []
    monkeypatch.setattr(Peer, "_run", lambda self, args, payload=None: sent.append(payload) or [])
    nics = [NicRecord("02:00:0a:64:00:2a", "ib-sriov"), NicRecord("02:00:0a:64:00:2b", "ib-sriov")]
    Peer.__new__(Peer).reserve(42, "one-42", nics, guid_spaces={"02:00:0a:64:00:2a": 5})
    assert [e["guid_space"] for e in sent[0]] == [5, None]  # no network in the record: the MAC-only GUID
    Peer.__new__(Peer).reserve(42, "one-42", nics)
    assert not [e for e in sent[1] if "guid_space" in e]
