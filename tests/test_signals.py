"""The signal router (engine/plumbing/signals.py): how the main thread is made to stop, and the
three signals kept blocked there whatever a library does."""

from __future__ import annotations

import signal
import subprocess
import sys

_BLOCKED_IN_A_READ = """
import os
from batchinfer.engine.plumbing.signals import SignalRouter
SignalRouter.install()
r, w = os.pipe()
try:
    print("reading", flush=True)
    os.read(r, 1)  # nothing ever comes
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_signal_with_no_route_interrupts_a_main_thread_blocked_in_a_read():
    """The router raised KeyboardInterrupt in the main thread as an asynchronous exception,
    seen only at its next bytecode: a main thread blocked in a read never saw it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_IN_A_READ], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "reading\n"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert out == "interrupted\n"
    assert proc.returncode == 0


_TRACKER_STARTED_LATE = """
import signal
from multiprocessing import resource_tracker
from batchinfer.engine.plumbing.signals import SIGNALS, SignalRouter, StopSignals
SignalRouter.install()
resource_tracker.ensure_running()  # it unblocks SIGINT and SIGTERM in the calling thread
with StopSignals():
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
print(sorted(int(s) for s in set(SIGNALS) - blocked))
"""


def test_a_run_blocks_its_signals_again_after_a_library_unblocked_them():
    """A signal the main thread does not block is delivered to it, where SIGINT is ignored
    (lost) and SIGTERM kills without the run's clean stop."""
    proc = subprocess.run(
        [sys.executable, "-c", _TRACKER_STARTED_LATE], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[]\n"
