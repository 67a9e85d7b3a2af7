"""The programs the simulated hosts start, and the Debian package of each.

    require('ip', '/usr/sbin/sshd')   # MissingProgram('missing /usr/sbin/sshd: apt-get install openssh-server')

A program that is not there is one line saying what to install, never a
traceback from deep inside a subprocess call (FileNotFoundError, exit 127).
dev-tools/programs.py reads PACKAGE_OF too (the suites' lint and install check).
"""
from __future__ import annotations

import os
import re

PATH_DIRS = ('/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin')

# program (as the code names it) -> Debian 12 package
PACKAGE_OF = {
    '/usr/sbin/sshd': 'openssh-server', 'sshd': 'openssh-server',
    'ssh': 'openssh-client', 'ssh-keygen': 'openssh-client',
    'ip': 'iproute2', 'bridge': 'iproute2',
    'libvirtd': 'libvirt-daemon', 'virtlogd': 'libvirt-daemon',
    'virsh': 'libvirt-clients', 'virt-xml-validate': 'libvirt-clients',
    'qemu-system-x86_64': 'qemu-system-x86', '/usr/bin/qemu-system-x86_64': 'qemu-system-x86',
    'qemu-img': 'qemu-utils',
    'busybox': 'busybox-static', '/bin/busybox': 'busybox-static',
    'cpio': 'cpio', 'depmod': 'kmod', 'modprobe': 'kmod', 'insmod': 'kmod',
    'python3': 'python3-minimal', '/usr/bin/python3': 'python3-minimal',
    'rake': 'rake', 'ruby': 'ruby',
    'pkill': 'procps', 'pgrep': 'procps',
    'shellcheck': 'shellcheck', 'gcc': 'gcc',
    'opensm': 'opensm', 'ibsim': 'ibsim-utils', 'smpquery': 'infiniband-diags',
    'ethtool': 'ethtool', 'xmllint': 'libxml2-utils', 'jq': 'jq',
    'rsync': 'rsync', 'lspci': 'pciutils', 'xorriso': 'xorriso', 'sudo': 'sudo',
    'nc': 'netcat-openbsd', 'mpirun': 'openmpi-bin', 'hpcc': 'hpcc',
    'puppet': 'puppet-agent', 'puppet-lint': 'puppet-lint', 'rspec': 'ruby-rspec-core',
    'metadata-json-lint': 'metadata-json-lint',
    'apt-get': 'apt', 'apt-cache': 'apt', 'dpkg-deb': 'dpkg', 'ansible-playbook': 'ansible-core',
    'nsenter': 'util-linux', 'unshare': 'util-linux',
}


class MissingProgram(RuntimeError):
    """A program the simulated hosts need is not installed: str() is the one line to show."""

    def __init__(self, program: str):
        self.program = program
        pkg = PACKAGE_OF.get(program) or PACKAGE_OF.get(os.path.basename(program))
        super().__init__(f'missing {program}: apt-get install {pkg}' if pkg else
                         f'missing {program}: install the Debian package that provides it')


def locate(program: str):
    """Where the program is (absolute, or on root's PATH), or None."""
    if program.startswith('/'):
        return program if os.access(program, os.X_OK) else None
    for d in os.environ.get('PATH', '').split(os.pathsep) + list(PATH_DIRS):
        if d and os.access(os.path.join(d, program), os.X_OK):
            return os.path.join(d, program)
    return None


def require(*programs: str) -> None:
    """Raise MissingProgram for the first of programs that is not there."""
    for program in programs:
        if locate(program) is None:
            raise MissingProgram(program)


def from_shell_error(stderr: str):
    """The program a shell could not find ("sh: 1: /usr/sbin/sshd: not found"), or None."""
    m = re.search(r'(?:^|\s)(\S+): (?:not found|command not found|No such file or directory)\s*$',
                  stderr or '', re.M)
    return m.group(1) if m else None
