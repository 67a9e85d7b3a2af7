"""The rung-4 front-end runs the driver an operator gets: the .debs of
`./dev package`, installed by dpkg, registered by `kvm-sriov setup-frontend`
(docs/install.md), not a `rake install` of the checkout."""

import re
import shutil
import subprocess

from simhost.frontend import FRONTEND_PACKAGES, PACKAGE_SOURCES, reroot_links, sources_digest
from tests.conftest import REPO


def dpkg(frontend, *args):
    return subprocess.run(["dpkg", f"--root={frontend.package_root}", *args], capture_output=True, text=True)


def test_the_driver_is_the_installed_packages(frontend):
    version = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1) + "-1"
    for name in FRONTEND_PACKAGES:
        q = subprocess.run(["dpkg-query", f"--root={frontend.package_root}", "-W", "-f=${Status} ${Version}", name],
                           capture_output=True, text=True)
        assert q.stdout == f"install ok installed {version}", (name, q.stderr)
    # every file of the packages is in this front-end as dpkg put it (md5sums)
    verify = dpkg(frontend, "--verify", *FRONTEND_PACKAGES)
    assert verify.returncode == 0 and verify.stdout == "", verify.stdout + verify.stderr
    listed = dpkg(frontend, "-L", "opennebula-kvm-sriov").stdout.split()
    assert "/var/lib/one/remotes/vmm/kvm-sriov/deploy" in listed
    assert "/var/lib/one/remotes/scheduler/kvm-sriov/place" in listed
    remotes = frontend.one_location / "var" / "remotes"
    assert (frontend.package_root / "var/lib/one/remotes/vmm/kvm-sriov/deploy").samefile(
        remotes / "vmm" / "kvm-sriov" / "deploy")
    # the cluster-wide config is the package's conffile, reached through the remotes' link
    conf = remotes / "etc" / "vmm" / "kvm-sriov" / "kvm-sriov.toml"
    assert conf.is_symlink() and conf.resolve() == (frontend.one_location / "etc" / "kvm-sriov" / "kvm-sriov.toml")


def test_oned_runs_what_setup_frontend_registered(frontend):
    etc = frontend.one_location / "etc"
    text = (etc / "oned.conf").read_text()
    begin = text.index("# BEGIN kvm-sriov (written by `kvm-sriov setup-frontend`")
    block = text[begin:text.index("# END kvm-sriov\n", begin)]
    assert 'NAME           = "kvm-sriov"' in block and 'DEFAULT        = "vmm_exec/vmm_exec_kvm-sriov.conf"' in block
    assert "-p kvm-sriov" in text                          # the placer, as setup-frontend selects it
    assert (etc / "oned.conf.kvm-sriov-backup").is_file()
    assert (etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf").is_file()
    # oned loaded that driver: a host created with -v kvm-sriov is monitored
    host = next(iter(frontend.hosts.values()))
    assert frontend.xml("onehost", "show", host.one_name).findtext("VM_MAD") == "kvm-sriov"
    assert frontend.host_state(next(iter(frontend.hosts))) == "MONITORED"
    log = (frontend.workdir / "install.log").read_text()
    assert "rake install" not in log and "setup-frontend" in log


def test_absolute_links_are_rerooted(tmp_path):
    """What a chroot would see: /etc/one/x under the root, not this machine's."""
    root = tmp_path / "root"
    (root / "etc/one/kvm-sriov").mkdir(parents=True)
    (root / "etc/one/kvm-sriov/kvm-sriov.toml").write_text("[pool]\n")
    link = root / "var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml"
    link.parent.mkdir(parents=True)
    link.symlink_to("/etc/one/kvm-sriov/kvm-sriov.toml")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/kvm-sriov").symlink_to("../lib/kvm-sriov/bin/kvm-sriov")
    deb = tmp_path / "x.deb"
    stage = tmp_path / "stage"
    (stage / "DEBIAN").mkdir(parents=True)
    (stage / "DEBIAN/control").write_text("Package: x\nVersion: 1\nArchitecture: all\nMaintainer: x <x@x>\n"
                                          "Description: x\n")
    for rel in ("var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml", "usr/bin/kvm-sriov"):
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).symlink_to((root / rel).readlink())
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", stage, deb], check=True, capture_output=True)
    reroot_links(root, [deb])
    assert link.readlink() == root / "etc/one/kvm-sriov/kvm-sriov.toml" and link.read_text() == "[pool]\n"
    assert (root / "usr/bin/kvm-sriov").readlink().as_posix() == "../lib/kvm-sriov/bin/kvm-sriov"


def test_packages_are_built_again_only_when_their_sources_change(tmp_path):
    tree = tmp_path / "tree"
    for top in PACKAGE_SOURCES[:3] + ("vmm", "tests"):
        src = REPO / top
        if src.is_dir():
            shutil.copytree(src, tree / top, symlinks=True)
        elif src.is_file():
            (tree / top).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / top)
    first = sources_digest(tree)
    (tree / "tests" / "new.py").write_text("x = 1\n")            # not in a package
    (tree / "vmm" / "kvm-sriov" / "__pycache__").mkdir(exist_ok=True)
    (tree / "vmm" / "kvm-sriov" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert sources_digest(tree) == first
    deploy = tree / "vmm" / "kvm-sriov" / "deploy"
    deploy.chmod(0o644)                                         # a mode the package keeps
    assert sources_digest(tree) != first
    deploy.chmod(0o755)
    deploy.write_bytes(deploy.read_bytes() + b"\n")
    assert sources_digest(tree) != first
