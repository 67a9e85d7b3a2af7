"""`rake install` run into a remotes folder, for the install and upgrade tests."""

import subprocess
from pathlib import Path

from tests.conftest import REPO


def rake_install(remotes: Path, cwd: Path = REPO, task: str = "install", *args: str):
    return subprocess.run(["rake", task, f"REMOTES={remotes}", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
