"""Rung 3: the nested host's command line (simhost.nested). Its VFs and VFIO
are checked inside driver-vfio's nested host (tests/sim/l1_vfio_checks.py,
first there), which shares one boot with the driver's rung-3 modules."""
import subprocess
import sys

import pytest

from simhost.guest_image import REPO

pytestmark = pytest.mark.vfio


def test_cli_passes_output_and_exit_status_through():
    proc = subprocess.run([sys.executable, '-m', 'simhost.nested', '--vfs', '0', '--',
                           'sh', '-c', 'echo "hello from $(uname -r) in $PWD"; exit 3'],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 3, proc.stderr
    assert f'in {REPO}' in proc.stdout
