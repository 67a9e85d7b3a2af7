"""The Ansible roles (ansible/) for real: ansible-playbook with a local
connection into a throwaway root (fake sysfs with one SR-IOV PF, GRUB
defaults, OpenNebula 7.4's own oned.conf), as Puppet's apply test does; a
second run changes nothing; the files equal what Puppet's classes write from
the same settings (their "Managed by" line aside), the front-end's
registration included; both register the network hooks (as the given user,
with its ONE_AUTH) in a stand-in for oned's hook calls, the same hooks, and
their second runs change nothing; the subnet manager's partitions file is the
network hook's: created only when absent (the driver's Default line), never
rewritten nor reloaded for afterwards; ansible-lint passes."""

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from simhost import stock_kvm
from tests.conftest import REPO
from tests.packaging.hook_oned import HookOned

ANSIBLE = REPO / "ansible"
PF = "0000:03:00.0"
GRUB = ('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
        'GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=off"\n')


def make_root(root: Path):
    dev = root / "sys/bus/pci/devices" / PF
    dev.mkdir(parents=True)
    (dev / "sriov_totalvfs").write_text("16\n")
    (dev / "sriov_numvfs").write_text("0\n")
    (dev / "sriov_drivers_autoprobe").write_text("1\n")
    for m in ("vfio", "vfio_iommu_type1", "vfio_pci"):
        (root / "sys/module" / m).mkdir(parents=True)
    for d in ("etc/default", "etc/one/vmm_exec", "etc/modules-load.d", "etc/udev/rules.d",
              "etc/systemd/system/multi-user.target.wants", "usr/local/sbin", "var/lib/one", "etc/opensm", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/default/grub").write_text(GRUB)


def stock_files(root: Path):
    """OpenNebula 7.4's own oned.conf and vmm_exec_kvm.conf (0640/0644 as its packages have them)."""
    with tarfile.open(stock_kvm.tarball()) as tar:
        for suffix, dst, mode in (("share/etc/oned.conf", "etc/one/oned.conf", 0o640),
                                  ("src/vmm_mad/exec/x86_64/vmm_exec_kvm.conf", "etc/one/vmm_exec/vmm_exec_kvm.conf",
                                   0o644)):
            m = next(m for m in tar.getmembers() if m.name.endswith(suffix))
            (root / dst).write_bytes(tar.extractfile(m).read())
            (root / dst).chmod(mode)


HOST = {"pool": {"pfs": [PF], "numa_policy": "require", "state_dir": "STATE"}}


def one_auth(root: Path) -> Path:
    auth = root / "var/lib/one/.one/one_auth"
    auth.parent.mkdir(parents=True, exist_ok=True)
    auth.write_text("oneadmin:secret\n")
    auth.chmod(0o600)
    return auth


def playbook(root: Path, frontend: bool, endpoint: str = "") -> str:
    host = f"""
    - role: kvm_sriov_host
      vars:
        kvm_sriov_host_iommu_vendor: intel
        kvm_sriov_host_grub_file: {root}/etc/default/grub
        kvm_sriov_host_grub_update_command: touch {root}/grub-updated
        kvm_sriov_host_reboot_required_file: {root}/run/reboot-required
        kvm_sriov_host_pfs: {{ "{PF}": {{ numvfs: 8, drivers_autoprobe: false }} }}
        kvm_sriov_host_sysfs_root: {root}/sys
        kvm_sriov_host_helper_dir: {root}/usr/local/sbin
        kvm_sriov_host_vfs_config_dir: {root}/etc/kvm-sriov/vfs.d
        kvm_sriov_host_systemd_dir: {root}/etc/systemd/system
        kvm_sriov_host_modules_load_dir: {root}/etc/modules-load.d
        kvm_sriov_host_udev_rules_dir: {root}/etc/udev/rules.d
        kvm_sriov_host_config_file: {root}/etc/kvm-sriov/kvm-sriov.toml
        kvm_sriov_host_manage_libvirt: false
        kvm_sriov_host_state_dir: {root}/var/lib/one/kvm-sriov
        kvm_sriov_host_state_owner: root
        kvm_sriov_host_state_group: root
        kvm_sriov_host_settings:
          pool: {{ pfs: ["{PF}"], numa_policy: require, state_dir: "{root}/var/lib/one/kvm-sriov" }}
    - role: kvm_sriov_subnet_manager
      vars:
        kvm_sriov_subnet_manager_manage_package: false
        kvm_sriov_subnet_manager_manage_service: false
        kvm_sriov_subnet_manager_config_file: {root}/etc/opensm/opensm.conf
        kvm_sriov_subnet_manager_partitions_file: {root}/etc/opensm/partitions.conf
        kvm_sriov_subnet_manager_defaults_file: {root}/etc/default/opensm
        kvm_sriov_subnet_manager_reload_command: touch {root}/opensm-reloaded"""
    front = f"""
    - role: kvm_sriov_frontend
      vars:
        kvm_sriov_frontend_source: {REPO}
        kvm_sriov_frontend_destdir: {root}
        kvm_sriov_frontend_owner: root
        kvm_sriov_frontend_group: root
        kvm_sriov_frontend_oned_conf: {root}/etc/one/oned.conf
        kvm_sriov_frontend_templates: {REPO}/templates
        kvm_sriov_frontend_library: {REPO}
        kvm_sriov_frontend_hooks_user: root
        kvm_sriov_frontend_one_auth: {root}/var/lib/one/.one/one_auth
        kvm_sriov_frontend_one_xmlrpc: {endpoint}"""
    return f"""---
- name: Throwaway root
  hosts: localhost
  gather_facts: false
  roles:{host}{front if frontend else ''}
"""


def run_ansible(root: Path, play: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ANSIBLE / "roles"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(root.parent / "ansible-tmp"), ANSIBLE_REMOTE_TEMP=str(root.parent / "ansible-tmp"),
               ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3", ANSIBLE_HOME=str(root.parent / "ansible-home"))
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(play)],
                          capture_output=True, text=True, env=env, timeout=300)


def ansible(root: Path, play: Path):
    r = run_ansible(root, play)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)", r.stdout)
    return int(recap.group(2)), r.stdout


PARTITIONS = "etc/opensm/partitions.conf"
DRIVER_DEFAULT_LINE = "Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full ;"


def hook_installs_partitions(path: Path) -> bytes:
    """What the front-end's network hook installs on the SM node: the
    networks' partitions, written as the hook's writer writes them (its mode
    then changed, which config management must keep as well)."""
    from kvm_sriov.ib import partitions
    nets = partitions.networks_from_xml((REPO / "tests/ib/golden/vnpool.xml").read_text())
    assert partitions.write(path, partitions.render(nets))
    path.chmod(0o640)
    return path.read_bytes()


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    if not shutil.which("ansible-playbook"):
        pytest.fail("ansible-playbook missing: apt-get install ansible")
    root = tmp_path_factory.mktemp("ansible") / "root"
    make_root(root)
    stock_files(root)
    one_auth(root)
    play = root.parent / "site.yml"
    with HookOned() as oned:
        play.write_text(playbook(root, frontend=True, endpoint=oned.endpoint))
        first = ansible(root, play)
        sm = {"first_file": (root / PARTITIONS).read_text(), "first_reloaded": (root / "opensm-reloaded").exists()}
        for marker in ("grub-updated", "opensm-reloaded"):
            (root / marker).unlink(missing_ok=True)
        sm["hook_file"] = hook_installs_partitions(root / PARTITIONS)
        writes = len(oned.writes)
        second = ansible(root, play)
        assert len(oned.writes) == writes, "the second run wrote hooks"
    return root, first, second, oned.hooks, sm


def test_the_first_run_sets_the_host_up(applied):
    root, (changed, _out), _, _, _ = applied
    assert changed > 0
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=on iommu=pt"' in (root / "etc/default/grub").read_text()
    assert (root / "run/reboot-required").exists()
    assert (root / "sys/bus/pci/devices" / PF / "sriov_numvfs").read_text().strip() == "8"
    assert (root / "sys/bus/pci/devices" / PF / "sriov_drivers_autoprobe").read_text().strip() == "0"
    assert "NUMVFS=8" in (root / "etc/kvm-sriov/vfs.d/0000_03_00.0.conf").read_text()
    assert (root / "etc/systemd/system/multi-user.target.wants/kvm-sriov-vfs.service").is_symlink()
    assert 'numa_policy = "require"' in (root / "etc/kvm-sriov/kvm-sriov.toml").read_text()
    assert "virt_enabled 2" in (root / "etc/opensm/opensm.conf").read_text()


def test_the_first_run_registers_the_front_end(applied):
    root = applied[0]
    text = (root / "etc/one/oned.conf").read_text()
    assert 'NAME           = "kvm-sriov"' in text and "-p kvm-sriov -o one_drs" in text
    assert (root / "etc/one/vmm_exec/vmm_exec_kvm-sriov.conf").is_file()
    assert (root / "var/lib/one/remotes/vmm/kvm-sriov/deploy").is_file()
    assert (root / "var/lib/one/remotes/scheduler/kvm-sriov/place").is_file()
    assert 'VNET_RESTRICTED_ATTR = "VLAN_ID"' in text


def test_the_first_run_registers_the_network_hooks(applied):
    from kvm_sriov.ib import pkey
    hooks = applied[3]
    assert len(hooks) == len(pkey.NETWORK_CALLS) + len(pkey.STATE_HOOKS)
    assert {h["COMMAND"] for h in hooks.values()} == {f"{REPO}/bin/kvm-sriov network-hook"}
    assert {h["ARGUMENTS"].split()[0] for h in hooks.values()} == set(pkey.NETWORK_CALLS) | set(pkey.STATE_HOOKS)


def test_a_second_run_changes_nothing(applied):
    root, _, (changed, out), _, _ = applied
    assert changed == 0, out[-3000:]
    assert not (root / "grub-updated").exists() and not (root / "opensm-reloaded").exists()


def test_the_first_run_creates_the_partitions_file_with_the_drivers_default_line(applied):
    sm = applied[4]
    lines = [line for line in sm["first_file"].splitlines() if not line.startswith("#")]
    assert lines == [DRIVER_DEFAULT_LINE]
    assert sm["first_reloaded"]


def test_a_later_run_keeps_the_file_the_network_hook_wrote(applied):
    """The hook's file between the two runs: the second leaves it byte for
    byte (and its mode) and does not reload opensm."""
    root, _, (_, out), _, sm = applied
    path = root / PARTITIONS
    assert b"one_vnet_3=0x8001" in sm["hook_file"]
    assert path.read_bytes() == sm["hook_file"]
    assert path.stat().st_mode & 0o7777 == 0o640
    assert not (root / "opensm-reloaded").exists(), out[-3000:]


def sm_playbook(root: Path, **settings) -> Path:
    """The subnet-manager role alone, into root, with these role variables."""
    play = root.parent / "sm.yml"
    settings = {"manage_package": False, "manage_service": False, "config_file": f"{root}/etc/opensm/opensm.conf",
                "partitions_file": f"{root}/{PARTITIONS}", "defaults_file": f"{root}/etc/default/opensm",
                "reload_command": f"touch {root}/opensm-reloaded", **settings}
    roles_vars = "".join(f"\n        kvm_sriov_subnet_manager_{k}: {json.dumps(v)}" for k, v in settings.items())
    play.write_text(f"""---
- name: Throwaway root
  hosts: localhost
  gather_facts: false
  roles:
    - role: kvm_sriov_subnet_manager
      vars:{roles_vars}
""")
    return play


def test_an_operator_who_opts_out_gets_no_partitions_file(tmp_path):
    root = tmp_path / "root"
    make_root(root)
    changed, out = ansible(root, sm_playbook(root, create_partitions_file=False))
    assert not (root / PARTITIONS).exists(), out[-3000:]
    assert not (root / "opensm-reloaded").exists()
    assert (root / "etc/opensm/opensm.conf").is_file()


@pytest.mark.parametrize("settings, message", [
    ({"default_partition_members": ["ALL=full"]}, "kvm_sriov_subnet_manager_default_partition_members must be"),
    ({"default_partition_members": ["SELF=full ; evil=0x8001 : ALL=full"]},
     "kvm_sriov_subnet_manager_default_partition_members must be"),
    ({"default_partition_members": []}, "kvm_sriov_subnet_manager_default_partition_members must be"),
    ({"partitions": ["Default=0x7fff, ipoib : ALL=full ;"]}, "kvm_sriov_subnet_manager_partitions is no longer read"),
], ids=["every-port-full", "a-second-line", "no-members", "the-former-variable"])
def test_settings_that_would_open_the_default_partition_are_refused(tmp_path, settings, message):
    root = tmp_path / "root"
    make_root(root)
    r = run_ansible(root, sm_playbook(root, **settings))
    assert r.returncode != 0 and message in r.stdout, r.stdout[-3000:]
    assert not (root / PARTITIONS).exists()


# --- the same files as Puppet's classes ----------------------------------------

PUPPET_SITE = """
class {{ 'kvm_sriov::host':
  augeas_root => '{root}', iommu_vendor => 'intel', grub_update_command => 'touch {root}/grub-updated',
  reboot_required_file => '{root}/run/reboot-required', sysfs_root => '{root}/sys',
  helper_dir => '{root}/usr/local/sbin', vfs_config_dir => '{root}/etc/kvm-sriov/vfs.d',
  systemd_dir => '{root}/etc/systemd/system', modprobe_dir => '{root}/etc/modprobe.d',
  modules_load_dir => '{root}/etc/modules-load.d', udev_rules_dir => '{root}/etc/udev/rules.d',
  config_file => '{root}/etc/kvm-sriov/kvm-sriov.toml', manage_libvirt => false,
  pool_pfs => ['{pf}'], numa_policy => 'require', state_dir => '{root}/var/lib/one/kvm-sriov',
  remotes_owner => 'root', remotes_group => 'root',
  pfs => {{ '{pf}' => {{ 'numvfs' => 8, 'drivers_autoprobe' => false }} }},
}}
class {{ 'kvm_sriov::subnet_manager':
  manage_service => false, config_file => '{root}/etc/opensm/opensm.conf',
  partitions_file => '{root}/etc/opensm/partitions.conf', defaults_file => '{root}/etc/default/opensm',
  reload_command => 'touch {root}/opensm-reloaded',
}}
"""
COMPARED = ["etc/default/grub", "etc/kvm-sriov/kvm-sriov.toml", "etc/kvm-sriov/vfs.d/0000_03_00.0.conf",
            "etc/systemd/system/kvm-sriov-vfs.service", "etc/modules-load.d/kvm-sriov.conf",
            "etc/udev/rules.d/70-kvm-sriov-vfio.rules", "usr/local/sbin/kvm-sriov-vfs",
            "etc/opensm/opensm.conf", "etc/default/opensm", "etc/opensm/partitions.conf",
            "sys/bus/pci/devices/0000:03:00.0/sriov_numvfs", "sys/bus/pci/devices/0000:03:00.0/sriov_drivers_autoprobe"]


def normal(text: str, root: Path) -> str:
    return re.sub(r"(Managed|Created) by (Puppet|Ansible) \([^)]*\)", r"\1 by X", text.replace(str(root), "ROOT"))


def same_files(aroot: Path, proot: Path, files):
    """Each file the same text (roots and the "Managed by" line aside) and mode."""
    for rel in files:
        a, p = aroot / rel, proot / rel
        assert a.is_file() and p.is_file(), rel
        assert normal(a.read_text(), aroot) == normal(p.read_text(), proot), rel
        assert (a.stat().st_mode & 0o7777) == (p.stat().st_mode & 0o7777), rel


def test_puppet_and_ansible_write_the_same_files(applied, tmp_path):
    # The host and subnet-manager plays alone (the front-end's registration is compared in its own tests).
    aroot = tmp_path / "a" / "root"
    make_root(aroot)
    (aroot.parent / "site.yml").write_text(playbook(aroot, frontend=False))
    ansible(aroot, aroot.parent / "site.yml")
    proot = tmp_path / "p" / "root"
    make_root(proot)
    puppet_apply(proot, PUPPET_SITE.format(root=proot, pf=PF))
    same_files(aroot, proot, COMPARED)
    ours = {str(p.relative_to(aroot)) for p in aroot.rglob("*") if p.is_file() and "sys/" not in str(p)}
    theirs = {str(p.relative_to(proot)) for p in proot.rglob("*") if p.is_file() and "sys/" not in str(p)}
    assert ours == theirs


PUPPET_FRONTEND = """
class {{ 'kvm_sriov::frontend':
  source => '{repo}', remotes_dir => '{root}/var/lib/one/remotes', owner => 'root', group => 'root',
  oned_conf => '{root}/etc/one/oned.conf', snippet_file => '{root}/etc/one/kvm-sriov-vm_mad.conf',
  templates_dir => '{root}/usr/share/kvm-sriov/templates', manage_sched_mad => true,
  hooks_user => 'root', one_auth => '{root}/var/lib/one/.one/one_auth', one_xmlrpc => '{endpoint}',
}}
"""
# what the registration writes: the same bytes whoever runs it
FRONTEND_COMPARED = ["etc/one/oned.conf", "etc/one/oned.conf.kvm-sriov-backup", "etc/one/vmm_exec/vmm_exec_kvm-sriov.conf"]


def puppet_apply(root: Path, site=None, changes=(0, 2)):
    """puppet apply of site (None: the same site.pp again) with the module from this tree."""
    if not shutil.which("puppet") or not Path("/usr/share/puppet/modules/stdlib").is_dir():
        pytest.fail("puppet or its stdlib module missing: apt-get install puppet-agent puppet-module-puppetlabs-stdlib "
                    "puppet-module-puppetlabs-augeas-core")
    mods = root.parent / "modules"
    if site is not None:
        mods.mkdir()
        os.symlink(REPO / "puppet" / "kvm_sriov", mods / "kvm_sriov")
        for m in ("stdlib", "augeas_core"):
            os.symlink(Path("/usr/share/puppet/modules") / m, mods / m)
        (root.parent / "site.pp").write_text(site)
    r = subprocess.run(["puppet", "apply", "--modulepath", str(mods), "--detailed-exitcodes", "--color=false",
                        "--vardir", str(root.parent / "var"), "--logdir", str(root.parent / "log"),
                        str(root.parent / "site.pp")], capture_output=True, text=True, timeout=600)
    assert r.returncode in changes, r.stdout[-3000:] + r.stderr[-3000:]


def test_puppet_and_ansible_register_the_front_end_alike(applied, tmp_path):
    """kvm_sriov::frontend with the placer and the kvm_sriov_frontend role (its
    defaults) leave the same oned.conf (one marker format, DEFAULT
    vmm_exec/vmm_exec_kvm-sriov.conf), backup and defaults file, and
    register the same network hooks."""
    aroot = applied[0]
    proot = tmp_path / "p" / "root"
    make_root(proot)
    (proot / "usr/share").mkdir(parents=True)
    stock_files(proot)
    one_auth(proot)
    with HookOned() as oned:
        puppet_apply(proot, PUPPET_FRONTEND.format(repo=REPO, root=proot, endpoint=oned.endpoint))
        same_files(aroot, proot, FRONTEND_COMPARED)
        text = (proot / "etc/one/oned.conf").read_text()
        assert "# BEGIN kvm-sriov (written by `kvm-sriov setup-frontend`" in text
        assert 'DEFAULT        = "vmm_exec/vmm_exec_kvm-sriov.conf"' in text
        assert oned.hooks == applied[3]
        writes = len(oned.writes)
        puppet_apply(proot, changes=(0,))   # a second run changes nothing
        assert len(oned.writes) == writes


def test_ansible_lint(tmp_path):
    lint = REPO / ".venv" / "bin" / "ansible-lint"
    if not lint.exists():
        pytest.fail("ansible-lint missing: `./dev test:ansible` installs it in .venv (PyPI)")
    r = subprocess.run([str(lint), "--offline", "-p", "site.yml", "roles"], cwd=ANSIBLE, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, HOME=str(tmp_path)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
