"""The fork server's own process: its loop, a forked child's first moments, and the wire
format both sides speak (the NOTE below).

Of ours, the server imports only this (standard library only) before its ``PRELOAD``, and
a child runs only this before its target. The coordinator's side (launching servers,
sending starts, watching children) is engine/plumbing/fork_server.py, which also says why
children are forked at all and what the rest of the engine relies on.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select
import signal
import socket
import struct
import sys
import traceback
from multiprocessing.connection import Connection
from typing import NoReturn

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

#: A start's payload may not exceed this (a spec is a few kB).
MAX_REQUEST = 1 << 20
#: An exit (server -> coordinator) and a pid (child -> life pipe), as the NOTE says.
EXIT = struct.Struct("=ii")
PID = struct.Struct("=i")
_PR_SET_PDEATHSIG = 1


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
                payload, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3, socket.MSG_CMSG_CLOEXEC)
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
            sock.send(EXIT.pack(pid, os.waitstatus_to_exitcode(status)), socket.MSG_DONTWAIT)


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
            os.write(life_fd, PID.pack(os.getpid()))
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
