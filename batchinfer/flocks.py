"""A lock taken without waiting: how batchinfer tells a live holder from a gone one.

A run holds a lock (``flock``) on a file of its own while it lives: its output folder's,
its shared-memory owner segment's, its emulator state's. A lock dies with its process
however that process dies, where a pid says nothing across PID namespaces (containers
sharing /tmp or /dev/shm), so whoever asks "is that run alive?" tries the lock.
"""

from __future__ import annotations

import errno
import fcntl
import time


def try_flock(fd: int, operation: int) -> bool:
    """``flock(fd, operation)`` (LOCK_SH or LOCK_EX) without waiting: True when taken,
    False when another open file holds the lock; any other OSError is raised."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        raise
    return True


#: How long an exclusive taker waits out a shared lock before it counts as a holder: a
#: probe (sink/out_lock.py's lock_holder) holds one for microseconds; a run, for its life.
PROBE_PATIENCE_S = 0.05


def take_flock(fd: int, operation: int, patience_s: float = PROBE_PATIENCE_S) -> bool:
    """:func:`try_flock`, tried again for up to ``patience_s`` while it is refused.

    Asking "is this held?" takes a shared lock for an instant, so a taker that meets such a
    probe would otherwise refuse with "held by holder unknown"; two runs started together
    on one output folder could each meet the other's probe and both be refused (flock has
    no wait with a deadline, so the pauses are short and bounded: 1, 2, 4... ms).
    """
    deadline = time.monotonic() + patience_s
    pause = 0.001
    while not try_flock(fd, operation):
        if time.monotonic() + pause > deadline:
            return False
        time.sleep(pause)
        pause *= 2
    return True
