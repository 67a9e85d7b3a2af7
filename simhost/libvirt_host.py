"""A real, private libvirtd + virtlogd per simulated host (rung 2).

Each host runs in its own mount namespace where /run/libvirt,
/var/lib/libvirt, /etc/libvirt, /var/log/libvirt and /var/cache/libvirt are
bind-mounted from <workdir>/<name>/, so several hosts (and a system libvirtd,
if any) never share state. The root namespace talks to a host through its
unix socket, `LibvirtHost.uri`.

With an `ip`, the host also gets its own network namespace, plugged into a
bridge that lives in a "switch" namespace shared by every host of the same
workdir; libvirtd listens on plain TCP there, so hosts can migrate guests
between each other (`qemu+tcp://<ip>/system`). Nothing touches the root
network namespace. Such a host also runs an sshd on its address and has
root's ~/.ssh (one key per workdir, every host of the workdir known by its
name), so OpenNebula's scripts run inside it (`nsenter()`) reach the other
hosts as on real nodes (`ssh h2`, `qemu+ssh://h2/system`, rsync). And its
<workdir>/datastores is its own (a "local" system datastore: same path on
every host, different files); paths elsewhere are shared by all hosts.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import subprocess
import sys
import time
import uuid
from pathlib import Path

import libvirt

from simhost.guest_image import CACHE_DIR
from simhost.prereq import MissingProgram, from_shell_error, require

# per-host folder -> the system path it replaces inside the host's mount namespace
BIND_MOUNTS = {
    'run': '/run/libvirt',
    'lib': '/var/lib/libvirt',
    'etc': '/etc/libvirt',
    'log': '/var/log/libvirt',
    'cache': '/var/cache/libvirt',
}
START_TIMEOUT = 60
STOP_TIMEOUT = 15
# libvirt's probe of QEMU takes ~8 s under TCG; hosts share its result
CAPS_SEED = CACHE_DIR / 'qemu-capabilities'
BRIDGE = 'br0'


def _run(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _start_under_reaper(cmd: list) -> None:
    reaper = subprocess.Popen([sys.executable, str(Path(__file__).with_name('reaper.py')), *cmd],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    line = reaper.stdout.readline()
    reaper.stdout.close()
    result = json.loads(line) if line else {'rc': reaper.wait(), 'stdout': '', 'stderr': 'reaper died'}
    if result['rc'] == 127 and from_shell_error(result['stderr']):
        raise MissingProgram(from_shell_error(result['stderr']))
    if result['rc'] != 0:
        raise subprocess.CalledProcessError(result['rc'], cmd, result['stdout'], result['stderr'])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): a daemon we stopped lingers as one
    # until init reaps it, but it is gone for our purposes.
    try:
        return Path(f'/proc/{pid}/stat').read_text().split(')')[-1].split()[0] != 'Z'
    except (FileNotFoundError, ProcessLookupError):  # gone between kill(0) and the read (ESRCH)
        return False


def _stop_pid(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def _read_pid(path: Path):
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _workdir_tag(workdir: Path) -> str:
    """Short id that keeps namespace names of different workdirs apart."""
    return hashlib.sha1(str(Path(workdir).resolve()).encode()).hexdigest()[:6]


def write_config(etc: Path, ip: str = None) -> None:
    """libvirtd.conf, qemu.conf and virtlogd.conf for a simulated host (into
    its /etc/libvirt). With an ip: plain TCP and migration on that address."""
    conf = [
        'auth_unix_rw = "none"',
        'auth_unix_ro = "none"',
        f'host_uuid = "{uuid.uuid4()}"',  # migration refuses "the same host"
        'log_outputs = "3:file:/var/log/libvirt/libvirtd.log"',
    ]
    if ip:
        conf += ['listen_tcp = 1', 'listen_tls = 0', 'auth_tcp = "none"',
                 f'listen_addr = "{ip}"']
    (etc / 'libvirtd.conf').write_text('\n'.join(conf) + '\n')
    qemu = [
        # no SELinux/AppArmor labelling, no cgroups: neither is set up here
        'security_driver = "none"',
        'cgroup_controllers = [ ]',
        # as root, libvirt finds /dev/kvm usable and keeps its capability
        # cache instead of re-probing QEMU on every call
        'user = "root"',
        'group = "root"',
    ]
    if ip:
        qemu += [f'migration_address = "{ip}"', f'migration_host = "{ip}"']
    (etc / 'qemu.conf').write_text('\n'.join(qemu) + '\n')
    (etc / 'virtlogd.conf').write_text(
        'log_outputs = "3:file:/var/log/libvirt/virtlogd.log"\n')


class _Switch:
    """A network namespace holding one bridge that hosts' veths plug into.
    Created by the first host of a workdir, removed with the last one."""

    def __init__(self, workdir: Path):
        self.netns = f'simsw-{_workdir_tag(workdir)}'
        self._lock_path = Path(workdir) / '.switch.lock'

    @contextlib.contextmanager
    def _locked(self):
        with open(self._lock_path, 'w') as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _exists(self) -> bool:
        return Path('/run/netns', self.netns).exists()

    def plug(self, host_netns: str, port: str, ip: str) -> None:
        with self._locked():
            if not self._exists():
                _run('ip', 'netns', 'add', self.netns)
                _run('ip', '-n', self.netns, 'link', 'add', BRIDGE, 'type', 'bridge')
                _run('ip', '-n', self.netns, 'link', 'set', BRIDGE, 'up')
            # created directly inside both namespaces: never visible in the root one
            _run('ip', 'link', 'add', 'name', 'eth0', 'netns', host_netns, 'type', 'veth',
                 'peer', 'name', port, 'netns', self.netns)
            _run('ip', '-n', self.netns, 'link', 'set', port, 'master', BRIDGE, 'up')
            _run('ip', '-n', host_netns, 'addr', 'add', f'{ip}/24', 'dev', 'eth0')
            _run('ip', '-n', host_netns, 'link', 'set', 'eth0', 'up')

    def unplug(self, port: str) -> None:
        with self._locked():
            if not self._exists():
                return
            _run('ip', '-n', self.netns, 'link', 'del', port, check=False)
            ports = _run('ip', '-n', self.netns, '-o', 'link', 'show', 'master', BRIDGE,
                         check=False).stdout.strip()
            if not ports:
                _run('ip', 'netns', 'del', self.netns)


class LibvirtHost:
    """A simulated host: `with LibvirtHost('h1', tmp_path) as h: libvirt.open(h.uri)`."""

    def __init__(self, name: str, workdir, ip: str = None, binds: dict = None):
        """binds: {path inside the host: folder here} mounted there too (e.g. its
        remotes at /var/tmp/one, where `onehost sync` puts them on a real host)."""
        self.name = name
        self.binds = dict(binds or {})
        self._made_dirs = []   # mount points the binds needed (made on the shared root: removed at stop)
        self.workdir = Path(workdir)
        self.root = self.workdir / name
        self.ip = ip
        self.netns = f'sim-{_workdir_tag(workdir)}-{name}' if ip else None
        self._switch = _Switch(self.workdir) if ip else None
        self._port = f'v-{name}'[:15]
        self.uri = f'qemu+unix:///system?socket={self.root}/run/libvirt-sock'

    @property
    def tcp_uri(self) -> str:
        """How other hosts reach this one (only with an ip)."""
        if not self.ip:
            raise ValueError(f'host {self.name} has no network')
        return f'qemu+tcp://{self.ip}/system'

    @property
    def libvirtd_log(self) -> Path:
        return self.root / 'log' / 'libvirtd.log'

    def open(self) -> libvirt.virConnect:
        return libvirt.open(self.uri)

    def nsenter(self) -> list:
        """Prefix that runs a command inside this host (its mount namespace,
        and its network one if it has one), where qemu:///system is its
        libvirtd: OpenNebula's scripts connect there (kvmrc LIBVIRT_URI)."""
        pid = _read_pid(self.root / 'run' / 'libvirtd.pid')
        return ['nsenter', '-t', str(pid), '-m'] + (['-n', '-u'] if self.netns else [])

    # --- lifecycle -------------------------------------------------------

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _write_config(self) -> None:
        for sub in self._mounts:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        write_config(self.root / 'etc', self.ip)
        if self.ip:
            self._write_ssh()
            (self.root / 'hosts').write_text(self._hosts_file())
        if CAPS_SEED.is_dir():
            # libvirt re-validates each file (QEMU/libvirt/kernel versions)
            shutil.copytree(CAPS_SEED, self._caps_dir, dirs_exist_ok=True)

    @property
    def _caps_dir(self) -> Path:
        return self.root / 'cache' / 'qemu' / 'capabilities'

    def _save_caps_seed(self) -> None:
        if CAPS_SEED.is_dir() or not any(self._caps_dir.glob('*.xml')):
            return
        CAPS_SEED.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=CAPS_SEED.parent, prefix='.caps-'))
        shutil.copytree(self._caps_dir, tmp, dirs_exist_ok=True)
        try:
            os.rename(tmp, CAPS_SEED)
        except OSError:  # another host saved it first
            shutil.rmtree(tmp)

    @property
    def _mounts(self) -> dict:
        """per-host folder -> where it is mounted inside the host."""
        mounts = dict(BIND_MOUNTS)
        if self.ip:
            mounts.update({'ssh': '/root/.ssh', 'datastores': str(self.workdir / 'datastores')})
        return mounts

    def _hosts_file(self) -> str:
        """A networked host's /etc/hosts: its own name resolves, as on a real host
        (sudo in the stock scripts looks it up: 'unable to resolve host' otherwise)."""
        return f'127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{self.ip}\t{self.name}\n'

    def _daemon_script(self) -> str:
        lines = ['set -e']
        for sub, target in self._mounts.items():
            lines.append(f"mkdir -p '{target}'")
            lines.append(f"mount --bind '{self.root / sub}' '{target}'")
        for target, here in self.binds.items():
            lines.append(f"mount --bind '{here}' '{target}'")
        if self.ip:  # its own host name (a UTS namespace of its own) and /etc/hosts
            lines.append(f"hostname '{self.name}'")
            lines.append(f"mount --bind '{self.root / 'hosts'}' /etc/hosts")
        lines.append('virtlogd -d -p /run/libvirt/virtlogd.pid')
        listen = ' --listen' if self.ip else ''
        lines.append(f'libvirtd -d -p /run/libvirt/libvirtd.pid{listen}')
        if self.ip:
            lines.append('mkdir -p /run/sshd')
            lines.append(f"/usr/sbin/sshd -f '{self.root / 'sshd_config'}' -E '{self.root / 'log' / 'sshd.log'}'")
        return '\n'.join(lines)

    def _write_ssh(self) -> None:
        """Keys shared by the hosts of the workdir, this host's sshd on its
        address, root's ssh client config naming every host of the workdir."""
        keys = self.workdir / 'ssh'
        keys.mkdir(exist_ok=True)
        with open(keys / '.lock', 'w') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for key in ('id_ed25519', 'host_ed25519'):
                if not (keys / key).exists():
                    _run('ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'simhost', '-f', str(keys / key))
            with open(keys / 'hosts.conf', 'a') as f:  # read by every host's client at each call
                f.write(f'Host {self.name}\n    HostName {self.ip}\n')
        (self.root / 'sshd_config').write_text('\n'.join([
            f'ListenAddress {self.ip}', f'HostKey {keys / "host_ed25519"}',
            f'PidFile {self.root / "run" / "sshd.pid"}',
            f'AuthorizedKeysFile {keys / "id_ed25519.pub"}',
            'PermitRootLogin prohibit-password', 'PasswordAuthentication no',
            'KbdInteractiveAuthentication no', 'UsePAM no', 'StrictModes no', 'PrintMotd no',
            'MaxStartups 100', 'LogLevel ERROR']) + '\n')
        ssh = self.root / 'ssh'
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / 'config').write_text('\n'.join([
            f'Include {keys / "hosts.conf"}', 'Host *', f'    IdentityFile {keys / "id_ed25519"}',
            '    IdentitiesOnly yes', '    StrictHostKeyChecking no', '    UserKnownHostsFile /dev/null',
            '    BatchMode yes', '    LogLevel ERROR']) + '\n')
        (ssh / 'config').chmod(0o600)

    def start(self) -> None:
        require('unshare', 'virtlogd', 'libvirtd', *(('ip', '/usr/sbin/sshd', 'ssh-keygen') if self.ip else ()))
        for target in self.binds:
            missing = [p for p in [Path(target), *Path(target).parents] if not p.exists()]
            for p in reversed(missing):
                p.mkdir()
                self._made_dirs.insert(0, p)   # deepest first
        self._write_config()
        cmd = ['unshare', '--mount', *(['--uts'] if self.ip else []), '--propagation', 'private',
               'sh', '-c', self._daemon_script()]
        if self.ip:
            _run('ip', 'netns', 'add', self.netns)
            _run('ip', '-n', self.netns, 'link', 'set', 'lo', 'up')
            self._switch.plug(self.netns, self._port, self.ip)
            cmd = ['ip', 'netns', 'exec', self.netns] + cmd
        # the daemons fork away and keep the namespace alive; sh exits.
        # They (and their QEMUs) are adopted by a reaper, as systemd would.
        _start_under_reaper(cmd)
        self._wait_ready()

    def _wait_ready(self) -> None:
        sock = self.root / 'run' / 'libvirt-sock'
        pid_file = self.root / 'run' / 'libvirtd.pid'
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            pid = _read_pid(pid_file)
            if pid is not None and not _alive(pid):
                break
            if sock.exists():
                with contextlib.suppress(libvirt.libvirtError):
                    libvirt.open(self.uri).close()
                    return
            time.sleep(0.2)
        raise RuntimeError(f'libvirtd of {self.name} did not answer on {sock}; '
                           f'see {self.libvirtd_log}')

    def _destroy_domains(self) -> None:
        """QEMU outlives libvirtd: stop guests first (through libvirt, then by pid)."""
        if (self.root / 'run' / 'libvirt-sock').exists():
            with contextlib.suppress(libvirt.libvirtError):
                conn = libvirt.open(self.uri)
                for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                    with contextlib.suppress(libvirt.libvirtError):
                        dom.destroy()
                conn.close()
        for pid_file in (self.root / 'run' / 'qemu').glob('*.pid'):
            pid = _read_pid(pid_file)
            if pid and _alive(pid):
                _stop_pid(pid, timeout=5)

    def stop(self) -> None:
        """Stop guests and daemons, drop the namespaces. Safe to call twice."""
        self._destroy_domains()
        for daemon in ('libvirtd', 'virtlogd'):
            pid = _read_pid(self.root / 'run' / f'{daemon}.pid')
            if pid and _alive(pid):
                _stop_pid(pid)
        self._save_caps_seed()
        if self.netns and Path('/run/netns', self.netns).exists():
            # anything left in a namespace we made is ours (e.g. a helper of QEMU)
            for pid in _run('ip', 'netns', 'pids', self.netns, check=False).stdout.split():
                _stop_pid(int(pid), timeout=5)
            _run('ip', 'netns', 'del', self.netns, check=False)
        if self._switch:
            self._switch.unplug(self._port)
        for p in self._made_dirs:  # an empty folder seen on the host (e.g. a gem folder) would mislead
            with contextlib.suppress(OSError):
                p.rmdir()
        self._made_dirs = []


@contextlib.contextmanager
def two_hosts(workdir, binds: dict = None):
    """Two networked hosts, 10.99.0.1 and 10.99.0.2, for migration tests;
    binds: host name -> its LibvirtHost binds."""
    binds = binds or {}
    with LibvirtHost('h1', workdir, ip='10.99.0.1', binds=binds.get('h1')) as h1, \
            LibvirtHost('h2', workdir, ip='10.99.0.2', binds=binds.get('h2')) as h2:
        yield h1, h2
