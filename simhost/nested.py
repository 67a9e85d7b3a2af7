"""Rung 3: real SR-IOV + VFIO, nested one level.

`run_in_l1(command)` boots an outer QEMU (TCG) guest "L1" with an emulated
Intel IOMMU and QEMU's emulated NVMe controller, which implements SR-IOV.
L1's root is this machine's own root filesystem, shared read-only over 9p
with a tmpfs overlay on top, so L1 runs the installed libvirt, QEMU, python
and this repository unchanged at the same paths. In L1 the NVMe PF gets
`vfs` VFs (each in its own IOMMU group, left unbound), virtlogd and libvirtd
start (qemu:///system), then the command runs as root; its output streams
back over a second serial port and its exit status over a writable 9p share
(the run folder, mounted in L1 at the same path). Then L1 powers off.

L1 has two NUMA nodes, and on each an expander bus (pxb-pcie) holding a PCIe
switch with an SR-IOV PF and a stand-in GPU (GPU_SWITCHES): what a GPU
server's tree looks like to kvm-sriov (docs/gpu.md). They sit above the
root complex's bus numbers, so the PF at PF_ADDRESS stays where it was.

    /usr/bin/python3 -m simhost.nested [--vfs N] [--memory MiB] [--cwd DIR] -- COMMAND...
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from simhost.guest_image import (CACHE_DIR, build_initramfs, content_hash, uncompressed_kernel,
                                 ensure_kernel)
from simhost.libvirt_host import write_config
from simhost.prereq import MissingProgram, require

# PCI layout of L1: root ports at 00:02.0, 00:03.0, 00:04.0 get buses 1, 2, 3;
# the NVMe PF sits behind the third, its VFs follow it as functions 1..N.
PF_ADDRESS = '0000:03:00.0'
MAX_VFS = 4
DEFAULT_VFS = 4
DEFAULT_MEMORY_MIB = 3072
DEFAULT_TIMEOUT = 1800  # an L2 guest inside needs ~90 s to honour ACPI
SETUP_FAILED = 125      # exit status when L1 could not get to the command



class GpuSwitch(NamedTuple):
    """One PCIe switch of L1 behind an expander bus of its own (pxb-pcie on
    NUMA node `node`, root bus `bus_nr`): a root port, QEMU's x3130 upstream
    port, and below it two ports, one with the stand-in GPU and one with an
    SR-IOV PF (QEMU's NVMe, VFS_PER_SWITCH_PF VFs, left disabled).

    The ports below the upstream port are pcie-root-ports, not QEMU's
    xio3130 downstream ports: in QEMU 7.2 those have no ACS capability
    (only AER; QEMU 8.0 added ACS), so L1's kernel would put a PF and its
    VFs in one IOMMU group with the port (no VF could go to a guest while
    the PF is on nvme), and libvirt refuses any device below one ("behind a
    switch lacking ACS"). A pcie-root-port has ACS, so each VF and the GPU
    are in a group of their own; in sysfs the shape is a switch's all the
    same (bridge below the root port, bridge below that), which is what
    kvm-sriov reads.

    The stand-in GPU is QEMU's ati-vga: vendor 1002 (ATI/AMD), class 0x0300
    (VGA), so a GPU by kvm-sriov's own rule (topology.is_gpu), and a plain
    PCI function vfio-pci takes and passes to a guest. No option ROM: the
    firmware would run a VGA BIOS, and a guest's through VFIO."""
    node: int
    bus_nr: int

    def _at(self, bus_offset: int, slot: int = 0, function: int = 0) -> str:
        return f'0000:{self.bus_nr + bus_offset:02x}:{slot:02x}.{function}'

    # the firmware numbers the buses below the root bus depth first
    @property
    def root_port(self) -> str:
        return self._at(0)

    @property
    def upstream_port(self) -> str:
        return self._at(1)

    @property
    def gpu_port(self) -> str:
        return self._at(2, 0)

    @property
    def pf_port(self) -> str:
        return self._at(2, 1)

    @property
    def gpu(self) -> str:
        return self._at(3)

    @property
    def pf(self) -> str:
        return self._at(4)

    def vf_addresses(self, n: int) -> list:
        return [self._at(4, 0, i) for i in range(1, n + 1)]


# far above the root complex's buses (1-3), so none of those moves
GPU_SWITCHES = (GpuSwitch(node=0, bus_nr=0x40), GpuSwitch(node=1, bus_nr=0x80))
VFS_PER_SWITCH_PF = 2
GPU_STAND_IN = ('1002', '5046')     # ati-vga (Rage 128 Pro), vendor:device
NUMA_NODES = 2

L1_MODULES = ('virtio_pci', '9pnet_virtio', '9p', 'overlay')
NINEP = 'trans=virtio,version=9p2000.L,msize=262144'


def vf_addresses(n: int = DEFAULT_VFS) -> list:
    """PCI addresses of L1's VFs: 0000:03:00.1 .. 0000:03:00.<n>."""
    return [f'{PF_ADDRESS[:-1]}{i}' for i in range(1, n + 1)]


# Stage 1, the initramfs: host root (9p, read-only) + tmpfs -> overlay, then
# the run folder's share at its host path, and switch_root into stage 2.
L1_INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
fail() {{ echo "simhost-l1: $*"; poweroff -f; }}
for m in $(cat /etc/modules.order); do insmod /lib/modules/$m || fail "insmod $m"; done
for arg in $(cat /proc/cmdline); do
    case $arg in simhost.io=*) IO=${{arg#simhost.io=}};; esac
done
mkdir -p /lower /rw /newroot
# cache=loose: the lower layer never changes while L1 runs
mount -t 9p -o {NINEP},ro,cache=loose hostroot /lower || fail "mount hostroot"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \\
    || fail "mount overlay"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
# no tmpfs over /tmp: the checkout (CI clones it anywhere, /tmp included)
# must stay visible; the overlay already makes /tmp writable.
mkdir -p /newroot$IO
mount -t 9p -o {NINEP} simio /newroot$IO || fail "mount simio"
for d in proc sys dev; do mount --move /$d /newroot/$d; done
exec switch_root /newroot /bin/sh $IO/stage2.sh
"""

# Stage 2, PID 1 on the overlay root, with the host's own tools.
STAGE2 = """#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
IO={io}
export SIMHOST_IO=$IO
PF=/sys/bus/pci/devices/{pf}
say() {{ echo "simhost-l1: $*"; }}
finish() {{ echo "$1" > $IO/exit-status; sync; /bin/busybox poweroff -f; }}
wait_for() {{  # wait_for SECONDS TEST-ARGS...
    n=$(($1 * 5)); shift
    while ! test "$@"; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.2; done
}}
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# what udev/systemd make on a real host: bash's <(...) needs /dev/fd
# (OpenNebula's scripts_common.sh uses it)
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
# the extracted Debian kernel's modules, for modprobe
mkdir -p /lib/modules/{kver}
mount --bind {modules_dir} /lib/modules/{kver}
# a fresh libvirt: never the host's definitions, state or logs
for d in /etc/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt; do
    mkdir -p $d && mount -t tmpfs tmpfs $d
done
cp $IO/etc-libvirt/* /etc/libvirt/
modprobe nvme && modprobe vfio-pci || {{ say "modprobe failed"; finish {failed}; }}
wait_for 60 -e $PF/driver || {{ say "nvme did not bind {pf}"; finish {failed}; }}
# VFs stay unbound: libvirt binds them to vfio-pci when a guest gets one
# QEMU's ACPI gives the root complex (pcie.0) no _PXM, so on this 2-node L1
# its devices have no NUMA node, as no 2-socket host's firmware leaves them:
# node 0, through the kernel's override for such firmware
[ "$(cat $PF/numa_node)" != -1 ] || echo 0 > $PF/numa_node
echo 0 > $PF/sriov_drivers_autoprobe
echo {vfs} > $PF/sriov_numvfs || {{ say "sriov_numvfs failed"; finish {failed}; }}
virtlogd -d && libvirtd -d
wait_for 60 -S /run/libvirt/libvirt-sock || {{ say "libvirtd did not start"; finish {failed}; }}
say "ready, running the command"
stty -F /dev/ttyS1 raw -echo
(cd {cwd} && exec /bin/sh $IO/command.sh) </dev/null >/dev/ttyS1 2>&1
finish $?
"""


class L1Error(RuntimeError):
    """L1 ended without reporting the command's exit status."""


def ensure_l1_initrd(cache_dir: Path = CACHE_DIR):
    """(KernelTree, initramfs path) for L1, built once."""
    kernel = ensure_kernel(cache_dir)
    digest = content_hash(L1_INIT, L1_MODULES, kernel.version)
    initrd = build_initramfs(cache_dir / f'l1-initrd-{digest}.img', L1_INIT,
                             kernel.modules_dir, L1_MODULES)
    uncompressed_kernel(cache_dir, kernel)   # made here, once, before any L1 boots
    return kernel, initrd


def qemu_command(kernel, initrd: Path, io: Path, memory_mib: int, forward_ports=(), cpu: str = 'qemu64') -> list:
    nvme = ('nvme,serial=simhost-pf,id=nvme0,subsys=subsys0,bus=rp3,'
            f'sriov_max_vfs={MAX_VFS},sriov_vq_flexible=8,sriov_vi_flexible=4,'
            'max_ioqpairs=10,msix_qsize=5')
    return [
        'qemu-system-x86_64', '-accel', 'tcg,thread=multi', '-machine', 'q35',
        # not 'max': glibc then picks AVX2 routines, and a libvirt client
        # segfaulted in L1 on QEMU 7.2's young AVX emulation
        '-cpu', cpu, '-smp', '2', '-m', str(memory_mib),
        '-nodefaults', '-display', 'none', '-no-reboot',
        # before any PCI device, so that all of them sit behind it
        '-device', 'intel-iommu,intremap=on,caching-mode=on',
        # through the kernel's PVH entry: no xz decompression under emulation (25-85 s)
        '-kernel', str(uncompressed_kernel(kernel.root.parent, kernel)), '-initrd', str(initrd),
        '-append', f'console=ttyS0 intel_iommu=on panic=-1 no_timer_check simhost.io={io}',
        '-serial', f'file:{io}/console.log',
        '-serial', f'file:{io}/output',
        '-device', 'pcie-root-port,id=rp1,chassis=1,slot=1,addr=0x2',
        '-device', 'pcie-root-port,id=rp2,chassis=2,slot=2,addr=0x3',
        '-device', 'pcie-root-port,id=rp3,chassis=3,slot=3,addr=0x4',
        '-fsdev', 'local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap',
        '-device', 'virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot,bus=rp1',
        '-fsdev', f'local,id=simio,path={io},security_model=none',
        '-device', 'virtio-9p-pci,fsdev=simio,mount_tag=simio,bus=rp2',
        '-device', 'nvme-subsys,id=subsys0',
        '-device', nvme,
        '-drive', f'file={io}/ns.img,if=none,id=ns1,format=raw',
        '-device', 'nvme-ns,drive=ns1,bus=nvme0,nsid=1',
    ] + _numa(memory_mib) + _gpu_switches() + _user_network(forward_ports)


def _numa(memory_mib: int) -> list:
    """NUMA_NODES guest nodes, one CPU and half the memory each."""
    sizes = [memory_mib // NUMA_NODES] * NUMA_NODES
    sizes[-1] += memory_mib - sum(sizes)
    args = []
    for node, size in enumerate(sizes):
        args += ['-object', f'memory-backend-ram,id=ram{node},size={size}M',
                 '-numa', f'node,nodeid={node},cpus={node},memdev=ram{node}']
    return args


def _gpu_switches() -> list:
    """GPU_SWITCHES (see GpuSwitch). The expanders at 00:06.0 and on: a
    host bridge is no PCI bridge, so the root ports keep buses 1-3."""
    args = []
    for n, s in enumerate(GPU_SWITCHES):
        chassis = 10 * (n + 1)     # unique per port; the root complex's are 1-3
        vq, vi = 2 * VFS_PER_SWITCH_PF, VFS_PER_SWITCH_PF   # QEMU's least for that many VFs
        args += [
            '-device', f'pxb-pcie,id=pxb{n},bus=pcie.0,addr={6 + n:#x},bus_nr={s.bus_nr},numa_node={s.node}',
            '-device', f'pcie-root-port,id=sw{n}root,bus=pxb{n},addr=0x0,chassis={chassis}',
            '-device', f'x3130-upstream,id=sw{n}up,bus=sw{n}root',
            '-device', f'pcie-root-port,id=sw{n}gpu,bus=sw{n}up,addr=0x0,chassis={chassis + 1}',
            # room for the VFs' BARs: the firmware sizes a bridge's window by the BARs it
            # knows (not SR-IOV's), and the kernel cannot grow one past an expander's
            '-device', f'pcie-root-port,id=sw{n}pf,bus=sw{n}up,addr=0x1,chassis={chassis + 2},mem-reserve=2M',
            '-device', f'ati-vga,bus=sw{n}gpu,romfile=',
            '-device', f'nvme-subsys,id=sw{n}subsys',
            '-device', f'nvme,serial=simhost-sw{n}-pf,subsys=sw{n}subsys,bus=sw{n}pf,'
                       f'sriov_max_vfs={VFS_PER_SWITCH_PF},sriov_vq_flexible={vq},sriov_vi_flexible={vi},'
                       f'max_ioqpairs={vq + 2},msix_qsize={vi + 1}',
        ]
    return args


def _user_network(ports) -> list:
    """A user-mode NIC (no root networking on this machine): 127.0.0.1:P here
    reaches port P of L1 (eth0, 10.0.2.15) for each port; L1 reaches this
    machine's 127.0.0.1 as 10.0.2.2. On the root complex (00:05.0), so the
    root ports keep their bus numbers and the PF stays 0000:03:00.0 (named:
    with expander buses, QEMU's default bus would be an expander's)."""
    if not ports:
        return []
    forwards = ''.join(f',hostfwd=tcp:127.0.0.1:{p}-:{p}' for p in ports)
    return ['-netdev', f'user,id=net0,net=10.0.2.0/24{forwards}',
            '-device', 'virtio-net-pci,netdev=net0,bus=pcie.0,addr=0x5']


def _prepare_io(io: Path, kernel, command, cwd: Path, vfs: int) -> None:
    (io / 'etc-libvirt').mkdir()
    write_config(io / 'etc-libvirt')
    (io / 'command.sh').write_text(
        'exec ' + (command if isinstance(command, str) else shlex.join(command)) + '\n')
    (io / 'stage2.sh').write_text(STAGE2.format(
        io=shlex.quote(str(io)), pf=PF_ADDRESS, kver=kernel.version,
        modules_dir=shlex.quote(str(kernel.modules_dir)), vfs=vfs,
        cwd=shlex.quote(str(cwd)), failed=SETUP_FAILED))
    with open(io / 'ns.img', 'wb') as f:
        f.truncate(64 << 20)


def run_in_l1(command, vfs: int = DEFAULT_VFS, memory_mib: int = DEFAULT_MEMORY_MIB,
              cwd=None, timeout: float = DEFAULT_TIMEOUT, out=None, forward_ports=(), io=None,
              cpu: str = 'qemu64') -> int:
    """Run `command` (argv list, or a shell string) as root in a fresh L1;
    stream its output (stdout and stderr together) to `out` (a binary file,
    default: our stdout) and return its exit status. Raises L1Error (with
    the tail of L1's console) if L1 failed before reporting one.
    forward_ports: TCP ports of L1 reachable on 127.0.0.1 here (user-mode
    network, see _user_network). io: an empty folder to use as the run
    folder (kept afterwards; the command sees it as $SIMHOST_IO, L1's QEMU
    pid is in io/qemu.pid); default: a temporary one, removed. cpu: L1's
    QEMU CPU model."""
    if not 0 <= vfs <= MAX_VFS:
        raise ValueError(f'vfs must be 0..{MAX_VFS}')
    out = out or sys.stdout.buffer
    cwd = Path(cwd or os.getcwd()).resolve()
    require('qemu-system-x86_64')
    kernel, initrd = ensure_l1_initrd()
    keep = io is not None
    io = Path(io) if keep else Path(tempfile.mkdtemp(prefix='simhost-l1-'))
    try:
        _prepare_io(io, kernel, command, cwd, vfs)
        (io / 'output').touch()
        with open(io / 'qemu.err', 'wb') as err:
            qemu = subprocess.Popen(qemu_command(kernel, initrd, io, memory_mib, forward_ports, cpu),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err)
        (io / 'qemu.pid').write_text(f'{qemu.pid}\n')
        try:
            _stream_until_exit(qemu, io / 'output', out, timeout)
        finally:
            if qemu.poll() is None:
                qemu.kill()
                qemu.wait()
        status = io / 'exit-status'
        if not status.exists():
            raise L1Error(_failure_report(io, qemu.returncode))
        return int(status.read_text())
    finally:
        if not keep:
            shutil.rmtree(io, ignore_errors=True)


def _stream_until_exit(qemu, output: Path, out, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with open(output, 'rb') as f:
        while True:
            done = qemu.poll() is not None
            chunk = f.read()
            if chunk:
                out.write(chunk)
                out.flush()
            if done:
                return
            if time.monotonic() > deadline:
                raise L1Error(f'L1 still running after {timeout} s')
            time.sleep(0.2)


def _failure_report(io: Path, returncode: int) -> str:
    tail = []
    for name in ('console.log', 'qemu.err'):
        path = io / name
        if path.exists():
            lines = path.read_text(errors='replace').splitlines()[-30:]
            tail += [f'--- {name} (last lines)'] + lines
    return '\n'.join([f'L1 ended (QEMU exit {returncode}) without an exit status'] + tail)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog='python3 -m simhost.nested',
        description='Run a command as root in a nested host with real SR-IOV VFs '
                    f'(PF {PF_ADDRESS}) and VFIO; exits with its exit status.')
    parser.add_argument('--vfs', type=int, default=DEFAULT_VFS,
                        help=f'number of VFs to enable, 0..{MAX_VFS} (default {DEFAULT_VFS})')
    parser.add_argument('--memory', type=int, default=DEFAULT_MEMORY_MIB, metavar='MiB',
                        help=f'L1 memory (default {DEFAULT_MEMORY_MIB})')
    parser.add_argument('--cwd', default=None, metavar='DIR',
                        help='where the command runs (default: the current directory)')
    parser.add_argument('--timeout', type=float, default=DEFAULT_TIMEOUT, metavar='S',
                        help=f'give up after S seconds (default {DEFAULT_TIMEOUT})')
    parser.add_argument('command', nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        parser.error('no command given')
    try:
        return run_in_l1(command, vfs=args.vfs, memory_mib=args.memory, cwd=args.cwd,
                         timeout=args.timeout)
    except (L1Error, MissingProgram) as e:
        print(e, file=sys.stderr)
        return SETUP_FAILED


if __name__ == '__main__':
    sys.exit(main())
