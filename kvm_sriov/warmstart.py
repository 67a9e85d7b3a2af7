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

The socket lives in a directory only its user can enter (~/.kvm-sriov-warm,
mode 0700, checked on every call; in the home, not /tmp, so that no other
user can make it first): no other user can bind the name or connect, and
anything else found there means the action runs cold, said once in the
action's log.
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

A fork costs the call ~1 ms, and its first steps ~1 ms more: every page
Python writes to (reference counts) is copied then. So once no script of
ours has run for SPARE_AFTER_SECONDS (the server watches each script's
process, which a handed-over call turns into the stock script: a spare is
never made while one runs), the server forks a spare ahead of the next call;
it touches what taking and deciding a call touches (rehearse()) and waits
for the call's connection. A call that finds no spare (another call came
first) is forked for as before.

The script's side is warmstart_client.py.
"""

import os
import sys

from .warmstart_client import decode, dispatch, encode, peer

IDLE_SECONDS = 300
REQUEST_SECONDS = 30
SPARE_AFTER_SECONDS = 0.25  # idle this long first: a spare is not forked while a call runs

# -- server -------------------------------------------------------------------
class _Request:
    """One call: the action's pid and a pidfd to see it end, the script's
    connection, and a pidfd on the script's process if it can be had (it
    outlives the action when the call was handed over to the stock script)."""

    def __init__(self, pid: int, conn, pidfd: int = None, script: int = None):
        self.pid, self.conn, self.script = pid, conn, script
        self.pidfd = os.pidfd_open(pid) if pidfd is None else pidfd

    def fds(self) -> tuple:
        return (self.pidfd, self.conn.fileno()) + (() if self.script is None else (self.script,))

    def close(self) -> None:
        os.close(self.pidfd)
        self.conn.close()
        if self.script is not None:
            os.close(self.script)


class _Spare:
    """A process forked ahead of the next call, waiting on a socket pair
    for that call's connection; it exits when the pair is closed."""

    def __init__(self, pid: int, pidfd: int, pair):
        self.pid, self.pidfd, self.pair = pid, pidfd, pair

    def take(self, conn, script_pid: int) -> _Request:
        """The call's action, run by this spare. OSError: it cannot take it."""
        import socket
        self.pair.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    conn.fileno().to_bytes(4, sys.byteorder))])
        self.pair.close()
        return _Request(self.pid, conn, self.pidfd, _pidfd_of(script_pid))

    def close(self) -> None:
        """Let it go (it exits on its own), or, in a forked process, forget it."""
        os.close(self.pidfd)
        self.pair.close()

    def end(self) -> None:
        """In the server: make it exit, and reap it."""
        import signal
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        self.close()


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
    spare = None
    busy = time.monotonic()  # when it last started or finished an action of ours
    spare_due = busy + SPARE_AFTER_SECONDS
    while True:
        now = time.monotonic()
        if spare is None and not running and now >= spare_due:
            spare = _fork_spare(listener, remotes_dir)
            if spare is None:
                spare_due = now + IDLE_SECONDS  # no fork now: calls are forked for as they come
            else:
                poller.register(spare.pidfd, select.POLLIN)
        idle = busy + IDLE_SECONDS - now
        if idle <= 0 and not running:
            if spare is not None:
                spare.end()
            try:
                os.unlink(addr)  # under the lock: a later server binds a fresh one
            except OSError:
                pass
            return
        wait = idle if spare is not None or running else min(idle, spare_due - now)
        events = poller.poll(max(wait, 0.01) * 1000)
        for fd, event in events:
            if fd == listener.fileno():
                request = _accept(listener, running, spare, remotes_dir)
                if request is not None:
                    busy = time.monotonic()
                    spare_due = busy + SPARE_AFTER_SECONDS
                    if spare is not None and request.pid == spare.pid:
                        poller.unregister(spare.pidfd)
                        spare = None
                    running.update(dict.fromkeys(request.fds(), request))
                    poller.register(request.pidfd, select.POLLIN)
                    poller.register(request.conn, select.POLLRDHUP)
                    if request.script is not None:
                        poller.register(request.script, select.POLLIN)
                continue
            if spare is not None and fd == spare.pidfd:  # died waiting (killed): make another later
                poller.unregister(fd)
                spare.end()
                spare = None
                spare_due = time.monotonic() + SPARE_AFTER_SECONDS
                continue
            request = running.pop(fd, None)
            if request is None:
                continue
            poller.unregister(fd)
            if fd == request.pidfd:  # the action ended: tell the script how
                succeeded = _report(request)
                if running.pop(request.conn.fileno(), None) is not None:
                    poller.unregister(request.conn)
                # a script whose action failed or never started (a probe's
                # connection) ends or runs it cold: only a hand-over's (exit 0,
                # the script now the stock one) is worth waiting for
                if not succeeded and running.pop(request.script, None) is not None:
                    poller.unregister(request.script)
            elif fd == request.conn.fileno():  # the script was killed (OpenNebula's timeout): so is its action
                try:
                    os.kill(request.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not any(f in running for f in request.fds()):  # action and script ended: forget it
                request.close()
                busy = time.monotonic()
                spare_due = busy + SPARE_AFTER_SECONDS


def preload(remotes_dir: str) -> None:
    """Everything an action imports, imported once (no connection, no thread:
    fork-safe); what a forked action still imports, it imports every time."""
    import importlib
    for module in ("node.host", "domain.hotplug", "actions.peer", "actions.paths"):
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


def rehearse(remotes_dir: str) -> None:
    """In a spare: what taking a call and deciding it touches, touched once,
    so that the pages it writes to are copied before a call waits on it. A
    made-up call, and only steps that read: nothing here acts on a VM or the
    pool (the spare takes on the server's own environment and umask)."""
    import io
    from pathlib import Path
    from . import config, opennebula
    from .domain import domain_xml
    from .actions import delegate, paths
    from .node.host import Host
    mask = os.umask(0o022)
    _as_the_script(dict(os.environ), "/", mask)
    argv = ["one-0", "localhost", "0", "localhost"]
    call = opennebula.parse_argv("cancel", argv)
    paths.check("cancel", call.args, call.vm_id)
    decode(encode("cancel", argv, "/", b"A=b\0")[8:])
    delegate.read_sent("cancel", argv, io.TextIOWrapper(io.BytesIO(b"<VM/>")))
    host = Host(config.load(Path(remotes_dir)), remotes_dir=Path(remotes_dir))
    try:
        domain_xml.sriov_nics(domain_xml.parse("<domain type='kvm'><devices/></domain>", "rehearsal"),
                              host.config.bridge)
    finally:
        host.close()


def _forget_in_child(*held) -> None:
    """In a forked process: close what the server holds for others."""
    for thing in held:
        if thing is not None:
            thing.close()


def _fork_spare(listener, remotes_dir: str):
    import socket
    try:
        pair, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        pair.close()
        theirs.close()
        return None
    if pid == 0:
        code = 1
        try:
            _forget_in_child(listener, pair)
            try:
                rehearse(remotes_dir)
            except Exception:
                pass  # the call itself will meet (and report) whatever went wrong
            conn = _wait_for_call(theirs)
            code = 0 if conn is None else _start_action(conn, remotes_dir)
        finally:
            os._exit(code)
    theirs.close()
    try:
        return _Spare(pid, os.pidfd_open(pid), pair)
    except OSError:  # no pidfd (out of fds): a spare nobody watches must not take a call
        pair.close()  # it exits on its own
        os.waitpid(pid, 0)
        return None


def _pidfd_of(script_pid: int):
    """A pidfd on the script's process, or None (not in our pid namespace, no fds)."""
    try:
        return os.pidfd_open(script_pid) if script_pid > 0 else None
    except OSError:
        return None


def _fds_in(ancdata) -> list:
    """The file descriptors that came with a message (SCM_RIGHTS)."""
    import array
    import socket
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return list(fds)


def _wait_for_call(pair):
    """In a spare: the connection of the call it runs, or None (the server closed the pair)."""
    import socket
    try:
        msg, ancdata, _, _ = pair.recvmsg(1, socket.CMSG_SPACE(4))  # one int
    except OSError:
        return None
    fds = _fds_in(ancdata)
    pair.close()
    if not msg or len(fds) != 1:
        return None
    os.set_inheritable(fds[0], False)  # as accept() gives it: closed on exec
    return socket.socket(fileno=fds[0])


def _accept(listener, running: dict, spare, remotes_dir: str):
    """The accepted call's action: the spare, when there is one, else forked."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    try:
        script_pid, uid = peer(conn)
    except OSError:
        uid = None
    if uid != os.getuid():  # nothing for another uid, not even a fork
        conn.close()
        return None
    if spare is not None:
        try:
            return spare.take(conn, script_pid)
        except OSError:
            pass  # fork one
    try:
        pid = os.fork()
    except OSError:
        conn.close()  # the script hears nothing and runs the action itself
        return None
    if pid == 0:
        code = 1
        try:
            _forget_in_child(listener, spare, *set(running.values()))
            code = _start_action(conn, remotes_dir)
        finally:
            os._exit(code)
    try:
        return _Request(pid, conn, script=_pidfd_of(script_pid))
    except OSError:  # no pidfd (out of fds): an action nobody watches must not run
        import signal
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        conn.close()
        return None


def _report(request: _Request) -> bool:
    """Tell the script how its action ended; True if with exit status 0."""
    _, status = os.waitpid(request.pid, 0)
    if os.WIFSIGNALED(status):
        reply = f"signal {os.WTERMSIG(status)}\n"
    else:
        reply = f"exit {os.waitstatus_to_exitcode(status)}\n"
    try:
        request.conn.sendall(reply.encode())
    except OSError:
        pass
    return reply == "exit 0\n"


def _start_action(conn, remotes_dir: str) -> int:
    """In the forked process: read the request, tell the script our pid
    (nothing happens before it knows who runs its action), become the action."""
    import socket
    conn.settimeout(REQUEST_SECONDS)  # a script sends at once; one that does not is stuck
    fds = []
    data = b""
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "little"):
        msg, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))  # an int[3]
        if not msg:
            return 1
        data += msg
        fds += _fds_in(ancdata)
    if len(fds) != 3:
        return 1
    request = decode(data[8:])
    try:
        conn.sendall(f"pid {os.getpid()}\n".encode())
        go = b""
        while len(go) < 3 and (chunk := conn.recv(3 - len(go))):
            go += chunk
    except OSError:  # the script is gone or gave up waiting: its action never starts
        return 1
    if go != b"go\n":
        return 1
    _become_action(request, fds, remotes_dir, _hand_back(conn))
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


def _as_the_script(env: dict, cwd: str, umask: int) -> None:
    """This process's environment, directory, umask and signals as the script's."""
    import signal
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.umask(umask)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # as in a fresh interpreter
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _become_action(request: tuple, fds: list, remotes_dir: str, hand_back=None) -> None:
    action, cwd, umask, argv, env = request
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _as_the_script(env, cwd, umask)
        sys.argv = [action, *argv]
        code = dispatch(action, argv, remotes_dir, hand_back)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the caller closed its end: nothing to say
                pass
        os._exit(code)
