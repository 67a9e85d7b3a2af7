"""Rung 4: the subnet manager follows the IB networks through oned's own hook
manager. `kvm-sriov setup-hooks` registers the API hooks on the real oned;
onehem runs the installed `kvm-sriov network-hook` on each one.vn.* call.
A network is READY (its address ranges in AR_POOL) only after its allocate
call: the state hook on NET/READY brings them in. The SM is local here: the partitions file is a file of this
test, and the reload command asks the real opensm about the file it reloads
and records when it ran. Its own front-end without hosts (no VM runs here),
so its hooks never see the other tests' networks."""

import base64
import hashlib
import json
import re
import shlex
import subprocess
import time

import pytest

from kvm_sriov.ib import opensm_check
from simhost.frontend import FrontEnd
from tests.conftest import REPO
from tests.sched.sched_frontend import running

RANGE = (0x2000, 0x2002)
WITHIN = 10.0   # seconds from the call to opensm's reload
IB_NET = ('NAME = "{name}"\nVN_MAD = "dummy"\nBRIDGE = "ib-sriov"\nKVM_SRIOV_PKEY = "AUTO"\n'
          'AR = [ TYPE = "ETHER", MAC = "{mac}", SIZE = "{size}" ]\n')


class Hooked:
    def __init__(self, fe, work):
        self.fe, self.work = fe, work
        self.kvm_sriov = fe.package_root / "usr" / "bin" / "kvm-sriov"
        self.conf = work / "front-end.toml"
        self.partitions = work / "sm" / "partitions.conf"
        self.reloads = work / "reloads"
        self.state = work / "state"
        self.configure([])

    def configure(self, push: list) -> None:
        # records when opensm took which file (its validation takes seconds: the file is in
        # place before the record)
        reload = ["sh", "-c", f'{shlex.quote(str(self.kvm_sriov))} partitions --validate "$0" && '
                              f'echo "$(date +%s.%N) $(sha256sum < "$0" | cut -c1-64)" >> "$1"',
                  str(self.partitions), str(self.reloads)]
        self.conf.write_text(
            f'[pool]\nstate_dir = "{self.state}"\n'
            f'[infiniband]\npartitions_file = "{self.partitions}"\n'
            f'pkey_range = "0x{RANGE[0]:04x}-0x{RANGE[1]:04x}"\n'
            f'sm_reload_command = {json.dumps(reload)}\nsm_push_command = {json.dumps(push)}\n')

    @property
    def command(self) -> str:
        return shlex.join([str(self.kvm_sriov), "--config", str(self.conf), "network-hook"])

    def rpc(self, method, *args):
        ok, body = self.fe.rpc(method, *args)
        assert ok, f"{method}: {body}"
        return body

    def reload_records(self) -> list:
        """(time, sha256 of the file opensm reloaded), oldest first."""
        lines = self.reloads.read_text().splitlines() if self.reloads.exists() else []
        return [(float(t), digest) for t, digest in (line.split() for line in lines)]

    def reload_times(self) -> list:
        return [t for t, _ in self.reload_records()]

    def vnet(self, vid):
        return self.fe.info("vn", vid)

    def vlan(self, vid):
        v = self.vnet(vid)
        return (v.findtext("VLAN_ID") or v.findtext("TEMPLATE/VLAN_ID") or "").strip()

    def runs(self, method: str) -> list:
        """(exit code, stdout, stderr) of each run of the hook on method, oldest first."""
        hook = next(h for h in self.fe.xml("onehook", "list").iter("HOOK")
                    if h.findtext("TEMPLATE/CALL") == method)
        out = []
        for rec in self.fe.xml("onehook", "show", hook.findtext("ID")).iter("HOOK_EXECUTION_RECORD"):
            res = rec.find("EXECUTION_RESULT")
            out.append((int(res.findtext("CODE")), base64.b64decode(res.findtext("STDOUT") or "").decode(),
                        base64.b64decode(res.findtext("STDERR") or "").decode()))
        return out

    def wait_runs(self, method: str, count: int, timeout: float = 60) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.runs(method)
            if len(runs) >= count:
                return runs
            time.sleep(0.5)
        raise TimeoutError(f"hook on {method}: {len(runs)} run(s), {count} expected")

    def reloaded_with(self, since: float, present=(), absent=(), timeout: float = 60) -> float:
        """Seconds from since to the reload after which the file says what it should."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.partitions.read_text() if self.partitions.exists() else ""
            digest = hashlib.sha256(text.encode()).hexdigest()
            took = [t for t, d in self.reload_records() if t >= since and d == digest]
            if took and all(p in text for p in present) and not any(a in text for a in absent):
                return took[0] - since
            time.sleep(0.2)
        raise TimeoutError(f"no reload with {present} and without {absent}; reloads {self.reload_times()}, "
                           f"file:\n{text}\nstate: {(self.state / 'network-hook.json').read_text()}")


@pytest.fixture(scope="module")
def frontend(request):
    work = REPO / "build" / "rung4-hooks"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    with running(FrontEnd(work / "fe", []), REPO / "build" / "test-logs" / "opennebula-hooks",
                 lambda: request.session.testsfailed) as fe:
        yield fe


@pytest.fixture(scope="module")
def hooked(frontend):
    if not opensm_check.available():  # declared by the opennebula suite: missing is a failure, not a skip
        pytest.fail(f"the SM here needs opensm: install {opensm_check.PACKAGES}", pytrace=False)
    work = frontend.workdir / "network-hooks"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    h = Hooked(frontend, work)
    setup = [str(h.kvm_sriov), "setup-hooks", "--command", h.command]
    first = subprocess.run(setup, env=frontend.env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(setup, env=frontend.env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "created" not in again.stdout and "up to date" in again.stdout
    yield h
    for hook in frontend.xml("onehook", "list").iter("HOOK"):  # the other tests' networks stay unhooked
        if hook.findtext("NAME").startswith("kvm-sriov-network-"):
            frontend.cli("onehook", "delete", hook.findtext("ID"))
    for vnet in sorted(frontend.xml("onevnet", "list").iter("VNET"), key=lambda v: -int(v.findtext("ID"))):
        if vnet.findtext("NAME").startswith("hook-"):  # reservations before their parents
            frontend.cli("onevnet", "delete", vnet.findtext("ID"), check=False)
    for tmpl in frontend.xml("onevntemplate", "list").iter("VNTEMPLATE"):
        if tmpl.findtext("NAME").startswith("hook-"):
            frontend.cli("onevntemplate", "delete", tmpl.findtext("ID"), check=False)


def until(predicate, what: str, timeout: float = 30, check: bool = True):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    if check:
        raise TimeoutError(f"{what}: not after {timeout} s")


def partition(vid, pkey):
    return f"one_vnet_{vid}=0x{pkey | 0x8000:04x}"


def test_the_subnet_manager_follows_the_ib_networks_in_seconds(hooked):
    h = hooked
    # a new network asking for a key: VLAN_ID set, opensm reloaded with its partition
    t0 = time.time()
    a = h.rpc("one.vn.allocate", IB_NET.format(name="hook-a", mac="02:00:0c:00:00:01", size=4), -1)
    took = h.reloaded_with(t0, present=[partition(a, RANGE[0]), "02:00:0c:00:00:01+4"])
    print(f"\nnetwork create -> opensm reload: {took:.2f} s")
    assert took < WITHIN
    assert int(h.vlan(a), 16) == RANGE[0]
    assert opensm_check.check_text(h.partitions.read_text()).accepted

    # a second one: the next key
    t0 = time.time()
    b = h.rpc("one.vn.allocate", IB_NET.format(name="hook-b", mac="02:00:0c:00:01:01", size=2), -1)
    took = h.reloaded_with(t0, present=[partition(a, RANGE[0]), partition(b, RANGE[0] + 1), "02:00:0c:00:01:01+2"])
    print(f"second network -> reload: {took:.2f} s")
    assert took < WITHIN and int(h.vlan(b), 16) == RANGE[0] + 1

    # an address range added: its GUIDs are in the file
    before = h.partitions.read_text().count("0x")
    t0 = time.time()
    h.rpc("one.vn.add_ar", b, 'AR = [ TYPE = "ETHER", MAC = "02:00:0c:00:02:01", SIZE = "3" ]')
    deadline = time.monotonic() + WITHIN
    while h.partitions.read_text().count("0x") < before + 6 and time.monotonic() < deadline:  # 3 MACs x 2 GUIDs
        time.sleep(0.2)
    took = h.reloaded_with(t0, present=["02:00:0c:00:02:01+3"])
    print(f"add_ar -> reload: {took:.2f} s")
    assert took < WITHIN

    # a network that is not InfiniBand: nothing happens, the hook says so
    reloads = len(h.reload_times())
    calls = len(h.runs("one.vn.allocate"))
    other = h.rpc("one.vn.allocate", 'NAME = "hook-eth"\nVN_MAD = "dummy"\nBRIDGE = "br0"\n'
                                     'KVM_SRIOV_PKEY = "AUTO"\nAR = [ TYPE = "ETHER", SIZE = "2" ]\n', -1)
    code, out, err = h.wait_runs("one.vn.allocate", calls + 1)[-1]
    assert code == 0 and "not InfiniBand" in out, (out, err)
    assert h.vlan(other) == "" and len(h.reload_times()) == reloads

    # the range exhausted: a clear reason in the network, a failing hook run; a VM already on it waits
    c = h.rpc("one.vn.allocate", IB_NET.format(name="hook-c", mac="02:00:0c:00:03:01", size=2), -1)
    d = h.rpc("one.vn.allocate", IB_NET.format(name="hook-d", mac="02:00:0c:00:04:01", size=2), -1)
    until(lambda: any(code != 0 and f"network {d}: no PKey: every PKey of infiniband.pkey_range" in err
                      for code, _o, err in h.runs("one.vn.allocate")), "a failed run for the exhausted range")
    assert int(h.vlan(c), 16) == RANGE[1] and h.vlan(d) == ""
    assert "every PKey" in h.vnet(d).findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR")
    vm = h.rpc("one.vm.allocate", f'NAME = "hook-vm"\nCPU = "0.1"\nMEMORY = "64"\n'
                                  f'NIC = [ NETWORK_ID = "{d}" ]\n', True)   # on hold: never placed
    assert (h.fe.info("vm", vm).findtext("TEMPLATE/NIC/VLAN_ID") or "") == ""

    # a network deleted: its partition goes, its key goes to the network that waited, and
    # oned carries the new VLAN_ID into the NIC of the VM created before it (not deployed)
    t0 = time.time()
    h.rpc("one.vn.delete", a)
    took = h.reloaded_with(t0, present=[partition(d, RANGE[0]), "02:00:0c:00:04:01+2"], absent=[f"one_vnet_{a}="])
    print(f"delete -> reload (key handed on): {took:.2f} s")
    assert took < WITHIN and int(h.vlan(d), 16) == RANGE[0]
    until(lambda: h.fe.info("vm", vm).findtext("TEMPLATE/NIC/VLAN_ID"), "the NIC's VLAN_ID", check=False)
    nic_vlan = h.fe.info("vm", vm).findtext("TEMPLATE/NIC/VLAN_ID")
    print(f"VLAN_ID set after the VM was created: its NIC (VM on hold) has VLAN_ID {nic_vlan!r}")
    assert nic_vlan and int(nic_vlan, 16) == RANGE[0]
    h.rpc("one.vm.action", "terminate-hard", vm)

    # the SM node unreachable: the last good file stays, the hook run fails, doctor says so
    good = h.partitions.read_text()
    reloads = len(h.reload_times())
    h.configure(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "kvm-sriov-no-such-sm.invalid",
                 "kvm-sriov", "partitions", "--install", "-", "--reload"])
    calls = len(h.runs("one.vn.update_ar"))
    ar = h.vnet(b).find("AR_POOL/AR").findtext("AR_ID")
    h.rpc("one.vn.update_ar", b, f'AR = [ AR_ID = "{ar}", SIZE = "5" ]')
    code, out, err = h.wait_runs("one.vn.update_ar", calls + 1)[-1]
    assert code != 0 and "SM node" in err and "last good file kept" in err, (out, err)
    assert len(err.strip().splitlines()) == 1
    assert h.partitions.read_text() == good and len(h.reload_times()) == reloads
    doctor = subprocess.run([str(h.kvm_sriov), "--config", str(h.conf), "doctor", "--no-libvirt"],
                            capture_output=True, text=True, timeout=120)
    line = next((x for x in doctor.stdout.splitlines() if "network hook" in x), "")
    assert line.startswith("[FAIL]") and "SM node" in line and doctor.returncode == 1, doctor.stdout

    # reachable again: the next call brings the file up to date, doctor is content
    h.configure([])
    t0 = time.time()
    h.rpc("one.vn.update", b, 'DESCRIPTION = "touched"', 1)
    took = h.reloaded_with(t0, present=["02:00:0c:00:01:01+5"])
    print(f"after the SM came back, update -> reload: {took:.2f} s")
    doctor = subprocess.run([str(h.kvm_sriov), "--config", str(h.conf), "doctor", "--no-libvirt"],
                            capture_output=True, text=True, timeout=120)
    assert re.search(r"^\[OK  \] network hook", doctor.stdout, re.M), doctor.stdout

    # a network made from a virtual network template (what OneFlow does for each service):
    # no one.vn.allocate hook fires for it, the one.vntemplate.instantiate hook does
    t0 = time.time()
    h.rpc("one.vn.delete", c)
    h.reloaded_with(t0, absent=[f"one_vnet_{c}="])
    tmpl = h.rpc("one.vntemplate.allocate", IB_NET.format(name="hook-tmpl", mac="02:00:0c:00:05:01", size=2))
    t0 = time.time()
    e = h.rpc("one.vntemplate.instantiate", tmpl, "hook-e", "")
    took = h.reloaded_with(t0, present=[partition(e, RANGE[1]), "02:00:0c:00:05:01+2"])
    print(f"vntemplate instantiate -> reload: {took:.2f} s")
    assert took < WITHIN and int(h.vlan(e), 16) == RANGE[1]

    # a reservation is folded into its parent: the file does not change, opensm is not reloaded
    reloads = len(h.reload_times())
    calls = len(h.runs("one.vn.reserve"))
    r = h.rpc("one.vn.reserve", b, 'NAME = "hook-r"\nSIZE = "1"')
    code, out, err = h.wait_runs("one.vn.reserve", calls + 1)[-1]
    assert code == 0 and "unchanged" in out, (out, err)
    assert len(h.reload_times()) == reloads and f"one_vnet_{r}=" not in h.partitions.read_text()
