"""The nested SR-IOV host (rung 3) as OpenNebula nodes a front-end reaches by ssh.

    node = NestedNode(workdir, ssh_dir, [InnerHost('one2633-nested1', 2641, {...}), ...])
    node.start()        # L1 up, its inner libvirt hosts up, each reachable as below
    ...
    node.stop()

L1 (simhost.nested) gets a user-mode network with one forwarded TCP port
per inner host: 127.0.0.1:P on this machine is port P of L1, where L1's sshd
listens, and the port's ForceCommand enters that inner host (a LibvirtHost
without a network of its own: its mount namespace, with its own libvirtd,
/var/tmp and local system datastore). So one ssh alias per inner host,
`HostName 127.0.0.1 Port P`, reaches it from the front-end AND from inside
L1 (the same port there), which the stock migrate needs (`ssh <dest>`,
`qemu+ssh://<dest>/system` run on the source host). The inner hosts share
L1's network: monitord's client there answers to the ssh client's address,
10.0.2.2, which user-mode networking turns into this machine's 127.0.0.1.
The four real VFs of L1's PF are split between the inner hosts by each
one's kvm-sriov config (pool.exclude_vfs).

Inside L1, `python3 -m simhost.nested_node serve` (started by NestedNode)
does that set-up, writes `ready` into the run folder and serves until a
`stop` file appears there.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
L1_ADDRESS = '10.0.2.15'       # user-mode networking's guest address
L1_HOSTNAME = 'simhost-l1'     # libvirt's migration address: must resolve, not to localhost
NODE_DIR = Path('/var/lib/simhost-node')  # inside L1 (its tmpfs overlay)
START_TIMEOUT = 600            # L1 boot + two libvirtds + QEMU probes under TCG
# OpenNebula's host probe prediction.sh runs numpy, whose OpenBLAS dies with
# 'Illegal instruction' on qemu64 (seen: host ERROR, its VMs UNKNOWN); Nehalem
# (SSE4.2, no AVX: see simhost.nested on AVX) runs it
L1_CPU = 'Nehalem'
# each inner host's datastore filesystem (a sparse file in L1's memory)
DATASTORE_SIZE = '2G'


@dataclass
class InnerHost:
    """One libvirt host inside L1: its OpenNebula name (= ssh alias), its
    port, its private folders (path inside the host -> nothing: made fresh)
    and its kvm-sriov config sections (state_dir and libvirt.uri are added)."""
    one_name: str
    port: int
    config: dict = field(default_factory=dict)
    private: list = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return NODE_DIR / 'hosts' / self.one_name / 'kvm-sriov-state'

    @property
    def config_path(self) -> Path:
        return NODE_DIR / 'hosts' / self.one_name / 'kvm-sriov.toml'

    @property
    def libvirt_dir(self) -> Path:
        """Its libvirtd's own root (simhost.libvirt_host.LibvirtHost): run/, log/, ..."""
        return NODE_DIR / 'libvirt' / self.one_name


# --- outside: boot, wait, stop ---------------------------------------------------

class NestedNode:
    """A long-running L1 whose inner hosts are reachable by ssh on 127.0.0.1."""

    def __init__(self, workdir, ssh_dir: Path, hosts: list[InnerHost], vfs: int = 4,
                 memory_mib: int = 3072):
        self.workdir = Path(workdir).resolve()
        self.ssh_dir = Path(ssh_dir)
        self.hosts = list(hosts)
        self.vfs, self.memory_mib = vfs, memory_mib
        self.io = self.workdir / 'l1-io'
        self.log = self.workdir / 'l1-output.log'
        self._thread = None
        self._error = None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Boot L1 in the background (wait_ready() waits for its hosts)."""
        from simhost.nested import run_in_l1
        subprocess.run(['rm', '-rf', str(self.io)], check=True)
        self.io.mkdir(parents=True)
        (self.io / 'node.json').write_text(json.dumps({
            'ssh_dir': str(self.ssh_dir), 'hosts': [asdict(h) for h in self.hosts]}))

        def run():
            try:
                with open(self.log, 'wb') as out:
                    rc = run_in_l1(['/usr/bin/python3', '-m', 'simhost.nested_node', 'serve', str(self.io)],
                                   vfs=self.vfs, memory_mib=self.memory_mib, cwd=REPO, timeout=24 * 3600,
                                   out=out, forward_ports=[h.port for h in self.hosts], io=self.io,
                                   cpu=L1_CPU)
                if rc != 0:
                    self._error = f'the nested node ended with exit status {rc}'
            except Exception as e:  # reported by start()/stop()
                self._error = f'{type(e).__name__}: {e}'

        self._thread = threading.Thread(target=run, name='nested-node', daemon=True)
        self._thread.start()
        self._launched = time.monotonic()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = self._launched + timeout
        while not (self.io / 'ready').exists():
            if not self._thread.is_alive() or time.monotonic() > deadline:
                reason = self._error or (f'not ready after {timeout} s' if self._thread.is_alive() else 'it ended')
                raise RuntimeError(f'nested node did not come up: {reason}\n{self.output_tail()}')
            time.sleep(1)

    def output_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors='replace') if self.log.exists() else ''
        return '\n'.join(['--- nested node output (last lines)'] + text.splitlines()[-lines:])

    def stop(self, timeout: float = 180) -> None:
        """Ask L1 to stop its hosts and power off; kill it if it does not."""
        if self._thread is None:
            return
        with contextlib.suppress(OSError):
            (self.io / 'stop').touch()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int((self.io / 'qemu.pid').read_text()), 9)
            self._thread.join(30)
        self._thread = None


# --- inside L1 -----------------------------------------------------------------

def _sh(*cmd, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f'{shlex.join(map(str, cmd))}: rc={p.returncode} {p.stderr.strip()}')
    return p


def _network() -> None:
    _sh('modprobe', 'virtio_net')
    for _ in range(50):
        if Path('/sys/class/net/eth0').exists():
            break
        time.sleep(0.2)
    _sh('ip', 'link', 'set', 'lo', 'up')
    _sh('ip', 'link', 'set', 'eth0', 'up')
    _sh('ip', 'addr', 'add', f'{L1_ADDRESS}/24', 'dev', 'eth0')
    _sh('ip', 'route', 'add', 'default', 'via', '10.0.2.2')
    _sh('hostname', L1_HOSTNAME)
    with open('/etc/hosts', 'a') as f:
        f.write(f'{L1_ADDRESS} {L1_HOSTNAME}\n')


def _start_inner_host(h: InnerHost, ssh_work: Path):
    from simhost.libvirt_host import LibvirtHost
    from tests.support.driver_env import write_config
    root = NODE_DIR / 'hosts' / h.one_name
    lv = LibvirtHost(h.one_name, h.libvirt_dir.parent)
    lv.start()
    pid = int((lv.root / 'run' / 'libvirtd.pid').read_text())
    enter_ns = ('nsenter', f'--mount=/proc/{pid}/ns/mnt', '--')
    for inside in ['/var/tmp'] + list(h.private):
        here = root / ('private' + inside.replace('/', '_'))
        here.mkdir(parents=True, exist_ok=True)
        Path(inside).mkdir(parents=True, exist_ok=True)
        if inside == '/var/tmp':
            _sh(*enter_ns, 'mount', '--bind', here, inside)
            continue
        # A datastore: L1's folders are tmpfs, which refuses O_DIRECT, and
        # the stock defaults open disks with cache=none (O_DIRECT): QEMU
        # then cannot open disk.0. An ext4 on a loop file accepts it.
        for module in ('loop', 'ext4'):
            _sh('modprobe', module, check=False)
        image = root / ('fs' + inside.replace('/', '_') + '.ext4')
        _sh('truncate', '-s', DATASTORE_SIZE, image)
        _sh('mkfs.ext4', '-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', image)
        _sh(*enter_ns, 'mount', '-o', 'loop', image, inside)
    sections = {'pool': {'state_dir': str(h.state_dir)}, 'libvirt': {'uri': 'qemu:///system'}}
    for section, values in h.config.items():
        sections.setdefault(section, {}).update(values)
    write_config(h.config_path, sections)
    enter = ssh_work / f'enter-{h.one_name}'
    enter.write_text(
        '#!/bin/sh\n'
        f'export KVM_SRIOV_CONFIG={shlex.quote(str(h.config_path))}\n'
        f'exec nsenter --mount=/proc/{pid}/ns/mnt -- /bin/bash -c "cd; ${{SSH_ORIGINAL_COMMAND:-exec bash -l}}"\n')
    enter.chmod(0o755)
    return lv, enter


def _sshd(ssh_dir: Path, ssh_work: Path, hosts: list[InnerHost], enters: dict) -> None:
    lines = [f'Port {h.port}' for h in hosts] + [
        'ListenAddress 0.0.0.0', f'HostKey {ssh_dir / "host_ed25519"}', f'PidFile {ssh_work / "sshd.pid"}',
        f'AuthorizedKeysFile {ssh_dir / "authorized_keys"}', 'PermitRootLogin prohibit-password',
        'PasswordAuthentication no', 'KbdInteractiveAuthentication no', 'UsePAM no', 'StrictModes no',
        'PrintMotd no', 'MaxStartups 200', 'MaxSessions 100', 'LogLevel ERROR',
        'Subsystem sftp internal-sftp']
    for h in hosts:
        lines += [f'Match LocalPort {h.port}', f'    ForceCommand {enters[h.one_name]}']
    (ssh_work / 'sshd_config').write_text('\n'.join(lines) + '\n')
    Path('/run/sshd').mkdir(exist_ok=True)
    # L1's root is this machine's: root's ~/.bashrc here (pyenv, cargo) would
    # run for every ssh command (bash reads it when sshd starts it), ~25 s
    # each under TCG, and put pyenv's python3 first; a node has none of it
    Path('/root/.bashrc').write_text('# simhost nested node: no shell set-up\n')
    _sh('/usr/sbin/sshd', '-f', ssh_work / 'sshd_config', '-E', ssh_work / 'sshd.log')
    # the same aliases as on the front-end (same ports here): the stock
    # migrate runs `ssh <dest>` inside the source host; read before any
    # front-end file in ssh_config.d (first value wins)
    client = [f'Host {" ".join(h.one_name for h in hosts)}', '    HostName 127.0.0.1', '    User root',
              f'    IdentityFile {ssh_dir / "id_ed25519"}', '    IdentitiesOnly yes',
              '    StrictHostKeyChecking no', '    UserKnownHostsFile /dev/null', '    LogLevel ERROR',
              '    BatchMode yes']
    for h in hosts:
        client += [f'Host {h.one_name}', f'    Port {h.port}']
    conf = Path('/etc/ssh/ssh_config.d/00-simhost-nested.conf')
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text('\n'.join(client) + '\n')


def serve(io: Path) -> int:
    spec = json.loads((io / 'node.json').read_text())
    hosts = [InnerHost(**h) for h in spec['hosts']]
    ssh_dir = Path(spec['ssh_dir'])
    ssh_work = NODE_DIR / 'ssh'
    ssh_work.mkdir(parents=True, exist_ok=True)
    _network()
    started, enters = [], {}
    try:
        for h in hosts:
            lv, enters[h.one_name] = _start_inner_host(h, ssh_work)
            started.append(lv)
            print(f'simhost-node: {h.one_name} up (port {h.port})', flush=True)
        _sshd(ssh_dir, ssh_work, hosts, enters)
        for h in hosts:  # as the front-end will: ssh <alias> lands in that host
            p = _sh('ssh', h.one_name, 'echo $KVM_SRIOV_CONFIG')
            if p.stdout.strip() != str(h.config_path):
                raise RuntimeError(f'ssh {h.one_name} landed elsewhere: {p.stdout!r}')
        (io / 'ready').write_text('ready\n')
        print('simhost-node: ready', flush=True)
        while not (io / 'stop').exists():
            time.sleep(1)
        print('simhost-node: stopping', flush=True)
        return 0
    finally:
        for lv in started:
            with contextlib.suppress(Exception):
                lv.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ['serve'] and len(argv) == 2:
        return serve(Path(argv[1]))
    print('usage: python3 -m simhost.nested_node serve RUN-FOLDER  (inside L1; see NestedNode)', file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
