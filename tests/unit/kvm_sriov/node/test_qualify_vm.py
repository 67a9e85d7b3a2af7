"""kvm-sriov qualify --vm (kvm_sriov/node/qualify_vm.py), rung 1: the fixture
hosts of tests/fixtures/qualify, stand-ins for the installed action scripts
(deploy writes the guest's console as the guest would, cancel ends the VM;
both record how they were called) and a stand-in for what libvirt and the
pool say (the stand-ins' shared state). What a guest prints is written from
the kernel's PCI scan format (drivers/pci/probe.c: "pci %s: [%04x:%04x] type
%02x class %#08x") and the guest report itself (run here by sh on a fixture
tree). The real scripts, libvirt and a guest: tests/driver/l1_driver_vfio.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvm_sriov.ib import guid
from kvm_sriov.node import qualify, qualify_vm
from tests.support.fake_sysfs import FakeSysfs
from tests.unit.kvm_sriov.node import test_qualify as base

fake_qemu, host = base.fake_qemu, base.host   # test_qualify's fixture hosts

IB_VF, IB_PF = "0000:41:00.1", "0000:41:00.0"          # connectx7.json: VF device 101e
NVME_VF, NVME_PF = "0000:03:00.1", "0000:03:00.0"      # nested-nvme.json: QEMU's NVMe, 1b36:0010
GUID = guid.port_guid(qualify_vm.MAC).replace(":", "")
GID = "fe80:0000:0000:0000:" + ":".join(GUID[i:i + 4] for i in range(0, 16, 4))

DEPLOY = '''#!/usr/bin/python3
import json, os, re, sys, pathlib
state = pathlib.Path(os.environ["QUALIFY_STANDIN"])
spec = json.loads(state.read_text())
xml = sys.stdin.read()
spec["calls"].append({"action": "deploy", "argv": sys.argv[1:], "uid": os.geteuid(), "stdin": xml,
                      "cwd": os.getcwd()})
if spec.get("deploy_fails"):
    state.write_text(json.dumps(spec))
    print("INFO: reserving", file=sys.stderr)
    print("not enough free SR-IOV VFs on this host: the VM needs 1", file=sys.stderr)
    sys.exit(1)
spec["running"], spec["vfs"] = True, [spec["vf"]]
console = re.search(r'<source path="([^"]+)"', xml).group(1)
pathlib.Path(console).write_text("".join(line + "\\r\\n" for line in spec["console"]))
state.write_text(json.dumps(spec))
print(re.search(r"<uuid>([^<]+)</uuid>", xml).group(1))
'''

CANCEL = '''#!/usr/bin/python3
import json, os, sys, pathlib
state = pathlib.Path(os.environ["QUALIFY_STANDIN"])
spec = json.loads(state.read_text())
spec["calls"].append({"action": "cancel", "argv": sys.argv[1:], "uid": os.geteuid()})
if spec.get("cancel_fails"):
    state.write_text(json.dumps(spec))
    print("Could not destroy domain", file=sys.stderr)
    sys.exit(1)
spec["running"] = False
if not spec.get("cancel_keeps_vf"):
    spec["vfs"] = []
state.write_text(json.dumps(spec))
'''


class StandInHere:
    """What libvirt and the pool say, from the stand-ins' state."""

    def __init__(self, cfg):
        self.path = Path(os.environ["QUALIFY_STANDIN"])

    def _spec(self):
        return json.loads(self.path.read_text())

    def vm_vfs(self):
        return [tuple(v) for v in self._spec()["vfs"]]

    def held(self):
        return {v for v, _ in self.vm_vfs()}

    def live(self):
        spec = self._spec()
        return spec["running"], ({v: qualify_vm.DOMAIN for v, _ in self.vm_vfs()} if spec["running"] else {})

    def running(self):
        return self.live()[0]


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """(remotes, state(**spec) -> dict now, calls()) of the stand-in scripts."""
    remotes = tmp_path / "remotes"
    for path, text in (("vmm/kvm-sriov/deploy", DEPLOY), ("vmm/kvm-sriov/cancel", CANCEL),
                       ("vmm/kvm/deploy", "#!/bin/sh\nexit 0\n")):
        (remotes / path).parent.mkdir(parents=True, exist_ok=True)
        (remotes / path).write_text(text)
        (remotes / path).chmod(0o755)
    state = tmp_path / "standin.json"
    monkeypatch.setenv("QUALIFY_STANDIN", str(state))
    monkeypatch.setattr(qualify_vm, "Here", StandInHere)
    monkeypatch.setattr(qualify_vm, "POLL_SECONDS", 0.05)

    class S:
        def __init__(self):
            self.remotes = remotes

        def set(self, **spec):
            now = {"calls": [], "running": False, "vfs": [], "console": []}
            now.update(spec)
            state.write_text(json.dumps(now))

        def spec(self):
            return json.loads(state.read_text())

        def calls(self):
            return [c["action"] for c in self.spec()["calls"]]
    return S()


@pytest.fixture
def vm_host(host, tmp_path):
    """(name, **changes) -> config of a fixture host whose datastores are in tmp_path."""
    def build(name="connectx7", **changes):
        (tmp_path / "datastores").mkdir(exist_ok=True)
        return host(name, hpc=False, **changes)._replace(datastore_location=str(tmp_path / "datastores"))
    return build


def run_vm(cfg, vm_options):
    """qualify's whole run with the VM test, as kvm-sriov qualify --vm makes it."""
    return qualify.run(cfg, vm=functools.partial(qualify_vm.run, vm_options))


def vm_args(argv):
    p = argparse.ArgumentParser()
    qualify_vm.add_arguments(p)
    return p.parse_args(argv)


def opts(standin, image, **kw):
    return qualify_vm.VmOptions(image=image, remotes=standin.remotes, **kw)


@pytest.fixture
def image(tmp_path):
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"not booted here")
    return kernel


def ib_console(state="ACTIVE", gid=GID, pkeys="0xffff,0x8001"):
    return ["[    0.512345] pci 0000:01:00.0: [15b3:101e] type 00 class 0x020700 PCIe Endpoint",
            "kvm-sriov-qualify: pci 0000:01:00.0 0x15b3 0x101e",
            f"kvm-sriov-qualify: ib mlx5_0 1 state {state} gid {gid} pkeys {pkeys}",
            "kvm-sriov-qualify: end"]


def vm_checks(checks):
    return {c.name: c for c in checks if c.name.startswith(("VM", "earlier VM"))}


def test_a_vm_on_infiniband_passes_and_is_called_as_opennebula_calls_the_actions(vm_host, standin, image, tmp_path):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console())
    got = vm_checks(run_vm(cfg, opts(standin, image, pkey=0x0001)))
    assert {n: c.status for n, c in got.items()} == {
        "VM deploy": "PASS", "VM VF in the guest": "PASS", "VM IB port": "PASS", "VM PKey": "PASS",
        "VM end": "PASS", "VM VF back in the pool": "PASS"}, got
    assert got["VM VF in the guest"].detail.startswith(f"the guest sees VF {IB_VF} (15b3:101e): the kernel's PCI "
                                                       f"scan, ")
    assert got["VM VF in the guest"].detail.endswith(" s after the deploy")
    assert got["VM IB port"].detail == f"mlx5_0/1 in the guest is ACTIVE, GUID {GUID}"
    assert "0x8001" in got["VM PKey"].detail
    deploy, cancel = standin.spec()["calls"]
    folder = tmp_path / "datastores" / str(qualify_vm.VM_ID) / str(qualify_vm.VM_ID)
    me = qualify_vm.host_name()
    assert deploy["argv"] == [str(folder / "deployment.0"), me, str(qualify_vm.VM_ID), me]
    assert deploy["stdin"].endswith("</domain>\n") and deploy["cwd"] == "/"
    assert f"<source bridge=\"{cfg.bridge}\" />" in deploy["stdin"] and qualify_vm.MAC in deploy["stdin"]
    assert f"<kernel>{image}</kernel>" in deploy["stdin"] and f"<name>{qualify_vm.DOMAIN}</name>" in deploy["stdin"]
    uuid = deploy["stdin"].split("<uuid>")[1].split("</uuid>")[0]
    assert cancel["argv"] == [uuid, me, str(qualify_vm.VM_ID), me]   # the deploy id deploy printed
    assert not folder.parent.exists()    # the VM's folder goes with it


def test_on_an_emulated_pf_the_ib_checks_say_not_infiniband_hardware(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=["pci 0000:01:00.0: [1b36:0010] type 00 class 0x010802"])
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM VF in the guest"].status == "PASS"
    for name in ("VM IB port", "VM PKey"):
        assert got[name].status == "SKIP" and "not InfiniBand hardware" in got[name].detail
    assert [c.status for c in got.values()].count("PASS") == 4


def test_the_guest_report_alone_shows_the_vf(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=["kvm-sriov-qualify: pci 0000:01:00.0 0x1b36 0x0010"])
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert ": the guest report, " in got["VM VF in the guest"].detail


def test_a_vf_the_guest_never_shows_fails_and_the_vm_still_ends(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=["Run /init as init process", "simhost-counter 1"])
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3)))
    seen = got["VM VF in the guest"]
    assert seen.status == "FAIL" and "not within 0 s" in seen.detail and "'simhost-counter 1'" in seen.detail
    assert "quiet" in seen.fix
    assert standin.calls() == ["deploy", "cancel"]
    assert got["VM VF back in the pool"].status == "PASS"


@pytest.mark.parametrize("state", ["INIT", "DOWN"])
def test_a_port_the_sm_does_not_bring_up_fails_naming_virt_enabled(vm_host, standin, image, state):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console(state=state))
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3)))
    assert got["VM IB port"].status == "FAIL" and f"is {state}" in got["VM IB port"].detail
    assert "virt_enabled 2" in got["VM IB port"].fix
    assert got["VM PKey"].status == "SKIP" and got["VM end"].status == "PASS"


def test_a_pkey_missing_from_the_ports_table_fails(vm_host, standin, image):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console(pkeys="0xffff"))
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3, pkey=qualify_vm.pkey("0x8002"))))
    assert got["VM PKey"].status == "FAIL" and "holds not 0x0002" in got["VM PKey"].detail
    assert GUID in got["VM PKey"].fix


def test_an_empty_pkey_table_fails(vm_host, standin, image):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console(pkeys="none"))
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3)))
    assert got["VM PKey"].status == "FAIL" and "holds not any PKey" in got["VM PKey"].detail


def test_a_guid_other_than_the_drivers_fails(vm_host, standin, image):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console(gid="fe80:0000:0000:0000:0000:0000:0000:0000"))
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3)))
    assert got["VM IB port"].status == "FAIL" and f"not the {GUID}" in got["VM IB port"].detail


def test_an_image_without_the_guest_report_is_a_warn_on_infiniband(vm_host, standin, image):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], console=ib_console()[:1])
    got = vm_checks(run_vm(cfg, opts(standin, image, seconds=0.3)))
    assert got["VM VF in the guest"].status == "PASS"
    assert got["VM IB port"].status == "WARN" and "no guest report" in got["VM IB port"].detail
    assert "--guest-report" in got["VM IB port"].fix


def test_a_failed_deploy_is_a_fail_with_its_reason_and_the_clean_up_runs(vm_host, standin, image):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF], deploy_fails=True)
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM deploy"].status == "FAIL"
    assert got["VM deploy"].detail == "deploy exited 1: not enough free SR-IOV VFs on this host: the VM needs 1"
    assert standin.calls() == ["deploy", "cancel"] and got["VM end"].status == "PASS"
    assert "VM VF in the guest" not in got


def test_a_cancel_that_fails_is_a_fail_saying_what_to_do(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=["pci 0000:01:00.0: [1b36:0010] type 00"], cancel_fails=True)
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM end"].status == "FAIL" and "Could not destroy domain" in got["VM end"].detail
    assert "still runs" in got["VM end"].detail and "virsh destroy" in got["VM end"].fix


def test_a_vf_left_in_the_pool_fails(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=["pci 0000:01:00.0: [1b36:0010] type 00"], cancel_keeps_vf=True)
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM end"].status == "PASS"
    back = got["VM VF back in the pool"]
    assert back.status == "FAIL" and f"VF {NVME_VF} is still assigned in the pool" == back.detail
    assert "kvm-sriov reconcile" in back.fix


@pytest.mark.parametrize("error", [KeyboardInterrupt, qualify_vm.Interrupted, RuntimeError])
def test_whatever_breaks_while_the_vm_runs_it_is_ended_and_its_vf_given_back(vm_host, standin, image,
                                                                             monkeypatch, error):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=[])

    def breaks(*_args):
        assert standin.spec()["running"]
        raise error("SIGTERM")
    monkeypatch.setattr(qualify_vm, "watch_guest", breaks)
    if error is RuntimeError:   # a bug: it goes up, after the clean-up
        with pytest.raises(RuntimeError):
            run_vm(cfg, opts(standin, image))
    else:
        got = vm_checks(run_vm(cfg, opts(standin, image)))
        assert got["VM test"].status == "FAIL" and "interrupted" in got["VM test"].detail
        assert got["VM end"].status == "PASS" and got["VM VF back in the pool"].status == "PASS"
    assert standin.calls() == ["deploy", "cancel"]
    assert standin.spec()["vfs"] == [] and not standin.spec()["running"]


def test_sigterm_while_the_guest_boots_ends_the_vm(vm_host, standin, image, monkeypatch):
    """The signal itself, not a stand-in for it: the handler unwinds to the clean-up."""
    import signal
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], console=[])
    monkeypatch.setattr(qualify_vm, "POLL_SECONDS", 0.05)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    old = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        got = vm_checks(run_vm(cfg, opts(standin, image, seconds=30)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert got["VM test"].status == "FAIL" and "SIGTERM" in got["VM test"].detail
    assert standin.calls() == ["deploy", "cancel"] and got["VM end"].status == "PASS"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL   # given back as it was


def test_a_vm_an_earlier_run_left_is_ended_first(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], running=True, vfs=[[NVME_VF, NVME_PF]],
                console=["pci 0000:01:00.0: [1b36:0010] type 00"])
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert standin.calls() == ["cancel", "deploy", "cancel"]
    assert standin.spec()["calls"][0]["argv"][0] == qualify_vm.DOMAIN
    assert got["earlier VM end"].status == "PASS" and got["earlier VM VF back in the pool"].status == "PASS"
    assert got["VM deploy"].status == "PASS"


def test_an_earlier_vm_that_cannot_be_ended_stops_the_test(vm_host, standin, image):
    cfg = vm_host("nested-nvme")
    standin.set(vf=[NVME_VF, NVME_PF], running=True, vfs=[[NVME_VF, NVME_PF]], cancel_fails=True)
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["earlier VM end"].status == "FAIL"
    assert "deploy" not in standin.calls()


def test_missing_action_scripts_are_one_fail_and_nothing_runs(vm_host, standin, image, tmp_path):
    cfg = vm_host()
    standin.set(vf=[IB_VF, IB_PF])
    got = vm_checks(run_vm(cfg, qualify_vm.VmOptions(image=image, remotes=tmp_path / "nothing")))
    assert got["VM deploy"].status == "FAIL" and "is missing" in got["VM deploy"].detail
    assert "onehost sync" in got["VM deploy"].fix
    assert list(got) == ["VM deploy"] and standin.calls() == []   # nothing started: nothing to end


def test_no_datastores_directory_is_a_fail_naming_the_setting(host, standin, image, tmp_path):
    cfg = host("nested-nvme", hpc=False)._replace(datastore_location=str(tmp_path / "nowhere"))
    standin.set(vf=[NVME_VF, NVME_PF])
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM test"].status == "FAIL" and "opennebula.datastore_location" in got["VM test"].detail
    assert "deploy" not in standin.calls()


def test_a_link_in_place_of_qualifys_folder_is_refused(vm_host, standin, image, tmp_path):
    cfg = vm_host("nested-nvme")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "datastores" / str(qualify_vm.DATASTORE)).symlink_to(tmp_path / "elsewhere")
    standin.set(vf=[NVME_VF, NVME_PF])
    got = vm_checks(run_vm(cfg, opts(standin, image)))
    assert got["VM test"].status == "FAIL" and "symbolic link" in got["VM test"].detail
    assert (tmp_path / "elsewhere").is_dir() and "deploy" not in standin.calls()


def test_the_console_is_read_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(qualify_vm, "MAX_CONSOLE_BYTES", 1000)
    path = tmp_path / "console.log"
    path.write_bytes(b"x" * 5000 + b"\npci 0000:01:00.0: [1b36:0010] type 00\n")
    console = qualify_vm.Console(path)
    lines = console.new_lines()
    assert console.too_much and lines == [] and console.new_lines() == []
    os.mkfifo(tmp_path / "fifo")
    fifo = qualify_vm.Console(tmp_path / "fifo")
    assert fifo.new_lines() == [] and fifo.too_much     # no hang
    (tmp_path / "link").symlink_to(path)
    assert qualify_vm.Console(tmp_path / "link").new_lines() == []


def test_hostile_console_lines_are_parsed_strictly():
    view = qualify_vm.GuestView("15b3", "101e")
    for line in ["kvm-sriov-qualify: ib mlx5_0 1 state ACTIVE gid " + "f" * 5000 + " pkeys 0xffff",
                 "kvm-sriov-qualify: ib mlx5_0 1 state ACTIVE gid none pkeys 0xzzzz",
                 "kvm-sriov-qualify: pci x 0x15b3 0x101",
                 "pci 0000:01:00.0: [15b3:101f] type 00"]:
        view.read(line)
    assert view.ports == {} and view.seen_by is None


@pytest.mark.parametrize("shell", [["sh"], ["/bin/busybox", "sh"]])   # a distribution's, a small image's
def test_the_guest_report_run_by_sh_on_a_fixture_tree(tmp_path, shell):
    if not os.path.exists(shell[0]) and shell[0].startswith("/"):
        pytest.skip(f"no {shell[0]} (busybox-static)")
    fs = FakeSysfs(tmp_path / "guest")
    fs.add_device("0000:01:00.0", "15b3", "101e", 0x020700, 0, "mlx5_core")
    port = fs.sys / "class/infiniband/mlx5_0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "pkeys").mkdir()
    (port / "state").write_text("4: ACTIVE\n")
    (port / "gids/0").write_text(GID + "\n")
    for i, key in enumerate(["0xffff", "0x0000", "0x8001"]):
        (port / f"pkeys/{i}").write_text(key + "\n")
    script = tmp_path / "report.sh"
    script.write_text(qualify_vm.GUEST_REPORT)
    (tmp_path / "guest/proc").mkdir()
    (tmp_path / "guest/proc/cmdline").write_text("console=ttyS0 kvm_sriov_qualify.perf=client "
                                                 "kvm_sriov_qualify.ip=169.254.77.2/16 "
                                                 "kvm_sriov_qualify.server=169.254.77.1\n")
    tools = tmp_path / "guest-bin"   # the image's ip and perftest, as stand-ins
    tools.mkdir()
    base.fake_tool(tools, "ip", "")
    base.fake_tool(tools, "ib_write_bw", BW)
    base.fake_tool(tools, "ib_send_lat", LAT)
    done = subprocess.run([*shell, str(script), "once", str(tmp_path / "guest")], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, PATH=f"{tools}:/usr/bin:/bin"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    view = qualify_vm.GuestView("15b3", "101e")
    for line in done.stdout.splitlines():
        view.read(line)
    assert view.seen_by == "the guest report"
    port = view.ports[("mlx5_0", 1)]
    assert (port.state, port.port_guid, port.pkeys) == ("ACTIVE", GUID, [0xFFFF, 0x8001])
    assert "kvm-sriov-qualify: end" in done.stdout.splitlines()
    if shell[0] == "/bin/busybox":   # its own ip applet, not the stand-in: there is no ib0 here
        assert view.perf_end == "no IPoIB interface ib0 (load ib_ipoib)" and view.perf == {}
        return
    # the client's perftest runs, said line by line: what the measuring host reads back
    assert (tools / "ip.args").read_text() == "addr add 169.254.77.2/16 dev ib0\nlink set ib0 up\n"
    assert (tools / "ib_write_bw.args").read_text() == "-D 5 -F -p 18515 169.254.77.1\n"
    assert (tools / "ib_send_lat.args").read_text() == "-F -p 18516 169.254.77.1\n"
    assert view.perf_end == "done"
    assert qualify_vm.parse_perftest("ib_write_bw", "\n".join(view.perf["ib_write_bw"])) == 1861.25
    assert qualify_vm.parse_perftest("ib_send_lat", "\n".join(view.perf["ib_send_lat"])) == 0.97


@pytest.mark.parametrize("argv, said", [
    (["--vm"], "--vm needs --image KERNEL"),
    (["--vm", "--image", "/no/such/kernel"], "--image /no/such/kernel: no such file"),
    (["--peer", "h2"], "--peer goes with --vm"),
    (["--image", "/boot/x"], "--image goes with --vm"),
    (["--vm", "--image", "/no/such/kernel", "--peer", "h2;reboot"], "<--peer> 'h2;reboot' is not a host name"),
])
def test_bad_vm_options_are_one_line_and_exit_1_before_anything_runs(host, argv, said, capsys, standin):
    cfg = host("connectx7")
    assert qualify_vm.run_command(cfg, vm_args(argv)) == 1
    out = capsys.readouterr()
    assert out.err == f"kvm-sriov qualify: {said}" + out.err[len("kvm-sriov qualify: ") + len(said):]
    assert out.err.count("\n") == 1 and out.out == ""


@pytest.mark.parametrize("text, key", [("0x8001", 1), ("32769", 1), ("0x0001", 1), ("1", 1), ("0xffff", 0x7FFF),
                                       ("0x7fff", 0x7FFF)])
def test_pkeys_as_given(text, key):
    assert qualify_vm.pkey(text) == key


@pytest.mark.parametrize("text", ["0x0000", "0x8000", "0x10000", "abc", "-1", "0x8001 0x8002"])
def test_bad_pkeys(text):
    with pytest.raises(ValueError):
        qualify_vm.pkey(text)


def test_guest_report_prints_the_script(host, capsys):
    assert qualify_vm.run_command(host("connectx7"), vm_args(["--guest-report"])) == 0
    assert capsys.readouterr().out == qualify_vm.GUEST_REPORT


def test_the_vm_options_on_both_command_lines():
    from kvm_sriov import cli
    argv = ["--vm", "--image", "k", "--peer", "h2", "--pkey", "0x8001", "--vm-seconds", "60", "--write-test"]
    for args in (cli.build_parser().parse_args(["qualify", *argv]), vm_args(argv)):
        assert (args.vm, args.image, args.peer, args.pkey, args.vm_seconds, args.write_test) == \
            (True, "k", "h2", "0x8001", 60, True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the actions run as the state folder's owner")
def test_run_as_root_the_actions_run_as_the_pools_owner(standin, image, host, monkeypatch):
    """The state folder is nobody's here (oneadmin's on a host): the actions,
    and the VM test's looks at the pool, run as that user, as OpenNebula runs
    them; files root made there would lock the driver's user out."""
    import tempfile
    top = Path(tempfile.mkdtemp(prefix="qualify-vm-"))   # out of pytest's root-only folder
    try:
        top.chmod(0o755)
        (top / "state").mkdir()
        (top / "datastores").mkdir()
        for d in (top / "state", top / "datastores"):
            os.chown(d, 65534, 65534)
        remotes = top / "remotes"
        subprocess.run(["cp", "-a", str(standin.remotes), str(remotes)], check=True)
        standin.set(vf=[NVME_VF, NVME_PF], console=["pci 0000:01:00.0: [1b36:0010] type 00"])
        state = top / "standin.json"
        subprocess.run(["cp", os.environ["QUALIFY_STANDIN"], str(state)], check=True)
        os.chown(state, 65534, 65534)
        monkeypatch.setenv("QUALIFY_STANDIN", str(state))
        cfg = host("nested-nvme", hpc=False)._replace(state_dir=top / "state",
                                                     datastore_location=str(top / "datastores"))
        got = vm_checks(run_vm(cfg, qualify_vm.VmOptions(image=image, remotes=remotes, seconds=0.3)))
        assert [c["uid"] for c in json.loads(state.read_text())["calls"]] == [65534, 65534]
        assert got["VM deploy"].status == "PASS" and got["VM end"].status == "PASS", got
        assert os.geteuid() == 0   # qualify itself stays root (its reports, sminfo)
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=True)


# -- --peer: perftest ------------------------------------------------------------------------
PERFTEST = Path(__file__).resolve().parents[3] / "harness" / "data"   # perftest's own output (README there)
BW = (PERFTEST / "perftest_send_bw.txt").read_text()      # a BW table: "BW average[MB/sec]" 1861.25
LAT = (PERFTEST / "perftest_write_lat.txt").read_text()   # a latency table: "t_typical[usec]" 0.97

FAKE_SSH = '''#!/bin/sh
host=$1; shift
echo "$host $*" >> "$PEER_LOG"
case "$1" in
    kvm-sriov) echo "[PASS] VM perftest server  the guest served ib_write_bw, ib_send_lat"; exit 0 ;;
    stdbuf) [ -n "$PEER_SILENT" ] && exec sleep 30
            printf '%s\\n' '************************************' '* Waiting for client to connect... *'; sleep 0.3 ;;
esac
'''


def test_perftest_figures_from_perftests_own_tables():
    assert qualify_vm.parse_perftest("ib_write_bw", BW) == 1861.25
    assert qualify_vm.parse_perftest("ib_send_lat", LAT) == 0.97
    assert qualify_vm.parse_perftest("ib_write_bw", LAT) is None
    assert qualify_vm.parse_perftest("ib_send_lat", "Couldn't connect to 169.254.77.1:18516") is None
    assert qualify_vm.parse_perftest("ib_write_bw", BW.replace("1861.25", "lots")) is None


def perf_console(tools=(("ib_write_bw", BW.replace("1861.25", "1500.5")), ("ib_send_lat", LAT.replace("0.97", "1.94")))):
    lines = ib_console()
    for tool, text in tools:
        lines += [f"kvm-sriov-qualify: perf {tool}: {line.strip()}" for line in text.splitlines()]
        lines.append(f"kvm-sriov-qualify: perf {tool} end")
    return lines + ["kvm-sriov-qualify: perf done"]


@pytest.fixture
def perf_host(vm_host, tmp_path, monkeypatch):
    """An InfiniBand fixture host whose peer is a stand-in ssh, and perftest
    clients here printing perftest's tables."""
    bin_dir = tmp_path / "bin"   # fake_qemu's: already first on PATH
    for tool, text in (("ib_write_bw", BW), ("ib_send_lat", LAT)):
        base.fake_tool(bin_dir, tool, text)
    ssh = tmp_path / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PEER_LOG", str(tmp_path / "peer.log"))
    monkeypatch.setattr(qualify_vm, "PERF_SECONDS", 5)
    cfg = vm_host()
    return cfg._replace(peer_command=(str(ssh), "{host}"))


def test_peer_perftest_vm_to_vm_and_host_to_host_with_their_ratio(perf_host, standin, image, tmp_path):
    standin.set(vf=[IB_VF, IB_PF], console=perf_console())
    o = opts(standin, image, peer="h2")
    every = run_vm(perf_host, o)
    got, checks = vm_checks(every), {c.name: c for c in every if c.name.startswith("perftest")}
    assert checks["perftest ib_write_bw"].status == "PASS"
    assert checks["perftest ib_write_bw"].detail == ("VM to VM 1500.5 MB/s, host to host 1861.25 MB/s: "
                                                     "VM/host 0.81")
    assert checks["perftest ib_send_lat"].detail == "VM to VM 1.94 us, host to host 0.97 us: VM/host 2.00"
    assert checks["perftest peer VM"].status == "PASS"
    peer_calls = (tmp_path / "peer.log").read_text().splitlines()
    assert peer_calls[0] == f"h2 kvm-sriov qualify --vm --perf-serve --image {image} --vm-seconds 300"
    assert "h2 stdbuf -oL ib_write_bw -D 5 -F -p 18515" in peer_calls
    assert (tmp_path / "bin/ib_write_bw.args").read_text().split() == \
        ["-d", "mlx5_0", "-i", "1", "-D", "5", "-F", "-p", "18515", "h2"]
    deploy = standin.spec()["calls"][0]["stdin"]
    assert "kvm_sriov_qualify.perf=client kvm_sriov_qualify.ip=169.254.77.2/16 " \
           "kvm_sriov_qualify.server=169.254.77.1" in deploy
    assert got["VM end"].status == "PASS"


def test_peer_without_infiniband_is_one_line_and_no_peer_is_asked(vm_host, standin, image, tmp_path):
    cfg = vm_host("nested-nvme")._replace(peer_command=("false", "{host}"))
    standin.set(vf=[NVME_VF, NVME_PF], console=["pci 0000:01:00.0: [1b36:0010] type 00"])
    checks = [c for c in run_vm(cfg, opts(standin, image, peer="h2")) if c.name.startswith("perftest")]
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("perftest", "SKIP", "not InfiniBand hardware: nothing to measure")]


def test_peer_without_perftest_is_one_line(vm_host, standin, image, monkeypatch):
    monkeypatch.setattr(qualify_vm.shutil, "which", lambda name: None)
    standin.set(vf=[IB_VF, IB_PF], console=ib_console())
    checks = [c for c in run_vm(vm_host(), opts(standin, image, peer="h2")) if c.name.startswith("perftest")]
    assert [(c.name, c.status) for c in checks] == [("perftest", "WARN")]
    assert checks[0].detail == "ib_write_bw and ib_send_lat not installed here: nothing measured"
    assert "apt-get install perftest" in checks[0].fix


def test_a_silent_peer_server_and_guests_without_results_are_warns_in_bounded_time(perf_host, standin, image,
                                                                                   monkeypatch):
    monkeypatch.setenv("PEER_SILENT", "1")
    monkeypatch.setattr(qualify_vm, "PERF_SECONDS", 1)
    standin.set(vf=[IB_VF, IB_PF], console=ib_console() + ["kvm-sriov-qualify: perf failed: no IPoIB interface "
                                                            "ib0 (load ib_ipoib)"])
    checks = {c.name: c for c in run_vm(perf_host, opts(standin, image, peer="h2", seconds=1))}
    bw = checks["perftest ib_write_bw"]
    assert bw.status == "WARN" and "VM to VM: no IPoIB interface ib0" in bw.detail
    assert "did not start" in bw.detail and "perftest in the guest image" in bw.fix
    assert checks["VM end"].status == "PASS"


def test_a_peer_path_ssh_would_split_is_refused(tmp_path, host):
    odd = tmp_path / "my kernel"
    odd.write_text("x")
    with pytest.raises(ValueError, match="takes letters, digits"):
        qualify_vm.options(vm_args(["--vm", "--image", str(odd), "--peer", "h2"]))
    with pytest.raises(ValueError, match="one host measures"):
        qualify_vm.options(vm_args(["--vm", "--image", str(odd), "--perf-serve", "--peer", "h2"]))


def test_the_serving_side_keeps_its_vm_until_the_guest_has_served(vm_host, standin, image):
    standin.set(vf=[IB_VF, IB_PF], console=ib_console() + ["kvm-sriov-qualify: perf ib_write_bw end",
                                                            "kvm-sriov-qualify: perf ib_send_lat end",
                                                            "kvm-sriov-qualify: perf done"])
    o = opts(standin, image, perf_serve=True)
    got = vm_checks(run_vm(vm_host(), o))
    assert got["VM perftest server"].status == "PASS"
    assert "kvm_sriov_qualify.perf=server kvm_sriov_qualify.ip=169.254.77.1/16" in standin.spec()["calls"][0]["stdin"]


def test_here_reads_the_real_pool_and_libvirt(make_config, tmp_path):
    """What the VM test asks the host: the pool read-only (its own transaction
    while the file is not in WAL mode yet), libvirt's test driver."""
    from kvm_sriov.vf import pool
    import sqlite3
    cfg = make_config(tmp_path / "root", libvirt={"uri": "test:///default"})
    here = qualify_vm.Here(cfg)
    assert (here.vm_vfs(), here.held(), here.running(), here.live()) == ([], set(), False, (False, {}))
    cfg.state_dir.mkdir(mode=0o750)
    sqlite3.connect(cfg.pool_db).close()   # a database not in WAL mode: read in the pool's own transaction
    cfg.pool_db.chmod(0o640)
    assert here.vm_vfs() == []
    p = pool.VfPool(cfg.pool_db)
    try:
        with p.transaction() as txn:
            txn.add(IB_VF, IB_PF, qualify_vm.VM_ID, qualify_vm.DOMAIN, qualify_vm.MAC, "attached", "deploy")
            txn.add("0000:41:00.2", IB_PF, 7, "one-7", "02:00:0a:00:00:07", "attached", "deploy")
    finally:
        p.close()
    assert here.vm_vfs() == [(IB_VF, IB_PF)]
    assert here.held() == {IB_VF, "0000:41:00.2"}
