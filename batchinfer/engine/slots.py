"""Shared-memory slots: where tensors live while an item moves through the pipeline.

NOTE [Slot life cycle and shutdown order]
=========================================

Tensors never travel through pipes; only small tuples do (slot number, item index,
timings). Every tensor lives in a *slot*: slot ``s`` is one region in the **input
segment** and one in the **output segment**, both fixed-size, so memory is
``slots x (input bytes + output bytes)`` whatever the dataset size. A slot's input region
holds one tensor (view) per model input, in the model's input order (EnginePlan.input_layout:
a model with several inputs has several, each written by the slot's reader from its own
source, batchinfer.data.feeds), and its output region one per model output. A third, tiny segment,
the **status board** (:class:`StatusBoard`), has one row per reader and per (core worker,
instance): the index of the item it is working on and the monotonic time it started (0
when idle). The input segment and the board exist from the start, so readers start at
once; the output segment is made when the first core worker reports its output shapes.
A detection run has one more, the **geometry segment** (engine/detection.py): one small row
per slot saying where the reader letterboxed the slot's image (original size, scale,
padding), which the core worker reads after inference to put the boxes back in the
original image's pixels. It follows the input region's rules (written by the slot's reader
while READING, read by a core worker while INFERRING); the boxes go back in the ``done``
message, and a detection run's output segment holds nothing unless ``--save-outputs``.

A slot always holds one item, a batch-N model's too: its core worker packs up to N READY
slots into one runtime call and scatters the outputs back to each slot's output region
(the rule, and what a failure of such a call charges: the NOTE of engine/batching.py).

The scheduler (scheduler.py) owns every slot's state; nobody else decides about a slot::

    FREE ──admit──► READING ──loaded──► READY ──dispatch──► INFERRING ──done──► DONE ──► FREE
      ▲  (a reader decodes and   │  (waits for a   │  (the worker copies   │  (the collector
      │   preprocesses straight  │   core with     │   the outputs once    │   reads the output
      │   into the input region; │   room)         │   into the output     │   region, the sink
      │   sources without files  │                 │   region)             │   takes the row)
      │   fill it in the         │                 ├─ None / crash / hang: READY again (the input
      │   coordinator: READY)    │                 │  region is intact, so a retry needs no
      │◄── input error: error row┘                 │  re-read), or an error row after
      │◄───────────────────────────────────────────┘  reliability.max_attempts

Rules that make this safe:
1. A slot region is written by exactly one process at a time, the one the coordinator sent
   the slot to: a reader (input region) or a core worker (output region). The coordinator
   reads the output region only after the worker's ``done``, and reuses a slot only after
   the sink has taken that item's row (sinks copy what they keep).
2. A child that dies or hangs leaves its slots to the coordinator: the status board tells the
   items that were being worked on (the ones an attempt may be charged to: scheduler.py says
   which) from the ones only queued (never charged).
3. Only the coordinator creates and unlinks segments (:func:`create_segment`). Children map
   them by name with :func:`attach`. Segments are files of /dev/shm opened with ``os.open``
   (what shm_open(3) does on Linux), never ``multiprocessing.shared_memory``, whose resource
   tracker would unlink a segment when a child that attached it exits. A SIGKILLed
   coordinator loses nothing: its janitor process (plumbing/janitor.py) unlinks the run's segments
   when the coordinator is gone. Each run also holds an ``flock`` on its own ``…-owner``
   segment for as long as it lives; :func:`sweep_dead_segments` removes the segments of
   runs whose owner lock nobody holds (should a janitor have died too). A lock, not a pid:
   across PID namespaces (containers sharing /dev/shm) every pid of another namespace looks
   dead, and a live run's segments must survive that.
4. Space is reserved when a segment is created (``posix_fallocate``), so a /dev/shm too small
   for the slots is one clear error at start, never a SIGBUS in a reader later.

Shutdown order (engine loop, see ``Engine._close``), the same on success, error and Ctrl-C:
1. stop admitting items and dispatching to workers;
2. wait (bounded: ``reliability.drain_timeout_s``) for items in flight to come back and
   write their rows; a second Ctrl-C skips the rest of this wait;
3. send ``stop`` to every reader and worker that is ready, join them with a timeout (reading
   and dropping what they still send, so none blocks in a send and never reads its stop),
   SIGKILL what is left (after a second Ctrl-C: SIGKILL at once). A child still starting
   holds no item: it is killed at once, not waited for. Children also exit when their pipe from the
   coordinator closes, and get SIGKILL from the kernel when the coordinator dies;
4. close and unlink every segment: only after every child is gone, so no child ever maps a
   segment that has been unlinked and recreated;
5. the sink writes its last rows, stats and manifest (the run folder stays locked until then).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import mmap
import os
import re
import secrets
from dataclasses import dataclass

import numpy as np
import psutil

from batchinfer.errors import SharedMemoryError
from batchinfer.flocks import try_flock
from batchinfer.messages import setting

SEGMENT_PREFIX = "batchinfer"
SHM_DIR = "/dev/shm"
_ALIGN = 64
_NAME_RE = re.compile(rf"^{SEGMENT_PREFIX}-(\d+)-([0-9a-f]+)-(\w+)$")
_OWNER = "owner"
_BOARD_COLUMNS = 2  # item index, start time


def _aligned(n: int) -> int:
    return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)


def new_run_token() -> str:
    """A short random token that, with our pid, names this run's segments."""
    return secrets.token_hex(4)


def owner_name(token: str) -> str:
    """The name of the run's owner segment."""
    return segment_name(token, _OWNER)


def segment_name(token: str, role: str) -> str:
    """The name of one of this coordinator's segments (see NOTE, rule 3)."""
    return f"{SEGMENT_PREFIX}-{os.getpid()}-{token}-{role}"


def _shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _shm_open(name: str, flags: int) -> int:
    """shm_open(3) itself: on Linux a POSIX shared-memory object is the file ``name`` in
    /dev/shm, which glibc opens with O_NOFOLLOW and O_CLOEXEC, as here."""
    return os.open(_shm_path(name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _shm_unlink(name: str) -> None:
    """shm_unlink(3): remove the name (the memory goes with the last map)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_shm_path(name))


def attach(name: str) -> mmap.mmap:
    """Map an existing segment (rule 3)."""
    fd = _shm_open(name, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def free_space(shm_dir: str = SHM_DIR) -> int | None:
    """Bytes free in /dev/shm, None where it cannot be read (not Linux)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _too_small(nbytes: int, name: str, shm_dir: str = SHM_DIR) -> SharedMemoryError:
    free = free_space(shm_dir)
    has = "" if free is None else f" but {shm_dir} has only {free / 2**20:.1f} MiB free"
    return SharedMemoryError(
        f"the input/output slots need {nbytes / 2**20:.1f} MiB of shared memory ({name}){has}; "
        "run with fewer slots ("
        + setting("runtime.slots")
        + f"), or give the machine a bigger {shm_dir} (docker: --shm-size)."
    )


def check_free_space(nbytes: int, shm_dir: str = SHM_DIR) -> None:
    """Raise SharedMemoryError when /dev/shm cannot hold ``nbytes`` more (a first check;
    :func:`create_segment` reserves the space for real)."""
    free = free_space(shm_dir)
    if free is not None and nbytes > free:
        raise _too_small(nbytes, "in all")


class Segment:
    """A shared-memory segment: created (and later unlinked) by the coordinator, or attached."""

    def __init__(self, name: str, buf: mmap.mmap, created: bool) -> None:
        self.name = name
        self.buf = buf
        self.created = created

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.buf.close()

    def unlink(self) -> None:
        """Remove the segment's name (coordinator only); the memory goes with the last map."""
        if self.created:
            _shm_unlink(self.name)


def create_segment(name: str, size: int) -> Segment:
    """Create segment ``name`` of ``size`` bytes with its space reserved (rule 4)."""
    size = max(size, _ALIGN)
    try:
        fd = _shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    except OSError as e:
        raise SharedMemoryError(
            f"shared memory segment {name} could not be created ({e.strerror}); free {SHM_DIR} "
            "or run with fewer slots (" + setting("runtime.slots") + ")."
        ) from e
    segment = None
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _too_small(size, name) from e
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        segment = Segment(name, mmap.mmap(fd, size), created=True)
        return segment
    except OSError as e:
        raise SharedMemoryError(
            f"shared memory segment {name} ({size / 2**20:.1f} MiB) could not be created "
            f"({e.strerror}); run with fewer slots ("
            + setting("runtime.slots")
            + f") or free {SHM_DIR}."
        ) from e
    finally:
        os.close(fd)
        if segment is None:  # failed: leave nothing behind
            with contextlib.suppress(OSError):
                _shm_unlink(name)


class RunOwner:
    """The ``…-owner`` segment this run holds an flock on while it lives (NOTE, rule 3).

    It appears under its name already locked: made under a name no sweep reads (a leading
    dot), locked, then linked to its name. Made and then locked, another run's sweep could
    find it unlocked in between, take the run for gone and unlink its segments. It goes the
    other way round: unlinked while still locked, so no sweep sees it unlocked either.
    """

    def __init__(self, token: str) -> None:
        self.name = owner_name(token)
        hidden = "." + self.name
        try:
            fd = _shm_open(hidden, os.O_CREAT | os.O_EXCL | os.O_RDWR)
        except OSError as e:
            raise SharedMemoryError(
                f"shared memory segment {self.name} could not be created ({e.strerror}); "
                f"free {SHM_DIR}."
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.link(_shm_path(hidden), _shm_path(self.name))
        except BaseException:
            os.close(fd)
            raise
        finally:
            _shm_unlink(hidden)
        self._fd = fd

    def close(self) -> None:
        _shm_unlink(self.name)
        os.close(self._fd)


def _owner_alive(shm_dir: str, pid: str, token: str) -> bool | None:
    """True/False when the run has an owner segment; None when it has none (old or dying)."""
    path = os.path.join(shm_dir, f"{SEGMENT_PREFIX}-{pid}-{token}-{_OWNER}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return not try_flock(fd, fcntl.LOCK_SH)
    except OSError:
        return True  # cannot tell: taken for alive, so its segments are not swept
    finally:
        os.close(fd)


def sweep_dead_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the segments of runs that are gone; return their names (NOTE, rule 3).

    A run is gone when nobody holds its owner lock; a run without an owner segment (a run
    being set up this instant, or an older version) is gone only when its pid is dead.
    """
    swept: list[str] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return swept
    runs: dict[tuple[str, str], list[str]] = {}
    for name in names:
        m = _NAME_RE.match(name)
        if m:
            runs.setdefault((m.group(1), m.group(2)), []).append(name)
    for (pid, token), members in runs.items():
        alive = _owner_alive(shm_dir, pid, token)
        if alive is None:
            alive = psutil.pid_exists(int(pid))
        if alive:
            continue
        for name in members:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(shm_dir, name))
                swept.append(name)
    return swept


@dataclass(frozen=True)
class TensorLayout:
    """Where each tensor of one slot region sits: (shape, dtype, byte offset) per tensor."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        offs, at = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes, strict=True):
            offs.append(at)
            at += _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        return tuple(offs)

    @functools.cached_property
    def nbytes(self) -> int:
        if not self.shapes:
            return _ALIGN
        last = int(np.prod(self.shapes[-1], dtype=np.int64)) * np.dtype(self.dtypes[-1]).itemsize
        return _aligned(self.offsets[-1] + _aligned(last))


@dataclass(frozen=True)
class RegionSpec:
    """One segment of per-slot tensors (picklable: children get it to attach)."""

    name: str
    slots: int
    layout: TensorLayout

    @property
    def nbytes(self) -> int:
        return self.slots * self.layout.nbytes


class SlotRegion:
    """Per-slot numpy views over one segment (inputs or outputs; see NOTE)."""

    def __init__(self, spec: RegionSpec, segment: Segment) -> None:
        self.spec = spec
        self.segment = segment
        # Views are made once: building an ndarray per item and tensor costs tens of µs,
        # which on the core worker's path is NPU time lost.
        self._views = [self._slot_views(s) for s in range(spec.slots)]

    @classmethod
    def create(cls, spec: RegionSpec) -> SlotRegion:
        return cls(spec, create_segment(spec.name, spec.nbytes))

    @classmethod
    def attach(cls, spec: RegionSpec) -> SlotRegion:
        return cls(spec, Segment(spec.name, attach(spec.name), created=False))

    def _slot_views(self, slot: int) -> list[np.ndarray]:
        layout, base = self.spec.layout, slot * self.spec.layout.nbytes
        return [
            np.ndarray(shape, dtype=dtype, buffer=self.segment.buf, offset=base + off)
            for shape, dtype, off in zip(layout.shapes, layout.dtypes, layout.offsets, strict=True)
        ]

    def __getitem__(self, slot: int) -> list[np.ndarray]:
        """Views of slot ``slot``'s tensors (writable, no copy)."""
        return self._views[slot]

    def close(self, unlink: bool = False) -> None:
        self._views = []
        self.segment.close()
        if unlink:
            self.segment.unlink()


@dataclass(frozen=True)
class BoardSpec:
    """The status board: one row per reader and per worker instance (picklable)."""

    name: str
    rows: int


class StatusBoard:
    """Who works on which item since when: ``board[row] = (item index, start time or 0)``."""

    def __init__(self, spec: BoardSpec, segment: Segment) -> None:
        self.spec = spec
        self.segment = segment
        self.rows = np.ndarray((spec.rows, _BOARD_COLUMNS), dtype=np.float64, buffer=segment.buf)

    @classmethod
    def create(cls, spec: BoardSpec) -> StatusBoard:
        board = cls(spec, create_segment(spec.name, spec.rows * _BOARD_COLUMNS * 8))
        board.rows[:] = 0.0
        return board

    @classmethod
    def attach(cls, spec: BoardSpec) -> StatusBoard:
        return cls(spec, Segment(spec.name, attach(spec.name), created=False))

    def start(self, row: int, index: int, t: float) -> None:
        self.rows[row, 0] = index
        self.rows[row, 1] = t

    def finish(self, row: int) -> None:
        self.rows[row, 1] = 0.0

    def snapshot(self) -> np.ndarray:
        """A copy: children write concurrently, and reading a row twice could see it busy
        and then idle (0.0), which would look like a start at the epoch."""
        return self.rows.copy()

    def close(self, unlink: bool = False) -> None:
        self.rows = None
        self.segment.close()
        if unlink:
            self.segment.unlink()
