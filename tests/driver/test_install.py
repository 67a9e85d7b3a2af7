"""`rake install` (rakelib/install.rake) run by root from a checkout another
account owns: nothing installed may stay that account's, or it could change
the code oneadmin runs on every host."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKOUT_OWNER = 65534   # nobody: some developer's account
ONEADMIN = 4242          # the remotes' owner

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("rake"), reason="needs root and rake")


def test_install_as_root_gives_every_file_to_the_remotes_owner_with_explicit_modes(tmp_path):
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("Rakefile", "rakelib", "vmm", "kvm_sriov", "etc", "im", "sched"):
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
