"""Warm start: run an action in a process forked from one that has already
imported the library, instead of paying Python's and libvirt-python's
start-up (~90 ms) on every OpenNebula action.

Same pattern as Mercurial's chg. The first action on a host runs as usual
and leaves a server behind; later ones connect to it, hand over their
stdin/stdout/stderr, argv, environment and working directory, and the
server forks a fresh process that runs the action exactly as the script
would (its own config, pool, libvirt connection, locks). The server keeps no
state: it only holds imported modules and parsed config files (keyed by
their content), serves one library version (a change to any module gives a
new socket name, so ``onehost sync`` takes effect on the next action), and
exits after IDLE_SECONDS without a request and with no action running.

The socket lives in a directory only its user can enter (/tmp/kvm-sriov-
warm-<uid>, mode 0700, checked on every call): no other user can bind the
name or connect, and anything else found there means the action runs cold.
Connecting and the start of the action are bounded by short timeouts, the
server serves only its own uid (checked before it forks) and only served
requests keep it alive.

A kill of the script (OpenNebula's timeout) kills the action; an action
killed by a signal makes the script die by the same signal. Any trouble
reaching the server means the action runs in the script's own process.
``KVM_SRIOV_WARM_START=0`` or a file /etc/kvm-sriov/no-warm-start turns
it off. The action gets the script's argv, environment, working directory,
umask and stdio; resource limits are the server's (the same user's). A call
that has nothing to do with VFs goes back to the script once the fork has
decided so: the script's own process becomes the stock kvm script.

Client side: only cheap imports (every millisecond here is the point).
"""

import _socket  # not socket: its import (enum, selectors) costs more than the rest of the client
import os
import sys

ENV_SWITCH = "KVM_SRIOV_WARM_START"
DIR_ENV = "KVM_SRIOV_WARM_DIR"  # where the per-user socket directories go (default /tmp)
PEER = "kvm-sriov-peer"  # the migration helper a source host runs here: served the same way
IDLE_SECONDS = 300
REQUEST_SECONDS = 30
CONNECT_SECONDS = 1.0  # a wedged server costs at most this, then the action runs cold
START_SECONDS = 10.0   # from the request to the forked action's pid
OFF_FILE = "/etc/kvm-sriov/no-warm-start"  # a host-wide off switch for operators
_LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def enabled() -> bool:
    return (os.environ.get(ENV_SWITCH, "1") != "0" and sys.platform.startswith("linux")
            and not os.path.exists(OFF_FILE))


def _stamp(lib: str) -> str:
    """Names the library as installed: path, and size/mtime of every module."""
    import zlib
    parts = [lib]
    for sub in ("kvm_sriov", "kvm_sriov/actions"):
        with os.scandir(os.path.join(lib, sub)) as it:
            for e in sorted(it, key=lambda e: e.name):
                if e.name.endswith(".py"):
                    st = e.stat()
                    parts.append(f"{sub}/{e.name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{zlib.crc32(chr(0).join(parts).encode()):08x}"


def socket_dir() -> str:
    """This user's directory for its servers' sockets, made if missing.
    OSError unless it is a real directory of ours that nobody else can enter."""
    uid = os.getuid()
    path = os.path.join(os.environ.get(DIR_ENV) or "/tmp", f"kvm-sriov-warm-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if st.st_mode & 0o170777 != 0o040700 or st.st_uid != uid:  # a directory, 0700, ours (not a symlink)
        raise OSError(f"{path} is not a 0700 directory of uid {uid}")
    return path


def address(lib: str = _LIB, executable: str = sys.executable) -> str:
    """The server's socket for this library and interpreter."""
    import zlib
    name = zlib.crc32(f"{executable}\0{_stamp(lib)}".encode())
    return os.path.join(socket_dir(), f"{name:08x}.sock")


# -- client -------------------------------------------------------------------
def run(action: str, argv: list, remotes_dir: str) -> int:
    """The action's exit code; runs it here when no server can take it."""
    environment_as_started()
    code = _run_warm(action, argv, remotes_dir) if enabled() else None
    return code if code is not None else _dispatch(action, argv, remotes_dir)


def environment_as_started() -> None:
    """Give os.environ back the values the script was started with. Python's
    start-up adds LC_CTYPE=C.UTF-8 when the locale is C (PEP 538), and every
    child would inherit it: the stock kvm script must see OpenNebula's
    environment, not ours. /proc/self/environ still holds the original
    (setenv never writes there)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            started = f.read()
    except OSError:
        return
    was = dict(os.fsdecode(item).partition("=")[::2] for item in started.split(b"\0") if item.find(b"=") > 0)
    for key in [k for k in os.environ if k not in was]:
        del os.environ[key]
    for key, value in was.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _run_warm(action: str, argv: list, remotes_dir: str):
    """The exit code of the action run by the server, or None if it did not run it."""
    try:
        addr = address()
    except OSError:  # the library is not where it was, or no safe socket directory: no warm start
        return None
    try:
        conn = _connect(addr)
    except OSError:
        _spawn_server(addr, remotes_dir)
        return None
    try:
        return _run_remote(conn, action, argv, remotes_dir)
    finally:
        conn.close()


def _dispatch(action: str, argv: list, remotes_dir: str, hand_back=None) -> int:
    if "site" not in sys.modules:  # the scripts start with -S: the client needs no site packages, the action does
        import site
        site.main()
    from pathlib import Path
    if action == PEER:
        from .peer import main as peer_main
        return peer_main(argv, remotes_dir=Path(remotes_dir))
    from .actions import main
    return main(action, argv, remotes_dir=Path(remotes_dir), replace_process=hand_back or True)


def _peer_uid(conn) -> int:
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


def _connect(addr: str):
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(addr)
        if _peer_uid(conn) != os.getuid():  # somebody else's socket: never hand it our fds
            raise OSError("warm-start server of another user")
    except OSError:
        conn.close()
        raise
    return conn


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _encode(action: str, argv: list, cwd: str) -> bytes:
    """Length, then action, cwd, umask, argc, argv..., and the environment as
    K=V, NUL-separated (neither argv nor the environment can hold a NUL)."""
    fields = [action, cwd, str(_umask()), str(len(argv)), *argv] + [f"{k}={v}" for k, v in os.environ.items()]
    body = "\0".join(fields).encode("utf-8", "surrogateescape")
    return len(body).to_bytes(8, "little") + body


def _decode(body: bytes) -> tuple:
    fields = body.decode("utf-8", "surrogateescape").split("\0")
    argc = int(fields[3])
    argv = fields[4:4 + argc]
    env = dict(f.split("=", 1) for f in fields[4 + argc:] if "=" in f)
    return fields[0], fields[1], int(fields[2]), argv, env


def _replies(conn):
    """The server's answers, one line each, split, with the fds that came
    with it (a hand-over's stdin)."""
    buf, fds = b"", []
    while True:
        while b"\n" not in buf:
            chunk, ancdata, _, _ = conn.recvmsg(256, _socket.CMSG_SPACE(4))
            for level, kind, payload in ancdata:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        yield line.split(), fds
        fds = []


def _run_remote(conn, action: str, argv: list, remotes_dir: str):
    """The action's exit code, or None when the server did not start it."""
    import _signal
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # an int[3] for SCM_RIGHTS
    replies = _replies(conn)
    try:
        conn.settimeout(START_SECONDS)
        conn.sendmsg([_encode(action, argv, cwd)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        first = next(replies, ([], []))[0]
        if first[:1] == [b"pid"]:  # the action starts only on this answer: never twice
            conn.sendall(b"go\n")
            conn.settimeout(None)  # the action takes as long as it takes
    except OSError:
        first = []
    if first[:1] != [b"pid"]:  # the action has not started: run it here
        return None
    pid = int(first[1])

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for s in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(s, forward)
    try:
        last, passed = next(replies, ([], []))
    except OSError:
        last, passed = [], []
    if last[:1] == [b"handover"]:  # nothing to do with VFs: this process becomes the stock script
        _become_stock(os.path.join(remotes_dir, "vmm", "kvm", action), argv, passed[0] if passed else None)
    if last[:1] == [b"exit"]:
        return int(last[1])
    if last[:1] == [b"signal"]:  # die the way the action died (kill points, OOM, ...)
        signum = int(last[1])
        if signum != _signal.SIGKILL:  # SIGKILL has no handler to reset
            _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.stderr.write("ERROR: kvm-sriov warm start: lost the action's exit status\n")
    return 1


def _become_stock(script: str, argv: list, stdin_fd) -> None:
    """exec OpenNebula's kvm script here, in the script's own process (its
    pid, session, limits, as under the kvm driver), as delegate.become_stock
    does cold; stdin_fd holds what the action read from stdin."""
    import _signal
    if stdin_fd is not None:
        os.dup2(stdin_fd, 0)
    for s in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(s, _signal.SIG_DFL)  # Python ignores the first two; the rest were forwarded
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    try:
        os.execv(script, [script, *argv])
    except OSError as exc:
        sys.stderr.write(f"ERROR: {script}: {exc.strerror}\n")
        sys.exit(1)


def _spawn_server(addr: str, remotes_dir: str) -> None:
    import subprocess
    code = (f"import sys; sys.path.insert(0, {_LIB!r}); "
            f"from kvm_sriov import warmstart; warmstart.serve({addr!r}, {remotes_dir!r})")
    try:
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/")
    except OSError:
        pass  # next time, maybe


# -- server -------------------------------------------------------------------
class _Request:
    """One action the server forked: its pid, a pidfd to see it end, the script's connection."""

    def __init__(self, pid: int, conn):
        self.pid, self.conn, self.pidfd = pid, conn, os.pidfd_open(pid)

    def fds(self) -> tuple:
        return self.pidfd, self.conn.fileno()

    def close(self) -> None:
        os.close(self.pidfd)
        self.conn.close()


def serve(addr: str, remotes_dir: str) -> None:
    """Fork each request straight into its action; report how each ended.

    One process per action (no monitor in between): the server waits for the
    actions through pidfds, and sees a script that goes away (POLLRDHUP)
    without reading from its connection, which the action still reads its
    request from."""
    import select
    import signal
    import socket
    if not hasattr(os, "pidfd_open") or not hasattr(select, "POLLRDHUP"):  # Linux >= 5.3
        return
    import fcntl
    import time
    try:  # one server per socket; the holder of the lock may replace a dead server's socket file
        lock = os.open(addr + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another action started one first
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            os.unlink(addr)
        except FileNotFoundError:
            pass
        listener.bind(addr)
    except OSError:
        return
    preload(remotes_dir)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener.listen(16)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    running: dict = {}  # pidfd or connection fd -> _Request
    busy = time.monotonic()  # when it last started or finished an action of ours
    while True:
        idle = busy + IDLE_SECONDS - time.monotonic()
        if idle <= 0 and not running:
            try:
                os.unlink(addr)  # under the lock: a later server binds a fresh one
            except OSError:
                pass
            return
        events = poller.poll(max(idle, 1) * 1000)
        for fd, event in events:
            if fd == listener.fileno():
                request = _fork_action(listener, running, remotes_dir)
                if request is not None:
                    busy = time.monotonic()
                    running.update(dict.fromkeys(request.fds(), request))
                    poller.register(request.pidfd, select.POLLIN)
                    poller.register(request.conn, select.POLLRDHUP)
                continue
            request = running.get(fd)
            if request is None:
                continue
            if fd == request.pidfd:  # the action ended: tell the script how, and forget it
                busy = time.monotonic()
                _report(request)
                for done in request.fds():
                    if running.pop(done, None) is not None:
                        poller.unregister(done)
                request.close()
            else:  # the script was killed (OpenNebula's timeout): so is its action
                poller.unregister(fd)
                del running[fd]
                try:
                    os.kill(request.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def preload(remotes_dir: str) -> None:
    """Everything an action imports, imported once (no connection, no thread:
    fork-safe); what a forked action still imports, it imports every time."""
    import importlib
    for module in ("host", "hotplug", "peer", "actions.paths"):
        importlib.import_module(f"{__package__}.{module}")
    from .actions import ACTIONS
    for module in sorted(set(ACTIONS.values())):
        importlib.import_module(f"{__package__}.actions.{module}")
    from pathlib import Path
    from . import config
    try:  # the configuration as the first action saw it, parsed once (config._parsed)
        config.load(Path(remotes_dir))
    except Exception:
        pass  # the actions will say what is wrong with it


def _fork_action(listener, running: dict, remotes_dir: str):
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    try:
        ours = _peer_uid(conn) == os.getuid()
    except OSError:
        ours = False
    if not ours:  # nothing for another uid, not even a fork
        conn.close()
        return None
    try:
        pid = os.fork()
    except OSError:
        conn.close()  # the script hears nothing and runs the action itself
        return None
    if pid == 0:
        code = 1
        try:
            listener.close()
            for request in set(running.values()):  # other actions' ends are not this one's
                request.close()
            code = _start_action(conn, remotes_dir)
        finally:
            os._exit(code)
    try:
        return _Request(pid, conn)
    except OSError:  # no pidfd (out of fds): an action nobody watches must not run
        import signal
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        conn.close()
        return None


def _report(request: _Request) -> None:
    _, status = os.waitpid(request.pid, 0)
    if os.WIFSIGNALED(status):
        reply = f"signal {os.WTERMSIG(status)}\n"
    else:
        reply = f"exit {os.waitstatus_to_exitcode(status)}\n"
    try:
        request.conn.sendall(reply.encode())
    except OSError:
        pass


def _start_action(conn, remotes_dir: str) -> int:
    """In the forked process: read the request, tell the script our pid
    (nothing happens before it knows who runs its action), become the action."""
    import array
    import socket
    conn.settimeout(REQUEST_SECONDS)  # a script sends at once; one that does not is stuck
    fds = array.array("i")
    data = b""
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "little"):
        msg, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
        if not msg:
            return 1
        data += msg
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if len(fds) != 3:
        return 1
    request = _decode(data[8:])
    try:
        conn.sendall(f"pid {os.getpid()}\n".encode())
        go = b""
        while len(go) < 3 and (chunk := conn.recv(3 - len(go))):
            go += chunk
    except OSError:  # the script is gone or gave up waiting: its action never starts
        return 1
    if go != b"go\n":
        return 1
    _become_action(request, list(fds), remotes_dir, _hand_back(conn))
    return 1  # not reached: the action ends the process


def _hand_back(conn):
    """How the forked action gives a call that has nothing to do with VFs
    back to the script, whose process then becomes the stock script: no
    exec of this large process, no exit status to relay. The connection is
    closed on exec (a stock script run as a child never sees it)."""
    import socket

    def become(script, argv, stdin_fd):
        # script and argv are the ones the script has: a server serves one
        # library, which lives in one remotes directory (see address()).
        fds = [] if stdin_fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            stdin_fd.to_bytes(4, sys.byteorder))]
        try:
            conn.sendmsg([b"handover\n"], fds)
        except OSError:
            os._exit(1)  # the script is gone: so is its action
        os._exit(0)
    return become


def _become_action(request: tuple, fds: list, remotes_dir: str, hand_back=None) -> None:
    import signal
    action, cwd, umask, argv, env = request
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        os.umask(umask)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # as in a fresh interpreter
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        sys.argv = [action, *argv]
        code = _dispatch(action, argv, remotes_dir, hand_back)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the caller closed its end: nothing to say
                pass
        os._exit(code)
