"""A tiny bootable guest, built once and cached under <repo>/build/sim/.

The guest is a Debian kernel (downloaded with apt, unpacked with dpkg-deb)
and a busybox-static initramfs. Its init prints `simhost-counter N` on the
serial console every second, so a test can see that save/restore or
migration kept the guest's state, and `simhost-pci N` whenever the number
of its PCI functions changes (so a test sees a hot-plug end in the guest),
with PCI_TREE_OPTION on its kernel command line followed by one
`simhost-pci-dev` line per function (pci_trees reads them back);
it runs busybox acpid so an ACPI power-button press (libvirt `shutdown`)
powers it off at once.

Under nested emulation (an L2 guest in the nested host) every process the
guest starts costs seconds: the init starts as few as it can, and its
once-a-second loop starts none, so an idle guest leaves the CPU to the rest.

Every build step works in a temporary folder next to its result and
renames it into place, so concurrent builders never see half a cache.
"""
import dataclasses
import functools
import hashlib
import lzma
import os
import re
import shutil
import sys
import subprocess
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / 'build' / 'sim'
BUSYBOX = Path('/bin/busybox')  # from busybox-static: no shared libraries needed
COUNTER_PREFIX = 'simhost-counter '
PCI_PREFIX = 'simhost-pci '
# With this word on its kernel command line, the guest follows each PCI_PREFIX
# line with one line per PCI function: `simhost-pci-dev <address>
# <vendor>:<device> <parent>`, the parent being the folder above it in
# /sys/devices (the bridge it sits behind, or pci<domain>:<bus>), so a test
# sees the guest's PCI tree and where a hot-plugged device lands in it.
PCI_TREE_OPTION = 'simhost.pci_tree'
PCI_TREE_PREFIX = 'simhost-pci-dev '
PCI_TREE_MAX = 128    # lines per listing: the tree is the guest's, the console is shared
UP_LINE = 'simhost-guest: up'  # once per boot, when acpid listens
# the counter a guest has reached once it honours a PCI hot-unplug (nested
# TCG: ~90 s after its start; a request earlier than that is ignored)
HOTPLUG_READY = 20
# no_timer_check: under a loaded TCG host the kernel's timer IRQ test can
# time out and panic ("timer doesn't work through Interrupt-remapped IO-APIC").
# The rest skips boot work this throwaway guest does not need, which under
# nested emulation costs seconds each: crypto self-tests, zeroing every
# allocated page, speculation mitigations, the W+X page-table walk (rodata),
# PCIe port services (AER/PME on each of OpenNebula's 16 root ports; hot-plug
# is ACPI's here), IPv6, and shpchp, which cannot have the pcie-to-pci-bridge's
# slots (acpiphp registered them: "Slot initialization failed").
DEFAULT_CMDLINE = ('console=ttyS0 panic=-1 quiet no_timer_check cryptomgr.notests init_on_alloc=0 '
                   'mitigations=off rodata=off pcie_ports=compat ipv6.disable=1 '
                   'initcall_blacklist=shpcd_init')

# Modules the guest needs for acpid to see the power button.
GUEST_MODULES = ('button', 'evdev')

# The applets' links are in the archive (build_initramfs): no `busybox --install` here.
GUEST_INIT = f"""#!/bin/busybox sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel found no /dev/console in the archive: attach to it now.
exec </dev/console >/dev/console 2>&1
while read -r m; do insmod /lib/modules/$m; done </etc/modules.order
# acpid exits if it cannot open its log (default /var/log/acpid.log).
acpid -c /etc/acpi -l /dev/console
# the loop's pause: `read -t 1` on a FIFO nobody writes is a shell builtin,
# where `sleep 1` forks and execs busybox every second
mkfifo /tmp/tick
exec 3<>/tmp/tick
read -r cmdline </proc/cmdline
case " $cmdline " in *" {PCI_TREE_OPTION} "*) tree=1;; *) tree=;; esac
# each function, its ids and the folder above it (cd -P: the link resolved);
# builtins only, and a device gone meanwhile is skipped
pci_tree() {{
    n=0
    for d in "$@"; do
        n=$((n + 1))
        [ $n -le {PCI_TREE_MAX} ] || break
        {{ read -r v <"$d/vendor" && read -r p <"$d/device" && cd -P "$d/.."; }} 2>/dev/null || continue
        echo "{PCI_TREE_PREFIX}${{d##*/}} ${{v#0x}}:${{p#0x}} ${{PWD##*/}}"
    done
    cd /
}}
echo "{UP_LINE}"
i=0
seen=
while :; do
    # the PCI functions the guest has, whenever that changes: a test knows a
    # hot-plug has ended in the guest (an unplug asked earlier is ignored)
    set -- /sys/bus/pci/devices/*
    if [ "$#" != "$seen" ]; then
        echo "{PCI_PREFIX}$#"
        [ -z "$tree" ] || pci_tree "$@"
    fi
    seen=$#
    echo "{COUNTER_PREFIX}$i"
    i=$((i + 1))
    read -t 1 tick <&3
done
"""

# busybox acpid maps the power-button event to the action PWRF/00000080
# under its config folder and runs it; `exec`: the shell becomes poweroff
# rather than starting one more process.
POWER_BUTTON_ACTION = """#!/bin/sh
echo "simhost-guest: power button, powering off"
exec poweroff -f
"""


@dataclasses.dataclass(frozen=True)
class KernelTree:
    root: Path      # what dpkg-deb -x unpacked: boot/, lib/modules/<version>/
    version: str    # e.g. 6.1.0-56-amd64

    @property
    def vmlinuz(self) -> Path:
        return self.root / 'boot' / f'vmlinuz-{self.version}'

    @property
    def modules_dir(self) -> Path:
        return self.root / 'lib' / 'modules' / self.version


@dataclasses.dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    modules_dir: Path


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished build into place; if another process won, keep its copy."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=1)   # apt-cache takes seconds under load; one answer per run
def _kernel_package() -> str:
    """The versioned package linux-image-amd64 currently depends on."""
    for attempt in range(2):
        out = subprocess.run(['apt-cache', 'depends', 'linux-image-amd64'],
                             capture_output=True, text=True).stdout
        m = re.search(r'Depends: (linux-image-[0-9][^\s]*-amd64)', out)
        if m:
            return m.group(1)
        if attempt == 0:  # a fresh machine may have no package lists yet
            subprocess.run(['apt-get', 'update', '-qq'], check=True)
    raise RuntimeError('apt does not know linux-image-amd64')


def ensure_kernel(cache_dir: Path = CACHE_DIR) -> KernelTree:
    """Download and unpack the current Debian amd64 kernel (once)."""
    from simhost.prereq import require
    require('apt-get', 'apt-cache', 'dpkg-deb', 'depmod')
    cache_dir.mkdir(parents=True, exist_ok=True)
    pkg = _kernel_package()
    version = pkg[len('linux-image-'):]
    final = cache_dir / f'kernel-{version}'
    if not final.exists():
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix='.dl-') as dl:
            # apt-get download as root warns that _apt cannot write here; harmless.
            subprocess.run(['apt-get', 'download', '-qq', pkg], cwd=dl, check=True,
                           stderr=subprocess.DEVNULL)
            deb, = Path(dl).glob('*.deb')
            tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix='.kernel-'))
            subprocess.run(['dpkg-deb', '-x', str(deb), str(tmp)], check=True)
            # modules.dep is made by the package's postinst, which we skip.
            subprocess.run(['depmod', '-b', str(tmp), version], check=True)
            _publish(tmp, final)
    return KernelTree(final, version)



XZ_MAGIC = b"\xfd7zXZ\x00"


def uncompressed_kernel(cache_dir: Path = CACHE_DIR, kernel: "KernelTree | None" = None) -> Path:
    """The cached kernel as the ELF vmlinux inside its bzImage, which QEMU boots
    through the kernel's PVH entry: no xz decompression in the guest. The
    bzImage itself when the kernel has no PVH entry or no xz payload."""
    kernel = kernel or ensure_kernel(cache_dir)
    final = cache_dir / f"vmlinux-{kernel.version}"
    if final.exists():
        return final
    config = kernel.root / "boot" / f"config-{kernel.version}"
    if not config.exists() or "CONFIG_PVH=y" not in config.read_text(errors="replace").splitlines():
        return kernel.vmlinuz
    data = kernel.vmlinuz.read_bytes()
    start = data.find(XZ_MAGIC)
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:]) if start >= 0 else b""
    except lzma.LZMAError:
        elf = b""
    if not elf.startswith(b"\x7fELF"):
        return kernel.vmlinuz
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    tmp.write_bytes(elf)
    tmp.replace(final)
    return final

def module_closure(modules_dir: Path, names) -> list:
    """Paths (relative to modules_dir) of the named modules and everything
    they depend on, in an order insmod can load them."""
    deps = {}
    for line in (modules_dir / 'modules.dep').read_text().splitlines():
        mod, _, rest = line.partition(':')
        deps[mod] = rest.split()
    by_name = {Path(p).name[:-len('.ko')].replace('-', '_'): p for p in deps}
    order = []

    def visit(path):
        if path in order:
            return
        for dep in deps[path]:
            visit(dep)
        order.append(path)

    for name in names:
        key = name.replace('-', '_')
        if key not in by_name:
            raise KeyError(f'no module {name} in {modules_dir}')
        visit(by_name[key])
    return order


def _applets() -> list:
    """The names busybox answers to (`busybox --list`), each linked in the archive's /bin."""
    out = subprocess.run([str(BUSYBOX), '--list'], capture_output=True, text=True, check=True).stdout
    return [name for name in out.split() if name and '/' not in name and name != 'busybox']


def build_initramfs(dest: Path, init_script: str, modules_dir: Path, modules=(),
                    files=None) -> Path:
    """Write a newc cpio archive: busybox and a /bin link for each of its
    applets, the init script, the given modules (plus dependencies, listed in
    load order in /etc/modules.order) and extra {path-in-archive: (text,
    mode)} files. Not compressed: the guest would spend seconds inflating it
    under nested emulation, and QEMU loads the file into memory as it is.
    Skips the work when `dest` exists: callers put a content hash in its name."""
    if dest.exists():
        return dest
    from simhost.prereq import require
    require('cpio', str(BUSYBOX))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix='.initramfs-') as stage:
        root = Path(stage)
        for d in ('bin', 'dev', 'proc', 'sys', 'etc', 'lib/modules', 'mnt', 'tmp'):
            (root / d).mkdir(parents=True)
        shutil.copy2(BUSYBOX, root / 'bin' / 'busybox')
        for name in _applets():
            (root / 'bin' / name).symlink_to('busybox')
        order = module_closure(modules_dir, modules)
        for rel in order:
            target = root / 'lib' / 'modules' / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(modules_dir / rel, target)
        all_files = {'init': (init_script, 0o755),
                     'etc/modules.order': ('\n'.join(order) + '\n', 0o644)}
        all_files.update(files or {})
        for rel, (text, mode) in all_files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        names = sorted(str(p.relative_to(root)) for p in root.rglob('*'))
        cpio = subprocess.run(['cpio', '-o', '-H', 'newc', '-R', '0:0', '--quiet'],
                              cwd=root, input='\n'.join(names).encode(),
                              capture_output=True, check=True).stdout
        tmp = dest.parent / f'.{dest.name}.{os.getpid()}'
        tmp.write_bytes(cpio)
        os.replace(tmp, dest)
    return dest


# what build_initramfs makes (version 2: applet links, not compressed); in
# every content_hash, so archives of an older make are not reused
ARCHIVE_FORMAT = 2


def content_hash(*parts) -> str:
    h = hashlib.sha256()
    h.update(repr(ARCHIVE_FORMAT).encode())
    for p in parts:
        h.update(repr(p).encode())
    h.update(BUSYBOX.read_bytes())
    return h.hexdigest()[:12]


def ensure_guest_image(cache_dir: Path = CACHE_DIR) -> GuestImage:
    """The cached guest kernel (uncompressed: booted through its PVH entry, no
    xz inflating under TCG) + initramfs, built on first use."""
    kernel = ensure_kernel(cache_dir)
    files = {'etc/acpi/PWRF/00000080': (POWER_BUTTON_ACTION, 0o755)}
    digest = content_hash(GUEST_INIT, GUEST_MODULES, files, kernel.version)
    initrd = build_initramfs(cache_dir / f'guest-initrd-{digest}.img', GUEST_INIT,
                             kernel.modules_dir, GUEST_MODULES, files)
    return GuestImage(uncompressed_kernel(cache_dir, kernel), initrd, kernel.modules_dir)


def domain_xml(name: str, image: GuestImage, serial_log: Path, memory_mib: int = 192,
               uuid: str = None, vcpus: int = 1, cmdline: str = DEFAULT_CMDLINE,
               devices: str = '') -> str:
    """Minimal libvirt XML for the guest image under QEMU TCG. The serial
    console appends to `serial_log` (append, so a migrated guest keeps
    writing to the same file). `devices` is extra XML put in <devices>."""
    uuid_xml = f'<uuid>{uuid}</uuid>' if uuid else ''
    return f"""<domain type='qemu'>
  <name>{escape(name)}</name>{uuid_xml}
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>{vcpus}</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{escape(str(image.kernel))}</kernel>
    <initrd>{escape(str(image.initrd))}</initrd>
    <cmdline>{escape(cmdline)}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <serial type='file'>
      <source path='{escape(str(serial_log))}' append='on'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>{devices}
  </devices>
</domain>
"""


def serial_size(serial_log: Path) -> int:
    """Where the log ends now, in bytes: an offset for counted_since."""
    try:
        return Path(serial_log).stat().st_size
    except FileNotFoundError:
        return 0


def counted_since(serial_log: Path, offset: int) -> bool:
    """Whether the guest has counted after byte offset of its serial log. In
    bytes: read as text, every "\\r\\n" the console wrote becomes one
    character, so a byte offset lands ever later (by a line per line)."""
    try:
        with open(serial_log, "rb") as f:
            f.seek(offset)
            return COUNTER_PREFIX.encode() in f.read()
    except FileNotFoundError:
        return False


def last_counter(serial_log: Path):
    """The last counter value the guest printed, or None before the first."""
    try:
        text = Path(serial_log).read_text(errors='replace')
    except FileNotFoundError:
        return None
    values = re.findall(rf'^{COUNTER_PREFIX}(\d+)\r?$', text, re.M)
    return int(values[-1]) if values else None


def pci_trees(serial_log: Path) -> list:
    """Each PCI listing the guest printed (PCI_TREE_OPTION), oldest first:
    {address: (vendor:device, parent)}, parent the folder above the device
    (a bridge's address, or pci<domain>:<bus> on a root bus)."""
    try:
        text = Path(serial_log).read_text(errors='replace')
    except FileNotFoundError:
        return []
    trees = []
    for line in text.splitlines():
        line = line.strip()
        if re.fullmatch(rf'{PCI_PREFIX}\d+', line):
            trees.append({})
        elif line.startswith(PCI_TREE_PREFIX) and trees:
            fields = line[len(PCI_TREE_PREFIX):].split()
            if len(fields) == 3:
                trees[-1][fields[0]] = (fields[1], fields[2])
    return trees


def main() -> int:
    """python3 -m simhost.guest_image: build the cached guest image (once); a
    missing program is one line saying what to install."""
    from simhost.prereq import MissingProgram
    try:
        image = ensure_guest_image()
    except MissingProgram as e:
        print(f'guest image: {e}', file=sys.stderr)
        return 1
    print(f'guest image: {image.kernel} + {image.initrd}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
