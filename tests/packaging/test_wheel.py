"""pyproject.toml tells the truth: a wheel built from it installs in a fresh
venv, and there both command lines start and every module imports, from the
venv and not from this checkout.

The venv sees Debian's site packages (python3-libvirt and the harness's
numpy/scipy/matplotlib, as a host or a benchmark machine has them), so the
check needs no download; the wheel's declared dependencies are then held
against what is installed.
"""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"  # Debian's, with pip, setuptools and venv
PACKAGES = ("kvm_sriov", "kvm_sriov_bench")


def run(*cmd, cwd):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def test_a_wheel_from_pyproject_installs_and_every_module_imports_from_it(tmp_path):
    source = tmp_path / "source"  # setuptools writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    run(PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist",
        source, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("kvm_sriov-*.whl")

    venv = tmp_path / "venv"
    run(PYTHON, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    run(venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-deps", wheel, cwd=tmp_path)
    # what the wheel says it needs (extras aside) is installed (pip check would also judge Debian's own packages)
    run(venv / "bin" / "python", "-c", "import importlib.metadata as m, re\n"
        "for req in m.requires('kvm-sriov') or []:\n"
        "    if 'extra ==' not in req:\n"
        "        m.version(re.match(r'[A-Za-z0-9_.-]+', req).group())\n", cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"  # no checkout on sys.path
    elsewhere.mkdir()
    assert "usage" in run(venv / "bin" / "kvm-sriov", "--help", cwd=elsewhere).lower()
    assert "usage" in run(venv / "bin" / "kvm-sriov-bench", "--help", cwd=elsewhere).lower()

    expected = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                      for name in PACKAGES for p in (ROOT / name).rglob("*.py") if p.stem != "__main__")
    code = ("import importlib, sys\n"
            f"for name in {expected!r}:\n"
            "    module = importlib.import_module(name)\n"
            f"    assert module.__file__.startswith({str(venv)!r}), (name, module.__file__)\n"
            "print(len(sys.modules))\n")
    run(venv / "bin" / "python", "-c", code, cwd=elsewhere)
