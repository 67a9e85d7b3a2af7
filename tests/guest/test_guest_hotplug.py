"""The guest's own InfiniBand outage across a VF hot-unplug and hot-plug (a
live migration): kvm-sriov-ib-hotplug as udev runs it, for real (bash, real
ip in a network namespace, the fake sysfs of guest_helpers). The test plays
the kernel: it takes the IB device and its IPoIB netdev away, brings a new
one (another PCI address, device and netdev name, the same GUID) in INIT,
and turns the port ACTIVE, with a fake /proc/uptime (IB_UPTIME) so the
figure is exact. Stand-ins: systemd-run (runs the detached part at once,
its output in detached.out) and curl (records what would go to OneGate);
the real curl against a OneGate stand-in at the end."""
import http.server
import os
import re
import subprocess
import threading
import time

import pytest

from guest_helpers import CTX
from test_guest_context_scripts import LOC, NET, fixture_guest

HOTPLUG = CTX / "kvm-sriov-ib.d" / "kvm-sriov-ib-hotplug"
RULES = CTX / "udev" / "90-kvm-sriov-ib.rules"
TOKEN = "xD6HKnnhQteNWMRIqfJtfw=="
ONE_ENV = f'export TOKENTXT="{TOKEN}"\nexport VMID="42"\nexport ONEGATE_ENDPOINT="http://169.254.16.9:5030"\n'


def until(check, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.1)


def stand_ins(guest):
    """OneGate settings as one-context leaves them; systemd-run that runs the
    detached part at once (its output in detached.out); curl that records."""
    (guest.tmp / "one_env").write_text(ONE_ENV)
    guest.recorder("systemd-run", script=(
        'while [ "$1" != "--" ]; do shift; done; shift\n'
        f'"$@" >> "{guest.tmp}/detached.out" 2>&1'))
    guest.recorder("curl", script=(
        'while [ $# -gt 0 ]; do\n'
        f'  case "$1" in -K) cat "$2" >> "{guest.tmp}/curl.config"; shift ;;\n'
        f'    --data-binary) printf "%s\\n--\\n" "$2" >> "{guest.tmp}/curl.body"; shift ;; esac\n'
        '  shift\ndone'))


def reports(guest):
    p = guest.tmp / "curl.body"
    return [b.strip().splitlines() for b in p.read_text().split("\n--\n") if b.strip()] if p.exists() else []


class Migrating:
    """A booted guest whose VF the test unplugs and plugs again."""

    def __init__(self, guest, setup=None, **port):
        self.g = guest
        if setup:
            setup(guest)
        else:
            fixture_guest(guest, **port)
            if port.get("pkey") == "0xffff":     # ETH1's partition on a child, as the kernel made it
                guest.ib_child("ib0", "0x8001")
        self.clock = guest.tmp / "uptime"
        self.set_clock("990.00")
        guest.env["IB_UPTIME"] = str(self.clock)
        stand_ins(guest)
        self.boot = guest.run(LOC)
        assert self.boot.returncode == 0, self.boot.stdout + self.boot.stderr
        # udev gives its handler no context: what the boot hooks saw is in the state folder
        self.context = {k: guest.env.pop(k) for k in list(guest.env) if k.startswith("ETH")}

    def set_clock(self, value):
        self.clock.write_text(f"{value} 1.00\n")

    def udev(self, action, dev, env=None):
        return self.g.run(HOTPLUG, action, args=[dev], env=env)

    def unplug(self, dev="mlx5_0", netdev="ib0", at="1000.00"):
        self.set_clock(at)
        self.g.remove_ib(dev, netdev, pci="0000:00:05.0" if dev == "mlx5_0" else None)
        r = self.udev("remove", dev)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    def plug(self, dev="mlx5_1", netdev="ib1", pci="0000:00:06.0", state="2: INIT", pkey="0x8001", mac=None):
        self.g.pci(addr=pci)
        return self.g.ib_port(dev=dev, mac=mac or self.context["ETH1_MAC"], netdev=netdev, pkey=pkey,
                              state=state, lid="0x0" if "INIT" in state else "0x7")

    def activate(self, dev="mlx5_1", at=None):
        if at:
            self.set_clock(at)
        (self.g.sys / "class" / "infiniband" / dev / "ports" / "1" / "state").write_text("4: ACTIVE\n")

    @property
    def state(self):
        return self.g.state

    def detached(self):
        p = self.g.tmp / "detached.out"
        return p.read_text() if p.exists() else ""

    def reports(self):
        return reports(self.g)


@pytest.fixture
def vm(guest):
    return Migrating(guest)


def test_a_migration_is_timed_on_the_guests_clock_reconfigured_and_reported(vm, guest):
    assert (vm.state / "context").stat().st_mode & 0o777 == 0o600
    r = vm.unplug()
    assert "the InfiniBand outage is timed" in r.stdout, r.stdout + vm.boot.stdout
    assert (vm.state / "outage.pending").read_text() == "start 100000 last 100000 keys 02000a64002a\n"
    # the destination's VF: another PCI address, device and netdev name, the same GUID, INIT first
    vm.set_clock("1003.40")
    vm.plug()
    before = time.time()
    p = guest.start(HOTPLUG, "add", args=["mlx5_1"])
    # configured as at boot while the port is still INIT (the status comes last)
    until(lambda: "ib1(ETH1)" in (vm.state / "status").read_text(), "the configuration of the new netdev")
    assert guest.addrs("ib1") == [f"{vm.context['ETH1_IP']}/16"]
    assert guest.link("ib1")["mtu"] == int(vm.context["ETH1_MTU"]) and "UP" in guest.link("ib1")["flags"]
    assert vm.reports() == []            # not ACTIVE yet: nothing reported
    vm.activate(at="1005.75")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    after = time.time()
    log = vm.detached()
    assert "IB outage 5.75s, from the VF's removal until mlx5_1/1 ACTIVE" in log, log
    assert "ERROR" not in log, log
    assert log.splitlines()[-3].startswith("kvm-sriov-ib: INFO: port mlx5_1/1 guid 0x02000a000064002a state ACTIVE")
    [report] = vm.reports()
    assert report[:2] == ["IB_STATE=ACTIVE", "IB_OUTAGE_SECONDS=5.75"]
    ended = int(report[2].removeprefix("IB_OUTAGE_ENDED="))
    assert int(before) <= ended <= after
    assert (vm.state / "last-outage").read_text().splitlines() == report
    assert not (vm.state / "outage.pending").exists()
    # apart from udev (which kills what a rule leaves running), to OneGate as the VM's onegate client
    [detach] = guest.calls("systemd-run")
    assert "--no-block" in detach and detach.endswith(f"-- {HOTPLUG} settle")
    call = (guest.tmp / "curl.calls").read_text()     # one call, its body on several lines
    assert call.count("-X PUT") == 1 and "http://169.254.16.9:5030/vm" in call and "X-ONEGATE-VMID: 42" in call
    assert TOKEN not in call       # in a config from a pipe, not on the command line
    assert (guest.tmp / "curl.config").read_text() == f'header = "X-ONEGATE-TOKEN: {TOKEN}"\n'
    assert "port mlx5_1/1 guid 0x02000a000064002a state ACTIVE" in (vm.state / "status").read_text()
    assert "ib1(ETH1)" in (vm.state / "status").read_text()


def test_the_pkey_child_is_made_again_on_the_new_netdev(guest):
    vm = Migrating(guest, pkey="0xffff")   # the parent in the default partition: ETH1 on ib0.8001
    assert guest.addrs("ib0") == []
    vm.unplug()
    assert not (guest.sys / "class/net/ib0.8001").exists()
    vm.plug(pkey="0xffff", state="4: ACTIVE")
    vm.set_clock("1002.00")
    p = guest.start(HOTPLUG, "add", args=["mlx5_1"], env={"IB_CHILD_WAIT": "20"})
    # the kernel's part: the child appears once asked for through create_child
    until(lambda: guest.read("class/net/ib1/create_child") == "0x8001", "the PKey child requested")
    guest.ib_child("ib1", "0x8001")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert guest.addrs("ib1.8001") == [f"{vm.context['ETH1_IP']}/16"]
    assert "ib1: created PKey child ib1.8001" in vm.detached()
    assert vm.reports() == [["IB_STATE=ACTIVE", "IB_OUTAGE_SECONDS=2.00", vm.reports()[0][2]]]


def test_a_port_that_stays_init_is_reported_as_such_within_the_bound(vm, guest):
    vm.unplug()
    vm.plug()                      # no subnet manager: INIT for good
    r = vm.udev("add", "mlx5_1", env={"IB_PORT_WAIT": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    log = vm.detached()
    assert "IB port(s) mlx5_1/1 not ACTIVE within 2s of the hot-plug (state INIT" in log, log
    assert vm.reports() == [["IB_STATE=INIT"]]
    assert guest.addrs("ib1") == [f"{vm.context['ETH1_IP']}/16"]    # configured all the same
    assert not (vm.state / "outage.pending").exists() and not (vm.state / "last-outage").exists()


def test_a_vf_that_never_comes_back_is_waited_for_within_the_bound(vm, guest):
    vm.unplug()
    r = guest.run(HOTPLUG, "settle", env={"IB_PORT_WAIT": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not ACTIVE within 1s of the hot-plug (state NONE" in r.stdout
    assert vm.reports() == [["IB_STATE=NONE"]]


def test_two_vfs_plugged_at_once_give_one_outage(guest):
    """Two IB NICs: both VFs go, both come back, their add events' handlers
    overlap; the lock keeps their configurations apart and one of them ends
    the outage once both ports are ACTIVE."""
    macs = {"ETH1": "02:00:0a:64:00:07", "ETH2": "02:00:0a:65:00:07"}

    def two_nics(g):
        g.module("mlx5_core", "mlx5_ib", "ib_ipoib")
        g.env.update({"ETH1_MAC": macs["ETH1"], "ETH1_IP": "10.100.0.7", "ETH1_MASK": "255.255.0.0",
                      "ETH2_MAC": macs["ETH2"], "ETH2_IP": "10.101.0.7", "ETH2_MASK": "255.255.0.0"})
        g.ib_port(dev="mlx5_0", mac=macs["ETH1"], netdev="ib0")
        g.ib_port(dev="mlx5_1", mac=macs["ETH2"], netdev="ib1")

    vm = Migrating(guest, setup=two_nics)
    vm.set_clock("1000.00")
    guest.remove_ib("mlx5_0", "ib0")
    assert vm.udev("remove", "mlx5_0").returncode == 0
    vm.set_clock("1000.30")
    guest.remove_ib("mlx5_1", "ib1")
    assert vm.udev("remove", "mlx5_1").returncode == 0
    assert (guest.state / "outage.pending").read_text() == \
        "start 100000 last 100030 keys 02000a640007 02000a650007\n"
    vm.set_clock("1004.00")
    guest.ib_port(dev="mlx5_2", mac=macs["ETH1"], netdev="ib2")
    guest.ib_port(dev="mlx5_3", mac=macs["ETH2"], netdev="ib3")
    procs = [guest.start(HOTPLUG, "add", args=[d]) for d in ("mlx5_2", "mlx5_3")]
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, out + err
    log = vm.detached()
    assert log.count("IB outage 4.00s") == 1 and "ERROR" not in log, log
    assert [r for r in vm.reports() if "IB_OUTAGE_SECONDS=4.00" in r] == [vm.reports()[0]]
    assert guest.addrs("ib2") == ["10.100.0.7/16"] and guest.addrs("ib3") == ["10.101.0.7/16"]


def test_an_add_with_nothing_timed_does_nothing(vm, guest):
    """A boot's coldplug replays add for every device; a NIC attached is one-context's."""
    r = vm.udev("add", "mlx5_0")
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    assert guest.calls("systemd-run") == [] and vm.reports() == []


def test_a_device_no_context_nic_used_times_nothing(vm, guest):
    guest.ib_port(dev="mlx5_9", guid="0002c90300a1b2c3", netdev="ib9")   # not the VM's NIC
    assert guest.run(LOC, env=vm.context).returncode == 0
    vm.set_clock("1000.00")
    guest.remove_ib("mlx5_9", "ib9")
    r = vm.udev("remove", "mlx5_9")
    assert r.returncode == 0 and "no port of a context NIC went with it, nothing to time" in r.stdout
    assert not (vm.state / "outage.pending").exists()


def test_a_nic_detached_for_good_holds_up_nothing(vm, guest):
    """detach_nic: the port goes and never comes back; one-context re-runs the
    hooks with the new context (no ETH1), and the outage record lets it go."""
    vm.unplug()
    ctx = {k: v for k, v in vm.context.items() if not k.startswith("ETH1_")}
    assert guest.run(LOC, env=ctx).returncode == 0
    r = guest.run(HOTPLUG, "settle")
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert not (vm.state / "outage.pending").exists() and vm.reports() == []


def test_the_network_stage_reports_ib_state_once_the_port_is_active(guest):
    """What the harness waits for: net-16 (after its configuration) leaves
    kvm-sriov-ib-hotplug report apart, which puts IB_STATE into the VM's
    USER_TEMPLATE once the port is ACTIVE; nothing without OneGate."""
    fixture_guest(guest, state="2: INIT", lid="0x0")
    stand_ins(guest)
    p = guest.start(NET, "network", env={"IB_INSTALL_STACK": "NO"})
    until(lambda: "ETH1" in (guest.state / "status").read_text() if (guest.state / "status").exists() else False,
          "the configuration")
    assert reports(guest) == []
    (guest.sys / "class/infiniband/mlx5_0/ports/1/state").write_text("4: ACTIVE\n")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert reports(guest) == [["IB_STATE=ACTIVE"]]
    assert guest.calls("systemd-run")[-1].endswith(f"-- {HOTPLUG} report")
    # a port that stays INIT is said as such, within the bound
    (guest.sys / "class/infiniband/mlx5_0/ports/1/state").write_text("2: INIT\n")
    r = guest.run(NET, "network", env={"IB_INSTALL_STACK": "NO", "IB_PORT_WAIT": "1"})
    assert r.returncode == 0 and reports(guest)[-1] == ["IB_STATE=INIT"]
    assert "not ACTIVE within 1s (state INIT)" in (guest.tmp / "detached.out").read_text()
    # no OneGate: nothing started
    (guest.tmp / "one_env").unlink()
    calls = len(guest.calls("systemd-run"))
    assert guest.run(NET, "network", env={"IB_INSTALL_STACK": "NO"}).returncode == 0
    assert len(guest.calls("systemd-run")) == calls


# ------------------------------------------------------------------ odd input

@pytest.mark.parametrize("dev", ["mlx5_0\nkvm-sriov-ib: INFO: forged", "$(touch {ran})", "a/../b", "x" * 65])
def test_a_device_name_that_is_not_one_is_one_error_line(vm, guest, dev):
    ran = guest.tmp / "ran"
    r = vm.udev("remove", dev.format(ran=ran))
    assert r.returncode == 2 and "is not an IB device name" in r.stdout
    assert len(r.stdout.splitlines()) == 1 and not ran.exists()
    assert not (vm.state / "outage.pending").exists()


@pytest.mark.parametrize("record", ["start 1 last 2 keys $(touch {ran})\n", "start x last 2 keys 02000a64002a\n",
                                    "start 1 last 2 keys 02000a64002a" + " 02000a64002a" * 64 + "\n",
                                    "\n", "start 1\n", "k" * 100000])
def test_an_outage_record_that_is_not_one_is_dropped(vm, guest, record):
    ran = guest.tmp / "ran"
    (vm.state / "outage.pending").write_text(record.format(ran=ran))
    r = guest.run(HOTPLUG, "settle")
    assert r.returncode == 0 and "is not an outage record: dropped" in r.stdout, r.stdout
    assert not (vm.state / "outage.pending").exists() and not ran.exists() and vm.reports() == []


@pytest.mark.parametrize("clock", ["", "12 34", "1e5 1", "-5.00 1", "99999999999999.00 1"])
def test_a_clock_that_cannot_be_read_times_nothing(vm, guest, clock):
    vm.clock.write_text(clock)
    guest.remove_ib("mlx5_0", "ib0")
    r = vm.udev("remove", "mlx5_0")
    assert r.returncode == 0 and "cannot read the clock" in r.stdout
    assert not (vm.state / "outage.pending").exists()


def test_an_odd_port_state_is_never_sent_as_read(vm, guest):
    vm.unplug()
    vm.plug(state="4: ACT$(IVE)\nB")
    r = vm.udev("add", "mlx5_1", env={"IB_PORT_WAIT": "1"})
    assert r.returncode == 0
    assert vm.reports() == [["IB_STATE=UNKNOWN"]]


def test_a_saved_context_another_user_owns_is_not_read(vm, guest):
    os.chown(vm.state / "context", 65534, 65534)
    guest.remove_ib("mlx5_0", "ib0")
    r = vm.udev("remove", "mlx5_0")
    assert "nothing to time" in r.stdout and not (vm.state / "outage.pending").exists()


@pytest.mark.parametrize("one_env", [
    'export TOKENTXT="$(touch {ran})"\nexport VMID="42"\nexport ONEGATE_ENDPOINT="http://169.254.16.9:5030"\n',
    f'export TOKENTXT="{TOKEN}"\nexport VMID="42"\nexport ONEGATE_ENDPOINT="http://u:p@169.254.16.9:5030"\n',
    f'export TOKENTXT="{TOKEN}"\nexport VMID="42; x"\nexport ONEGATE_ENDPOINT="http://169.254.16.9:5030"\n',
    f'export TOKENTXT="{TOKEN}"\nexport VMID="42"\n',
], ids=["token with shell", "credentials in the endpoint", "vmid", "no endpoint"])
def test_onegate_settings_that_are_not_usable_send_nothing(vm, guest, one_env):
    ran = guest.tmp / "ran"
    (guest.tmp / "one_env").write_text(one_env.format(ran=ran))
    vm.unplug()
    vm.plug(state="4: ACTIVE")
    r = vm.udev("add", "mlx5_1")
    assert r.returncode == 0
    assert "no OneGate for this VM" in vm.detached() and "IB outage" in vm.detached()
    assert vm.reports() == [] and not ran.exists()


# ------------------------------------------------------------------ install, the real curl

def test_the_udev_rule_runs_the_installed_handler(tmp_path):
    rules = [line for line in RULES.read_text().splitlines() if line and not line.startswith("#")]
    assert sorted(re.fullmatch(r'SUBSYSTEM=="infiniband", ACTION=="(\w+)", RUN\+="(\S+) (\w+) %k"', r).groups()
                  for r in rules) == [("add", "/etc/one-context.d/kvm-sriov-ib.d/kvm-sriov-ib-hotplug", "add"),
                                      ("remove", "/etc/one-context.d/kvm-sriov-ib.d/kvm-sriov-ib-hotplug", "remove")]
    root = tmp_path / "image"
    subprocess.run([str(CTX / "install.sh"), "--root", str(root)], check=True, capture_output=True)
    assert (root / "etc/udev/rules.d/90-kvm-sriov-ib.rules").read_text() == RULES.read_text()
    handler = root / "etc/one-context.d/kvm-sriov-ib.d/kvm-sriov-ib-hotplug"
    assert handler.stat().st_mode & 0o777 == 0o755
    r = subprocess.run([str(handler), "add", "mlx5_0"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "IB_STATE_DIR": str(tmp_path / "state"), "IB_SYSLOG": "NO"})
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


class PutGate:
    """OneGate's PUT /vm as the real curl meets it (127.0.0.1: outside the namespaces)."""

    def __init__(self):
        self.requests = []
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                gate.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200 if self.headers.get("X-ONEGATE-TOKEN") == TOKEN else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def report(env, *words):
    return subprocess.run(["bash", "-c", f'. "{CTX}/kvm-sriov-ib.d/functions.sh"; ib_onegate_report "$@"', "-",
                           *words], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "IB_SYSLOG": "NO", **env})


@pytest.mark.skipif(not any(os.access(os.path.join(d, "curl"), os.X_OK) for d in ("/usr/bin", "/bin")),
                    reason="curl not installed")
def test_the_real_curl_puts_the_words_into_the_vm_template(tmp_path):
    gate = PutGate()
    try:
        one_env = tmp_path / "one_env"
        one_env.write_text(f'export TOKENTXT="{TOKEN}"\n')
        env = {"ONEGATE_ENDPOINT": gate.endpoint, "VMID": "42", "IB_ONE_ENV": str(one_env)}
        r = report(env, "IB_STATE=ACTIVE", "IB_OUTAGE_SECONDS=5.75", "IB_OUTAGE_ENDED=1795458819")
        assert r.returncode == 0 and "reported to OneGate: IB_STATE=ACTIVE" in r.stdout, r.stdout + r.stderr
        [(path, headers, body)] = gate.requests
        assert path == "/vm" and headers["x-onegate-token"] == TOKEN and headers["x-onegate-vmid"] == "42"
        assert body.decode().splitlines() == ["IB_STATE=ACTIVE", "IB_OUTAGE_SECONDS=5.75",
                                              "IB_OUTAGE_ENDED=1795458819"]
        one_env.write_text('export TOKENTXT="AAAAAAAAAAAAAAAAAAAAAA=="\n')
        r = report(env, "IB_STATE=ACTIVE")
        assert r.returncode == 0 and "did not take IB_STATE=ACTIVE" in r.stdout and "401" in r.stdout, r.stdout
    finally:
        gate.close()
    # nobody there: one line, and on
    r = report({"ONEGATE_ENDPOINT": "http://127.0.0.1:9", "VMID": "42", "TOKENTXT": TOKEN}, "IB_STATE=ACTIVE")
    assert r.returncode == 0 and "did not take" in r.stdout and len(r.stdout.splitlines()) == 1, r.stdout
