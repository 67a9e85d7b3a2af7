"""A VM's InfiniBand traffic (kvm_sriov/node/traffic.py): totals that are the
VM's own and only grow, across a VF change, a VF another VM held before, a
PF driver reload and a hostile state file; on the rung-1 fake host with the
recording `ip` (tests/support/fake_ip) answering `ip -s -j link show`."""

import base64
import json
import os
import shutil
from pathlib import Path

import xml.etree.ElementTree as ET

import pytest

from kvm_sriov.node import traffic
from kvm_sriov.vf.pool import VfPool
from kvm_sriov.vf.state_folder import Untrusted

SUPPORT = Path(__file__).resolve().parents[3] / "support"
FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "iproute2"
PF = "0000:03:00.0"                                     # standard_host's mlx5 PF, ib0, VFs 03:00.1-.4
VF = ["0000:03:00.1", "0000:03:00.2", "0000:03:00.3", "0000:03:00.4"]


@pytest.fixture
def host(tmp_path, fake_host, make_config):
    """The fake host with ib0's ifindex, a recording `ip`, a config naming
    both, and helpers to set the VFs' counters and the pool."""
    net = fake_host["fs"].dev(PF) / "net" / "ib0"
    (net / "ifindex").write_text("5\n")
    (net / "iflink").write_text("5\n")
    ip = tmp_path / "fake-ip"
    ip.mkdir()
    shutil.copy(SUPPORT / "fake_ip", ip / "ip")
    cfg = make_config(fake_host["root"], infiniband={"ip_command": str(ip / "ip")})
    pool = VfPool(cfg.pool_db)
    logged = []

    class Host:
        def __init__(self):
            self.cfg, self.ip, self.pool, self.logged, self.state = cfg, ip, pool, logged, \
                Path(cfg.state_dir) / traffic.STATE_FILE

        def counters(self, **per_vf):
            """vf index -> (rx bytes, tx bytes, rx packets, tx packets) as ip prints them."""
            vfs = [{"vf": int(n[2:]), "link_type": "infiniband",
                    "stats": {"rx": {"bytes": c[0], "packets": c[2], "multicast": 0, "broadcast": 0},
                              "tx": {"tx_bytes": c[1], "tx_packets": c[3]}}}
                   for n, c in per_vf.items()]
            (ip / "ip-s-j-link-show-ib0.json").write_text(json.dumps([{"ifname": "ib0", "vfinfo_list": vfs}]))

        def attach(self, vf, vm, since):
            with pool.transaction() as txn:
                txn.add(vf, PF, vm, f"one-{vm}", "", "attached", "deploy", now=since)

        def release(self, vf):
            with pool.transaction() as txn:
                txn.release([vf])

        def run(self):
            return shown(traffic.report(cfg, logged.append))
    yield Host()
    pool.close()


def shown(lines):
    """VM id -> {IB_...: int}, decoded as monitord decodes MONITOR."""
    out = {}
    for line in lines:
        assert line.startswith('VM = [ ID = "') and line.endswith('" ]'), line
        vm = int(line.split('"')[1])
        body = base64.b64decode(line.split('MONITOR = "')[1][:-3]).decode()
        out[vm] = {k.strip(): int(v.strip().strip('"')) for k, v in
                   (row.split("=") for row in body.splitlines())}
    return out


def ib(rx, tx, rxp, txp):
    return dict(zip(traffic.ATTRIBUTES, (rx, tx, rxp, txp)))


def test_first_sight_is_the_baseline_and_traffic_then_adds_up(host):
    host.counters(vf0=(5000, 4000, 50, 40))          # traffic before: not this VM's to claim
    host.attach(VF[0], 7, since=100.0)
    assert host.run() == {7: ib(0, 0, 0, 0)}
    host.counters(vf0=(6500, 4100, 65, 41))
    assert host.run() == {7: ib(1500, 100, 15, 1)}
    host.counters(vf0=(6600, 4100, 66, 41))
    assert host.run() == {7: ib(1600, 100, 16, 1)}
    assert host.logged == []
    assert os.stat(host.state).st_mode & 0o777 == 0o600


def test_a_vm_with_two_vfs_sums_them_and_vms_are_apart(host):
    host.counters(vf0=(0, 0, 0, 0), vf1=(10, 10, 1, 1), vf3=(0, 0, 0, 0))
    host.attach(VF[0], 7, 100.0)
    host.attach(VF[1], 7, 100.0)
    host.attach(VF[3], 8, 100.0)
    host.run()
    host.counters(vf0=(100, 1, 1, 1), vf1=(20, 30, 2, 3), vf3=(7, 7, 7, 7))
    assert host.run() == {7: ib(110, 21, 2, 3), 8: ib(7, 7, 7, 7)}


def test_a_new_vf_for_the_same_vm_keeps_its_total_growing(host):
    """Save and restore, or a move away and back: another VF, the same VM."""
    host.counters(vf0=(1000, 1000, 10, 10), vf2=(9000, 9000, 90, 90))
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.counters(vf0=(3000, 2000, 30, 20), vf2=(9000, 9000, 90, 90))
    assert host.run() == {7: ib(2000, 1000, 20, 10)}
    host.release(VF[0])                              # saved: nothing reported, the total kept
    assert host.run() == {}
    host.attach(VF[2], 7, 200.0)                     # restored on another VF with its own past
    assert host.run() == {7: ib(2000, 1000, 20, 10)}
    host.counters(vf0=(3000, 2000, 30, 20), vf2=(9500, 9100, 95, 91))
    assert host.run() == {7: ib(2500, 1100, 25, 11)}


def test_a_vf_reused_by_another_vm_is_not_counted_twice(host):
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.counters(vf0=(800, 800, 8, 8))
    assert host.run() == {7: ib(800, 800, 8, 8)}
    host.release(VF[0])
    host.attach(VF[0], 9, 200.0)                     # VM 9 gets VF 0, with VM 7's 800 in it
    assert host.run() == {9: ib(0, 0, 0, 0)}
    host.counters(vf0=(1000, 900, 10, 9))
    assert host.run() == {9: ib(200, 100, 2, 1)}
    host.release(VF[0])
    host.attach(VF[0], 7, 300.0)                     # back to VM 7: VM 9's traffic is not VM 7's
    host.counters(vf0=(1500, 900, 15, 9))
    assert host.run() == {7: ib(800, 800, 8, 8)}
    host.counters(vf0=(1600, 950, 16, 10))
    assert host.run() == {7: ib(900, 850, 9, 9)}


def test_a_vf_free_at_the_last_run_counts_from_there(host):
    """Attached between two runs (a deploy, a restore, a migration's
    destination): the traffic since the attach is the VM's."""
    host.counters(vf0=(0, 0, 0, 0), vf1=(700, 700, 7, 7))   # VF 1: an earlier VM's traffic
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.attach(VF[1], 8, 200.0)
    host.counters(vf0=(10, 10, 1, 1), vf1=(950, 800, 9, 8))
    assert host.run() == {7: ib(10, 10, 1, 1), 8: ib(250, 100, 2, 1)}


def test_a_vf_free_at_the_last_run_whose_counters_dropped(host):
    host.counters(vf0=(0, 0, 0, 0), vf1=(700, 700, 7, 7))
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.attach(VF[1], 8, 200.0)                     # and the PF's driver reloaded meanwhile
    host.counters(vf0=(10, 10, 1, 1), vf1=(50, 40, 5, 4))
    assert host.run()[8] == ib(50, 40, 5, 4)


def test_a_new_assignment_of_the_same_vf_between_two_runs_is_a_first_sight(host):
    """VM 7 saved and restored onto the same VF while VM 9 used it in between:
    the pool's stamp of the assignment changed, so VM 9's traffic is not added."""
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.release(VF[0])
    host.attach(VF[0], 7, 400.0)
    host.counters(vf0=(5000, 5000, 50, 50))
    assert host.run() == {7: ib(0, 0, 0, 0)}


def test_counters_that_drop_do_not_make_the_total_go_back(host):
    """The PF's driver reloaded: the VF's counters restart at 0."""
    host.counters(vf0=(1000, 1000, 10, 10))
    host.attach(VF[0], 7, 100.0)
    host.run()
    host.counters(vf0=(5000, 3000, 50, 30))
    assert host.run() == {7: ib(4000, 2000, 40, 20)}
    host.counters(vf0=(300, 200, 3, 2))
    assert host.run() == {7: ib(4300, 2200, 43, 22)}
    host.counters(vf0=(400, 200, 4, 2))
    assert host.run() == {7: ib(4400, 2200, 44, 22)}


def test_a_pf_that_cannot_be_read_keeps_its_baseline(host):
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 7, 100.0)
    host.run()
    (host.ip / "ip-s-j-link-show-ib0.json").write_text('[{"ifname": "ib0", "vfinfo_list": [{"vf": "x"}]}]')
    assert host.run() == {}
    assert len(host.logged) == 1 and "VF index 'x'" in host.logged[0] and "\n" not in host.logged[0]
    host.counters(vf0=(70, 70, 7, 7))                # what it counted meanwhile is added once
    assert host.run() == {7: ib(70, 70, 7, 7)}


def test_the_recorded_fixture_is_read(host):
    shutil.copy(FIXTURES / "ip-s-j-link-show-ib0.json", host.ip / "ip-s-j-link-show-ib0.json")
    host.attach(VF[2], 7, 100.0)                     # VF 2: counters at the largest u64
    assert host.run() == {7: ib(0, 0, 0, 0)}
    assert host.logged == []


def test_nothing_held_reads_nothing_and_writes_nothing(host):
    host.counters(vf0=(1, 1, 1, 1))
    with host.pool.transaction() as txn:             # reserved: not in the guest yet
        txn.add(VF[0], PF, 7, "one-7", "", "reserved", "deploy")
    assert host.run() == {}
    assert not host.state.exists() and not (host.ip / "ip-calls.log").exists()


def test_without_ip_or_without_vf_counters_nothing_is_reported(host):
    host.attach(VF[0], 7, 100.0)
    shutil.copy(FIXTURES / "ip-s-j-link-show-ib0-nostats.json", host.ip / "ip-s-j-link-show-ib0.json")
    assert host.run() == {}                          # a driver without per-VF counters
    (host.ip / "ip").unlink()
    assert host.run() == {}
    assert "install iproute2" in host.logged[-1]
    assert not host.state.exists()


def test_ib0_partition_child_is_not_taken_for_the_pf(host, fake_host):
    child = fake_host["fs"].dev(PF) / "net" / "ib0.8001"   # sorts after ib0; here made to sort first
    child.mkdir()
    (child / "ifindex").write_text("9\n")
    (child / "iflink").write_text("5\n")
    os.rename(fake_host["fs"].dev(PF) / "net" / "ib0", fake_host["fs"].dev(PF) / "net" / "ibz")
    assert traffic.pf_netdev(traffic.Sysfs(host.cfg.sysfs_root), PF) == "ibz"


# -- the state file: ours alone, bounded, garbage refused ------------------------
def test_a_planted_state_file_is_refused_and_left_alone(host, tmp_path):
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 7, 100.0)
    victim = tmp_path / "victim"
    victim.write_text("the driver user's other file\n")
    os.symlink(victim, host.state)
    assert host.run() == {}
    assert "is a link" in host.logged[-1]
    assert host.state.is_symlink() and victim.read_text() == "the driver user's other file\n"
    host.state.unlink()
    os.link(victim, host.state)                      # a hard link: writes would land in victim
    assert host.run() == {}
    assert "2 names" in host.logged[-1] and victim.read_text() == "the driver user's other file\n"
    host.state.unlink()
    os.mkfifo(host.state)                            # a FIFO: would hang a reader
    assert host.run() == {}
    assert "not a regular file" in host.logged[-1]


def test_load_state_refuses_another_users_file(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    path = tmp_path / traffic.STATE_FILE
    path.write_text("{}")
    os.chown(path, 12345, 12345)
    with pytest.raises(Untrusted, match="uid 12345"):
        traffic.load_state(str(path), print)


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[]", b'{"vms": []}', b"\xff\xfe", b"[" * 100000, b'{"vms": {"1": NaN}}',
])
def test_a_garbage_state_file_gives_no_entries(body):
    logged = []
    assert traffic.parse_state(body, logged.append) == traffic.State({}, {})
    assert len(logged) <= 1


def test_garbage_entries_are_dropped_and_good_ones_kept():
    good = {"total": [1, 2, 3, 4], "seen": 5.0, "vfs": {VF[0]: [100.0, [1, 2, 3, 4]]}}
    vms = {"7": good,
           "-1": good, "07": good, "x": good, "9" * 11: good, "٣": good,           # not VM ids
           "8": dict(good, total=[-1, 0, 0, 0]),
           "9": dict(good, total=[2 ** 96, 0, 0, 0]),
           "10": dict(good, total=[True, 0, 0, 0]),
           "11": dict(good, total=[1.5, 0, 0, 0]),
           "12": dict(good, vfs={"../../etc": [1.0, [0, 0, 0, 0]]}),
           "13": dict(good, vfs={VF[0]: [1.0, [2 ** 64, 0, 0, 0]]}),
           "14": dict(good, vfs={f"0000:03:{n // 8:02x}.{n % 8}": [1.0, [0, 0, 0, 0]] for n in range(65)}),
           "15": dict(good, seen="yesterday"),
           "16": [1, 2, 3]}
    logged = []
    free = {VF[1]: [1, 2, 3, 4], VF[2]: [-1, 0, 0, 0], "0000:03:00.9x": [0, 0, 0, 0], VF[3]: "x"}
    state = traffic.parse_state(json.dumps({"vms": vms, "free": free}).encode(), logged.append)
    assert list(state.vms) == [7]
    assert state.vms[7] == traffic.VmEntry((1, 2, 3, 4), {VF[0]: (100.0, (1, 2, 3, 4))}, 5.0)
    assert state.free == {VF[1]: (1, 2, 3, 4)}
    assert logged == [f"{traffic.STATE_FILE}: {len(vms) - 1 + len(free) - 1} malformed entries dropped"]


def test_the_state_file_is_bounded(host):
    too_big = b'{"vms": {}, "pad": "' + b"x" * traffic.MAX_STATE_BYTES + b'"}'
    logged = []
    assert traffic.parse_state(too_big, logged.append) == traffic.State({}, {}) and "larger than" in logged[0]
    many = {vm: traffic.VmEntry((2 ** 64 * vm, 0, 0, 0), {}, float(vm)) for vm in range(traffic.MAX_VMS + 50)}
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 5, 100.0)                     # held now: kept whatever its age
    free = {f"0000:{0x10 + n // 256:02x}:{n % 256 // 8:02x}.{n % 8}": (2 ** 63,) * 4
            for n in range(traffic.MAX_FREE_VFS)}
    state = traffic.account(traffic.State(many, {}), traffic.attached(host.cfg.pool_db)[0],
                            dict(free, **{VF[0]: (0, 0, 0, 0)}), now=1.0)
    assert len(state.vms) == traffic.MAX_VMS and 5 in state.vms
    assert min(vm for vm in state.vms if vm != 5) == 51   # the oldest others went first
    assert len(state.free) == traffic.MAX_FREE_VFS
    data = traffic.dump_state(state)
    assert len(data) < traffic.MAX_STATE_BYTES
    assert traffic.parse_state(data, print) == state


def test_a_garbage_state_file_is_replaced_and_totals_start_over(host):
    host.counters(vf0=(10, 10, 1, 1))
    host.attach(VF[0], 7, 100.0)
    host.state.parent.mkdir(exist_ok=True)
    host.state.write_bytes(b"\x00garbage")
    assert host.run() == {7: ib(0, 0, 0, 0)}
    assert "not JSON" in host.logged[0]
    assert json.loads(host.state.read_text())["vms"]["7"]["total"] == [0, 0, 0, 0]


def test_too_many_free_vfs_are_not_kept():
    free = {f"0000:{n // 256:02x}:{n % 256 // 8:02x}.{n % 8}": [0, 0, 0, 0] for n in range(traffic.MAX_FREE_VFS + 1)}
    assert traffic.parse_state(json.dumps({"vms": {}, "free": free}).encode(), print).free == {}


def _brought(host, vm, totals):
    """What an arriving action does: reserve the VM's VF with the totals oned showed for it."""
    with host.pool.transaction() as txn:
        traffic.carry(txn, vm, totals)


def test_a_vm_arriving_from_another_host_goes_on_from_the_totals_it_brought(host):
    """oned showed 1000/2000/10/20 for VM 5 on the host it came from: this host's
    first sight starts there, and what its VF counts is added."""
    host.counters(vf0=(777, 888, 7, 8))              # an earlier holder's traffic
    host.attach(VF[0], 5, 100.0)
    _brought(host, 5, (1000, 2000, 10, 20))
    assert host.run() == {5: ib(1000, 2000, 10, 20)}
    host.counters(vf0=(777 + 50, 888 + 60, 7 + 1, 8 + 2))
    assert host.run() == {5: ib(1050, 2060, 11, 22)}


def test_a_vm_coming_back_keeps_the_larger_of_its_old_total_here_and_what_it_brought(host):
    host.counters(vf0=(0, 0, 0, 0))
    host.attach(VF[0], 5, 100.0)
    host.run()
    host.counters(vf0=(500, 500, 5, 5))
    assert host.run() == {5: ib(500, 500, 5, 5)}
    host.release(VF[0])                              # saved; restored here, oned a run behind
    host.attach(VF[1], 5, 200.0)
    _brought(host, 5, (400, 400, 4, 4))
    host.counters(vf0=(500, 500, 5, 5), vf1=(0, 0, 0, 0))
    assert host.run() == {5: ib(500, 500, 5, 5)}     # never back


def test_what_vms_brought_goes_with_their_vfs(host):
    host.attach(VF[0], 5, 100.0)
    _brought(host, 5, (1, 2, 3, 4))
    host.release(VF[0])
    host.attach(VF[1], 6, 100.0)
    assert traffic.attached(host.cfg.pool_db)[1] == {}   # VM 5 has no VF here: nothing read of it
    _brought(host, 6, (5, 6, 7, 8))                  # the next arrival drops VM 5's row
    assert traffic.attached(host.cfg.pool_db)[1] == {6: (5, 6, 7, 8)}
    with host.pool.transaction() as txn:
        assert txn.db.execute("SELECT vm_id FROM vm_traffic_carried").fetchall() == [(6,)]


@pytest.mark.parametrize("values,want", [
    (("1", "2", "3", "4"), (1, 2, 3, 4)),
    ((" 10 ", "0", "0", "0"), (10, 0, 0, 0)),
    (("1", "2", "3", None), None),                   # all four or nothing
    (("-1", "2", "3", "4"), None),
    (("1e9", "2", "3", "4"), None),
    (("\u0661", "2", "3", "4"), None),               # a digit Python reads, not oned
    ((str(2 ** 63), "2", "3", "4"), None),            # beyond SQLite's INTEGER
    (("9" * 40, "2", "3", "4"), None),
])
def test_known_totals_reads_only_what_oned_could_have_shown(values, want):
    mon = "".join(f"<{name}>{v}</{name}>" for name, v in zip(traffic.ATTRIBUTES, values) if v is not None)
    vm = ET.fromstring(f"<VM><ID>5</ID><MONITORING><CPU>1</CPU>{mon}</MONITORING>"
                       f"<USER_TEMPLATE><IB_RX_BYTES>99</IB_RX_BYTES></USER_TEMPLATE></VM>")
    assert traffic.known_totals(vm) == want
    assert traffic.known_totals(ET.fromstring("<VM><USER_TEMPLATE><IB_RX_BYTES>9</IB_RX_BYTES>"
                                              "</USER_TEMPLATE></VM>")) is None   # a tenant's, not oned's
    assert traffic.known_totals(None) is None
