"""Rung 1: the front-end's figures (kvm_sriov/metrics/frontend.py) from the status
file the real network hook writes (runs, failures, the SM push's seconds, the
partitions and their members), and a status file that says odd things."""

import json
import os

import pytest

from kvm_sriov import config
from kvm_sriov.errors import DriverError
from kvm_sriov.frontend import network_hook
from kvm_sriov.ib import partitions
from kvm_sriov.metrics import frontend


def vnet(vid, pkey, mac, size, uid=1):
    return (f"<VNET><ID>{vid}</ID><UID>{uid}</UID><GID>1</GID><NAME>net{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
            f"<VLAN_ID>{pkey}</VLAN_ID><TEMPLATE></TEMPLATE><AR_POOL><AR><AR_ID>0</AR_ID><MAC>{mac}</MAC>"
            f"<SIZE>{size}</SIZE></AR></AR_POOL></VNET>")


class Oned:
    """one.vnpool.info of networks that have their keys already (nothing to write)."""

    def __init__(self, *vnets, down=False):
        self.vnets, self.down = vnets, down

    def pool_xml(self):
        if self.down:
            raise DriverError("cannot reach OpenNebula at http://localhost:2633/RPC2: Connection refused")
        return "<VNET_POOL>" + "".join(self.vnets) + "</VNET_POOL>"

    def merge(self, vid, template):
        raise AssertionError(f"nothing to write, but network {vid} got {template!r}")


NETWORKS = (vnet(1, "0x1000", "02:00:0a:00:01:01", 2), vnet(2, "0x1000", "02:00:0a:00:02:01", 3),
            vnet(3, "0x1001", "02:00:0a:00:03:01", 1))


def cfg_for(tmp_path):
    return config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")}})


def guid_lines(text):
    """partitions.conf's members per PKey, counted the plain way: its member lines."""
    out, key = {}, None
    for line in text.split("\n"):
        if "=0x" in line and not line.startswith(("#", " ")):
            key = line.split("=0x")[1][:4]
            out[key] = 0
        elif line.strip().startswith("0x") and key:
            out[key] += 1
    return {f"0x{int(k, 16) & 0x7fff:04x}": n for k, n in out.items() if k != "7fff"}


def samples(status):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in frontend.families(status) for s in f.samples}


def test_the_hooks_runs_failures_push_seconds_and_members_reach_the_metrics(tmp_path):
    cfg, sent = cfg_for(tmp_path), []

    def pusher(cfg, text):
        sent.append(text)
        return "sent to the SM node"

    def refused(cfg, text):
        raise DriverError("the SM node refused or could not be reached (ssh sm1 ..., exit 255): timeout")

    assert network_hook.run(cfg, None, Oned(*NETWORKS), pusher).ok
    first = frontend.read(cfg)
    assert (first["runs"], first["failures"], first["sm_ok"]) == (1, 0, True)
    assert first["sm_seconds"] >= 0 and first["sm_time"] >= first["time"]
    assert first["members"] == guid_lines(sent[0]) and set(first["members"]) == {"0x1000", "0x1001"}
    assert first["members"]["0x1000"] == 2 * (2 + 3)   # GUIDs with the network's ID and MAC-only ones

    assert not network_hook.run(cfg, None, Oned(*NETWORKS), refused).ok      # the SM node refuses
    assert not network_hook.run(cfg, None, Oned(down=True), pusher).ok       # oned down
    last = frontend.read(cfg)
    assert (last["runs"], last["failures"], last["sm_ok"], last["ok"]) == (3, 2, False, False)
    # the SM node still has the last good file: its push and its partitions stay as they were
    assert (last["sm_seconds"], last["sm_time"], last["members"]) == \
        (first["sm_seconds"], first["sm_time"], first["members"])

    values = samples(last)
    assert values[("kvm_sriov_network_hook_runs_total", ())] == 3
    assert values[("kvm_sriov_network_hook_failures_total", ())] == 2
    assert values[("kvm_sriov_network_hook_last_run_success", ())] == 0
    assert values[("kvm_sriov_network_hook_last_sm_reload_success", ())] == 0
    assert values[("kvm_sriov_network_hook_last_sm_reload_duration_seconds", ())] == first["sm_seconds"]
    assert values[("kvm_sriov_network_hook_last_sm_reload_timestamp_seconds", ())] == first["sm_time"]
    assert values[("kvm_sriov_network_hook_last_run_timestamp_seconds", ())] == last["time"]
    assert values[("kvm_sriov_partitions", ())] == 2
    assert values[("kvm_sriov_partition_networks", (("pkey", "0x1000"),))] == 2
    assert values[("kvm_sriov_partition_networks", (("pkey", "0x1001"),))] == 1
    assert values[("kvm_sriov_partition_members", (("pkey", "0x1000"),))] == 10
    assert values[("kvm_sriov_partition_members", (("pkey", "0x1001"),))] == 2


def test_an_unchanged_file_keeps_the_last_push_seconds(tmp_path):
    from kvm_sriov.ib import pkey
    cfg = cfg_for(tmp_path)
    assert network_hook.run(cfg, None, Oned(*NETWORKS), lambda cfg, text: "sent").ok
    first = frontend.read(cfg)
    again = network_hook.run(cfg, pkey.Call("one.vn.update", True, (1,)), Oned(*NETWORKS),
                             lambda cfg, text: pytest.fail("an unchanged file is not pushed"))
    assert again.ok and "unchanged" in again.message
    second = frontend.read(cfg)
    assert second["runs"] == 2 and second["failures"] == 0
    assert (second["sm_seconds"], second["sm_time"]) == (first["sm_seconds"], first["sm_time"])


def test_members_counts_what_render_lists_and_leaves_default_out():
    nets = partitions.networks_from_xml("<VNET_POOL>" + "".join(NETWORKS) + vnet(4, "0x1002", "02:00:0a:00:04:01", 0)
                                        + "</VNET_POOL>")
    text = partitions.render(nets)
    members = network_hook._members(text)
    assert members == guid_lines(text) == {"0x1000": 10, "0x1001": 2, "0x1002": 0}


def test_no_status_file_no_front_end_figures(tmp_path):
    assert frontend.read(cfg_for(tmp_path)) is None


@pytest.mark.parametrize("odd", [
    {"runs": "3", "failures": -1, "time": float("nan"), "sm_seconds": True, "ok": "yes", "sm_ok": 1},
    {"runs": 1e400, "pkeys": {"1": "0x1000", "2": 0x7fff, "3": None, "4": True, "5": 0}, "members": {"zz": 3}},
    {"pkeys": ["0x1000"], "members": {"0x1000": "ten", "0x1001": -2, "0x10000": 5}},
])
def test_odd_values_in_the_status_file_are_left_out_not_a_traceback(odd):
    values = samples(odd)
    assert values[("kvm_sriov_network_hook_runs_total", ())] == 0
    assert values[("kvm_sriov_network_hook_failures_total", ())] == 0
    assert values[("kvm_sriov_network_hook_last_run_success", ())] == 0
    assert values[("kvm_sriov_network_hook_last_sm_reload_success", ())] == 0
    assert ("kvm_sriov_network_hook_last_run_timestamp_seconds", ()) not in values
    assert ("kvm_sriov_network_hook_last_sm_reload_duration_seconds", ()) not in values
    partitions_named = {k for k in values if k[0] in ("kvm_sriov_partition_networks", "kvm_sriov_partition_members")}
    assert partitions_named <= {("kvm_sriov_partition_networks", (("pkey", "0x1000"),))}


def test_a_status_file_that_is_not_the_hooks_own_is_ignored(tmp_path):
    cfg = cfg_for(tmp_path)
    os.makedirs(cfg.state_dir, mode=0o750)
    (cfg.state_dir / network_hook.STATUS).symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"runs": 99}))
    assert frontend.read(cfg) is None


@pytest.mark.parametrize("drift,want", [
    (None, None),                                                            # never checked
    ({"exit_code": None, "counts": {}}, None),                               # no way to read back
    ({"exit_code": 2, "counts": {"sm1": {}}}, None),                         # a place unread: unknown
    ({"exit_code": 0, "counts": {"sm1": {}, "sm2": {}}}, 0),
    ({"exit_code": 1, "counts": {"sm1": {"missing_pkey": 1}, "sm2": {"stale_pkey": 2, "x": "odd"}}}, 3),
    ({"exit_code": 1, "counts": "garbage"}, 0),
])
def test_the_last_drift_check_is_a_gauge_only_when_it_could_tell(drift, want):
    status = {"runs": 1, "failures": 0, "time": 1.0, "ok": True, "sm_ok": True}
    if drift is not None:
        status["drift"] = drift
    got = samples(status).get(("kvm_sriov_network_hook_last_drift_findings", ()))
    assert got == want
