"""Warm start (kvm_sriov/warmstart.py): the installed scripts, called the
way OpenNebula calls them, give the same stdout, stderr and exit code
whether the action runs in the script's process or is forked from the
server; kill points kill the script; a changed library gets a new server.
libvirt is its test driver here (each action process has its own)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kvm_sriov import warmstart, warmstart_client
from tests.support.driver_env import DriverOnHost, install_remotes, write_config, wait_for

SYSTEM_PYTHON = "/usr/bin/python3"  # the scripts' interpreter (their #! line)
KILLED = 128 + signal.SIGKILL


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    remotes = install_remotes(tmp_path_factory.mktemp("host"))
    yield remotes
    subprocess.run(["pkill", "-f", f"warmstart.serve.*{remotes}"], check=False)


def driver_on(remotes: Path, fake_host, tmp_path: Path) -> DriverOnHost:
    config = write_config(tmp_path / "host.toml", {
        "pool": {"state_dir": str(tmp_path / "state")}, "sysfs": {"root": str(fake_host["root"])},
        "libvirt": {"uri": "test:///default"}})
    return DriverOnHost(remotes, config, "host1")


@pytest.fixture
def driver(remotes, fake_host, tmp_path):
    return driver_on(remotes, fake_host, tmp_path)


def lib_of(remotes: Path) -> str:
    return str(remotes / "vmm" / "kvm-sriov" / "lib")


def recorded(driver, action: str = "shutdown") -> Path:
    """OpenNebula's kvm <action> (which kvm-sriov hands a VM without VFs to)
    replaced by one that notes each run and echoes its stdin: how many times
    an action ran, and that stdio reaches it."""
    runs = driver.remotes / f"{action}.runs"
    runs.write_text("")
    script = driver.remotes / "vmm" / "kvm" / action
    script.write_text(f'#!/bin/sh\necho "$*" >> {runs}\ncat\n')
    script.chmod(0o755)
    return runs


def ran(runs: Path) -> int:
    return len(runs.read_text().splitlines())


def give_vm_a_vf(driver, vm_id: int = 42) -> None:
    """A pool row for the VM, so its actions are kvm-sriov's own, not handed over."""
    from kvm_sriov import config
    from kvm_sriov.node.host import Host
    host = Host(config.load(files=[driver.config]))
    with host.pool.transaction() as txn:
        txn.add("0000:03:00.1", "0000:03:00.0", vm_id, f"one-{vm_id}", "02:00:0a:64:00:2a", "attached", "deploy")
    host.close()


def served(remotes: Path) -> bool:
    try:
        warmstart_client._connect(warmstart_client.address(lib_of(remotes), SYSTEM_PYTHON)).close()
        return True
    except OSError:
        return False


def warm(driver):
    """Make sure the server is up (the first call of a library starts it)."""
    driver("cancel", ["nothing", "host1"])
    assert wait_for(lambda: served(driver.remotes), 30, 0.1), "no warm-start server came up"


def both(driver, *args, extra_env=None, **kwargs):
    """The same call with warm start off, then through the server."""
    cold = driver(*args, **kwargs, extra_env={warmstart_client.ENV_SWITCH: "0", **(extra_env or {})})
    warm(driver)
    return cold, driver(*args, **kwargs, extra_env=extra_env)


@pytest.mark.parametrize("args", [["cancel", ["no-such-domain", "host1"]],
                                  ["cancel", ["too-few"]],
                                  ["frobnicate", ["x"]]])
def test_same_output_warm_or_cold(driver, args):
    cold, hot = both(driver, *args)
    assert (hot.code, hot.stdout, hot.stderr) == (cold.code, cold.stdout, cold.stderr)


def test_stdin_reaches_the_action_and_stdout_comes_back(driver):
    runs = recorded(driver)
    warm(driver)
    xml = "<VMM_DRIVER_ACTION_DATA><VM><ID>42</ID></VM></VMM_DRIVER_ACTION_DATA>"
    r = driver("shutdown", ["one-42", "host1"], stdin=xml)
    assert r.code == 0 and xml in r.stdout, r.stderr
    assert ran(runs) == 1


def test_a_call_handed_over_runs_in_the_scripts_own_process(driver):
    """A VM without VFs: OpenNebula's kvm script runs as the action script's
    own process (its pid, as under the kvm driver), warm or cold, with the
    whole stdin, SIGPIPE at its default and no fd of ours open."""
    script = driver.remotes / "vmm" / "kvm" / "shutdown"
    script.write_text('#!/bin/bash\necho "pid $$"; grep SigIgn /proc/$$/status; ls /proc/$$/fd | tr "\\n" " "; echo; cat\n')
    script.chmod(0o755)
    env = dict(os.environ, KVM_SRIOV_CONFIG=str(driver.config))
    xml = "<VMM_DRIVER_ACTION_DATA>" + "x" * 200_000 + "</VMM_DRIVER_ACTION_DATA>"  # more than a pipe holds
    for extra in ({warmstart_client.ENV_SWITCH: "0"}, {}):
        if not extra:
            warm(driver)
        p = subprocess.Popen([str(driver.remotes / "vmm" / "kvm-sriov" / "shutdown"), "one-42", "host1", "42", "host1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env, **extra), text=True)
        out, _ = p.communicate(xml)
        lines = out.splitlines()
        assert p.returncode == 0 and lines[0] == f"pid {p.pid}", (extra, lines[:3])
        assert int(lines[1].split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0, lines[1]
        fds = lines[2].split()
        assert sorted(fds) == ["0", "1", "2", "255"] or sorted(fds) == ["0", "1", "2"], fds  # 255: bash's own
        assert lines[3] == xml


@pytest.mark.parametrize("with_vf", [False, True], ids=["handed-over", "vf-owned"])
def test_the_stock_script_gets_the_environment_opennebula_gave(driver, with_vf):
    """Under a C locale Python adds LC_CTYPE=C.UTF-8 to its own environment
    at start-up; the stock script must not inherit it, warm or cold, whether
    the call is handed over or kvm-sriov's own (a VM with a VF)."""
    seen = driver.remotes / "environ"
    script = driver.remotes / "vmm" / "kvm" / "shutdown"
    script.write_text(f'#!/bin/sh\ncat /proc/$$/environ > {seen}\ncat > /dev/null\n')
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHON"))}
    env.update(KVM_SRIOV_CONFIG=str(driver.config), ODD="a=b\tc")
    if with_vf:
        give_vm_a_vf(driver)
    for extra in ({warmstart_client.ENV_SWITCH: "0"}, {}):
        if not extra:
            warm(driver)
        seen.unlink(missing_ok=True)
        p = subprocess.run([str(driver.remotes / "vmm" / "kvm-sriov" / "shutdown"), "one-42", "host1", "42", "host1"],
                           input=b"<VMM_DRIVER_ACTION_DATA/>", capture_output=True, env=dict(env, **extra))
        assert p.returncode == 0, p.stderr
        got = dict(item.split("=", 1) for item in seen.read_text().split("\0") if item)
        assert got == dict(env, **extra), (extra, set(got.items()) ^ set(dict(env, **extra).items()))


def test_a_kill_point_kills_the_script(driver):
    kill = {"KVM_SRIOV_KILL_AT": "cancel:begin"}
    warm(driver)
    give_vm_a_vf(driver)  # so cancel is kvm-sriov's own and reaches cancel:begin (killed: the row stays)
    cold = driver("cancel", ["one-42", "host1"], extra_env={warmstart_client.ENV_SWITCH: "0", **kill})
    hot = driver("cancel", ["one-42", "host1"], extra_env=kill)
    assert cold.code == hot.code == KILLED


def test_a_changed_library_gets_its_own_server(driver):
    warm(driver)
    before = warmstart_client.address(lib_of(driver.remotes), SYSTEM_PYTHON)
    module = Path(lib_of(driver.remotes)) / "kvm_sriov" / "errors.py"
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as `onehost sync` would
    after = warmstart_client.address(lib_of(driver.remotes), SYSTEM_PYTHON)
    assert after != before and not served(driver.remotes)
    assert driver("cancel", ["no-such-domain", "host1"]).code == 0  # runs cold, starts the new server
    assert wait_for(lambda: served(driver.remotes), 30, 0.1)


def test_switched_off_starts_no_server(tmp_path, fake_host):
    remotes = install_remotes(tmp_path / "off")
    d = driver_on(remotes, fake_host, tmp_path)
    for _ in range(2):
        assert d("cancel", ["nothing", "host1"], extra_env={warmstart_client.ENV_SWITCH: "0"}).code == 0
    time.sleep(1)
    assert not served(remotes)


def test_the_request_round_trips():
    """argv with empty and odd arguments, cwd, umask and the environment."""
    environ = warmstart_client.started_environment()
    body = warmstart_client.encode("cancel", ["", "a b", "x=y", "\u00e9"], "/some/dir", environ)[8:]
    action, cwd, umask, argv, env = warmstart_client.decode(body)
    assert (action, cwd, argv) == ("cancel", "/some/dir", ["", "a b", "x=y", "\u00e9"])
    assert umask == warmstart_client.umask()
    assert env == {os.fsdecode(k): os.fsdecode(v) for k, v in warmstart_client._variables(environ).items()}


def test_a_server_that_does_not_start_the_action_means_it_runs_here(driver):
    """Whatever answers on the socket without starting the action (a dying
    server, say), the script runs it itself, once: the action waits for the
    script to know its pid before it does anything."""
    import socket
    import threading
    warm(driver)
    subprocess.run(["pkill", "-f", f"warmstart.serve.*{driver.remotes}"], check=False)
    assert wait_for(lambda: not served(driver.remotes), 10, 0.1)
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    addr = warmstart_client.address(lib_of(driver.remotes), SYSTEM_PYTHON)
    Path(addr).unlink(missing_ok=True)  # the killed server's
    fake.bind(addr)
    fake.listen(4)
    hung_up = []

    def hang_up():
        conn, _ = fake.accept()
        conn.recv(65536)
        conn.close()
        hung_up.append(True)
    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    runs = recorded(driver)
    try:
        r = driver("shutdown", ["one-42", "host1"])
    finally:
        fake.close()
    assert hung_up and r.code == 0, r.stderr
    assert ran(runs) == 1


def descendants(pid: int) -> set:
    kids = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            kids |= {int(child)} | descendants(int(child))
    return kids


def warm_server(driver) -> int:
    """The pid of the driver's warm-start server, started if need be."""
    warm(driver)
    return int(subprocess.run(["pgrep", "-f", f"warmstart.serve.*{driver.remotes}"],
                              capture_output=True, text=True).stdout.split()[0])


def cancel_in_background(driver, stdin) -> subprocess.Popen:
    """The installed cancel script of VM 42, not waited for."""
    script = driver.remotes / "vmm" / "kvm-sriov" / "cancel"
    env = dict(os.environ, KVM_SRIOV_CONFIG=str(driver.config))
    return subprocess.Popen([str(script), "x", "host1", "42", "host1"], stdin=stdin, env=env)


def holding(pids: set, stdin) -> set:
    """Those of pids whose fd 0 is the other end of stdin (a pipe we write)."""
    pipe = os.readlink(f"/proc/self/fd/{stdin.fileno()}")
    found = set()
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/fd/0") == pipe:
                found.add(pid)
        except OSError:
            pass  # gone, or not ours to look at
    return found


def test_killing_the_script_kills_its_action(driver):
    """OpenNebula's timeout kills the script: the forked action goes too
    (and the server's spare, which waits for the next call, stays)."""
    server = warm_server(driver)
    # stdin left open: the action waits on it, as if oned were slow to send
    client = cancel_in_background(driver, subprocess.PIPE)
    action = set()
    assert wait_for(lambda: action.update(holding(descendants(server), client.stdin)) or action, 10, 0.05), \
        "the action did not start"
    time.sleep(0.5)  # past its start: it waits on stdin
    client.kill()
    client.wait()
    assert wait_for(lambda: not action & descendants(server), 10, 0.05), action


def test_the_server_keeps_a_spare_that_takes_the_next_call(driver):
    """Once idle, the server has forked the process that runs the next call
    (it has already touched what a decision touches); the call gets it, and
    a new spare follows."""
    server = warm_server(driver)
    assert wait_for(lambda: len(descendants(server)) == 1, 10, 0.05), descendants(server)
    spare = descendants(server)
    runs = recorded(driver, "cancel")
    client = cancel_in_background(driver, subprocess.PIPE)
    try:
        assert wait_for(lambda: holding(spare, client.stdin) == spare, 10, 0.05), "the spare did not take the call"
        client.stdin.close()
        assert client.wait(30) == 0 and ran(runs) == 1
    finally:
        client.kill()
    assert wait_for(lambda: len(descendants(server)) == 1 and descendants(server) != spare, 10, 0.05), \
        "no new spare"


def test_no_spare_is_made_while_a_handed_over_call_runs(driver):
    """The spare's fork and first steps take CPU: the server makes it only
    once the stock script that a call became has ended."""
    server = warm_server(driver)
    assert wait_for(lambda: len(descendants(server)) == 1, 10, 0.05), descendants(server)
    stock = driver.remotes / "vmm" / "kvm" / "cancel"
    kept = stock.read_bytes()
    stock.write_text("#!/bin/sh\nsleep 2\n")
    try:
        client = cancel_in_background(driver, subprocess.DEVNULL)
        assert wait_for(lambda: b"vmm/kvm/cancel" in Path(f"/proc/{client.pid}/cmdline").read_bytes(), 10, 0.02)
        end = time.monotonic() + 1
        while time.monotonic() < end:  # well past SPARE_AFTER_SECONDS
            assert not descendants(server), "a spare was forked while the stock script ran"
            time.sleep(0.05)
        assert client.wait(30) == 0
    finally:
        stock.write_bytes(kept)
    assert wait_for(lambda: len(descendants(server)) == 1, 10, 0.05), "no spare once it ended"


def test_a_silent_client_holds_up_nobody(driver):
    """The server forks before it reads a request: a connection that never
    sends one (a script stopped at the wrong moment) delays no other action."""
    import socket
    warm(driver)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(warmstart_client.address(lib_of(driver.remotes), SYSTEM_PYTHON))
    try:
        t = time.monotonic()
        r = driver("cancel", ["no-such-domain", "host1"])
        assert r.code == 0 and time.monotonic() - t < 10, r.stderr
    finally:
        silent.close()


NOBODY = 65534


def as_nobody(setup) -> int:
    """Runs setup() in a forked process of uid nobody, which then stays
    alive (holding what it made) until killed; returns its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            kept = [setup()]  # its sockets stay open while this process lives
            os.write(w, b"1")
            time.sleep(120)
            kept.clear()
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1", "the nobody process failed"
    os.close(r)
    return pid


def shared_tmp() -> Path:
    """A world-writable sticky directory like /tmp, for another user to plant things in."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="kvm-sriov-warm-test."))
    d.chmod(0o1777)
    return d


def hung_listener(path: str):
    """A socket nobody answers with one connection pending: connect() to it blocks."""
    import socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    pending = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pending.connect(path)
    return listener, pending


def test_another_user_cannot_hang_the_actions(driver, tmp_path, monkeypatch):
    """Another user binds what it can predict of the server's name (the old
    abstract name; this user's socket in a directory it made first under a
    shared /tmp) and never answers: every action still answers at once, cold."""
    import shutil
    lib = lib_of(driver.remotes)
    monkeypatch.setenv(warmstart_client.DIR_ENV, str(tmp_path))
    socket_name = Path(warmstart_client.address(lib, SYSTEM_PYTHON)).name
    monkeypatch.delenv(warmstart_client.DIR_ENV)
    base = shared_tmp()
    old_name = f"\0kvm-sriov-warm/{os.getuid()}/{SYSTEM_PYTHON}/{warmstart_client._stamp(lib)}"
    victims_dir = base / f"kvm-sriov-warm-{os.getuid()}"

    def plant():
        victims_dir.mkdir()
        victims_dir.chmod(0o777)
        return hung_listener(old_name), hung_listener(str(victims_dir / socket_name))
    squatter = as_nobody(plant)
    runs = recorded(driver)
    try:
        t = time.monotonic()
        r = driver("shutdown", ["one-42", "host1"], extra_env={warmstart_client.DIR_ENV: str(base)})
        took = time.monotonic() - t
        assert r.code == 0 and ran(runs) == 1, r.stderr
        assert took < 5, f"the action took {took:.1f} s"
    finally:
        os.kill(squatter, signal.SIGKILL)
        os.waitpid(squatter, 0)
        shutil.rmtree(base)


def test_a_wedged_server_of_ours_costs_a_second_then_the_action_runs_cold(driver, tmp_path):
    base = tmp_path / "warm"
    base.mkdir()
    env = {warmstart_client.DIR_ENV: str(base)}
    os.environ[warmstart_client.DIR_ENV] = str(base)
    try:
        addr = warmstart_client.address(lib_of(driver.remotes), SYSTEM_PYTHON)
    finally:
        del os.environ[warmstart_client.DIR_ENV]
    listener, pending = hung_listener(addr)
    runs = recorded(driver)
    t = time.monotonic()
    r = driver("shutdown", ["one-42", "host1"], extra_env=env)
    assert r.code == 0 and ran(runs) == 1, r.stderr
    assert time.monotonic() - t < warmstart_client.CONNECT_SECONDS + 4
    pending.close()
    listener.close()


def test_the_socket_directory_must_be_ours_and_private(tmp_path, monkeypatch):
    monkeypatch.setenv(warmstart_client.DIR_ENV, str(tmp_path))
    made = Path(warmstart_client.socket_dir())
    assert made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o755)
    with pytest.raises(OSError):
        warmstart_client.socket_dir()
    made.rmdir()
    made.symlink_to(tmp_path)
    with pytest.raises(OSError):
        warmstart_client.socket_dir()


def test_another_users_connections_neither_fork_nor_keep_the_server_alive(remotes, monkeypatch):
    """Even where another user can reach the socket (a directory made
    accessible by mistake), the server forks nothing for it (it would answer
    "exit 1" from a fork) and still idles out."""
    import shutil
    import socket
    base = shared_tmp()
    d = base / "open"
    d.mkdir()
    d.chmod(0o755)
    addr = str(d / "warm.sock")
    server = os.fork()
    if server == 0:
        try:
            warmstart.IDLE_SECONDS = 2
            warmstart.serve(addr, str(remotes))
        finally:
            os._exit(0)
    try:
        assert wait_for(lambda: os.path.exists(addr), 30, 0.05)
        os.chmod(addr, 0o777)

        def flood():
            answers = []
            end = time.monotonic() + 5
            while time.monotonic() < end:
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.settimeout(5)
                try:
                    c.connect(addr)
                    answers.append(c.recv(64))
                except OSError:
                    answers.append(b"refused")
                c.close()
                time.sleep(0.05)
            return answers
        r, w = os.pipe()
        flooder = os.fork()
        if flooder == 0:
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                answers = flood()
                os.write(w, repr(sorted(set(answers))).encode())
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 4096).decode()
        os.waitpid(flooder, 0)
        assert "exit" not in got, got    # no action was forked for nobody
        assert "b''" in got, got         # the server took and dropped the connections
        # idle 2 s counted from its start: gone while nobody was still connecting (for 5 s)
        assert "refused" in got and os.waitpid(server, os.WNOHANG)[0] == server, \
            "the server stayed up under another user's connections"
        server = 0
        assert not os.path.exists(addr)
    finally:
        if server:
            os.kill(server, signal.SIGKILL)
            os.waitpid(server, 0)
        shutil.rmtree(base)


def test_the_socket_directory_is_in_the_home_where_no_other_user_can_make_it(monkeypatch):
    import pwd
    monkeypatch.delenv(warmstart_client.DIR_ENV, raising=False)
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert warmstart_client.socket_dir() == f"{home.rstrip('/')}/.kvm-sriov-warm"


def test_a_socket_directory_another_user_made_is_said_once_in_the_log(driver):
    """Warm start off for good, by another user's mkdir: the action's log
    says so (OpenNebula's WARN: line) the first time, not on every action."""
    import shutil
    base = shared_tmp()
    squatted = base / f"kvm-sriov-warm-{os.getuid()}"
    squatter = as_nobody(lambda: squatted.mkdir(mode=0o700))
    try:
        runs = recorded(driver)
        env = {warmstart_client.DIR_ENV: str(base)}
        said = []
        for _ in range(3):
            r = driver("shutdown", ["one-42", "host1"], extra_env=env)
            assert r.code == 0, r.stderr
            said += [line for line in r.stderr.splitlines() if line.startswith("WARN:")]
        assert ran(runs) == 3
        assert len(said) == 1 and str(squatted) in said[0] and "warm start is off" in said[0], said
    finally:
        os.kill(squatter, signal.SIGKILL)
        os.waitpid(squatter, 0)
        shutil.rmtree(base)
