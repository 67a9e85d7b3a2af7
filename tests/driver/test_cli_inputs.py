"""The admin CLI (bin/kvm-sriov) with files it cannot use, and where it
looks for its library: one clear line and exit 1, never a traceback; and
never a module from a directory another user can add to."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "kvm-sriov"
BOOTSTRAP = REPO / "kvm_sriov_bootstrap.py"
NOBODY = 65534


def cli_tree(top: Path) -> Path:
    """The CLI as the tools package lays it out: top/bin/kvm-sriov, and the
    bootstrap it imports first at top (where the library may also be)."""
    (top / "bin").mkdir()
    shutil.copy(CLI, top / "bin" / "kvm-sriov")
    shutil.copy(BOOTSTRAP, top / BOOTSTRAP.name)
    return top / "bin" / "kvm-sriov"


def cli(tmp_path: Path, *args: str, cli_path: Path = CLI, **env: str):
    conf = tmp_path / "empty.toml"
    conf.touch()
    done = subprocess.run(["/usr/bin/python3", str(cli_path), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60, env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf), **env))
    return done.returncode, done.stdout, done.stderr


def one_clear_line(err: str, *words: str) -> None:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("flag", ["--from-xml", "--validate"])
def test_a_missing_file_is_one_line_and_exit_1(tmp_path, flag):
    code, out, err = cli(tmp_path, "partitions", flag, "missing.xml")
    assert code == 1 and out == ""
    one_clear_line(err, "missing.xml", "No such file or directory")


@pytest.mark.parametrize("flag", ["--from-xml", "--validate"])
def test_a_directory_or_binary_file_is_one_line_and_exit_1(tmp_path, flag):
    (tmp_path / "dir").mkdir()
    (tmp_path / "binary").write_bytes(b"\xd3\xff\x00" * 10)
    for name, words in (("dir", ("Is a directory",)), ("binary", ("not UTF-8",))):
        code, out, err = cli(tmp_path, "partitions", flag, str(tmp_path / name))
        assert code == 1 and out == ""
        one_clear_line(err, name, *words)


@pytest.mark.skipif(os.geteuid() != 0, reason="root reads whatever the mode says")
def test_an_unreadable_file_is_one_line_and_exit_1():
    import tempfile
    top = Path(tempfile.mkdtemp(prefix="kvm-sriov-cli-inputs."))  # tmp_path is closed to nobody
    try:
        top.chmod(0o755)
        xml = top / "vnets.xml"
        xml.write_text("<VNET_POOL/>")
        xml.chmod(0)
        (top / "empty.toml").touch()
        # the CLI and its library where nobody can read them, wherever the checkout is (0700 in CI)
        cli_tree(top)
        shutil.copytree(CLI.parent.parent / "kvm_sriov", top / "kvm_sriov",
                        ignore=shutil.ignore_patterns("__pycache__"))
        done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               "/usr/bin/python3", str(top / "bin" / "kvm-sriov"), "partitions", "--from-xml",
                               str(xml)],
                              capture_output=True, text=True, timeout=60, cwd="/",
                              env=dict(os.environ, KVM_SRIOV_CONFIG=str(top / "empty.toml")))
    finally:
        shutil.rmtree(top)
    assert done.returncode == 1
    one_clear_line(done.stderr, "vnets.xml", "Permission denied")


def test_check_against_a_directory_is_one_line_and_exit_1(tmp_path):
    xml = tmp_path / "vnets.xml"
    xml.write_text("<VNET_POOL/>")
    (tmp_path / "out").mkdir()
    code, out, err = cli(tmp_path, "partitions", "--from-xml", str(xml), "--check", "--output", str(tmp_path / "out"))
    assert code == 1
    one_clear_line(err, "out", "Is a directory")


def test_an_endless_input_is_refused_not_read_to_the_end(tmp_path, monkeypatch):
    from kvm_sriov import cli as cli_mod
    from kvm_sriov.errors import DriverError
    monkeypatch.setattr(cli_mod, "MAX_INPUT_BYTES", 1024)
    with pytest.raises(DriverError, match="larger than"):
        cli_mod.read_input("/dev/zero", "network list")


# -- where the library comes from: one bootstrap, one rule (kvm_sriov_bootstrap.py) --------
def library_copy(where: Path) -> Path:
    shutil.copytree(REPO / "kvm_sriov", where / "kvm_sriov", ignore=shutil.ignore_patterns("__pycache__"))
    for p in [where / "kvm_sriov", *(where / "kvm_sriov").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return where


def plant(directory: Path, module: str, marker: Path) -> None:
    """Another user's module beside ours: a marker proves it ran."""
    f = directory / f"{module}.py"
    f.write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted {module} ran')\n")
    os.lchown(f, NOBODY, NOBODY)


def sticky_shared(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"       # like /tmp or /var/tmp
    shared.mkdir()
    shared.chmod(0o1777)
    tmp_path.chmod(0o755)
    return shared


@pytest.mark.skipif(os.geteuid() != 0, reason="the planting user must be another one")
def test_the_library_directory_may_not_be_sticky_world_writable(tmp_path):
    """The library straight in a /tmp-like directory: another user's argparse.py
    beside it would run as root."""
    shared = library_copy(sticky_shared(tmp_path))
    marker = tmp_path / "ran"
    plant(shared, "argparse", marker)
    plant(shared, "kvm_sriov_bootstrap", marker)   # the bootstrap never comes from the library's folder
    code, out, err = cli(tmp_path, "partitions", "--from-xml", "x", cli_path=cli_tree(tmp_path),
                         KVM_SRIOV_LIB=str(shared))
    assert not marker.exists(), "imported a module another user put beside the library"
    assert code == 1 and "writable by group or others (mode 1777)" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="the planting user must be another one")
def test_nothing_is_imported_from_the_scripts_own_directory(tmp_path):
    """bin/kvm-sriov in a /tmp-like directory: Python puts that directory first
    on sys.path, before the standard library. Nothing is imported from there,
    the bootstrap included, and the CLI refuses to run from it."""
    shared = sticky_shared(tmp_path)
    shutil.copy(cli_tree(tmp_path), shared / "kvm-sriov")
    marker = tmp_path / "ran"
    for module in ("pathlib", "kvm_sriov_bootstrap"):
        plant(shared, module, marker)
    trusted = library_copy(tmp_path / "lib")
    code, out, err = cli(tmp_path, "--version", cli_path=shared / "kvm-sriov", KVM_SRIOV_LIB=str(trusted))
    assert not marker.exists(), "imported a module from the script's directory"
    assert code == 1
    one_clear_line(err, f"{shared} is writable by group or others (mode 1777)")


def fake_remotes(tmp_path: Path) -> Path:
    """OpenNebula's remotes as rake install lays them out, with this checkout's files."""
    remotes = tmp_path / "remotes"
    drv = remotes / "vmm" / "kvm-sriov"
    drv.mkdir(parents=True)
    for name in ("kvm_sriov_entry.py", "shutdown"):
        shutil.copy(REPO / "vmm" / "kvm-sriov" / name, drv / name)
    shutil.copy(BOOTSTRAP, drv / BOOTSTRAP.name)
    library_copy(drv / "lib")
    (remotes / "scheduler" / "kvm-sriov").mkdir(parents=True)
    shutil.copy(REPO / "sched" / "kvm-sriov" / "place", remotes / "scheduler" / "kvm-sriov" / "place")
    probes = remotes / "im" / "kvm-probes.d" / "host" / "system"
    probes.mkdir(parents=True)
    shutil.copy(REPO / "im" / "kvm-probes.d" / "host" / "system" / "kvm_sriov.py", probes / "kvm_sriov.py")
    tmp_path.chmod(0o755)
    return remotes


@pytest.mark.skipif(os.geteuid() != 0, reason="the planting user must be another one")
@pytest.mark.parametrize("loose", ["lib", "script"])
def test_an_action_refuses_a_library_or_script_directory_others_can_add_to(tmp_path, loose):
    """The action scripts' own start (kvm_sriov_entry.py): the same rule."""
    drv = fake_remotes(tmp_path) / "vmm" / "kvm-sriov"
    shared = drv / "lib" if loose == "lib" else drv
    shared.chmod(0o1777)
    marker = tmp_path / "ran"
    plant(shared, "pathlib", marker)   # every action imports it (os is frozen in)
    if loose == "lib":
        plant(shared, "kvm_sriov_bootstrap", marker)
    done = subprocess.run([str(drv / "shutdown"), "one-1", "host1", "1", "host1"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert not marker.exists(), "imported a module another user could have put there"
    assert done.returncode == 1
    one_clear_line(done.stderr, f"{shared} is writable by group or others (mode 1777)")


def tampered(remotes: Path, module: str, marker: Path, how: str) -> str:
    """A module of the installed library that writes marker when it runs,
    left where another user could have changed it; what the refusal names."""
    lib = remotes / "vmm" / "kvm-sriov" / "lib"
    f = lib / "kvm_sriov" / module
    f.write_text(f.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    if how == "owned by another user":
        os.chown(f, NOBODY, NOBODY)
        return f"{f} is owned by uid {NOBODY}"
    if how == "its folder writable by others":
        lib.chmod(0o777)
        return f"{lib} is writable by group or others (mode 777)"
    os.chown(f.parent, 0, NOBODY)          # another group may write the package's folder
    f.parent.chmod(0o775)
    return f"{f.parent} is writable by group or others (mode 775)"


LOOSE = ["owned by another user", "its folder writable by others", "writable by another group"]


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
@pytest.mark.parametrize("how", LOOSE)
def test_the_placer_refuses_a_library_another_user_could_change(tmp_path, how):
    """The placer loaded the library with no check at all: one line, non-zero,
    and not one line of that library runs."""
    remotes = fake_remotes(tmp_path)
    marker = tmp_path / "ran"
    named = tampered(remotes, "scheduler/placement_program.py", marker, how)
    done = subprocess.run([str(remotes / "scheduler" / "kvm-sriov" / "place")], input="", capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, KVM_SRIOV_PLACEMENT_LEDGER=str(tmp_path / "l")))
    assert not marker.exists(), "the placer ran a library another user could have changed"
    assert done.returncode != 0 and done.stdout == ""
    one_clear_line(done.stderr, "kvm-sriov place:", named)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
@pytest.mark.parametrize("how", LOOSE)
def test_the_probe_refuses_a_library_another_user_could_change(tmp_path, how):
    """The probe loaded the library with no check at all: it says why in one
    monitoring line and exits 0 (monitord goes on with the other probes)."""
    remotes = fake_remotes(tmp_path)
    marker = tmp_path / "ran"
    named = tampered(remotes, "node/probe.py", marker, how)
    done = subprocess.run([str(remotes / "im" / "kvm-probes.d" / "host" / "system" / "kvm_sriov.py")],
                          capture_output=True, text=True, timeout=60)
    assert not marker.exists(), "the probe ran a library another user could have changed"
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert len(done.stdout.splitlines()) == 1 and done.stdout.startswith('KVM_SRIOV_ERROR = "kvm-sriov probe: ')
    assert named in done.stdout and done.stdout.rstrip().endswith('"'), done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
def test_the_placer_and_the_probe_run_from_a_trusted_remotes_tree(tmp_path):
    """The same tree untouched: both start (the placer up to its ledger, the probe to its output)."""
    remotes = fake_remotes(tmp_path)
    conf = tmp_path / "probe.toml"
    conf.write_text(f'[sysfs]\nroot = "{tmp_path / "no-sysfs"}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n')
    done = subprocess.run([str(remotes / "im" / "kvm-probes.d" / "host" / "system" / "kvm_sriov.py")],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)))
    assert done.returncode == 0 and "KVM_SRIOV_TOTAL_VFS = 0" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([str(remotes / "scheduler" / "kvm-sriov" / "place")], input="", capture_output=True,
                          text=True, timeout=60,
                          env=dict(os.environ, KVM_SRIOV_PLACEMENT_LEDGER=str(tmp_path / "no-dir" / "ledger")))
    assert "kvm-sriov place:" in done.stderr and "library" not in done.stderr, done.stderr
