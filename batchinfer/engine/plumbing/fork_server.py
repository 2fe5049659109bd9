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
death. Here a child's death is seen without the server (the NOTE in
fork_server_loop.py, where the server's side lives).

What is preloaded, and what is not:
- numpy, Pillow and our child modules (``worker``, ``reader`` and what they import): plain
  modules that start no thread holding state at import (numpy's OpenBLAS pool is fork-safe,
  it is what every forked numpy program relies on). Also what each child imported after
  its fork: ``numpy.random`` (every core worker's canary input), the emulator's module
  (``batchinfer.runtime.sim``, Python and numpy: the sim backend's workers load it, the
  board's do not) and the image formats Pillow loads at a reader's first open
  (``Image.preinit``: BMP, GIF, PNG, PPM). ``tools/bench_startup.py``'s start-up CPU (the
  server's launch included) went from 0.50-0.52 to 0.47-0.49 s with these three
  (2-CPU VM at a load of 3-5, 2026-12-07, alternated with the list before).
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
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from batchinfer.engine.plumbing.fork_server_loop import EXIT, PID

log = logging.getLogger(__name__)

#: Modules the server imports once, in this order (see the module docstring).
PRELOAD = [
    "numpy",
    "numpy.random",
    "batchinfer.runtime.sim",
    "batchinfer.engine.board.worker",
    "PIL.BmpImagePlugin",
    "PIL.GifImagePlugin",
    "PIL.PngImagePlugin",
    "PIL.PpmImagePlugin",
    "batchinfer.engine.board.reader",
    "batchinfer.engine.plumbing.fork_server_frozen",
]

#: The server's program (``python -c PROGRAM FD PATH... -- PRELOAD...``): the coordinator's
#: path before any import (``-c`` put the current folder first: a ``signal.py`` or
#: ``batchinfer`` there would be imported), then signals, then the server's loop
#: (fork_server_loop.py).
_PROGRAM = """\
import sys
_, fd, *rest = sys.argv
cut = rest.index("--")
sys.path[:] = rest[:cut]
import signal
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
from batchinfer.engine.plumbing.fork_server_loop import serve
serve(int(fd), rest[cut + 1 :])
"""

#: How long sending a start may block (a full socket: a server that does not read).
_SEND_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0


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
        """Send a start (fork_server_loop's NOTE); the child's pid and death come by its
        life pipe."""
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
                    data = self.sock.recv(EXIT.size, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    data = b""
                if len(data) != EXIT.size:  # end-of-file: the server is gone
                    return
                pid, code = EXIT.unpack(data)
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
    """A child of a server, watched by its life pipe (fork_server_loop's NOTE): the part of
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
            if self._pid is None and len(self._got) >= PID.size:
                (self._pid,) = PID.unpack(self._got[: PID.size])

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
