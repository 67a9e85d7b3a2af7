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
import xml.etree.ElementTree as ET

import pytest

from kvm_sriov.ib import opensm_check
from simhost.frontend import FrontEnd
from tests.conftest import REPO
from tests.sched.sched_frontend import running
from tests.support.prometheus import Prometheus, dashboard_exprs, wait_for

RANGE = (0x2000, 0x2002)
# Each step waits for opensm's reload of the file as it should be (reloaded_with's time-out
# guards against a hang) and prints the seconds it took: a speed is no test's verdict.
WITHIN = 10.0   # how long add_ar's step waits for its GUIDs in the file before it looks for the reload
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

    def configure(self, push: list, key_range: tuple = RANGE, per_user: int = 0) -> None:
        # records when opensm took which file (its validation takes seconds: the file is in
        # place before the record); per_user: infiniband.pkeys_per_user (0: the default)
        reload = ["sh", "-c", f'{shlex.quote(str(self.kvm_sriov))} partitions --validate "$0" && '
                              f'echo "$(date +%s.%N) $(sha256sum < "$0" | cut -c1-64)" >> "$1"',
                  str(self.partitions), str(self.reloads)]
        self.conf.write_text(
            f'[pool]\nstate_dir = "{self.state}"\n'
            f'[infiniband]\npartitions_file = "{self.partitions}"\n'
            f'pkey_range = "0x{key_range[0]:04x}-0x{key_range[1]:04x}"\n'
            + (f'pkeys_per_user = {per_user}\n' if per_user else '')
            + f'sm_reload_command = {json.dumps(reload)}\nsm_push_command = {json.dumps(push)}\n')

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

    def last_run(self, method: str) -> int:
        """The EXECUTION_ID of the hook's last run on method (0: none): oned keeps only the
        last 20 records of each hook (HOOK_LOG_CONF), their IDs go on counting."""
        pool = ET.fromstring(self.rpc("one.hookpool.info", -2, -1, -1))
        hook = next(h for h in pool.iter("HOOK") if h.findtext("TEMPLATE/CALL") == method)
        ids = [int(r.findtext("EXECUTION_ID")) for r in self.fe.info("hook", hook.findtext("ID"))
               .iter("HOOK_EXECUTION_RECORD")]
        return max(ids, default=0)

    def quiet(self, method: str, seconds: float = 8, timeout: float = 90) -> int:
        """Waits until the hook on method has not run for seconds: its last run's ID."""
        last, since, deadline = self.last_run(method), time.monotonic(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            now = self.last_run(method)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= seconds:
                return last
        raise TimeoutError(f"the hook on {method} still runs after {timeout} s (run {last})")

    def doctor(self) -> str:
        """kvm-sriov doctor's line about the network hook."""
        out = subprocess.run([str(self.kvm_sriov), "--config", str(self.conf), "doctor", "--no-libvirt"],
                             capture_output=True, text=True, timeout=120).stdout
        return next((x for x in out.splitlines() if "network hook" in x), out)

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
    assert int(h.vlan(a), 16) == RANGE[0]
    assert opensm_check.check_text(h.partitions.read_text()).accepted

    # a second one: the next key
    t0 = time.time()
    b = h.rpc("one.vn.allocate", IB_NET.format(name="hook-b", mac="02:00:0c:00:01:01", size=2), -1)
    took = h.reloaded_with(t0, present=[partition(a, RANGE[0]), partition(b, RANGE[0] + 1), "02:00:0c:00:01:01+2"])
    print(f"second network -> reload: {took:.2f} s")
    assert int(h.vlan(b), 16) == RANGE[0] + 1

    # an address range added: its GUIDs are in the file
    before = h.partitions.read_text().count("0x")
    t0 = time.time()
    h.rpc("one.vn.add_ar", b, 'AR = [ TYPE = "ETHER", MAC = "02:00:0c:00:02:01", SIZE = "3" ]')
    deadline = time.monotonic() + WITHIN
    while h.partitions.read_text().count("0x") < before + 6 and time.monotonic() < deadline:  # 3 MACs x 2 GUIDs
        time.sleep(0.2)
    took = h.reloaded_with(t0, present=["02:00:0c:00:02:01+3"])
    print(f"add_ar -> reload: {took:.2f} s")

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
    assert int(h.vlan(d), 16) == RANGE[0]
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
    assert int(h.vlan(e), 16) == RANGE[1]

    # a reservation is folded into its parent: the file does not change, opensm is not reloaded
    reloads = len(h.reload_times())
    calls = len(h.runs("one.vn.reserve"))
    r = h.rpc("one.vn.reserve", b, 'NAME = "hook-r"\nSIZE = "1"')
    code, out, err = h.wait_runs("one.vn.reserve", calls + 1)[-1]
    assert code == 0 and "unchanged" in out, (out, err)
    assert len(h.reload_times()) == reloads and f"one_vnet_{r}=" not in h.partitions.read_text()


def test_the_hooks_own_updates_do_not_run_it_again_and_an_operators_key_still_reaches_the_sm(hooked):
    """Each one.vn.update the hook makes runs it again: a network waiting for a key the range
    cannot give must not be written again and again (oned would run the hook for ever)."""
    h = hooked
    one = (0x2100, 0x2100)
    h.configure([], key_range=one)
    t0 = time.time()
    x = h.rpc("one.vn.allocate", IB_NET.format(name="hook-x", mac="02:00:0d:00:00:01", size=2), -1)
    h.reloaded_with(t0, present=[partition(x, one[0])])
    y = h.rpc("one.vn.allocate", IB_NET.format(name="hook-y", mac="02:00:0d:00:01:01", size=2), -1)
    until(lambda: "every PKey" in (h.vnet(y).findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") or ""),
          "the waiting network's reason")
    last = h.quiet("one.vn.update")            # fails while the hook keeps re-running itself
    print(f"\nhook runs on one.vn.update so far: {last}, then none for 8 s")
    assert any(code == 0 and "nothing to do" in out for code, out, _e in h.runs("one.vn.update"))

    # the operator gives x another key: that update is followed, and y gets x's old key
    t0 = time.time()
    h.rpc("one.vn.update", x, 'VLAN_ID = "0x2105"', 1)
    took = h.reloaded_with(t0, present=[partition(x, 0x2105), partition(y, one[0])])
    print(f"operator's VLAN_ID -> reload (the freed key handed on): {took:.2f} s")
    assert int(h.vlan(y), 16) == one[0] and h.vnet(y).findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") == ""
    h.quiet("one.vn.update")


def test_a_locked_network_and_a_tenant_over_its_quota_leave_the_others_their_partitions(hooked):
    """A tenant (UID/GID as oned writes them) gets one key, its second network waits with the
    reason; locked by its owner (MANAGE is enough; oned then refuses even oneadmin's merge),
    that network alone goes without: a deleted network's partition still goes, another
    network still gets its key, doctor says which network and why; unlocked, a resync
    gives it its key."""
    h, fe = hooked, hooked.fe
    keys = (0x2110, 0x2117)
    h.configure([], key_range=keys, per_user=1)
    uid = h.rpc("one.user.allocate", "hook-tenant", "hook-secret", "core", [])
    tenant = "hook-tenant:hook-secret"
    tmpl = h.rpc("one.vntemplate.allocate", IB_NET.format(name="hook-auto", mac="02:00:0e:00:00:01", size=2))
    h.rpc("one.vntemplate.chmod", tmpl, -1, -1, -1, -1, -1, -1, 1, -1, -1)   # others may use it

    def instantiate(name):
        ok, vid = fe.rpc("one.vntemplate.instantiate", tmpl, name, "", session=tenant)
        assert ok, vid
        return vid

    t0 = time.time()
    t1 = instantiate("hook-t1")
    h.reloaded_with(t0, present=[partition(t1, keys[0])])
    t2 = instantiate("hook-t2")
    until(lambda: "pkeys_per_user" in (h.vnet(t2).findtext("TEMPLATE/KVM_SRIOV_PKEY_ERROR") or ""),
          "the quota's reason in the tenant's second network")
    assert h.vnet(t2).findtext("UID") == str(uid) and h.vlan(t2) == ""
    ok, why = fe.rpc("one.vn.update", t2, 'VLAN_ID = "0x2116"', 1, session=tenant)
    assert not ok, "the tenant gave itself a key past its quota"   # VNET_RESTRICTED_ATTR (setup-frontend)
    print(f"\ntenant {uid}: network {t1} key 0x{int(h.vlan(t1), 16):04x}, network {t2}: "
          f"{h.vnet(t2).findtext('TEMPLATE/KVM_SRIOV_PKEY_ERROR')}")
    a1 = h.rpc("one.vn.allocate", IB_NET.format(name="hook-a1", mac="02:00:0e:00:01:01", size=2), -1)
    h.reloaded_with(t0, present=[partition(a1, keys[0] + 1)])   # oneadmin: no quota
    until(lambda: h.doctor().startswith("[OK  ]"), "doctor content with a tenant at its quota")

    # the tenant locks its waiting network and deletes its other one: its key is free, the
    # waiting network is first in line, and oned refuses the hook's merge
    ok, why = fe.rpc("one.vn.lock", t2, 2, False, session=tenant)
    assert ok, why
    ok, why = fe.rpc("one.vn.update", t2, 'DESCRIPTION = "x"', 1)
    assert not ok and "locked" in why, why
    t0 = time.time()
    ok, why = fe.rpc("one.vn.delete", t1, session=tenant)
    assert ok, why
    h.reloaded_with(t0, absent=[f"one_vnet_{t1}="])
    a2 = h.rpc("one.vn.allocate", IB_NET.format(name="hook-a2", mac="02:00:0e:00:02:01", size=2), -1)
    took = h.reloaded_with(t0, present=[partition(a1, keys[0] + 1), f"one_vnet_{a2}="])
    print(f"network {t2} locked: another network's key and partition all the same in {took:.2f} s")
    assert h.vlan(t2) == "" and int(h.vlan(a2), 16) == keys[0] + 2   # t2 was first in line for keys[0]
    until(lambda: h.doctor().startswith("[FAIL]"), "doctor's FAIL")
    line = h.doctor()
    assert f"network {t2}: not updated" in line and "locked" in line, line

    # unlocked: the resync doctor's fix names gives it the key
    ok, why = fe.rpc("one.vn.unlock", t2, session=tenant)
    assert ok, why
    resync = subprocess.run([str(h.kvm_sriov), "--config", str(h.conf), "network-hook", "--resync"],
                            env=fe.env, capture_output=True, text=True, timeout=120)
    assert resync.returncode == 0, resync.stderr
    assert int(h.vlan(t2), 16) == keys[0] and partition(t2, keys[0]) in h.partitions.read_text()
    until(lambda: h.doctor().startswith("[OK  ]"), "doctor content again")


def test_prometheus_scrapes_the_front_end_while_its_networks_change(hooked):
    """The front-end's figures as OpenNebula's Prometheus integration gets them: after each
    network action through the real oned and its hook, the packaged `kvm-sriov metrics` (what
    its timer runs every 30 s) writes the file, the real node exporter serves it (unlabelled,
    as OpenNebula's configuration leaves the front-end's) and the real Prometheus scrapes it:
    the runs grow, a new network's partition and its members appear and go with the network,
    and every front-end panel of the dashboard returns series."""
    h = hooked
    keys = (0x2120, 0x2127)
    h.configure([], key_range=keys)
    work = h.work / "prometheus"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    metrics_dir, textfile_dir = work / "kvm-sriov-metrics", work / "node-exporter"
    metrics_dir.mkdir(parents=True)
    textfile_dir.mkdir()
    (textfile_dir / "kvm_sriov.prom").symlink_to(metrics_dir / "kvm_sriov.prom")   # what the package links

    def timer():
        done = subprocess.run([str(h.kvm_sriov), "--config", str(h.conf), "metrics", "--textfile-dir",
                               str(metrics_dir)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done

    timer()
    with Prometheus(work, {None: textfile_dir}) as prom:
        wait_for("the first scrape", lambda: prom.value("kvm_sriov_build_info"))
        runs = prom.value("kvm_sriov_network_hook_runs_total") or 0     # none before the hook's first run
        members = f'kvm_sriov_partition_members{{pkey="0x{keys[0]:04x}"}}'
        assert prom.query(members) == []

        t0 = time.time()
        n = h.rpc("one.vn.allocate", IB_NET.format(name="hook-prom", mac="02:00:0e:00:00:01", size=3), -1)
        h.reloaded_with(t0, present=[partition(n, keys[0])])
        h.quiet("one.vn.update")      # the hook's own VLAN_ID update runs it once more
        timer()
        wait_for("the new network's partition scraped", lambda: (prom.value(members) or 0) > 0)
        # as many as the hook says the SM took (how many GUIDs a MAC gives: docs/infiniband.md)
        took = json.loads((h.state / "network-hook.json").read_text())["members"][f"0x{keys[0]:04x}"]
        assert prom.value(members) == took >= 3, (took, prom.value(members))     # 3 MACs
        assert prom.value("kvm_sriov_network_hook_runs_total") > runs
        assert prom.value("kvm_sriov_network_hook_last_sm_reload_success") == 1
        assert prom.value(f'kvm_sriov_partition_networks{{pkey="0x{keys[0]:04x}"}}') == 1

        # every front-end panel has series (rate() and increase() once two scrapes saw a change)
        front = [(title, e) for title, e in dashboard_exprs("") if "network_hook" in e or "partition" in e]
        assert len(front) >= 8, front
        deadline = time.monotonic() + 90
        while True:
            missing = [(title, e) for title, e in front if not prom.query(e)]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert missing == [], f"front-end panels without series after 90 s: {missing}"

        t0 = time.time()
        h.rpc("one.vn.delete", n)
        h.reloaded_with(t0, absent=[f"one_vnet_{n}="])

        def gone():
            timer()            # again until the hook's status (written after the reload) has it
            time.sleep(1.5)    # and a scrape of that file
            return prom.value(members) is None
        wait_for("the deleted network's partition gone from the scrape", gone)
