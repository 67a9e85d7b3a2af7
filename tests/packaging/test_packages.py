"""`./dev package` (rakelib/package.rake): the .debs hold the remotes exactly
as `rake install` lays them out, pass lintian (each remaining tag overridden
with a reason), install, upgrade and remove in a throwaway dpkg root (the
maintainer scripts run, chrootless, against $DPKG_ROOT) keeping config and
pool state; the RPMs are checked as far as Debian's rpm and rpmlint go, their
scriptlets run as shell against a throwaway root. In that root /var/lib/one
is a stand-in oneadmin's (uid ONEADMIN), who plants symlinks where root's
scripts work: none may lead root to change anything else."""

import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from simhost import stock_kvm
from tests.conftest import REPO

FRONTEND, NODE, TOOLS = "opennebula-kvm-sriov", "opennebula-node-kvm-sriov", "opennebula-kvm-sriov-tools"
V1, V2 = "0.1.0", "0.1.0+test2"
ONEADMIN = 4242  # the stand-in oneadmin: /var/lib/one's owner in the throwaway root


def run(*cmd, check=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def build(dest, version, formats):
    env = dict(os.environ, PACKAGE_DIST=str(dest), PACKAGE_VERSION=version, PACKAGE_FORMATS=formats)
    run("rake", "-f", REPO / "Rakefile", "package", cwd=REPO, env=env)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dist-v1"), V1, "deb rpm")


@pytest.fixture(scope="module")
def dist2(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dist-v2"), V2, "deb")


def deb(dist, name, version=V1):
    return dist / f"{name}_{version}-1_all.deb"


def contents(path):
    """path -> (mode string, owner, link target) of a .deb's data."""
    out = {}
    for line in run("dpkg-deb", "-c", path).stdout.splitlines():
        parts = line.split(None, 5)
        name = parts[5]
        target = None
        if " -> " in name:
            name, target = name.split(" -> ", 1)
        out[name.removeprefix("./").rstrip("/")] = (parts[0], parts[1], target)
    return out


def test_the_front_end_deb_holds_the_remotes_as_rake_install_lays_them(dist, tmp_path):
    env = dict(os.environ, DESTDIR=str(tmp_path / "inst"), OWNER="root", GROUP="root")
    run("rake", "-f", REPO / "Rakefile", "install", cwd=REPO, env=env)
    remotes = tmp_path / "inst" / "var/lib/one/remotes"
    installed = {str(p.relative_to(tmp_path / "inst")) for p in remotes.rglob("*")}
    files = contents(deb(dist, FRONTEND))
    packaged = {p for p in files if p.startswith("var/lib/one/remotes/")}
    assert packaged == installed
    assert files["var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml"][2] == "/etc/one/kvm-sriov/kvm-sriov.toml"
    for want in ("var/lib/one/remotes/vmm/kvm-sriov/deploy", "var/lib/one/remotes/scheduler/kvm-sriov/place",
                 "var/lib/one/remotes/im/kvm-probes.d/host/system/kvm_sriov.py",
                 "var/lib/one/remotes/im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py",
                 "var/lib/one/remotes/vmm/kvm-sriov/lib/kvm_sriov/supported-opennebula.txt",
                 "etc/one/kvm-sriov/kvm-sriov.toml", "usr/share/kvm-sriov/templates/oned/oned.conf.vm_mad"):
        assert want in files, want
    assert all(owner == "root/root" for _mode, owner, _t in files.values())
    assert not [p for p, (mode, _o, _t) in files.items() if mode[0] != "l" and (mode[5] == "w" or mode[8] == "w")]
    assert files["var/lib/one/remotes/vmm/kvm-sriov/deploy"][0] == "-rwxr-xr-x"


def test_conffiles_are_the_files_under_etc(dist):
    def conffiles(name):
        return run("dpkg-deb", "-I", deb(dist, name), "conffiles", check=False).stdout.split()
    assert conffiles(FRONTEND) == ["/etc/one/kvm-sriov/kvm-sriov.toml"]
    assert conffiles(NODE) == ["/etc/kvm-sriov/kvm-sriov.toml"]
    assert conffiles(TOOLS) == []


def test_dependencies_name_opennebulas_packages(dist):
    def depends(name):
        return run("dpkg-deb", "-f", deb(dist, name), "Depends").stdout
    assert "opennebula (>= 7.4~)" in depends(FRONTEND)
    assert "opennebula-node-kvm (>= 7.4~)" in depends(NODE) and "python3-libvirt" in depends(NODE)
    assert f"{TOOLS} (= {V1}-1)" in depends(FRONTEND)


def test_lintian_is_clean_with_each_override_explained(dist):
    r = run("lintian", "--pedantic", "-I", "--tag-display-limit", "0", *sorted(dist.glob("*.deb")), check=False)
    tags = [line for line in r.stdout.splitlines() if line[:2] in ("E:", "W:", "I:", "P:")]
    assert r.returncode == 0 and tags == [], r.stdout + r.stderr
    for name in (FRONTEND, NODE, TOOLS):
        lines = (REPO / "packaging" / "deb" / name / "lintian-overrides").read_text().splitlines()
        for i, line in enumerate(lines):
            if line and not line.startswith("#"):
                assert i > 0 and lines[i - 1].startswith("#"), f"{name}: override {line!r} has no comment above it"


# --- install, upgrade, remove in a throwaway dpkg root -------------------------

@pytest.fixture
def work():
    """A folder the stand-in oneadmin can reach (pytest's tmp_path is root's
    alone), for the throwaway root and the stand-in commands."""
    w = tempfile.mkdtemp(prefix="kvm-sriov-packages.")
    os.chmod(w, 0o755)
    yield Path(w)
    shutil.rmtree(w)


@pytest.fixture
def root(work):
    r = work / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/lib/one", "etc/one"):
        (r / d).mkdir(parents=True)
    for f in ("status", "available"):
        (r / "var/lib/dpkg" / f).touch()
    os.chown(r / "var/lib/one", ONEADMIN, ONEADMIN)
    return r


# The host has no oneadmin: these give the scripts one (uid ONEADMIN) without
# touching the machine's users. `mkdir` also plays oneadmin winning a race: the
# moment a folder named kvm-sriov appears in /var/lib/one, it is moved away and
# a symlink to $VICTIM takes its place.
STANDINS = {
    "id": '#!/bin/sh\n[ "$1" = oneadmin ] && exit 0\nexec /usr/bin/id "$@"\n',
    "chown": '#!/bin/sh\nfor a; do shift; set -- "$@" "$(printf %s "$a" | sed s/oneadmin/' + str(ONEADMIN) + '/g)"; done\n'
             'exec /bin/chown "$@"\n',
    "runuser": '#!/bin/sh\n[ "$1 $2 $3" = "-u oneadmin --" ] || exit 64\nshift 3\n'
               f'exec setpriv --reuid={ONEADMIN} --regid={ONEADMIN} --clear-groups -- "$@"\n',
    "mkdir": ('#!/bin/sh\n/bin/mkdir "$@" || exit\n'
              'for a; do\n'
              '    case "$a" in */var/lib/one/kvm-sriov) ;; *) continue ;; esac\n'
              '    [ -n "$VICTIM" ] || exit 0\n'
              f'    as=""; [ "$(/usr/bin/id -u)" = 0 ] && as="setpriv --reuid={ONEADMIN} --regid={ONEADMIN} --clear-groups --"\n'
              '    $as sh -c \'mv "$1" "$1.moved" && ln -s "$VICTIM" "$1"\' sh "$a"\n'
              'done\n'),
}


@pytest.fixture
def oneadmin(work):
    """PATH and the environment for scripts run with the stand-in oneadmin (VICTIM: set it to play the race)."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    for name, text in STANDINS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def victim_folder(work):
    """A folder of root's that oneadmin aims its symlinks at."""
    v = work / "victim"
    v.mkdir(mode=0o700)
    (v / "kvm-sriov.toml").write_text("root's\n")
    return v


def untouched(victim):
    st = victim.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o700)
    assert sorted(p.name for p in victim.iterdir()) == ["kvm-sriov.toml"]
    assert (victim / "kvm-sriov.toml").read_text() == "root's\n"


def dpkg(root, *args, check=True, env=None):
    return run("dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", "--log=/dev/null",
               *args, check=check, env=env)


def status(root, name):
    r = run("dpkg-query", f"--root={root}", "-W", "-f=${Status} ${Version}", name, check=False)
    return r.stdout


def test_install_upgrade_keeps_config_and_pool_state(dist, dist2, root, oneadmin):
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND), deb(dist, NODE), env=oneadmin)
    assert status(root, FRONTEND) == f"install ok installed {V1}-1"
    conf = root / "etc/one/kvm-sriov/kvm-sriov.toml"
    conf.write_text(conf.read_text() + '\n# site\n[timeouts]\nlock_seconds = 99\n')
    host_conf = root / "etc/kvm-sriov/kvm-sriov.toml"
    host_conf.write_text('[pool]\npfs = ["mlx5_0"]\n')
    state = root / "var/lib/one/kvm-sriov"
    assert state.is_dir() and oct(state.stat().st_mode & 0o777) == "0o750" and state.stat().st_uid == ONEADMIN
    (state / "pool.sqlite").write_bytes(b"pool state")
    before = (state / "pool.sqlite").stat().st_mtime_ns
    r = dpkg(root, "-i", deb(dist2, TOOLS, V2), deb(dist2, FRONTEND, V2), deb(dist2, NODE, V2), env=oneadmin)
    assert status(root, FRONTEND) == f"install ok installed {V2}-1"
    assert "lock_seconds = 99" in conf.read_text() and host_conf.read_text() == '[pool]\npfs = ["mlx5_0"]\n'
    assert (state / "pool.sqlite").read_bytes() == b"pool state" and (state / "pool.sqlite").stat().st_mtime_ns == before
    assert "onehost sync --force" in r.stdout
    link = root / "var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml"
    assert os.readlink(link) == "/etc/one/kvm-sriov/kvm-sriov.toml"


def test_a_rake_install_config_is_kept_aside(dist, root):
    old = root / "var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml"
    old.parent.mkdir(parents=True)
    old.write_text("[pool]\npfs = ['site']\n")
    r = dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND))
    assert (root / "etc/one/kvm-sriov/kvm-sriov.toml.rake-install").read_text() == "[pool]\npfs = ['site']\n"
    assert "rake-install" in r.stderr and old.is_symlink()


def test_the_node_package_makes_the_state_folder_as_oneadmin(dist, root, oneadmin, work):
    """oneadmin owns /var/lib/one and swaps the new folder for a symlink the
    moment it appears: root's script must not change where it points."""
    victim = victim_folder(work)
    r = dpkg(root, "-i", deb(dist, TOOLS), deb(dist, NODE), env=dict(oneadmin, VICTIM=str(victim)), check=False)
    untouched(victim)
    assert r.returncode == 0, r.stderr
    moved = root / "var/lib/one/kvm-sriov.moved"  # the folder the script made, before the swap
    assert (moved.stat().st_uid, stat.S_IMODE(moved.stat().st_mode)) == (ONEADMIN, 0o750)


def test_a_symlink_planted_as_the_state_folder_is_left_alone(dist, root, oneadmin, work):
    victim = victim_folder(work)
    (root / "var/lib/one/kvm-sriov").symlink_to(work / "missing")  # dangling: -e says no folder
    os.lchown(root / "var/lib/one/kvm-sriov", ONEADMIN, ONEADMIN)
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, NODE), env=oneadmin)
    assert status(root, NODE) == f"install ok installed {V1}-1" and not (work / "missing").exists()
    untouched(victim)


def plant_rake_install_config(root, text, owner=ONEADMIN):
    """The config `rake install` left in oneadmin's remotes."""
    old = root / "var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(text)
    for p in (old, *old.parents):
        if p == root / "var/lib/one":
            break
        os.lchown(p, owner, owner)
    return old


def test_the_preinst_follows_no_symlinked_folder_of_oneadmins(dist, root, work):
    victim = victim_folder(work)
    conf_dir = root / "var/lib/one/remotes/etc/vmm/kvm-sriov"
    plant_rake_install_config(root, "x\n").unlink()
    conf_dir.rmdir()
    conf_dir.symlink_to(victim)
    os.lchown(conf_dir, ONEADMIN, ONEADMIN)
    r = dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND), check=False)
    untouched(victim)
    assert r.returncode != 0 and f"{conf_dir.relative_to(root)} is not a folder" in r.stderr, r.stderr
    assert not (root / "etc/one/kvm-sriov/kvm-sriov.toml.rake-install").exists()


def test_a_second_install_keeps_the_copy_the_first_one_kept(dist, root):
    plant_rake_install_config(root, "first\n")
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND))
    dpkg(root, "-r", FRONTEND)
    old = plant_rake_install_config(root, "second\n")
    r = dpkg(root, "-i", deb(dist, FRONTEND))
    kept = root / "etc/one/kvm-sriov/kvm-sriov.toml.rake-install"
    assert kept.read_text() == "first\n"
    assert kept.with_name(kept.name + ".2").read_text() == "second\n" and "rake-install.2" in r.stderr
    assert old.is_symlink()


# setup-frontend's block as written, a VM_MAD written by hand, the block indented
REGISTRATIONS = {
    "block": lambda vm_mad: f"# BEGIN kvm-sriov (written by `kvm-sriov setup-frontend`; x)\n{vm_mad}# END kvm-sriov\n",
    "by hand": lambda vm_mad: vm_mad,
    "indented": lambda vm_mad: "".join("  " + line for line in
                                       f"# BEGIN kvm-sriov (x)\n{vm_mad}# END kvm-sriov\n".splitlines(True)),
}


def registration(kind):
    lines = (REPO / "templates/oned/oned.conf.vm_mad").read_text().splitlines(True)
    return 'LOG = [ SYSTEM = "file" ]\n' + REGISTRATIONS[kind]("".join(x for x in lines if not x.startswith("#")))


@pytest.mark.parametrize("kind", REGISTRATIONS)
def test_removal_is_refused_while_oned_conf_registers_the_driver(dist, root, kind):
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND))
    (root / "etc/one/oned.conf").write_text(registration(kind))
    r = dpkg(root, "-r", FRONTEND, check=False)
    assert r.returncode != 0 and "setup-frontend --undo" in r.stderr and 'VM_MAD "kvm-sriov"' in r.stderr
    assert " ok installed " in status(root, FRONTEND)  # selection "deinstall", still installed
    assert (root / "var/lib/one/remotes/vmm/kvm-sriov/deploy").is_file()
    env = dict(os.environ, KVM_SRIOV_FORCE_REMOVE="1")
    dpkg(root, "-r", FRONTEND, env=env)
    assert not (root / "var/lib/one/remotes/vmm/kvm-sriov").exists()


def test_removal_is_refused_while_hosts_use_the_driver(dist, root, tmp_path):
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND))
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {
        "id": "#!/bin/sh\nexit 0\n",
        "runuser": '#!/bin/sh\nwhile [ "$1" != -- ]; do shift; done; shift; exec "$@"\n',
        "onehost": "#!/bin/sh\nprintf '<HOST_POOL>\\n  <HOST><VM_MAD><![CDATA[kvm]]></VM_MAD></HOST>\\n"
                   "  <HOST><VM_MAD><![CDATA[kvm-sriov]]></VM_MAD></HOST>\\n</HOST_POOL>\\n'\n",
    }
    for name, text in scripts.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    r = dpkg(root, "-r", FRONTEND, check=False, env=env)
    assert r.returncode != 0 and "1 host(s) still use -v kvm-sriov" in r.stderr
    (fake / "onehost").write_text("#!/bin/sh\nexit 1\n")  # oned unreachable: cannot tell, removal goes on
    dpkg(root, "-r", FRONTEND, env=env)
    conf = root / "etc/one/kvm-sriov/kvm-sriov.toml"
    assert conf.is_file()  # removed, not purged: the config stays
    dpkg(root, "--purge", FRONTEND)
    assert not conf.exists()


def test_removing_the_host_package_keeps_pool_state(dist, root):
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, NODE))
    (root / "var/lib/one/kvm-sriov/pool.sqlite").write_bytes(b"x")
    dpkg(root, "--purge", NODE)
    assert (root / "var/lib/one/kvm-sriov/pool.sqlite").read_bytes() == b"x"
    assert not (root / "usr/sbin/kvm-sriov-vfs").exists()


def test_setup_frontend_runs_from_the_installed_packages(dist, root):
    """What the operator runs after installing: the tools' library, the front-end's templates."""
    dpkg(root, "-i", deb(dist, TOOLS), deb(dist, FRONTEND))
    try:
        with tarfile.open(stock_kvm.tarball()) as tar:
            for suffix, dst in (("share/etc/oned.conf", "etc/one/oned.conf"),
                                ("src/vmm_mad/exec/x86_64/vmm_exec_kvm.conf", "etc/one/vmm_exec/vmm_exec_kvm.conf")):
                m = next(m for m in tar.getmembers() if m.name.endswith(suffix))
                (root / dst).parent.mkdir(parents=True, exist_ok=True)
                (root / dst).write_bytes(tar.extractfile(m).read())
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    stock = (root / "etc/one/oned.conf").read_bytes()
    env = dict(os.environ, PYTHONPATH=str(root / "usr/lib/kvm-sriov"))
    args = ["--oned-conf", root / "etc/one/oned.conf", "--templates", root / "usr/share/kvm-sriov/templates",
            "--remotes", root / "var/lib/one/remotes"]
    r = run(sys.executable, "-m", "kvm_sriov.frontend.oned_conf", "setup", *args, env=env, cwd="/")
    assert "registered" in r.stdout and "WARNING" in r.stdout  # the package's remotes have no OpenNebula VERSION
    assert (root / "etc/one/vmm_exec/vmm_exec_kvm-sriov.conf").is_file()
    run(sys.executable, "-m", "kvm_sriov.frontend.oned_conf", "undo", "--oned-conf", root / "etc/one/oned.conf", env=env, cwd="/")
    assert (root / "etc/one/oned.conf").read_bytes() == stock


# --- RPM: what Debian's rpm and rpmlint can check -----------------------------

def rpm(dist, name):
    return dist / f"{name}-{V1}-1.noarch.rpm"


def scriptlets(path):
    """{"postinstall": (interpreter, body), ...} of an RPM."""
    text = run("rpm", "-qp", "--scripts", path).stdout
    parts = re.split(r"(?m)^(\w+) scriptlet \(using (\S+)\):\n", text)
    return {parts[i]: (parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)}


def run_scriptlet(dist, name, which, root, arg, env=None):
    """An RPM scriptlet run as shell, with its absolute paths moved into the throwaway root."""
    interpreter, body = scriptlets(rpm(dist, name))[which]
    assert interpreter == "/bin/sh"
    for path in ("/var/lib/one", "/etc/one", "/usr/lib/kvm-sriov"):
        body = body.replace(path, f"{root}{path}")
    return run("sh", "-c", body, "sh", arg, check=False, env=env, cwd="/")


def test_the_rpm_post_makes_the_state_folder_as_oneadmin(dist, root, oneadmin, work):
    victim = victim_folder(work)
    r = run_scriptlet(dist, NODE, "postinstall", root, "1", env=dict(oneadmin, VICTIM=str(victim)))
    untouched(victim)
    assert r.returncode == 0, r.stderr
    moved = root / "var/lib/one/kvm-sriov.moved"
    assert (moved.stat().st_uid, stat.S_IMODE(moved.stat().st_mode)) == (ONEADMIN, 0o750)


def test_the_rpm_pre_keeps_the_config_and_follows_no_symlinked_folder(dist, root, work):
    plant_rake_install_config(root, "first\n")
    assert run_scriptlet(dist, FRONTEND, "preinstall", root, "1").returncode == 0
    plant_rake_install_config(root, "second\n")
    assert run_scriptlet(dist, FRONTEND, "preinstall", root, "1").returncode == 0
    kept = root / "etc/one/kvm-sriov/kvm-sriov.toml.rake-install"
    assert kept.read_text() == "first\n" and kept.with_name(kept.name + ".2").read_text() == "second\n"
    victim = victim_folder(work)
    conf_dir = root / "var/lib/one/remotes/etc/vmm/kvm-sriov"
    shutil.rmtree(conf_dir)
    conf_dir.symlink_to(victim)
    r = run_scriptlet(dist, FRONTEND, "preinstall", root, "1")
    untouched(victim)
    assert r.returncode != 0 and "is not a folder" in r.stderr


@pytest.mark.parametrize("kind", REGISTRATIONS)
def test_the_rpm_preun_refuses_while_oned_conf_registers_the_driver(dist, root, kind):
    dpkg(root, "-i", deb(dist, TOOLS))  # the tools' library, as the RPM of the tools has it
    (root / "etc/one/oned.conf").write_text(registration(kind))
    r = run_scriptlet(dist, FRONTEND, "preuninstall", root, "0")
    assert r.returncode != 0 and "setup-frontend --undo" in r.stderr and 'VM_MAD "kvm-sriov"' in r.stderr
    (root / "etc/one/oned.conf").write_text('LOG = [ SYSTEM = "file" ]\n')
    assert run_scriptlet(dist, FRONTEND, "preuninstall", root, "0").returncode == 0


def test_the_rpms_hold_what_the_debs_hold(dist):
    """Same files and links (directories aside: dpkg lists every parent), RHEL's unit and udev paths."""
    def rpm_files(name):
        out = run("rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]", rpm(dist, name)).stdout
        return {p.lstrip("/") for mode, p in (line.split(" ", 1) for line in out.splitlines()) if mode[0] != "d"
                and not p.startswith(("/usr/share/doc", "/usr/share/licenses"))}

    def deb_files(name):
        return {p for p, (mode, _o, _t) in contents(deb(dist, name)).items()
                if mode[0] != "d" and not p.startswith(("usr/share/doc", "usr/share/lintian"))}
    moved = {"lib/systemd/system/": "usr/lib/systemd/system/", "lib/udev/rules.d/": "usr/lib/udev/rules.d/"}
    for name in (FRONTEND, NODE, TOOLS):
        want = set()
        for p in deb_files(name):
            for old, new in moved.items():
                p = new + p[len(old):] if p.startswith(old) else p
            want.add(p)
        assert rpm_files(name) == want, name


def test_the_rpms_config_requires_and_scripts(dist):
    assert run("rpm", "-qcp", rpm(dist, FRONTEND)).stdout.split() == ["/etc/one/kvm-sriov/kvm-sriov.toml"]
    assert run("rpm", "-qcp", rpm(dist, NODE)).stdout.split() == ["/etc/kvm-sriov/kvm-sriov.toml"]
    requires = run("rpm", "-qp", "--requires", rpm(dist, NODE)).stdout
    assert "opennebula-node-kvm >= 7.4" in requires and "python3-libvirt" in requires
    scripts = run("rpm", "-qp", "--scripts", rpm(dist, FRONTEND)).stdout
    assert "setup-frontend --undo" in scripts and "still use -v kvm-sriov" in scripts
    for name in (FRONTEND, NODE, TOOLS):  # each scriptlet is valid sh
        for interpreter, body in scriptlets(rpm(dist, name)).values():
            assert interpreter == "/bin/sh" and run("sh", "-n", input=body, check=False).returncode == 0, body


def test_rpmlint_is_clean_with_each_filter_explained(dist):
    rc = REPO / "packaging" / "rpm" / "rpmlintrc"
    r = run("rpmlint", "-r", rc, *sorted(dist.glob("*.rpm")), check=False)
    assert r.returncode == 0 and "0 errors, 0 warnings" in r.stdout, r.stdout + r.stderr
    lines = rc.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("addFilter"):
            assert lines[i - 1].startswith("#") or lines[i - 1].startswith("addFilter"), line
