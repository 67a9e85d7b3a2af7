"""Rung 1: the per-VF traffic counters read from `ip -s -j link show dev <pf>`."""

import json
import shutil
import subprocess

import pytest

from kvm_sriov.errors import DriverError
from kvm_sriov.vf import counters
from kvm_sriov.vf.counters import CountersError, VfCounters
from tests.conftest import FIXTURES, REPO

SAMPLES = FIXTURES / "iproute2"
FAKE_IP = REPO / "tests" / "support" / "fake_ip"
GOOD = SAMPLES / "ip-s-j-link-show-ib0.json"


def sample():
    return json.loads(GOOD.read_text())


def vf_entry(links, i):
    return links[0]["vfinfo_list"][i]


# -- parse: the good path -----------------------------------------------------
def test_four_vfs_with_their_counters():
    got = counters.parse(GOOD.read_bytes())
    assert got == {
        0: VfCounters(48519302144, 47210993664, 11843072, 11529981, 0, 0),
        1: VfCounters(0, 0, 0, 0, 0, 0),
        2: VfCounters(2**64 - 1, 123456789012, 4294967296, 30141, 0, 0),
        3: VfCounters(2048, 1024, 8, 4, 0, 0),
    }
    assert counters.parse(GOOD.read_text()) == got  # str as well as bytes


def test_tx_counters_come_from_the_tx_prefixed_names():
    # iproute2 prints stats.tx.tx_bytes, not stats.tx.bytes: a mix-up would
    # report rx twice or nothing at all
    links = sample()
    vf_entry(links, 3)["stats"]["tx"] = {"tx_bytes": 7, "tx_packets": 1}
    got = counters.parse(json.dumps(links))[3]
    assert (got.rx_bytes, got.tx_bytes, got.tx_packets) == (2048, 7, 1)


def test_dropped_is_optional_each_side():
    links = sample()
    del vf_entry(links, 0)["stats"]["rx"]["dropped"]
    vf_entry(links, 0)["stats"]["tx"]["dropped"] = 9
    got = counters.parse(json.dumps(links))[0]
    assert (got.rx_dropped, got.tx_dropped) == (None, 9)


def test_vfs_without_stats_have_no_counters():
    assert counters.parse((SAMPLES / "ip-s-j-link-show-ib0-nostats.json").read_bytes()) == {}
    links = sample()
    del vf_entry(links, 1)["stats"]
    assert sorted(counters.parse(json.dumps(links))) == [0, 2, 3]


def test_a_pf_without_vfs_has_no_counters():
    links = sample()
    del links[0]["vfinfo_list"]
    assert counters.parse(json.dumps(links)) == {}


# -- parse: refusals ------------------------------------------------------------
def test_the_hostile_sample_is_refused():
    with pytest.raises(CountersError):
        counters.parse((SAMPLES / "ip-s-j-link-show-ib0-hostile.json").read_bytes())


def _set(path, value):
    def change(links):
        obj = links
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return change


def _delete(path):
    def change(links):
        obj = links
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return change


RX = (0, "vfinfo_list", 0, "stats", "rx")
TX = (0, "vfinfo_list", 0, "stats", "tx")
VF0 = (0, "vfinfo_list", 0)

REFUSED = {
    "negative counter": _set(RX + ("bytes",), -1),
    "counter of 2**64": _set(TX + ("tx_bytes",), 2**64),
    "counter as a string": _set(RX + ("packets",), "12"),
    "counter as a float": _set(TX + ("tx_packets",), 1.0),
    "counter as a bool": _set(RX + ("bytes",), True),
    "counter null": _set(RX + ("bytes",), None),
    "negative dropped": _set(TX + ("dropped",), -3),
    "rx bytes missing": _delete(RX + ("bytes",)),
    "tx bytes missing": _delete(TX + ("tx_bytes",)),
    "rx not an object": _set(RX, [1, 2]),
    "tx missing": _delete(TX),
    "stats not an object": _set(VF0 + ("stats",), 5),
    "stats null": _set(VF0 + ("stats",), None),
    "vf index missing": _delete(VF0 + ("vf",)),
    "vf index negative": _set(VF0 + ("vf",), -1),
    "vf index 4096": _set(VF0 + ("vf",), 4096),
    "vf index a string": _set(VF0 + ("vf",), "0"),
    "vf index a bool": _set(VF0 + ("vf",), False),
    "vf listed twice": _set((0, "vfinfo_list", 1, "vf"), 0),
    "vf entry not an object": _set((0, "vfinfo_list", 2), [3]),
    "vfinfo_list not a list": _set((0, "vfinfo_list"), {"0": {}}),
}


@pytest.mark.parametrize("change", REFUSED.values(), ids=REFUSED.keys())
def test_odd_values_are_one_clear_error(change):
    links = sample()
    change(links)
    with pytest.raises(CountersError) as err:
        counters.parse(json.dumps(links))
    assert "\n" not in str(err.value) and str(err.value).startswith("ip link output")


@pytest.mark.parametrize("text", [
    b"", b"not json", b"\xff\xfe[]", "{}", "[]", "[1]", "[{}, {}]", '"ib0"', "null",
    '[{"vfinfo_list": [{"vf": NaN}]}]', '[{"vfinfo_list": [{"vf": Infinity}]}]',
    '[{"vfinfo_list": [{"vf": 1e400}]}]',
    '[{"vfinfo_list": [{"vf": ' + "9" * 5000 + "}]}]",
    "[" * 100_000 + "]" * 100_000,
], ids=["empty", "not-json", "not-utf8", "object", "no-link", "not-an-object", "two-links", "string",
        "null", "nan", "infinity", "huge-float", "huge-int", "deep-nesting"])
def test_malformed_output_is_one_clear_error(text):
    with pytest.raises(CountersError):
        counters.parse(text)


def test_too_many_vfs_are_refused_before_they_are_read():
    links = sample()
    links[0]["vfinfo_list"] = [{"vf": 1}] * (counters.MAX_VFS + 1)
    with pytest.raises(CountersError, match="more than 4096"):
        counters.parse(json.dumps(links))


def test_output_up_to_the_size_cap_is_read():
    good = GOOD.read_bytes()
    at_cap = b" " * (counters.MAX_OUTPUT_BYTES - len(good)) + good
    assert counters.parse(at_cap) == counters.parse(good)


def test_output_over_the_size_cap_is_refused_unparsed(monkeypatch):
    big = b" " * counters.MAX_OUTPUT_BYTES + GOOD.read_bytes()
    with pytest.raises(CountersError, match="larger than"):
        counters.parse(big)
    with pytest.raises(CountersError, match="larger than"):
        counters.parse(big.decode())
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed"))
    with pytest.raises(CountersError):
        counters.parse(big)


def test_counters_error_is_a_driver_error():
    assert issubclass(CountersError, DriverError)


# -- read: runs ip --------------------------------------------------------------
class FakeRun:
    def __init__(self, stdout=b"", returncode=0, stderr=b"", raises=None):
        self.calls = []
        self.stdout, self.returncode, self.stderr, self.raises = stdout, returncode, stderr, raises

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        if self.raises:
            raise self.raises
        return subprocess.CompletedProcess(cmd, self.returncode, self.stdout, self.stderr)


def test_read_runs_ip_with_a_timeout():
    run = FakeRun(GOOD.read_bytes())
    assert counters.read("ib0", run=run) == counters.parse(GOOD.read_bytes())
    (cmd, kwargs), = run.calls
    assert cmd == ["ip", "-s", "-j", "link", "show", "dev", "ib0"]
    assert kwargs["timeout"] == counters.TIMEOUT_SECONDS and kwargs["capture_output"]


@pytest.mark.parametrize("name", [
    "", "-s", "--help", "ib0/../x", "a" * 16, "ib 0", "ib0\n", "ib\t0", "ib:0", ".", "..", "ib\x00",
    "ib\x7f", "ïb0", None, 5, b"ib0",
])
def test_a_bad_name_is_refused_before_anything_runs(name):
    run = FakeRun(GOOD.read_bytes())
    with pytest.raises(CountersError, match="not a network interface name"):
        counters.read(name, run=run)
    assert run.calls == []


@pytest.mark.parametrize("name", ["ib0", "a" * 15, "ibp65s0f0", "enp3s0f0np0", "ib0.8001", "ib-sriov_1"])
def test_names_the_kernel_takes_are_accepted(name):
    assert counters.valid_netdev(name)


def test_timeout_is_one_line():
    run = FakeRun(raises=subprocess.TimeoutExpired(["ip"], counters.TIMEOUT_SECONDS))
    with pytest.raises(CountersError, match=r"no answer within 10 s") as err:
        counters.read("ib0", run=run)
    assert "\n" not in str(err.value)


def test_missing_ip_says_what_to_install():
    with pytest.raises(CountersError, match="install iproute2$"):
        counters.read("ib0", run=FakeRun(raises=FileNotFoundError(2, "No such file or directory")))


def test_ip_that_cannot_start_is_one_line():
    with pytest.raises(CountersError, match="Permission denied"):
        counters.read("ib0", run=FakeRun(raises=PermissionError(13, "Permission denied")))


def test_ip_failing_gives_its_first_line():
    run = FakeRun(returncode=1, stderr=b'Device "ib9" does not exist.\nmore\n')
    with pytest.raises(CountersError, match=r'failed: Device "ib9" does not exist\.$'):
        counters.read("ib9", run=run)
    with pytest.raises(CountersError, match="failed: exit status 255$"):
        counters.read("ib9", run=FakeRun(returncode=255))


def test_garbage_from_ip_is_refused():
    with pytest.raises(CountersError):
        counters.read("ib0", run=FakeRun(b"vf 0 MAC 00:00:00:00:00:00\n"))


def test_missing_ip_with_the_real_subprocess(tmp_path):
    with pytest.raises(CountersError, match="install iproute2"):
        counters.read("ib0", ip_command=str(tmp_path / "no-such-ip"))


# -- read: through the recording fake ip (a real executable) ------------------------
@pytest.fixture
def fake_ip(tmp_path):
    d = tmp_path / "fake-ip"
    d.mkdir()
    shutil.copy(FAKE_IP, d / "ip")
    shutil.copy(GOOD, d / GOOD.name)
    return d


def test_read_through_the_fake_ip(fake_ip):
    got = counters.read("ib0", ip_command=str(fake_ip / "ip"))
    assert sorted(got) == [0, 1, 2, 3] and got[0].rx_bytes == 48519302144
    assert (fake_ip / "ip-calls.log").read_text().splitlines() == ["-s -j link show dev ib0"]


def test_an_unknown_device_through_the_fake_ip(fake_ip):
    with pytest.raises(CountersError, match='Device "ib1" does not exist'):
        counters.read("ib1", ip_command=str(fake_ip / "ip"))
