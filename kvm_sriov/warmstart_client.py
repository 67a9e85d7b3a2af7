"""Warm start, the script's side (the server is warmstart.py): hand the call
to this user's server for this library, then either wait for the forked
action's exit status or, for a call that has nothing to do with VFs, become
the stock kvm script in this process; without a server, run the action here.

Every millisecond here is added to every OpenNebula action, so this module
imports only modules built into the interpreter: posix, not os (whose
import, for os.environ's collections.abc, is ~0.9 ms with python3 -S), and
_socket, not socket. The cold path (no server) imports what it needs.
"""

import _socket
import posix
import sys

ENV_SWITCH = "KVM_SRIOV_WARM_START"
DIR_ENV = "KVM_SRIOV_WARM_DIR"  # where the per-user socket directories go (default: the home)
PEER = "kvm-sriov-peer"  # the migration helper a source host runs here: served the same way
CONNECT_SECONDS = 1.0  # a wedged server costs at most this, then the action runs cold
START_SECONDS = 10.0   # from the request to the forked action's pid
OFF_FILE = "/etc/kvm-sriov/no-warm-start"  # a host-wide off switch for operators
_LIB = __file__.rpartition("/")[0].rpartition("/")[0]  # the directory holding kvm_sriov/ (__file__ is absolute)


def _env(name: str, default: str = "") -> str:
    """This process's variable: from os.environ once os is loaded (it may
    have been set since), else from posix's copy, made at start-up."""
    os = sys.modules.get("os")
    if os is not None:
        return os.environ.get(name, default)
    return posix.environ.get(name.encode(), default.encode()).decode("utf-8", "surrogateescape")


def _exists(path: str) -> bool:
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def enabled() -> bool:
    return _env(ENV_SWITCH, "1") != "0" and sys.platform.startswith("linux") and not _exists(OFF_FILE)


def _stamp(lib: str) -> str:
    """Names the library as installed: path, and size/mtime of every module."""
    import zlib
    parts = [lib]
    for sub in ("kvm_sriov", "kvm_sriov/actions"):
        with posix.scandir(f"{lib}/{sub}") as it:
            for e in sorted(it, key=lambda e: e.name):
                if e.name.endswith(".py"):
                    st = e.stat()
                    parts.append(f"{sub}/{e.name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{zlib.crc32(chr(0).join(parts).encode()):08x}"


def socket_dir() -> str:
    """This user's directory for its servers' sockets, made if missing:
    .kvm-sriov-warm in the user's home (oneadmin's /var/lib/one), where no
    other user can make it first, as they could in /tmp; $KVM_SRIOV_WARM_DIR
    names another parent (tests, simulated hosts). OSError unless it is a
    real directory of ours that nobody else can enter."""
    uid = posix.getuid()
    base = _env(DIR_ENV)
    if base:
        path = f"{base}/kvm-sriov-warm-{uid}"
    else:
        import pwd
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            home = _env("HOME")
        if not home.startswith("/"):
            raise OSError(f"uid {uid} has no home directory for the warm-start socket")
        path = f"{home.rstrip('/')}/.kvm-sriov-warm"
    try:
        posix.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = posix.lstat(path)
    if st.st_mode & 0o170777 != 0o040700 or st.st_uid != uid:  # a directory, 0700, ours (not a symlink)
        why = f"{path} is not a 0700 directory of uid {uid}"
        _say_once(path + ".unusable", f"warm start is off: {why} (another user may have made it); every "
                  f"action runs cold (~90 ms more) until it is removed")
        raise OSError(why)
    return path


def _say_once(marker: str, message: str) -> None:
    """A WARN line in the action's log (OpenNebula's stderr convention), the
    first time only: the marker file records that it was said."""
    try:
        posix.close(posix.open(marker, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW, 0o600))
    except FileExistsError:
        return
    except OSError:
        pass  # cannot record it: better said each time than never
    sys.stderr.write(f"WARN: kvm-sriov: {message}\n")


def address(lib: str = _LIB, executable: str = sys.executable) -> str:
    """The server's socket for this library and interpreter."""
    import zlib
    name = zlib.crc32(f"{executable}\0{_stamp(lib)}".encode())
    return f"{socket_dir()}/{name:08x}.sock"


def run(action: str, argv: list, remotes_dir: str) -> int:
    """The action's exit code; runs it here when no server can take it."""
    code = _run_warm(action, argv, remotes_dir) if enabled() else None
    if code is not None:
        return code
    environment_as_started()
    return dispatch(action, argv, remotes_dir)


def started_environment() -> bytes:
    """The environment the script was started with, K=V NUL-terminated.
    Python's start-up adds LC_CTYPE=C.UTF-8 to its own when the locale is C
    (PEP 538), and every child would inherit it: the stock kvm script must
    see OpenNebula's environment, not ours. /proc/self/environ still holds
    the original (setenv never writes there)."""
    try:
        fd = posix.open("/proc/self/environ", posix.O_RDONLY | posix.O_CLOEXEC)
    except OSError:
        return b"".join(k + b"=" + v + b"\0" for k, v in posix.environ.items())
    try:
        chunks = []
        while chunk := posix.read(fd, 65536):
            chunks.append(chunk)
    finally:
        posix.close(fd)
    return b"".join(chunks)


def _variables(environ: bytes) -> dict:
    return dict(item.split(b"=", 1) for item in environ.split(b"\0") if item.find(b"=") > 0)


def environment_as_started() -> None:
    """os.environ as the script was started (see started_environment), for
    an action run in this process."""
    import os
    was = {os.fsdecode(k): os.fsdecode(v) for k, v in _variables(started_environment()).items()}
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


def dispatch(action: str, argv: list, remotes_dir: str, hand_back=None) -> int:
    """Run the action in this process (the script's, or a fork of the server)."""
    if "site" not in sys.modules:  # the scripts start with -S: the client needs no site packages, the action does
        import site
        site.main()
    from pathlib import Path
    if action == PEER:
        from .actions.peer import main as peer_main
        return peer_main(argv, remotes_dir=Path(remotes_dir))
    from .actions import main
    return main(action, argv, remotes_dir=Path(remotes_dir), replace_process=hand_back or True)


def peer(conn) -> tuple:
    """The pid and uid of the process at the other end."""
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[0:4], sys.byteorder), int.from_bytes(creds[4:8], sys.byteorder)


def _connect(addr: str):
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(addr)
        if peer(conn)[1] != posix.getuid():  # somebody else's socket: never hand it our fds
            raise OSError("warm-start server of another user")
    except OSError:
        conn.close()
        raise
    return conn


def umask() -> int:
    mask = posix.umask(0o022)
    posix.umask(mask)
    return mask


# The request: its length (8 bytes), then NUL-separated action, cwd, umask,
# argc, argv..., and the environment's K=V (neither argv nor the environment
# can hold a NUL).
def encode(action: str, argv: list, cwd: str, environ: bytes) -> bytes:
    head = "\0".join([action, cwd, str(umask()), str(len(argv)), *argv]).encode("utf-8", "surrogateescape")
    body = head + b"\0" + environ
    return len(body).to_bytes(8, "little") + body


def decode(body: bytes) -> tuple:
    """action, cwd, umask, argv, environment (a dict of str)."""
    fields = body.decode("utf-8", "surrogateescape").split("\0")
    argc = int(fields[3])
    argv = fields[4:4 + argc]
    env = dict(f.split("=", 1) for f in fields[4 + argc:] if f.find("=") > 0)
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
        cwd = posix.getcwd()
    except OSError:
        cwd = "/"
    environ = started_environment()
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # an int[3] for SCM_RIGHTS
    replies = _replies(conn)
    try:
        conn.settimeout(START_SECONDS)
        conn.sendmsg([encode(action, argv, cwd, environ)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
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
            posix.kill(pid, signum)
        except ProcessLookupError:
            pass
    for s in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(s, forward)
    try:
        last, passed = next(replies, ([], []))
    except OSError:
        last, passed = [], []
    if last[:1] == [b"handover"]:  # nothing to do with VFs: this process becomes the stock script
        _become_stock(f"{remotes_dir}/vmm/kvm/{action}", argv, passed[0] if passed else None, environ)
    if last[:1] == [b"exit"]:
        return int(last[1])
    if last[:1] == [b"signal"]:  # die the way the action died (kill points, OOM, ...)
        signum = int(last[1])
        if signum != _signal.SIGKILL:  # SIGKILL has no handler to reset
            _signal.signal(signum, _signal.SIG_DFL)
        posix.kill(posix.getpid(), signum)
    sys.stderr.write("ERROR: kvm-sriov warm start: lost the action's exit status\n")
    return 1


def _become_stock(script: str, argv: list, stdin_fd, environ: bytes) -> None:
    """exec OpenNebula's kvm script here, in the script's own process (its
    pid, session, limits, as under the kvm driver) and with the environment
    it was started with, as delegate.become_stock does cold; stdin_fd holds
    what the action read from stdin."""
    import _signal
    if stdin_fd is not None:
        posix.dup2(stdin_fd, 0)
    for s in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(s, _signal.SIG_DFL)  # Python ignores the first two; the rest were forwarded
    posix.closerange(3, posix.sysconf("SC_OPEN_MAX"))
    try:
        posix.execve(script, [script, *argv], _variables(environ))
    except OSError as exc:
        sys.stderr.write(f"ERROR: {script}: {exc.strerror}\n")
        sys.exit(1)


def _spawn_server(addr: str, remotes_dir: str) -> None:
    import subprocess
    try:  # the directory is usable again: a later problem with it is worth saying again
        posix.unlink(addr.rpartition("/")[0] + ".unusable")
    except OSError:
        pass
    code = (f"import sys; sys.path.insert(0, {_LIB!r}); "
            f"from kvm_sriov import warmstart; warmstart.serve({addr!r}, {remotes_dir!r})")
    try:
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/",
                         env=_variables(started_environment()))
    except OSError:
        pass  # next time, maybe
