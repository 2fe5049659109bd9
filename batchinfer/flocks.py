"""A lock taken without waiting: how batchinfer tells a live holder from a gone one.

A run holds a lock (``flock``) on a file of its own while it lives: its output folder's,
its shared-memory owner segment's, its emulator state's. A lock dies with its process
however that process dies, where a pid says nothing across PID namespaces (containers
sharing /tmp or /dev/shm), so whoever asks "is that run alive?" tries the lock.
"""

from __future__ import annotations

import errno
import fcntl


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
