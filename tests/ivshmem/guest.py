"""The busybox test guest plus a shared-memory probe: at boot it finds the
ivshmem-plain device (PCI 1af4:1110), prints the host's header from BAR2
and, as told on the kernel command line, writes a word into the region
(ivshmem_write=0x...) or waits until it reads it (ivshmem_read=0x...).
BAR2 is read and written with busybox devmem at the address in the
device's sysfs `resource` file (its third line)."""

from __future__ import annotations

from simhost import guest_image

PROBE = r"""
ivs_probe() {
    dev=""
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ] && dev=$d
    done
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
            while [ "$(devmem $data 32)" != "$want" ]; do sleep 0.5; done
            echo "ivshmem-guest: read $want" ;;
        esac
    done
}
ivs_probe &
"""

MARK = 'echo "simhost-guest: up"'


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
