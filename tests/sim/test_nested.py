"""Rung 3: a nested host (L1) with real SR-IOV VFs and VFIO, from simhost.nested."""
import io
import subprocess
import sys

import pytest

from simhost.guest_image import REPO
from simhost.nested import run_in_l1

pytestmark = pytest.mark.vfio


def test_cli_passes_output_and_exit_status_through():
    proc = subprocess.run([sys.executable, '-m', 'simhost.nested', '--vfs', '0', '--',
                           'sh', '-c', 'echo "hello from $(uname -r) in $PWD"; exit 3'],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 3, proc.stderr
    assert f'in {REPO}' in proc.stdout


def test_vfs_and_managed_vfio_hostdev_in_l1(guest_image):
    # guest_image: built here, where apt can download; L1 only reads the cache
    out = io.BytesIO()
    rc = run_in_l1(['/usr/bin/python3', '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                    'tests/sim/l1_vfio_checks.py'], cwd=REPO, out=out, timeout=900)
    assert rc == 0, out.getvalue().decode(errors='replace')
