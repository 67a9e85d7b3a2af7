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
ENTRY = REPO / "vmm" / "kvm-sriov" / "kvm_sriov_entry.py"
NOBODY = 65534


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
        (top / "bin").mkdir()
        shutil.copy(CLI, top / "bin" / "kvm-sriov")
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


# -- where the library comes from --------------------------------------------------
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
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(CLI, bindir / "kvm-sriov")
    shared = library_copy(sticky_shared(tmp_path))
    marker = tmp_path / "ran"
    plant(shared, "argparse", marker)
    code, out, err = cli(tmp_path, "partitions", "--from-xml", "x", cli_path=bindir / "kvm-sriov",
                         KVM_SRIOV_LIB=str(shared))
    assert not marker.exists(), "imported a module another user put beside the library"
    assert code == 1 and "writable by group or others (mode 1777)" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="the planting user must be another one")
def test_nothing_is_imported_from_the_scripts_own_directory(tmp_path):
    """bin/kvm-sriov copied to a /tmp-like directory: Python puts that
    directory first on sys.path, before the standard library."""
    shared = sticky_shared(tmp_path)
    shutil.copy(CLI, shared / "kvm-sriov")
    marker = tmp_path / "ran"
    plant(shared, "pathlib", marker)
    trusted = library_copy(tmp_path / "lib")
    cli(tmp_path, "--version", cli_path=shared / "kvm-sriov", KVM_SRIOV_LIB=str(trusted))
    assert not marker.exists(), "imported a module from the script's directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="the planting user must be another one")
@pytest.mark.parametrize("loose", ["lib", "script"])
def test_an_action_refuses_a_library_or_script_directory_others_can_add_to(tmp_path, loose):
    """The action scripts' own start (kvm_sriov_entry.py): the same rule."""
    drv = tmp_path / "remotes" / "vmm" / "kvm-sriov"
    drv.mkdir(parents=True)
    for name in ("kvm_sriov_entry.py", "shutdown"):
        shutil.copy(REPO / "vmm" / "kvm-sriov" / name, drv / name)
    library_copy(drv / "lib")
    tmp_path.chmod(0o755)
    shared = drv / "lib" if loose == "lib" else drv
    shared.chmod(0o1777)
    marker = tmp_path / "ran"
    plant(shared, "pathlib", marker)   # every action imports it (os is frozen in)
    done = subprocess.run([str(drv / "shutdown"), "one-1", "host1", "1", "host1"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert not marker.exists(), "imported a module another user could have put there"
    assert done.returncode == 1
    one_clear_line(done.stderr, f"{shared} is writable by group or others (mode 1777)")
