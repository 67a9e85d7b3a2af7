"""The demo's own parts (simhost/demo.py): progress lines, the closing summary,
what "booted" means, and the guest kernel it boots uncompressed (PVH)."""

import io
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simhost import demo, guest_image
from simhost.guest_image import COUNTER_PREFIX, UP_LINE

pytestmark = pytest.mark.libvirt   # sim-libvirt runs them: QEMU and the cached kernel

REPO = Path(__file__).resolve().parents[2]
XEN_ELFNOTE_PHYS32_ENTRY = 18


def test_a_boot_is_up_once_its_init_said_so_and_counted():
    first = f"kernel noise\n{UP_LINE}\n{COUNTER_PREFIX}0\n{COUNTER_PREFIX}1\n"
    assert not demo.booted("", 1)
    assert not demo.booted(f"{UP_LINE}\n", 1)           # acpid listens, nothing counted yet
    assert demo.booted(first, 1)
    assert not demo.booted(first, 2)                      # the reboot has not come up
    assert not demo.booted(first + f"{UP_LINE}\n", 2)     # the counter seen is the first boot's
    assert demo.booted(first + f"{UP_LINE}\n{COUNTER_PREFIX}0\n", 2)


def test_a_quiet_demo_says_what_it_waits_for_at_least_every_interval():
    out = io.StringIO()
    progress = demo.Progress(out, every=0.3).start()
    try:
        with progress.doing(lambda: "waiting for VM 100's boot #1: booting"):
            time.sleep(1.2)
        lines = out.getvalue().splitlines()
        assert len(lines) >= 2, lines
        assert all(line.startswith("  ... waiting for VM 100's boot #1: booting (") for line in lines)
        # nothing to say when no one waits
        seen = len(lines)
        time.sleep(0.8)
        assert len(out.getvalue().splitlines()) == seen
    finally:
        progress.stop.set()


def test_a_demo_that_prints_is_not_interrupted_by_progress_lines():
    out = io.StringIO()
    progress = demo.Progress(out, every=10)
    with progress.doing("deploy of VM 100 on h1 still running"):
        progress.write("[h1] $ deploy\n")
        progress.tick()
    assert out.getvalue() == "[h1] $ deploy\n"


def test_the_summary_gives_each_step_ok_its_line_and_seconds_and_the_total():
    stages = demo.Stages()
    stages.begin("0", "install")
    stages.shown("install: both hosts")
    stages.begin("1", "deploy VMs 100 and 101 on h1")
    stages.shown("deploy: VM 100 got 03:00.1")
    stages.begin("2", "deploy VM 102 on a full h1: refused")
    stages.end("FAILED")
    lines = stages.summary(412.4)
    assert lines[0].split() == ["ok", "0.", "install:", "both", "hosts", "(0s)"]
    assert lines[1].startswith("  ok") and "1. deploy: VM 100 got 03:00.1  (" in lines[1]
    assert lines[2].startswith("  FAILED") and "2. deploy VM 102 on a full h1: refused" in lines[2]
    assert lines[3] == "  2 of 3 steps ok, 412s in the nested host"


def _elf_notes(path: Path):
    """(name, type) of each note in an ELF64's PT_NOTE segments."""
    data = path.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type != 4:
            continue
        at, end = p_offset, p_offset + p_filesz
        while at + 12 <= end:
            namesz, descsz, kind = struct.unpack_from("<III", data, at)
            name = data[at + 12:at + 12 + namesz].rstrip(b"\0").decode()
            yield name, kind
            at += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4


def test_the_guest_kernel_is_the_bzimage_s_own_elf_with_a_pvh_entry():
    kernel = guest_image.uncompressed_kernel()
    assert kernel.name.startswith("vmlinux-")
    assert kernel.read_bytes()[:4] == b"\x7fELF"
    assert ("Xen", XEN_ELFNOTE_PHYS32_ENTRY) in set(_elf_notes(kernel))
    # every suite's guests boot it too (an L2 boot in the nested host: 75 s -> 45 s)
    assert guest_image.ensure_guest_image().kernel == kernel


def test_the_demo_guest_boots_through_the_pvh_entry(tmp_path):
    image = demo.images()["plain"]
    console = tmp_path / "console.log"
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-machine", "q35", "-m", "128", "-nodefaults",
         "-display", "none", "-no-reboot", "-kernel", str(image.kernel), "-initrd", str(image.initrd),
         "-append", demo.DEFAULT_CMDLINE, "-serial", f"file:{console}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and qemu.poll() is None:
            if console.exists() and demo.booted(console.read_text(errors="replace"), 1):
                break
            time.sleep(0.5)
        text = console.read_text(errors="replace") if console.exists() else ""
        assert demo.booted(text, 1), text[-2000:]
    finally:
        qemu.kill()
        qemu.wait()


def test_prepare_on_a_warm_cache_says_it_was_cached():
    run = [sys.executable, "-m", "simhost.demo", "--prepare"]
    subprocess.run(run, cwd=REPO, check=True, capture_output=True)
    again = subprocess.run(run, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.startswith("first run: nothing to do"), again.stdout
    assert (demo.CACHE_DIR / "demo-images.json").exists()


def test_a_success_line_carries_only_what_the_script_printed_on_stdout(monkeypatch, capsys):
    """The stock restore's `virsh dominfo` complaint goes to the VM log (stderr), not onto the
    RESTORE SUCCESS line; a failure still shows OpenNebula's reason."""
    class Host:
        def nsenter(self):
            return []
    answers = iter([demo.Result(0, "", "error: failed to get domain 'one-101'\nINFO: plugged"),
                    demo.Result(1, "", "not enough free SR-IOV VFs on this host")])
    monkeypatch.setattr(demo, "one_call", lambda *a, **k: next(answers))
    cluster = demo.Cluster({"h1": Host()})
    cluster.configs["h1"] = Path("/nonexistent/kvm-sriov.toml")
    vm = type("VM", (), {"vmid": 101})()
    cluster.call("h1", "restore", ["checkpoint", "h1"], vm)
    cluster.call("h1", "deploy", ["deployment.0", "h1"], vm)
    lines = capsys.readouterr().out.splitlines()
    assert "  | error: failed to get domain 'one-101'" in lines
    assert [line.rsplit(" (", 1)[0] for line in lines if line.startswith("  -> ")] == [
        "  -> RESTORE SUCCESS 101 -", "  -> DEPLOY FAILURE 101 not enough free SR-IOV VFs on this host"]


def test_a_shutdown_is_the_guest_s_own_power_off_only_after_its_last_boot():
    before_reboot = f"{UP_LINE}\n{COUNTER_PREFIX}0\nsimhost-guest: {demo.POWERING_OFF}\n"
    assert demo.powered_itself_off(before_reboot)
    assert not demo.powered_itself_off(before_reboot + f"{UP_LINE}\n{COUNTER_PREFIX}0\n")
    assert demo.powered_itself_off(before_reboot + f"{UP_LINE}\nsimhost-guest: {demo.POWERING_OFF}\n")
