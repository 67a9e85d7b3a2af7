"""Front-ends that start at once never pick the same ports (and so the same
host aliases): each process claims its block before it binds anything."""

import subprocess
import sys

from tests.conftest import REPO

PICK = ("from simhost.frontend import _free_port_block; import sys, time; "
        "print(_free_port_block(12), flush=True); sys.stdin.read()")


def test_processes_starting_at_once_get_different_port_blocks():
    procs = [subprocess.Popen([sys.executable, "-c", PICK], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        bases = [int(p.stdout.readline()) for p in procs]   # all four alive, holding their claims
    finally:
        for p in procs:
            p.communicate("")
    assert len(set(bases)) == 4, bases


def test_a_process_gets_a_new_block_for_each_front_end():
    out = subprocess.run([sys.executable, "-c", "from simhost.frontend import _free_port_block as f; "
                          "print(f(12), f(12))"], cwd=REPO, capture_output=True, text=True, check=True)
    first, second = map(int, out.stdout.split())
    assert first != second
