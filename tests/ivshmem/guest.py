"""The busybox test guest plus a shared-memory probe: at boot it finds the
ivshmem-plain device (PCI 1af4:1110), prints the host's header from BAR2
and, as told on the kernel command line, writes a word into the region
(ivshmem_write=0x...) or waits until it reads it (ivshmem_read=0x...).
BAR2 is read and written with busybox devmem at the address in the
device's sysfs `resource` file (its third line)."""

from __future__ import annotations

from pathlib import Path

from simhost import guest_image

# sets $dev to the ivshmem-plain device's sysfs folder (empty if none)
FIND = r"""
ivs_find() {
    dev=""
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ] && dev=$d
    done
}
"""

PROBE = FIND + r"""
ivs_probe() {
    ivs_find
    if [ -z "$dev" ]; then echo "ivshmem-guest: no device"; return; fi
    echo 1 > $dev/enable
    bar=$(sed -n 3p $dev/resource | cut -d' ' -f1)
    echo "ivshmem-guest: device $(basename $dev) bar2 $bar"
    echo "ivshmem-guest: header magic $(devmem $bar 32) count $(devmem $((bar + 20)) 32)"
    data=$((bar + 4096))
    for arg in $(cat /proc/cmdline); do
        case "$arg" in
        ivshmem_write=*)
            devmem $data 32 ${arg#ivshmem_write=}
            echo "ivshmem-guest: wrote $(devmem $data 32)" ;;
        ivshmem_read=*)
            want=$(printf '0x%08X' ${arg#ivshmem_read=})
            # fd 3 is the init loop's FIFO: a builtin pause, no `sleep` process
            while [ "$(devmem $data 32)" != "$want" ]; do read -t 0.5 tick <&3; done
            echo "ivshmem-guest: read $want" ;;
        esac
    done
}
ivs_probe &
"""

MARK = f'echo "{guest_image.UP_LINE}"'
PATTERN = 0x5A17C0DE   # what one guest writes at offset 4096 and the other waits for
SAYS = "ivshmem-guest: "


def writes(value: int = PATTERN) -> str:
    """Kernel command line argument: the guest writes `value` into the region."""
    return f"ivshmem_write=0x{value:08X}"


def reads(value: int = PATTERN) -> str:
    """Kernel command line argument: the guest waits until it reads `value` there."""
    return f"ivshmem_read=0x{value:08X}"


def has_read(console: str, value: int = PATTERN) -> bool:
    return f"{SAYS}read 0x{value:08X}" in console


def view(console: str) -> list:
    """The probe's lines on a guest's serial console: what the guest saw."""
    return [line.strip() for line in console.splitlines() if line.startswith(SAYS)]


def ensure_ivshmem_guest() -> guest_image.GuestImage:
    base = guest_image.ensure_guest_image()
    kernel = guest_image.ensure_kernel()
    assert MARK in guest_image.GUEST_INIT
    init = guest_image.GUEST_INIT.replace(MARK, PROBE + MARK)
    files = {'etc/acpi/PWRF/00000080': (guest_image.POWER_BUTTON_ACTION, 0o755)}
    digest = guest_image.content_hash(init, guest_image.GUEST_MODULES, files, kernel.version)
    initrd = guest_image.build_initramfs(guest_image.CACHE_DIR / f'ivshmem-initrd-{digest}.img', init,
                                         kernel.modules_dir, guest_image.GUEST_MODULES, files)
    return guest_image.GuestImage(base.kernel, initrd, base.modules_dir)


PINGPONG = FIND + r"""
pp_run() {
    ivs_find
    for arg in $(cat /proc/cmdline); do
        case "$arg" in
        pp_ip=*) ip=${arg#pp_ip=} ;; pp_peer=*) peer=${arg#pp_peer=} ;;
        pp_role=*) role=${arg#pp_role=} ;; pp_iters=*) iters=${arg#pp_iters=} ;;
        esac
    done
    [ -n "$dev" ] && [ -n "${role:-}" ] || { echo "pingpong-guest: not configured"; return; }
    echo 1 > $dev/enable
    ifconfig eth0 $ip netmask 255.255.255.0 up
    /bin/shm-pingpong shm $dev/resource2 4096 $role $iters
    /bin/shm-pingpong tcp $peer 5000 $role $((iters / 10))
    echo "pingpong-guest: done"
}
pp_run &
"""

PINGPONG_MODULES = guest_image.GUEST_MODULES + ('virtio_pci', 'virtio_net')


def ensure_pingpong_guest(binary) -> guest_image.GuestImage:
    """The test guest with the ping-pong binary and virtio-net: the
    kernel command line says its role, address, peer and iterations."""
    base = guest_image.ensure_guest_image()
    kernel = guest_image.ensure_kernel()
    init = guest_image.GUEST_INIT.replace(MARK, PINGPONG + MARK)
    files = {'etc/acpi/PWRF/00000080': (guest_image.POWER_BUTTON_ACTION, 0o755)}
    digest = guest_image.content_hash(init, PINGPONG_MODULES, files, kernel.version, binary.name)
    dest = guest_image.CACHE_DIR / f'pingpong-initrd-{digest}.img'
    if not dest.exists():
        # build_initramfs writes text files: add the binary to the archive it made
        import gzip
        import shutil
        import subprocess
        import tempfile
        plain = guest_image.build_initramfs(dest.with_suffix('.base'), init, kernel.modules_dir,
                                            PINGPONG_MODULES, files)
        with tempfile.TemporaryDirectory(dir=dest.parent) as stage:
            (Path(stage) / 'bin').mkdir()
            shutil.copy2(binary, Path(stage) / 'bin' / 'shm-pingpong')
            extra = subprocess.run(['cpio', '-o', '-H', 'newc', '-R', '0:0', '--quiet'], cwd=stage,
                                   input=b'bin\nbin/shm-pingpong\n', capture_output=True, check=True).stdout
            tmp = dest.with_name(f'.{dest.name}.tmp')
            # the kernel unpacks concatenated archives in turn
            tmp.write_bytes(plain.read_bytes() + gzip.compress(extra))
            tmp.replace(dest)
    return guest_image.GuestImage(base.kernel, dest, base.modules_dir)
