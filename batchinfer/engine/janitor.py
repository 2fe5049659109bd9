"""The janitor: removes a run's shared memory if the coordinator dies without doing it.

A coordinator killed with SIGKILL cannot clean up. Python's resource tracker could (it
unlinks what was registered with it), but it also prints a warning about "leaked
shared_memory objects" into the user's terminal or log for every such run. The janitor is
a tiny process of our own instead: it learns the names of the run's segments as they are
created, waits for its stdin to close (which happens however the coordinator ends), and
unlinks whatever is left, silently. It ignores SIGINT, SIGTERM and SIGHUP, which reach the
whole process group, so it outlives the coordinator by the moment it needs. On a normal end
the coordinator has already unlinked everything and the janitor finds nothing to do.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from batchinfer.engine.slots import SHM_DIR

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

    def close(self) -> None:
        """The run removed its segments: let the janitor check and go."""
        assert self.proc.stdin is not None  # started with stdin=PIPE
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait()
