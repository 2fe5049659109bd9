"""What every child process (reader, core worker) does first, and how it reports failure.

- Ctrl-C and a closed terminal go to the whole process group; only the coordinator decides
  what they mean, so children ignore SIGINT and SIGHUP (from their first instruction: they
  are forked by a fork server that ignores them, engine/plumbing/fork_server.py).
- A child must never outlive the coordinator, even blocked in a read of a hanging file:
  on Linux the kernel sends it SIGKILL when its parent, the fork server, dies
  (PR_SET_PDEATHSIG, set by the server's code in the child right after the fork, and
  checked again here), and the server exits when the coordinator does.
- A child whose coordinator is gone exits quietly (no BrokenPipeError traceback).
- An exception during start-up travels back as Failed(traceback text), so the
  coordinator shows it once, instead of seeing only "exit code 1" (PyTorch's
  ExceptionWrapper does the same for DataLoader workers).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import traceback
from multiprocessing.connection import Connection

import psutil

from batchinfer.engine.plumbing.fork_server_loop import die_with_parent
from batchinfer.engine.protocol import Failed, encode

# Ctrl-C and a closed terminal reach the whole process group; the coordinator decides.
_TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)


def setup_child(parent_pid: int, cpus: tuple[int, ...] | None) -> None:
    """Signals, parent-death signal and CPU affinity for a freshly forked child;
    ``parent_pid`` is the fork server's."""
    for s in _TERMINAL_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)
    pin_current_process(cpus)


def pin_current_process(cpus: tuple[int, ...] | None) -> None:
    """Pin this process to ``cpus`` (no-op for None or where the OS refuses); which CPUs is
    planning's choice (engine/planning/affinity.py), pinning is the child's first step."""
    if cpus:
        with contextlib.suppress(AttributeError, OSError, psutil.Error):
            psutil.Process().cpu_affinity(list(cpus))


def send_or_exit(conn: Connection, message: tuple) -> None:
    """Send to the coordinator; if it is gone, exit at once and quietly."""
    try:
        conn.send(encode(message))
    except OSError:
        os._exit(0)


def report_failure(conn: Connection, exc: BaseException) -> None:
    """Send Failed(traceback text) for an exception the child cannot go on after."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    send_or_exit(conn, Failed(text))


def cpu_seconds() -> float:
    """CPU seconds this process has used so far, every thread, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
