"""The emulated board: a small mmap'd file per chip shared by every process, holding per
core the time until which it is reserved (the "Time model" of batchinfer/runtime/sim.py's
docstring), with one ``flock`` a core.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

from batchinfer.runtime import constants as C
from batchinfer.runtime.private_files import ensure_private_dir, open_private_file
from batchinfer.runtime.sim_load import WINDOW_OFFSET, load_path, publish

# ---------------------------------------------------------------- the board file
_MAGIC = b"BISIMv01"
_HEADER = struct.Struct("8s40s")  # magic, boot id
# busy_until, inference calls, init calls, seconds held in all (the NPU load: sim_load.py)
_CORE = struct.Struct("dqqd")
_MAX_CORES = 16
_BOARD_SIZE = 4096
assert _HEADER.size + _MAX_CORES * _CORE.size <= WINDOW_OFFSET < _BOARD_SIZE
# A reservation further ahead than this is left over from another clock epoch: ignore it.
_STALE_S = 60.0


def _boot_id() -> bytes:
    # CLOCK_MONOTONIC restarts at boot: a board file from an earlier boot is reset.
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()[:40]
    except OSError:
        return b"unknown"


class Board:
    """One chip's shared state: per-core reservations and call counters, under flock.

    Each instance opens its own file descriptions, so flock also serialises threads
    of one process (flock locks belong to the open file description). A core's
    reservation and counters are changed under that core's own lock file
    (``<chip>.core<N>.lock``; several cores in ascending order), the board file's lock
    only guards its set-up: a worker stopped (SIGSTOP) in the middle of a call holds up
    the calls on its own core, never another core's, as on a board.
    """

    def __init__(self, state_dir: Path, chip: str) -> None:
        ensure_private_dir(state_dir)  # /tmp/batchinfer-sim-<uid> is a guessable name
        self.path = state_dir / f"{chip}.board"
        self._fd = open_private_file(self.path)
        try:
            # Set up once per boot, under the board's lock; once it is, no lock is taken
            # here either, so a worker frozen while creating a runtime holds up no other
            # worker's (re)start.
            mm = self._set_up()
            if mm is None:
                with self.locked():
                    mm = self._set_up()  # by another process while we waited?
                    if mm is None:
                        if os.fstat(self._fd).st_size < _BOARD_SIZE:
                            os.ftruncate(self._fd, _BOARD_SIZE)
                        mm = mmap.mmap(self._fd, _BOARD_SIZE)
                        mm[:] = bytes(_BOARD_SIZE)
                        _HEADER.pack_into(mm, 0, _MAGIC, _boot_id())
            self._mm = mm
        except BaseException:
            os.close(self._fd)
            raise
        self._core_fds: dict[int, int] = {}  # opened when a call first locks the core
        # An RKNNLite dropped without release() must not keep the descriptors: close them
        # when this object goes away (200 forgotten instances hit "too many open files").
        self._closer = weakref.finalize(self, _close_board, self._mm, self._fd, self._core_fds)
        self.load_path = load_path(state_dir, chip)
        self.ncores = C.CHIP_CORES[chip]
        self.publish_load(time.monotonic())  # the load file exists from the first init on

    def _set_up(self) -> mmap.mmap | None:
        """The board mapped, if it is set up for this boot already; else None."""
        if os.fstat(self._fd).st_size < _BOARD_SIZE:
            return None
        mm = mmap.mmap(self._fd, _BOARD_SIZE)
        magic, boot = _HEADER.unpack_from(mm, 0)
        if magic == _MAGIC and boot.rstrip(b"\0") == _boot_id():
            return mm
        mm.close()
        return None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The whole board (its set-up)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def cores_locked(self, cores: Iterable[int]) -> Iterator[None]:
        """``cores``' reservations and counters, locked in ascending order (no deadlock
        between two multi-core masks)."""
        taken: list[int] = []
        try:
            for core in sorted(set(cores)):
                fd = self._core_fds.get(core)
                if fd is None:
                    lock_file = self.path.with_name(f"{self.path.stem}.core{core}.lock")
                    fd = self._core_fds[core] = open_private_file(lock_file)
                fcntl.flock(fd, fcntl.LOCK_EX)
                taken.append(fd)
            yield
        finally:
            for fd in reversed(taken):
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _offset(self, core: int) -> int:
        return _HEADER.size + core * _CORE.size

    def busy_until(self, core: int, now: float) -> float:
        busy = _CORE.unpack_from(self._mm, self._offset(core))[0]
        return now if busy > now + _STALE_S else busy

    def hold(self, core: int, start: float, end: float) -> None:
        """Reserve ``core`` from ``start`` (never before its busy_until) to ``end``."""
        _, calls, inits, held = _CORE.unpack_from(self._mm, self._offset(core))
        _CORE.pack_into(self._mm, self._offset(core), end, calls, inits, held + end - start)

    def busy_s(self, core: int, now: float) -> float:
        """Seconds ``core`` has been held until ``now`` (a hold's part after now is not)."""
        busy, _, _, held = _CORE.unpack_from(self._mm, self._offset(core))
        return held - min(max(0.0, busy - now), _STALE_S)

    def publish_load(self, now: float) -> None:
        """Write the driver's load text when a window ends (batchinfer.runtime.sim_load)."""
        publish(self._mm, self._fd, self.load_path, self.ncores, now, self.busy_s)

    def count(self, core: int, *, init: bool) -> int:
        """Add one inference (or init) call on ``core``; the new count, from 1."""
        busy, calls, inits, held = _CORE.unpack_from(self._mm, self._offset(core))
        if init:
            inits += 1
        else:
            calls += 1
        _CORE.pack_into(self._mm, self._offset(core), busy, calls, inits, held)
        return inits if init else calls

    def close(self) -> None:
        self._closer()


def _close_board(mm: mmap.mmap, fd: int, core_fds: dict[int, int]) -> None:
    mm.close()
    os.close(fd)
    for core_fd in core_fds.values():
        os.close(core_fd)
