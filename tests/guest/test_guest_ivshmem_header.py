"""The guest IVShmem tool (contextualization/ivshmem/kvm-sriov-ivshmem) and a
header written by a VM of its group: every VM maps the whole region, header
included, read-write, so the tool checks each field against the device's
real size (BAR2: here a regular file behind a fake sysfs resource2, whose size
is the BAR's as sysfs gives it) and publishes nothing from a bad header:
one line, no traceback, the device's files removed; the watch loop lives on
and publishes again once the host rewrites the header."""
import os
import struct
import subprocess
import time

import pytest

from guest_helpers import CTX

TOOL = CTX / "ivshmem" / "kvm-sriov-ivshmem"
HEAD = struct.Struct("<8sIIIIQII")   # docs/ivshmem.md, "What the guest sees"
MIB = 1 << 20


def header(generation=2, hbytes=4096, count=None, size=MIB, uid=3, vmgroup=7, vms=(51, 52, 60),
           magic=b"KSRIVSHM", version=1) -> bytes:
    count = len(vms) if count is None else count
    body = HEAD.pack(magic, version, generation, hbytes, count, size, uid, vmgroup)
    return (body + struct.pack(f"<{len(vms)}I", *vms)).ljust(4096, b"\0")


def region(path, head: bytes, size=MIB):
    """The region file: `head` at its start, `size` bytes in all."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def device(tmp_path, size=MIB, head=None):
    sysfs, run = tmp_path / "sys", tmp_path / "run"
    dev = sysfs / "bus" / "pci" / "devices" / "0000:07:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1af4\n")
    (dev / "device").write_text("0x1110\n")
    (dev / "enable").write_text("0\n")
    region(tmp_path / "region", header() if head is None else head, size)
    (dev / "resource2").symlink_to(tmp_path / "region")
    return sysfs, run


def publish(sysfs, run):
    # the timeout only guards against a hang; no speed is asserted
    return subprocess.run(["/usr/bin/python3", str(TOOL), "publish", "--sysfs", str(sysfs), "--run", str(run),
                           "--vmid", "52"], capture_output=True, text=True, timeout=60)


def test_a_good_header_is_published(tmp_path):
    sysfs, run = device(tmp_path)
    r = publish(sysfs, run)
    assert r.returncode == 0, r.stderr
    out = run / "ivshmem" / "0"
    assert (out / "size").read_text() == f"{MIB}\n" and (out / "offset").read_text() == "4096\n"
    assert (out / "peers").read_text().split() == ["51", "60"]
    assert f"KVM_SRIOV_IVSHMEM_SIZE={MIB}\n" in (run / "ivshmem" / "env").read_text()


BAD_HEADERS = [
    (header()[:100], 100, "less than its 4096-byte header"),                   # a region shorter than a header
    (b"", 0, "less than its 4096-byte header"),
    (header(hbytes=0), MIB, "header bytes 0"),                                # count went negative: struct.error
    (header(hbytes=10), MIB, "header bytes 10"),
    (header(hbytes=1 << 31, count=1 << 28), MIB, "header bytes"),              # ids read past the 4096 bytes
    (header(hbytes=MIB + 4096), MIB, "header bytes"),                          # offset past the region
    (header(size=2 ** 64 - 1), MIB, "region size 18446744073709551615"),       # published as is before
    (header(size=2 * MIB), MIB, "the device's is 1048576"),                    # more than the BAR
    (header(size=4096), MIB, "region size 4096"),                              # no room after the header
    (header(count=2 ** 32 - 1), MIB, "room for"),
    (header(vms=(60, 51)), MIB, "not ascending"),
    (header(vms=(2 ** 32 - 1,)), MIB, "not ascending"),
    (header(version=7), MIB, "version 7"),
    (header(magic=b"XXXXXXXX"), MIB, "no kvm-sriov header"),
]


@pytest.mark.parametrize("head, size, why", BAD_HEADERS, ids=[why for _, _, why in BAD_HEADERS])
def test_a_bad_header_is_one_line_and_nothing_of_it_is_published(tmp_path, head, size, why):
    sysfs, run = device(tmp_path, size=size, head=head)
    r = publish(sysfs, run)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("kvm-sriov-ivshmem: ") and why in r.stderr, r.stderr
    assert not (run / "ivshmem" / "env").exists()
    assert not (run / "ivshmem" / "0" / "size").exists() and not (run / "ivshmem" / "0" / "offset").exists()


def test_a_header_gone_bad_takes_back_what_was_published(tmp_path):
    sysfs, run = device(tmp_path)
    assert publish(sysfs, run).returncode == 0
    region(tmp_path / "region", header(size=2 ** 64 - 1))
    assert publish(sysfs, run).returncode == 1
    assert sorted(p.name for p in (run / "ivshmem").rglob("*") if p.is_file()) == []


def wait_for(predicate, what, proc):
    deadline = time.monotonic() + 60  # a hang guard, not a speed check
    while not predicate():
        assert proc.poll() is None, f"the watch loop died while waiting for {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {what} in 60 s"
        time.sleep(0.05)


@pytest.mark.parametrize("bad", [header(hbytes=0), header(size=2 ** 64 - 1), b"short"],
                         ids=["header bytes 0", "size 2^64-1", "region shrunk"])
def test_the_watch_loop_outlives_a_bad_header_and_republishes_when_it_is_rewritten(tmp_path, bad):
    sysfs, run = device(tmp_path)
    size_file = run / "ivshmem" / "0" / "size"
    proc = subprocess.Popen(["/usr/bin/python3", str(TOOL), "watch", "--every", "0.05", "--sysfs", str(sysfs),
                             "--run", str(run), "--vmid", "52"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(size_file.exists, "first publish", proc)
        # a VM of the group scribbles over the header (or the region shrinks under it)
        if bad == b"short":
            os.truncate(tmp_path / "region", len(bad))
        else:
            region(tmp_path / "region", bad)
        wait_for(lambda: not size_file.exists(), "withdrawal of the bad header's values", proc)
        time.sleep(0.5)   # a few more rounds of the loop with the header still bad
        assert proc.poll() is None
        # the host rewrites the header at the next join or leave
        region(tmp_path / "region", header(generation=4, vms=(52, 60)))
        wait_for(lambda: (run / "ivshmem" / "0" / "generation").exists() and
                 (run / "ivshmem" / "0" / "generation").read_text() == "4\n", "republish", proc)
        assert (run / "ivshmem" / "0" / "peers").read_text() == "60\n"
        assert size_file.read_text() == f"{MIB}\n"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    lines = err.splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("kvm-sriov-ivshmem: "), err
