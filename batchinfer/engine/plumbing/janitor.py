"""The janitor: removes a run's shared memory if the coordinator dies without doing it.

A coordinator killed with SIGKILL cannot clean up. Python's resource tracker could (it
unlinks what was registered with it), but it also prints a warning about "leaked
shared_memory objects" into the user's terminal or log for every such run. The janitor is
a tiny process of our own instead: it learns the names of the run's segments as they are
created, waits for its stdin to close (which happens however the coordinator ends), and
unlinks whatever is left, silently. It ignores SIGINT, SIGTERM and SIGHUP, which reach the
whole process group, so it outlives the coordinator by the moment it needs. On a normal end
the coordinator has already unlinked everything and the janitor finds nothing to do.

Closing waits for it, boundedly: a janitor stopped with SIGSTOP cannot exit, so it is killed
at once (and said); one that does not exit otherwise (starved) is said on the console after
:data:`SAY_AFTER_S` and killed after :data:`KILL_AFTER_S`. Killing it loses nothing:
:meth:`Janitor.close` is called once the run has unlinked its segments itself.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time

import psutil

from batchinfer.engine.slots import SHM_DIR

log = logging.getLogger(__name__)

#: Seconds close() waits for the janitor before saying so, and before killing it. It
#: exits within milliseconds when it runs at all: only a stopped or starved one waits.
SAY_AFTER_S = 2.0
KILL_AFTER_S = 10.0
#: How often a wait looks whether the janitor is stopped (cheap: one /proc read).
STOPPED_CHECK_S = 0.05

_JANITOR = f"""
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
names = [line.strip() for line in sys.stdin if line.strip()]
for name in names:
    try:
        os.unlink(os.path.join({SHM_DIR!r}, name))
    except OSError:
        pass
"""


class Janitor:
    """See the module docstring."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _JANITOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def watch(self, name: str) -> None:
        """Remove segment ``name`` if the coordinator dies before it does."""
        stdin = self.proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        with contextlib.suppress(OSError):
            stdin.write(name + "\n")
            stdin.flush()

    def close(
        self,
        say_after_s: float = SAY_AFTER_S,
        kill_after_s: float = KILL_AFTER_S,
        *,
        kill_stopped: bool = True,
    ) -> None:
        """The run removed its segments: let the janitor check and go (waiting at most
        ``kill_after_s`` for it, and saying so after ``say_after_s``; one that is stopped,
        at once unless not ``kill_stopped``; see the module docstring)."""
        assert self.proc.stdin is not None  # started with stdin=PIPE
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        pid = self.proc.pid
        said = False
        ended = self._wait(say_after_s, kill_stopped)
        if ended == "timeout":
            log.warning(
                "waiting for the shared-memory janitor (pid %d) to exit; it is stopped or "
                "starved (the run is done and its shared memory removed)",
                pid,
            )
            said = True
            ended = self._wait(max(0.0, kill_after_s - say_after_s), kill_stopped)
        if ended == "stopped":
            log.warning(
                "the shared-memory janitor (pid %d) is stopped (SIGSTOP), so it was killed "
                "%s (the run is done and its shared memory removed)",
                pid,
                "then" if said else "at once",
            )
            self._kill(kill_after_s)
        elif ended == "timeout":
            log.warning(
                "the shared-memory janitor (pid %d) did not exit in %g s; killed it (nothing "
                "was left for it to remove)",
                pid,
                kill_after_s,
            )
            self._kill(kill_after_s)

    def _wait(self, timeout_s: float, kill_stopped: bool) -> str:
        """Wait for the janitor to exit: "exited", "stopped" (when ``kill_stopped``: looked
        at every STOPPED_CHECK_S, since a SIGSTOP takes effect only once the stopped
        process is scheduled, and may come while we wait), or "timeout"."""
        deadline = time.monotonic() + timeout_s
        while True:
            if kill_stopped and _stopped(self.proc.pid):
                return "stopped"
            left = deadline - time.monotonic()
            try:
                self.proc.wait(timeout=max(0.0, min(STOPPED_CHECK_S, left)))
                return "exited"
            except subprocess.TimeoutExpired:
                if left <= STOPPED_CHECK_S:
                    return "timeout"

    def _kill(self, wait_s: float) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()  # SIGKILL ends a stopped process too
        with contextlib.suppress(subprocess.TimeoutExpired):  # not in uninterruptible sleep
            self.proc.wait(timeout=wait_s)


def _stopped(pid: int) -> bool:
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return False
    return status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
