"""`rake install` (rakelib/install.rake) run by root from a checkout another
account owns: nothing installed may stay that account's, or it could change
the code oneadmin runs on every host."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.install import rake_install

CHECKOUT_OWNER = 65534   # nobody: some developer's account
ONEADMIN = 4242          # the remotes' owner

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("rake"), reason="needs root and rake")


def test_install_as_root_gives_every_file_to_the_remotes_owner_with_explicit_modes(tmp_path):
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("Rakefile", "rakelib", "vmm", "kvm_sriov", "kvm_sriov_bootstrap.py", "etc", "im", "sched"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    (src / "kvm_sriov" / "errors.py").chmod(0o664)        # loose modes are not copied either
    for p in [src, *src.rglob("*")]:
        os.lchown(p, CHECKOUT_OWNER, CHECKOUT_OWNER)
    remotes = tmp_path / "remotes"
    remotes.mkdir()
    os.chown(remotes, ONEADMIN, ONEADMIN)
    subprocess.run(["rake", "install", f"REMOTES={remotes}"], cwd=src, check=True, capture_output=True, timeout=300)
    ours = ("vmm", "etc", "im")  # other parts' steps (e.g. the scheduler's) answer for their own files
    installed = [p for p in remotes.rglob("*") if p.relative_to(remotes).parts[0] in ours]
    assert any(p.name == "deploy" for p in installed) and any(p.name == "__init__.py" for p in installed)
    wrong = [(str(p.relative_to(remotes)), p.lstat().st_uid, oct(stat.S_IMODE(p.lstat().st_mode)))
             for p in installed
             if p.lstat().st_uid != ONEADMIN or p.lstat().st_gid != ONEADMIN
             or stat.S_IMODE(p.lstat().st_mode) not in (0o755, 0o644)]
    assert wrong == []
    assert stat.S_IMODE((remotes / "vmm" / "kvm-sriov" / "deploy").stat().st_mode) == 0o755
    assert stat.S_IMODE((remotes / "vmm" / "kvm-sriov" / "lib" / "kvm_sriov" / "errors.py").stat().st_mode) == 0o644
    assert list((remotes / "vmm" / "kvm-sriov" / "lib" / "kvm_sriov").glob("__pycache__/*.pyc"))


# -- symlinks: root never writes through oneadmin's, nor installs the checkout's --------
def root_only(path: Path, text: str = "root's\n") -> Path:
    """A file only root may change: what oneadmin aims its symlinks at."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def oneadmins_remotes(tmp_path: Path, *dirs: str) -> Path:
    remotes = tmp_path / "remotes"
    for d in ("", *dirs):
        (remotes / d).mkdir(parents=True, exist_ok=True)
    for p in [remotes, *remotes.rglob("*")]:
        os.lchown(p, ONEADMIN, ONEADMIN)
    return remotes


def test_a_symlinked_file_in_the_remotes_is_replaced_not_written_through(tmp_path):
    victim = root_only(tmp_path / "shadow")
    remotes = oneadmins_remotes(tmp_path, "vmm/kvm-sriov")
    deploy = remotes / "vmm" / "kvm-sriov" / "deploy"
    deploy.symlink_to(victim)
    os.lchown(deploy, ONEADMIN, ONEADMIN)
    done = rake_install(remotes)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "root's\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not deploy.is_symlink() and deploy.lstat().st_uid == ONEADMIN
    assert deploy.read_bytes() == (REPO / "vmm" / "kvm-sriov" / "deploy").read_bytes()


def symlinked(tmp_path: Path, where: str):
    """oneadmin's remotes with `where` a symlink to a directory only root may change."""
    victim = tmp_path / "root-dir"
    (victim / "kvm_sriov").mkdir(parents=True)
    root_only(victim / "kvm_sriov" / "precious")
    victim.chmod(0o700)
    remotes = oneadmins_remotes(tmp_path, "vmm/kvm-sriov/lib/kvm_sriov", "im")
    link = remotes / where
    shutil.rmtree(link)
    link.symlink_to(victim)
    os.lchown(link, ONEADMIN, ONEADMIN)
    return remotes, link, victim


def left_alone(victim: Path) -> None:
    assert sorted(p.name for p in victim.rglob("*")) == ["kvm_sriov", "precious"]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700 and victim.stat().st_uid == 0
    assert (victim / "kvm_sriov" / "precious").read_text() == "root's\n"


@pytest.mark.parametrize("where", ["remotes", "im", "vmm", "vmm/kvm-sriov/lib"])
def test_a_symlinked_directory_in_the_remotes_is_refused_and_left_alone(tmp_path, where):
    remotes, link, victim = symlinked(tmp_path, "" if where == "remotes" else where)
    done = rake_install(remotes)
    assert done.returncode != 0
    assert f"{link} is a symlink" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    left_alone(victim)


def test_a_symlink_where_the_old_library_was_is_removed_not_followed(tmp_path):
    remotes, link, victim = symlinked(tmp_path, "vmm/kvm-sriov/lib/kvm_sriov")
    done = rake_install(remotes)
    assert done.returncode == 0, done.stderr
    left_alone(victim)
    assert not link.is_symlink() and (link / "__init__.py").is_file() and link.lstat().st_uid == ONEADMIN


def checkout_of(tmp_path: Path) -> Path:
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("Rakefile", "rakelib", "vmm", "kvm_sriov", "kvm_sriov_bootstrap.py", "etc", "im", "sched", "templates"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    return src


def test_a_symlink_in_the_checkout_stops_the_install_and_its_target_is_not_installed(tmp_path):
    secret = root_only(tmp_path / "secret", "root's secret\n")
    src = checkout_of(tmp_path)
    (src / "kvm_sriov" / "leak.txt").symlink_to(secret)
    for p in [src, *src.rglob("*")]:
        os.lchown(p, CHECKOUT_OWNER, CHECKOUT_OWNER)
    remotes = oneadmins_remotes(tmp_path)
    done = rake_install(remotes, cwd=src)
    assert done.returncode != 0
    assert "leak.txt in the checkout is a symlink" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not [p for p in remotes.rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()]


def test_oned_defaults_never_writes_through_a_symlink_of_the_directorys_owner(tmp_path):
    etc = tmp_path / "etc"
    (etc / "vmm_exec").mkdir(parents=True)
    (etc / "vmm_exec" / "vmm_exec_kvm.conf").write_text('EMULATOR = "/usr/bin/qemu-system-x86_64"\n')
    victims = [root_only(tmp_path / "one"), root_only(tmp_path / "two")]
    out = etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf"
    out.symlink_to(victims[0])
    out.with_name(out.name + ".tmp").symlink_to(victims[1])
    for p in [etc / "vmm_exec", *(etc / "vmm_exec").iterdir()]:
        os.lchown(p, ONEADMIN, ONEADMIN)
    done = subprocess.run(["rake", "install:oned_defaults", f"ONE_ETC={etc}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [v.read_text() for v in victims] == ["root's\n", "root's\n"]
    assert [stat.S_IMODE(v.stat().st_mode) for v in victims] == [0o600, 0o600]
    assert not out.is_symlink() and "kvm-sriov" in out.read_text() and out.lstat().st_uid == ONEADMIN


# -- precompile: oneadmin's remotes may hold anything beside the driver ------------------
PEAK = ("import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


@pytest.mark.parametrize("planted", ["huge.py", "pipe.py", "link.py"])
def test_precompile_reads_only_the_drivers_python_sources(tmp_path, planted):
    """A 300 MB sparse file, a FIFO, a symlink to a file of root's, planted by
    oneadmin beside the action scripts: the install compiles the driver's own
    Python sources (regular *.py of at most 1 MiB, no symlink) and reads
    nothing else, so its memory stays that of an install without them."""
    remotes = oneadmins_remotes(tmp_path, "vmm/kvm-sriov")
    path = remotes / "vmm" / "kvm-sriov" / planted
    if planted == "huge.py":
        with open(path, "wb") as f:
            f.truncate(300 << 20)
    elif planted == "pipe.py":
        os.mkfifo(path)
    else:
        path.symlink_to(root_only(tmp_path / "secret", "SECRET = 1\n"))
    os.lchown(path, ONEADMIN, ONEADMIN)
    done = subprocess.run(["/usr/bin/python3", "-c", PEAK, "rake", "install", f"REMOTES={remotes}"], cwd=REPO,
                          capture_output=True, text=True, timeout=360)
    rc, peak_kib = map(int, done.stdout.split())
    assert rc == 0, done.stderr
    assert peak_kib < 150 << 10, f"peak {peak_kib >> 10} MiB: the planted file was read"
    compiled = {p.name.split(".")[0] for p in (remotes / "vmm" / "kvm-sriov" / "__pycache__").iterdir()}
    assert "kvm_sriov_entry" in compiled and planted.split(".")[0] not in compiled
    assert path.is_symlink() or path.exists()  # left as it was
