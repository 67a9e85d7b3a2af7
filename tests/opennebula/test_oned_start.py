"""FrontEnd._start_oned on a loaded machine: oned gives up on a driver that
was slow to answer INIT after `one start` has returned (seen: 16-20 s after
its start, beside the nested lane), its pid in oned.pid possibly another
process's by then, and `one start` moves the last oned.log aside, so every
attempt's log may have the same size. Each attempt must see that oned is
gone and start it again (up to ONED_START_TRIES), never wait minutes for an
oned that no longer runs (seen: 2 x 240 s, then the suite's error). A
stand-in `one` in the front-end's bin/ plays oned, leaving in oned.pid the
pid of a process that runs on (a `sleep` of this test's)."""

import subprocess

import pytest

from simhost import frontend
from simhost.frontend import FrontEnd

ONE = """#!/bin/bash
V="$ONE_LOCATION/var"
case "$1" in
start)
    [ -f "$V/oned.log" ] && mv "$V/oned.log" "$V/oned.log.$(date +%s%N)"
    # "oned": up for a second, then out on a driver's INIT time-out; its pid is a live process's
    # (its output not `one start`'s: oned writes to its log, and the caller reads one start's)
    (sleep 1; printf 'oned started in solo mode.\\n%s\\nAll modules finalized, exiting.\\n' "$TIMED_OUT" \\
        > "$V/oned.log") > /dev/null 2>&1 &
    echo "$ALIVE" > "$V/oned.pid"
    echo start >> "$V/starts" ;;
stop)
    rm -f "$V/oned.pid" ;;
esac
exit 0
"""


class Bounded(FrontEnd):
    def _wait_oned(self, timeout: float = 60) -> None:   # a miss is OnedSilent in a minute, not four
        super()._wait_oned(timeout)


def test_an_oned_that_exits_after_its_start_is_started_again_each_time(tmp_path, monkeypatch):
    monkeypatch.setattr(frontend, "ONED_START_TRIES", 3)
    monkeypatch.setattr(frontend, "ONED_RETRY_PAUSE", 0)
    monkeypatch.setenv("TIMED_OUT", "Unable to start driver 'lxc': " + frontend.DRIVER_TIMED_OUT)
    other = subprocess.Popen(["sleep", "600"])      # the process oned's pid now names
    monkeypatch.setenv("ALIVE", str(other.pid))
    fe = Bounded.__new__(Bounded)
    fe.one_location, fe.auth_file, fe.port, fe.session = tmp_path / "one", tmp_path / "auth", \
        frontend._free_port_block(1), "oneadmin:x"
    fe._log_before = None
    (fe.one_location / "bin").mkdir(parents=True)
    (fe.one_location / "var").mkdir()
    one = fe.one_location / "bin" / "one"
    one.write_text(ONE)
    one.chmod(0o755)
    try:
        with pytest.raises(RuntimeError) as failed:
            fe._start_oned()
    finally:
        other.kill()
        other.wait()
    assert not isinstance(failed.value, frontend.OnedSilent), failed.value
    assert "oned exited while starting" in str(failed.value)
    assert (fe.one_location / "var" / "starts").read_text().split() == ["start"] * 3
