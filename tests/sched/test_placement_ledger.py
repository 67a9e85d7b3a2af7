"""The placer's ledger (placement.Ledger: bookings kept between scheduling
windows) is a hint: a ledger file of the wrong shape is ignored with one
logged line, a save that fails (a full disk, a folder it may not write) is
logged, and in both cases the window's placement is still answered."""

import base64
import errno
import json
import os
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.scheduler import placement_program
from kvm_sriov.scheduler.placement import Ledger
from tests.sched.test_placement import PLACE

# rank's stand-in: every VM it is asked about goes to its first candidate host
FAKE_RANK = r'''
import base64, sys
from xml.etree import ElementTree as ET
doc = ET.fromstring(base64.b64decode(sys.stdin.buffer.read().strip()))
out = ["<PLAN><ID>-1</ID>"]
for vm in doc.iterfind("REQUIREMENTS/VM"):
    out.append(f"<ACTION><VM_ID>{vm.findtext('ID')}</VM_ID><HOST_ID>{vm.findtext('HOSTS/ID')}</HOST_ID>"
               "<DS_ID>0</DS_ID><OPERATION>deploy</OPERATION></ACTION>")
print("".join(out) + "</PLAN>")
'''

HOST = ("<HOST><ID>0</ID><NAME>h0</NAME><VMS/><TEMPLATE><KVM_SRIOV_VERSION>1</KVM_SRIOV_VERSION>"
        "<KVM_SRIOV_PF><ADDRESS>0000:03:00.0</ADDRESS><NETDEV>ib0</NETDEV><VENDOR>15b3</VENDOR><DEVICE>101c"
        "</DEVICE><NUMA_NODE>0</NUMA_NODE><FREE_VFS>2</FREE_VFS></KVM_SRIOV_PF></TEMPLATE></HOST>")
VM = ("<VM><ID>7</ID><UID>5</UID><NAME>vm7</NAME><STATE>1</STATE><TEMPLATE><NIC><NIC_ID>0</NIC_ID>"
      "<BRIDGE>ib-sriov</BRIDGE><MAC>02:00:00:00:00:01</MAC></NIC></TEMPLATE><USER_TEMPLATE/></VM>")
DOC = (f"<SCHEDULER_DRIVER_ACTION><VM_POOL>{VM}</VM_POOL><HOST_POOL>{HOST}</HOST_POOL><VNET_POOL/>"
       "<REQUIREMENTS><VM><ID>7</ID><HOSTS><ID>0</ID></HOSTS></VM></REQUIREMENTS></SCHEDULER_DRIVER_ACTION>")
GOOD = {"7": {"host": 0, "pfs": ["0000:03:00.0"], "time": 1000.0}}

BOOKING = {"host": 0, "pfs": ["0000:03:00.0"], "time": 1000.0}
BAD_LEDGERS = {
    # wrong shapes
    "list": "[]",
    "list-of-bookings": json.dumps([BOOKING]),
    "null": "null",
    "string": '"ledger"',
    "number": "1",
    # an object of wrong types
    "booking-a-string": '{"3": "host 0"}',
    "booking-a-list": '{"3": [0, ["0000:03:00.0"]]}',
    "vm-not-a-number": json.dumps({"three": BOOKING}),
    "vm-negative": json.dumps({"-3": BOOKING}),
    "vm-unicode-digits": json.dumps({"\u0663": BOOKING}),
    "host-a-string": json.dumps({"3": dict(BOOKING, host="0")}),
    "host-a-bool": json.dumps({"3": dict(BOOKING, host=True)}),
    "host-missing": json.dumps({"3": {"pfs": [], "time": 1000.0}}),
    "pfs-a-number": json.dumps({"3": dict(BOOKING, pfs=5)}),
    "pfs-a-string": json.dumps({"3": dict(BOOKING, pfs="0000:03:00.0")}),
    "pfs-of-lists": json.dumps({"3": dict(BOOKING, pfs=[["0000:03:00.0"]])}),
    "time-a-string": json.dumps({"3": dict(BOOKING, time="now")}),
    "region-a-list": json.dumps({"3": dict(BOOKING, region=["kvm-sriov-ivshmem-u5-g7"], region_mb=4)}),
    "region-not-a-region": json.dumps({"3": dict(BOOKING, region="../../etc", region_mb=4)}),
    "region-mb-a-string": json.dumps({"3": dict(BOOKING, region="kvm-sriov-ivshmem-u5-g7", region_mb="4")}),
    # huge numbers
    "vm-huge": json.dumps({"9" * 30: BOOKING}),
    "vm-4301-digits": json.dumps({"9" * 4301: BOOKING}),
    "host-huge": json.dumps({"3": dict(BOOKING, host=10 ** 30)}),
    "host-4301-digits": '{"3": {"host": ' + "9" * 4301 + ', "pfs": [], "time": 1000.0}}',
    "host-infinite": '{"3": {"host": 1e999, "pfs": [], "time": 1000.0}}',
    "time-infinite": '{"3": {"host": 0, "pfs": [], "time": 1e999}}',
    "time-nan": '{"3": {"host": 0, "pfs": [], "time": NaN}}',
    "time-huge": json.dumps({"3": dict(BOOKING, time=10 ** 30)}),
    "region-mb-huge": json.dumps({"3": dict(BOOKING, region="kvm-sriov-ivshmem-u5-g7", region_mb=10 ** 30)}),
    # not JSON
    "empty": "",
    "truncated": json.dumps(GOOD)[:-3],
    "text": "kvm-sriov ledger v1\n7 0 0000:03:00.0\n",
    "binary": b"\xff\xfe\x00\x01\x80garbage",
    "nested-too-deep": "[" * 100000 + "]" * 100000,
}


@pytest.fixture
def rank(tmp_path) -> list[str]:
    script = tmp_path / "rank.py"
    script.write_text(FAKE_RANK)
    return [sys.executable, str(script)]


class Err:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += text.splitlines()

    def warnings(self) -> list[str]:
        return [line for line in self.lines if line.startswith("WARN:")]


def place(rank, ledger_path) -> tuple[int, dict[int, int], Err]:
    err = Err()
    code, out = placement_program.run(base64.b64encode(DOC.encode()), rank,
                                      str(ledger_path) if ledger_path else None, stderr=err)
    plan = {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(out).iterfind("ACTION")}
    return code, plan, err


@pytest.mark.parametrize("name", BAD_LEDGERS)
def test_a_ledger_of_the_wrong_shape_is_ignored_with_one_line_and_the_window_is_answered(name, rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    content = BAD_LEDGERS[name]
    ledger.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}, err.lines
    (line,) = err.warnings()
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} ignored (") and len(line) < 2100
    assert err.lines == [line]                   # one line, and no VM message
    saved = json.loads(ledger.read_text())       # rewritten with this window's booking
    assert set(saved) == {"7"} and (saved["7"]["host"], saved["7"]["pfs"]) == (0, ["0000:03:00.0"])


def test_a_good_ledger_says_nothing_and_a_missing_one_neither(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and err.lines == []
    assert set(json.loads(ledger.read_text())) == {"7"}
    code, plan, err = place(rank, ledger)    # 7 is pending again: its booking goes, it is placed anew
    assert code == 0 and plan == {7: 0} and err.lines == []


def test_a_ledger_larger_than_any_of_ours_is_ignored(rank, tmp_path, monkeypatch):
    monkeypatch.setattr(Ledger, "MAX_BYTES", 64)
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text(json.dumps({str(i): BOOKING for i in range(10)}))
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and "larger than" in err.warnings()[0] and len(err.lines) == 1


def test_a_ledger_that_cannot_be_read_is_ignored_with_one_line(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.mkdir()                                # EISDIR: read fails (root reads any mode)
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    assert err.lines == err.warnings() and len(err.lines) == 2   # not read, not saved
    assert "ignored (Is a directory)" in err.lines[0] and "not saved" in err.lines[1]


def test_a_save_to_a_full_disk_is_logged_and_the_window_answered(rank, tmp_path, monkeypatch):
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text(json.dumps({"3": BOOKING}))
    fdopen = os.fdopen

    def onto_a_full_disk(fd, *args, **kwargs):   # the new file's writes: ENOSPC, as on a full disk
        os.close(fd)
        return fdopen(os.open("/dev/full", os.O_WRONLY), *args, **kwargs)
    monkeypatch.setattr(os, "fdopen", onto_a_full_disk)
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    (line,) = err.lines
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} not saved (No space left on device)")
    assert json.loads(ledger.read_text()) == {"3": BOOKING}          # the old ledger, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ledger.name, f"{ledger.name}.lock", "rank.py"])


def test_a_link_planted_beside_the_ledger_is_neither_written_through_nor_removed(rank, tmp_path):
    ledger = tmp_path / "kvm-sriov-placement.json"
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    os.symlink(victim, f"{ledger}.tmp")     # the name the save used before it made its own
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and err.lines == []
    assert victim.read_text() == "victim's\n" and os.readlink(f"{ledger}.tmp") == str(victim)
    assert set(json.loads(ledger.read_text())) == {"7"}


def test_a_save_whose_write_raises_enospc_is_logged(rank, tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "replace", full)
    ledger = tmp_path / "kvm-sriov-placement.json"
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0} and "not saved (No space left on device)" in err.lines[0]
    assert not ledger.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{ledger.name}.lock", "rank.py"])


def test_a_folder_the_ledger_cannot_be_in_costs_the_window_nothing(rank, tmp_path):
    ledger = tmp_path / "gone" / "kvm-sriov-placement.json"    # no lock, no ledger, no save there
    code, plan, err = place(rank, ledger)
    assert code == 0 and plan == {7: 0}
    (line,) = err.lines
    assert line.startswith(f"WARN: kvm-sriov place: placement ledger {ledger} not used in this window")
    assert not ledger.parent.exists()


def test_the_place_program_answers_whatever_its_ledger_holds(tmp_path):
    """one_sched's call: exit 0 and the plan on stdout; the line reaches oned as a log line
    without a VM (DriverExecHelper: WARN: <text>)."""
    ledger = tmp_path / "kvm-sriov-placement.json"
    ledger.write_text("[1, 2, 3]")
    fake = tmp_path / "rank-place"
    fake.write_text(f"#!{sys.executable}\n{FAKE_RANK}")
    fake.chmod(0o755)
    env = dict(os.environ, KVM_SRIOV_PLACEMENT_LEDGER=str(ledger), KVM_SRIOV_RANK_PLACE=str(fake))
    done = subprocess.run([str(PLACE)], input=base64.b64encode(DOC.encode()) + b"\n", capture_output=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"<VM_ID>7</VM_ID>" in done.stdout
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("WARN: kvm-sriov place: placement ledger") and "JSON list" in line
