"""The emulator's NPU load file: what the rknpu driver prints, from the emulator's busy time.

The board file (sim.py's ``_Board``) keeps per core the seconds its calls held it
(``busy_s``, a hold counted from its start; the part still ahead of ``now`` is not busy
yet). Like the driver's timer, the load is the share of the last window that each core was
busy, windows of ``LOAD_INTERVAL_S``; the driver closes a window every second on a timer,
the emulator has no timer, so the first call that ends after a window's second closes it.
It writes ``<state_dir>/<chip>.load`` in the driver's text (batchinfer.runtime.npu_load.
format_load), atomically (a new file renamed over the old one), so a reader never sees half
of it. While no call runs the file keeps its last figure (the driver's would fall to 0 %
within a second): readers sample it while a run lasts.

The window lives in the board file too (its start and each core's busy seconds at that
start, at ``WINDOW_OFFSET``), so every process of the board closes the same windows. A
window is closed under the board file's lock, taken without waiting: a call that finds it
held (another process closing the window) goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path

from batchinfer.flocks import try_flock
from batchinfer.runtime.npu_load import format_load

#: The driver's window (RKNPU_LOAD_INTERVAL, 1 s).
LOAD_INTERVAL_S = 1.0
#: Where the window is kept in the board file (after the header and 16 cores' records).
WINDOW_OFFSET = 1024
MAX_CORES = 16
_WINDOW_FIELDS = 1 + MAX_CORES  # start, then busy seconds per core at the start


def load_path(state_dir: Path, chip: str) -> Path:
    """The emulated board's load file (beside its ``<chip>.board``)."""
    return Path(state_dir) / f"{chip}.load"


def _window(mm: mmap.mmap) -> list[float]:
    return list(struct.unpack_from(f"{_WINDOW_FIELDS}d", mm, WINDOW_OFFSET))


def _set_window(mm: mmap.mmap, values: list[float]) -> None:
    struct.pack_into(f"{_WINDOW_FIELDS}d", mm, WINDOW_OFFSET, *values)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def publish(
    mm: mmap.mmap,
    lock_fd: int,
    path: Path,
    ncores: int,
    now: float,
    busy_s: Callable[[int, float], float],
) -> bool:
    """Close the load window if its second is over (or none is open yet) and write the
    file; False when it was not time, or another process holds the lock."""
    start = _window(mm)[0]
    if start and now - start < LOAD_INTERVAL_S:
        return False
    if not try_flock(lock_fd, fcntl.LOCK_EX):
        return False
    try:
        window = _window(mm)  # again, under the lock: another process may have closed it
        start, marks = window[0], window[1 : 1 + ncores]
        if start and now - start < LOAD_INTERVAL_S:
            return False
        busy = [busy_s(core, now) for core in range(ncores)]
        if start and now > start:
            # Truncated to whole percent, as the driver's do_div does.
            percents = [
                min(100, max(0, int((b - m) * 100 / (now - start))))
                for b, m in zip(busy, marks, strict=True)
            ]
        else:
            percents = [0] * ncores
        with contextlib.suppress(OSError):  # a full disk costs the figure, never the call
            _write(path, format_load(percents))
        _set_window(mm, [now, *busy, *([0.0] * (MAX_CORES - ncores))])
        return True
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
