"""Without OpenNebula the suite says so in one line naming the variable to
set, and fails (rakelib/opennebula.rake runs `simhost.frontend --locate` first)."""

import os
import subprocess
import sys

import pytest

from simhost import frontend
from tests.conftest import REPO


def test_no_shared_folder_and_no_variable_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(frontend.ENV_VAR, raising=False)
    monkeypatch.setattr(frontend, "SHARED_ONE", tmp_path / "shared" / "opennebula")
    with pytest.raises(frontend.OpenNebulaMissing) as err:
        frontend.locate_install()
    assert "\n" not in str(err.value) and frontend.ENV_VAR in str(err.value)


def test_locate_command_fails_with_one_line_for_a_wrong_variable(tmp_path):
    env = dict(os.environ, **{frontend.ENV_VAR: str(tmp_path / "nothing-here")})
    p = subprocess.run([sys.executable, "-m", "simhost.frontend", "--locate"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and frontend.ENV_VAR in lines[0] and p.stderr == ""


def test_variable_may_name_an_install(monkeypatch, tmp_path):
    install = tmp_path / "one"
    (install / "bin").mkdir(parents=True)
    (install / "bin" / "oned").write_text("")
    (install / "var" / "remotes").mkdir(parents=True)
    monkeypatch.setenv(frontend.ENV_VAR, str(tmp_path))
    assert frontend.locate_install() == install
