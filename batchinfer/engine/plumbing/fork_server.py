"""Where children come from: a fork server that has already imported what they import.

A spawned child is a fresh interpreter that imports numpy, the child modules and their
dependencies again, paid by every reader and core worker of every run (and every restart).
So children are forked instead, by one server process per coordinator that imports
:data:`PRELOAD` once and forks each child from that state. ``python tools/bench_startup.py``
measures what it saves: on the digits demo (3 core workers and a reader) the run's start-up
CPU went from about 1.0 to 0.4 CPU s. The server is ours (about 200 lines over ``os.fork``,
a socket pair and ``socket.send_fds``), not multiprocessing's ``forkserver``: that one is
driven through private attributes (its pid, its "alive" pipe, its stop), puts its socket
in a folder of TMPDIR (a UNIX socket's path holds at most 107 bytes: a long TMPDIR failed
the run), and reports a child's exit only through the server, so a frozen server hid every
death. Here a child's death is seen without the server (the NOTE below).

What is preloaded, and what is not:
- numpy, Pillow and our child modules (``worker``, ``reader`` and what they import): plain
  modules that start no thread holding state at import (numpy's OpenBLAS pool is fork-safe,
  it is what every forked numpy program relies on).
- Never a runtime: importing onnxruntime starts a native thread, and RKNNLite owns a
  device. Runtimes are imported and created in the child, after the fork, as before.
- Last, :mod:`batchinfer.engine.plumbing.fork_server_frozen` collects and freezes the server's
  objects, so a child's garbage collections scan only what the child made.

What the rest of the engine relies on, and how it holds:
- Children ignore SIGINT and SIGHUP from their first instruction (engine/plumbing/signals.py): the
  server ignores them (and SIGTERM) before it imports anything, and a forked child keeps
  that. The server outlives a Ctrl-C (the coordinator decides what it means; a dead server
  would take every child with it).
- PR_SET_PDEATHSIG: a child's parent is the server, not the coordinator. The server exits
  as soon as the coordinator does (its socket reads end-of-file), which kills every child;
  a child closes its copy of that socket first thing, or a child blocked in a read would
  keep the server, and so itself, alive after a kill -9 of the coordinator.
- Nothing outlives the run: :func:`release` stops and reaps the server (every server this
  process launched, see below) when the last user of the process is done (a
  :class:`~batchinfer.engine.plumbing.children.ChildPool` when it closes, after its children are
  gone; the ``run`` command, which launches it before it imports the engine, when it ends), so
  the leak guard of the tests and the "nothing leaked" rule hold, and the next run's server
  sees the environment of that run. A pool reads the servers' CPU (their imports, their
  forks) when it closes and counts it as the run's start-up.
- Children import what the coordinator would: the server's ``sys.path`` is the
  coordinator's, set before it imports anything of ours (never the current folder, which
  ``python -c`` would put first); its environment is the coordinator's, unchanged.
- A frozen (SIGSTOP) or dead server never stalls a run: a child's death is told by a pipe
  the child alone holds, a start the server does not serve is given up when the child's
  start-up deadline passes (the engine's watchdog kills it: :meth:`ForkedChild.kill`), and
  the next start finds the server stopped or dead and launches a fresh one, said once on
  the console (:func:`_serving`). The old one keeps parenting its children (killing it would
  kill them) until :func:`release`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import psutil

log = logging.getLogger(__name__)

# NOTE [Fork server protocol]
# ===========================
#
# One SOCK_SEQPACKET socket pair per server (no path: nothing in TMPDIR, no length limit);
# the server gets its end as an inherited fd (argv[1]). Every packet is one message:
#
#   coordinator -> server   a start: payload pickle((target, spec)), and three fds passed
#                           with it (SCM_RIGHTS, socket.send_fds): the child's task pipe
#                           (read end), result pipe (write end) and *life* pipe (write end).
#   server -> coordinator   an exit: struct "=ii" (pid, exit code as multiprocessing gives
#                           it: -N for signal N), sent when the server reaps a child. Sent
#                           without blocking: if the coordinator's side is full, it is
#                           dropped and that child's exit code is unknown (None).
#   end-of-file             either side gone. The server exits, and PR_SET_PDEATHSIG ends
#                           its children; the coordinator launches a fresh server.
#
# The server forks at once on a start and closes its copies of the three fds. The child
# closes the socket, writes its pid ("=i") into the life pipe, unpickles the payload and
# calls ``target(spec, tasks, results)``, then exits with os._exit (0, or 1 after printing
# an exception's traceback). The coordinator keeps only the life pipe's read end (the
# child's *sentinel*): its pid arrives there without the server, and end-of-file there is
# the child's death, even with the server frozen or dead. The exit code does come from the
# server; the coordinator waits for it boundedly, and not at all from a server it sees
# stopped or gone. A start the server never serves (frozen with the request queued) gives
# no pid: killing such a child abandons it (the pool reports it gone with code None) and
# retires the server; should that server resume, the child it forks finds the life pipe
# closed and exits at once.

#: Modules the server imports once, in this order (see the module docstring).
PRELOAD = [
    "numpy",
    "batchinfer.engine.worker",
    "batchinfer.engine.reader",
    "batchinfer.engine.plumbing.fork_server_frozen",
]

#: The server's program (``python -c PROGRAM FD PATH... -- PRELOAD...``): the coordinator's
#: path before any import (``-c`` put the current folder first: a ``signal.py`` or
#: ``batchinfer`` there would be imported), then signals, then :func:`serve`.
_PROGRAM = """\
import sys
_, fd, *rest = sys.argv
cut = rest.index("--")
sys.path[:] = rest[:cut]
import signal
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
from batchinfer.engine.plumbing.fork_server import serve
serve(int(fd), rest[cut + 1 :])
"""

#: A start's payload may not exceed this (a spec is a few kB).
_MAX_REQUEST = 1 << 20
_EXIT = struct.Struct("=ii")
_PID = struct.Struct("=i")
#: How long sending a start may block (a full socket: a server that does not read).
_SEND_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- the server's side


def serve(fd: int, preload: list[str]) -> NoReturn:
    """The server's loop (in the server process): preload, then fork on every start."""
    sock = socket.socket(fileno=fd)
    for name in preload:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the poll below (wakeup fd)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    me = os.getpid()
    while True:
        for ready, _ in poller.poll():
            if ready == wake_r:
                with contextlib.suppress(OSError):
                    while os.read(wake_r, 512):
                        pass
                _reap(sock)
                continue
            try:
                payload, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3, socket.MSG_CMSG_CLOEXEC)
            except OSError:
                payload, fds = b"", []
            if not payload:  # the coordinator is gone: so is the server, and its children
                os._exit(0)
            if len(fds) == 3 and _fork() == 0:
                _child(me, sock, (wake_r, wake_w), payload, fds)
            for f in fds:  # closing the life pipe's copy: a failed fork reads as a death
                os.close(f)


def _fork() -> int:
    try:
        return os.fork()
    except OSError:  # out of processes or memory: the start fails, the server goes on
        return -1


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            sock.send(_EXIT.pack(pid, os.waitstatus_to_exitcode(status)), socket.MSG_DONTWAIT)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux); exit now if the
    parent is already gone (it died before the request took effect)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def _child(
    server: int, sock: socket.socket, wake: tuple[int, int], payload: bytes, fds: list[int]
) -> NoReturn:
    """A freshly forked child (see the NOTE): never returns."""
    code = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for f in wake:
            os.close(f)
        die_with_parent(server)
        task_fd, result_fd, life_fd = fds
        try:
            os.write(life_fd, _PID.pack(os.getpid()))
        except OSError:  # the coordinator gave this start up (or is gone): nothing to do
            os._exit(0)
        target, spec = pickle.loads(payload)
        target(spec, Connection(task_fd, writable=False), Connection(result_fd, readable=False))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


# ---------------------------------------------------------------- the coordinator's side


def interpreter_options() -> list[str]:
    """Options that start a Python with this one's settings: ``python -W error -X dev -m
    batchinfer ...`` means them in every worker and reader too, as multiprocessing's spawn
    passes them on. Read from the public ``sys.flags`` and ``sys.warnoptions`` (spawn uses
    a private helper of subprocess for the same); of the ``-X`` options, those sys.flags
    or a module can tell: dev, utf8, faulthandler."""
    import faulthandler

    f = sys.flags
    args = [f"-{letter * n}" for letter, n in (("O", f.optimize), ("b", f.bytes_warning)) if n]
    for name, option in (
        ("dont_write_bytecode", "-B"),
        ("ignore_environment", "-E"),
        ("no_user_site", "-s"),
        ("isolated", "-I"),
        ("safe_path", "-P"),  # Python 3.11+
    ):
        if getattr(f, name, 0):
            args.append(option)
    args += [f"-W{option}" for option in sys.warnoptions]
    for on, option in (
        (f.dev_mode, "dev"),
        (f.utf8_mode == 1, "utf8"),
        (faulthandler.is_enabled(), "faulthandler"),
    ):
        if on:
            args += ["-X", option]
    return args


class _Server:
    """One server process and the coordinator's end of its socket."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = [os.getcwd() if entry == "" else entry for entry in sys.path]
        args = [str(theirs.fileno()), *path, "--", *PRELOAD]
        try:
            self.proc = subprocess.Popen(  # children read nothing: stdin is /dev/null
                [sys.executable, *interpreter_options(), "-c", _PROGRAM, *args],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.settimeout(_SEND_TIMEOUT_S)
        self.sock = mine
        self.pid = self.proc.pid
        self.exits: dict[int, int] = {}
        self.retired: str | None = None  # why it takes no more starts
        self._lock = threading.Lock()

    def unusable(self) -> str | None:
        """Why this server cannot start a child now, or None."""
        return self.retired if self.retired is not None else self.unresponsive()

    def unresponsive(self) -> str | None:
        """Why this server cannot do anything now (stopped or gone), or None."""
        code = self.proc.poll()
        if code is not None:
            return f"exited (exit code {code})"
        try:
            status = psutil.Process(self.pid).status()
        except psutil.Error:
            return "is gone"
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return "is stopped (SIGSTOP)"
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return "exited"
        return None

    def start(self, target: Callable, spec: Any, task_fd: int, result_fd: int) -> ForkedChild:
        """Send a start (the NOTE); the child's pid and death come by its life pipe."""
        life_r, life_w = os.pipe()
        try:
            payload = pickle.dumps((target, spec))
            socket.send_fds(self.sock, [payload], [task_fd, result_fd, life_w])
        except BaseException:
            os.close(life_r)
            raise
        finally:
            os.close(life_w)
        self.collect(0.0)  # exits waiting there: keep the server's side from filling up
        return ForkedChild(self, life_r)

    def collect(self, timeout_s: float) -> None:
        """Read the exits the server sent, waiting up to ``timeout_s`` for the first."""
        with self._lock:
            wait = timeout_s
            while True:
                if not _readable(self.sock.fileno(), wait):
                    return
                try:
                    data = self.sock.recv(_EXIT.size, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    data = b""
                if len(data) != _EXIT.size:  # end-of-file: the server is gone
                    return
                pid, code = _EXIT.unpack(data)
                self.exits[pid] = code
                wait = 0.0

    def exit_code(self, pid: int, timeout_s: float) -> int | None:
        """``pid``'s exit code as the server reports it: waited for up to ``timeout_s``, and
        not at all from a server that is stopped or gone."""
        deadline = time.monotonic() + timeout_s
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0 or self.unresponsive() is not None:
                self.collect(0.0)
                break
            self.collect(min(left, 0.1))
        return self.exits.pop(pid, None)

    def cpu_seconds(self) -> float:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(self.pid).cpu_times()
            return t.user + t.system
        return 0.0

    def stop(self) -> None:
        """SIGKILL and reap (its children are gone, and it holds nothing to save: SIGKILL
        spares waiting for its interpreter to tear numpy down at the end of every run)."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(_STOP_TIMEOUT_S)
        self.sock.close()


class ForkedChild:
    """A child of a server, watched by its life pipe (the NOTE): the part of
    ``multiprocessing.Process`` the pool uses."""

    def __init__(self, server: _Server, sentinel: int) -> None:
        os.set_blocking(sentinel, False)
        self.server = server
        #: Readable when the pid arrives and at the child's death (end-of-file).
        self.sentinel = sentinel
        self.exitcode: int | None = None
        self.abandoned = False  # killed before its server forked it
        self._pid: int | None = None
        self._got = b""
        self._dead = False

    @property
    def pid(self) -> int | None:
        """The child's pid, None until it has told it."""
        self._read()
        return self._pid

    def _read(self) -> None:
        while not self._dead and self.sentinel >= 0:
            try:
                data = os.read(self.sentinel, 64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._dead = True
                return
            self._got += data
            if self._pid is None and len(self._got) >= _PID.size:
                (self._pid,) = _PID.unpack(self._got[: _PID.size])

    def is_alive(self) -> bool:
        self._read()
        return not self._dead and not self.abandoned

    def stopped(self) -> bool:
        """Whether the child cannot run now: stopped (SIGSTOP), or not forked yet by a
        server that is stopped or gone."""
        if not self.is_alive():
            return False
        if self._pid is None:
            return self.server.unresponsive() is not None
        try:
            status = psutil.Process(self._pid).status()
        except psutil.Error:
            return False
        return status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)

    def kill(self) -> None:
        """SIGKILL the child; one its server never forked is abandoned, and its server
        retired (it takes no more starts: the next one launches a fresh server)."""
        if not self.is_alive():
            return
        if self._pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
            return
        self.abandoned = True
        why = self.server.unusable() or "did not fork a child in time"
        self.server.retired = why

    def join(self, timeout_s: float | None = None) -> None:
        """Wait up to ``timeout_s`` for the child's death, then (in what is left of it)
        for its exit code."""
        deadline = time.monotonic() + (1e9 if timeout_s is None else timeout_s)
        while self.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            _readable(self.sentinel, left)
        if self._dead and self._pid is not None and self.exitcode is None:
            left = max(0.0, deadline - time.monotonic())
            self.exitcode = self.server.exit_code(self._pid, left)

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` is readable (or at end-of-file) within ``timeout_s``. A poll, not a
    select: a run may hold more than 1,024 file descriptors (engine/plumbing/fd_limit.py)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


# ---------------------------------------------------------------- the process's servers

_lock = threading.RLock()
_users = 0
_current: _Server | None = None
_retired: list[_Server] = []  # replaced, but maybe still the parent of live children


def _serving() -> _Server:
    """The server to start children with: the current one, or a fresh one if there is
    none or it cannot serve (said on the console, once per server replaced)."""
    global _current
    with _lock:
        if _current is not None:
            why = _current.unusable()
            if why is None:
                return _current
            pid = _current.pid
            log.warning("the fork server (pid %d) %s; children start from a fresh one", pid, why)
            _current.retired = why
            _retired.append(_current)
            _current = None
        _current = _Server()
        return _current


def acquire() -> None:
    """Launch the server if no pool of this process has it running (it imports PRELOAD in
    the background: this returns at once), and count one more user."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            ensure_running()


def ensure_running() -> None:
    """Launch the server if it is not running (again, if it died or is stopped)."""
    _serving()


def start_child(target: Callable, spec: Any, task_fd: int, result_fd: int) -> ForkedChild:
    """Fork ``target(spec, tasks, results)`` from the server, the child getting (copies of)
    ``task_fd`` and ``result_fd`` as its two pipes. A server that cannot be reached is
    replaced, once."""
    server = _serving()
    try:
        return server.start(target, spec, task_fd, result_fd)
    except OSError as e:
        server.retired = f"could not be sent a start ({e})"
    return _serving().start(target, spec, task_fd, result_fd)


def server_pid() -> int | None:
    """The pid the server that forks the next child has, or None if none is running."""
    with _lock:
        return _current.pid if _current is not None else None


def serving_pid() -> int:
    """The pid of the server the next child will come from, launched if need be."""
    return _serving().pid


def cpu_seconds() -> float:
    """CPU seconds this process's servers have used so far (their imports and forks)."""
    with _lock:
        servers = [s for s in (_current, *_retired) if s is not None]
    return sum(s.cpu_seconds() for s in servers)


def release() -> None:
    """One user fewer; the last one stops and reaps every server. Call it only once the
    user's children are gone: a child still running dies with its server."""
    global _users, _current
    with _lock:
        _users -= 1
        if _users > 0:
            return
        servers = [s for s in (_current, *_retired) if s is not None]
        _current = None
        _retired.clear()
    for server in servers:
        server.stop()


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Hold the server for a block: launched at its start, so it imports while the caller
    still imports and plans (the ``run`` command), and stopped at its end at the latest."""
    acquire()
    try:
        yield
    finally:
        release()
