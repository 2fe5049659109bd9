"""Where children come from: a fork server that has already imported what they import.

A spawned child is a fresh interpreter that imports numpy, the child modules and their
dependencies again, paid by every reader and core worker of every run (and every restart).
So children are started with multiprocessing's ``forkserver`` method instead: one server
process per run imports :data:`PRELOAD` once, then forks each child from that state.
``python tools/bench_startup.py`` measures what it saves: on the digits demo (3 core
workers and a reader) the run's start-up CPU went from about 1.0 to 0.4 CPU s.

What is preloaded, and what is not:
- numpy, Pillow and our child modules (``worker``, ``reader`` and what they import): plain
  modules that start no thread holding state at import (numpy's OpenBLAS pool is fork-safe,
  it is what every forked numpy program relies on).
- Never a runtime: importing onnxruntime starts a native thread, and RKNNLite owns a
  device. Runtimes are imported and created in the child, after the fork, as before.
- Last, :mod:`batchinfer.engine.fork_server_frozen` collects and freezes the server's
  objects, so a child's garbage collections scan only what the child made.

What the rest of the engine relies on, and how it still holds:
- Children ignore SIGINT and SIGHUP from their first instruction (engine/signals.py): the
  first preloaded module, :mod:`batchinfer.engine.fork_server_init`, makes the server ignore
  them before the server records its handlers, and a forked child gets those back; so a
  child is immune the moment it exists. The server itself outlives a Ctrl-C (the
  coordinator decides what it means; a dead server would take every child with it).
- PR_SET_PDEATHSIG: a child's parent is the server, not the coordinator. The server exits
  as soon as the coordinator does (multiprocessing's "alive" pipe), which kills every child
  (engine/child.py). A child closes its copy of that pipe first thing, or a child blocked in
  a read would keep the server, and so itself, alive after a kill -9 of the coordinator.
- Nothing outlives the run: :func:`release` stops and reaps the server when the last
  user of the process is done (a :class:`~batchinfer.engine.pool.ChildPool` when it closes,
  after its children are gone; the ``run`` command, which launches it before it imports the
  engine, when it ends), so the leak guard of the tests and the "nothing leaked" rule
  hold, and the next run's server sees the environment of that run. A pool reads the
  server's CPU (its imports, its forks) when it closes and counts it as the run's start-up
  (two runs at once in one process would both count it).
- Children import what the coordinator would: the server is launched with the
  coordinator's ``sys.path`` and never the current folder (:func:`ensure_running`; on
  Python 3.10, which has no ``PYTHONSAFEPATH``, a folder shadowing one of the preloaded
  modules still wins in the server).
- The server is multiprocessing's one per process (``multiprocessing.forkserver``): the
  preload list is set when it is launched.
- Its socket is a file in multiprocessing's ``pymp-*`` folder under TMPDIR, and a UNIX
  socket's path holds at most 107 bytes: with a long TMPDIR (a CI runner's, a test runner's
  per-worker one) Python 3.11 fails with "AF_UNIX path too long". That folder is then made
  in the system's own temporary folder instead (:func:`_short_temp_dir`; Python 3.13 does
  the same by itself).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, util
from typing import Any

import psutil

#: Modules the server imports once, in this order (see the module docstring).
PRELOAD = [
    "batchinfer.engine.fork_server_init",
    "numpy",
    "batchinfer.engine.worker",
    "batchinfer.engine.reader",
    "batchinfer.engine.fork_server_frozen",
]

_lock = threading.Lock()
_users = 0


def _server() -> Any:
    """multiprocessing's forkserver state, whose private fields (pid, alive pipe, stop) are
    read and used here: typeshed declares none of them, so it is untyped."""
    return forkserver._forkserver


def context() -> mp.context.ForkServerContext:
    """The multiprocessing context children are started with."""
    return mp.get_context("forkserver")


def acquire() -> None:
    """Launch the server if no pool of this process has it running (it imports PRELOAD in
    the background: this returns at once), and count one more user."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            ensure_running()


#: Carries the server's launch environment's original values to fork_server_init.
ENV_KEY = "_BATCHINFER_FORK_SERVER_ENV"


def ensure_running() -> None:
    """Launch the server if it is not running (again, if it died), importing from this
    process's ``sys.path``.

    multiprocessing starts the server as ``python -c ...``, whose path begins with the
    current folder, and (before Python 3.12) never applies the path it is given: a folder
    holding a ``batchinfer`` or ``queue.py`` of its own would be imported in place of ours.
    So the server is launched with ``PYTHONPATH`` set to this process's path and
    ``PYTHONSAFEPATH`` (no current folder; Python 3.11+), and fork_server_init puts both
    back to what they were, so children see this process's environment.
    """
    if _running():
        return
    _short_temp_dir()
    forkserver.set_forkserver_preload(PRELOAD)
    keys = ("PYTHONPATH", "PYTHONSAFEPATH")
    saved = {key: os.environ.get(key) for key in keys}
    path = [os.getcwd() if entry == "" else entry for entry in sys.path]
    os.environ.update(
        PYTHONPATH=os.pathsep.join(path), PYTHONSAFEPATH="1", **{ENV_KEY: json.dumps(saved)}
    )
    try:
        forkserver.ensure_running()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.environ.pop(ENV_KEY, None)


#: A UNIX socket's path holds at most 107 bytes and its NUL on Linux (sun_path, 108).
_SUN_PATH_MAX = 107
#: What the server's socket path adds to the temporary folder: "/pymp-" and 8 random
#: characters (util.get_temp_dir), "/listener-" and 8 more (connection.arbitrary_address).
_SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")
#: Where the socket's folder goes when TMPDIR is too long: the system's temporary folders.
_SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/usr/tmp")


def _short_temp_dir() -> None:
    """Have multiprocessing make its ``pymp-*`` folder (the server's socket's) where the
    socket's path fits, if TMPDIR is too long for it.

    multiprocessing makes that folder once per process, in ``tempfile.gettempdir()``, and
    keeps it: so it is made here, with ``tempfile.tempdir`` pointing at a short folder for
    the moment it takes. Nothing else of the process changes: TMPDIR and tempfile's own
    choice stay the user's, and the folder is removed at exit as before (entry.py removes it
    when the program ends with os._exit). A folder multiprocessing already made for some
    other use of this process stays, too long or not.
    """
    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_SUFFIX <= _SUN_PATH_MAX:
        return
    short = next(
        (d for d in _SHORT_TEMP_DIRS if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)),
        None,
    )
    if short is None:  # nowhere shorter to go: the bind fails as it would have
        return
    saved = tempfile.tempdir
    tempfile.tempdir = short
    try:
        util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def _running() -> bool:
    pid = server_pid()
    if pid is None:
        return False
    try:  # not os.waitpid: multiprocessing reaps it, and would fail on a pid reaped here
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def server_pid() -> int | None:
    """The pid a forked child's parent has (the server's), or None if it is not running."""
    return _server()._forkserver_pid


def cpu_seconds() -> float:
    """CPU seconds the server has used so far (its own imports and forks)."""
    pid = server_pid()
    if pid is None:
        return 0.0
    with contextlib.suppress(psutil.Error):
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    return 0.0


def release() -> None:
    """One user fewer; the last one stops the server and reaps it. Call it only once the
    user's children are gone: a child still running dies with the server."""
    global _users
    with _lock:
        _users -= 1
        if _users > 0:
            return
        pid = server_pid()
        if pid is not None:
            # Its children are gone and it holds nothing to save: SIGKILL spares waiting
            # for its interpreter to tear numpy down at the end of every run.
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _server()._stop()


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Hold the server for a block: launched at its start, so it imports while the caller
    still imports and plans (the ``run`` command), and stopped at its end at the latest."""
    acquire()
    try:
        yield
    finally:
        release()


def close_inherited_alive_pipe() -> None:
    """In a forked child: close its copy of the pipe whose closing stops the server."""
    fd = _server()._forkserver_alive_fd
    if fd is not None:
        _server()._forkserver_alive_fd = None
        with contextlib.suppress(OSError):
            os.close(fd)
