"""Shared-memory slots: where tensors live while an item moves through the pipeline.

NOTE [Slot life cycle and shutdown order]
=========================================

Tensors never travel through pipes; only small tuples do (slot number, item index,
timings). Every tensor lives in a *slot*: slot ``s`` is one input region in the input
segment and one output region in the output segment, both fixed-size, so memory is
``slots x (input bytes + output bytes)`` whatever the dataset size. A third, tiny segment,
the *status board*, has one row per (core worker, instance): the index of the item the
instance is inferring and the monotonic time it started (0 when idle).

The coordinator owns every slot's state; nobody else decides anything about a slot::

    FREE ──read──► READING ──loaded──► READY ──infer──► INFERRING ──done──► FREE
      ▲  (reader decodes and       │  (waits for a      │  (worker copies     │
      │   preprocesses straight    │   core with room)  │   outputs once into │
      │   into the input region)   │                    │   the output region)│
      │◄──────── input error: error row ◄───────────────┤                    │
      │                                                 ├─ None / crash / hang: back to READY
      │                                                 │  (the input region is intact, so a
      │                                                 │  retry needs no re-read), or an
      │◄──────────────── error row after --max-attempts ┘  error row after --max-attempts
      └◄──── collector reads the output region, writes the row, frees the slot ◄──┘

Rules that make this safe:
1. A slot is written by exactly one process at a time, the one the coordinator sent it to:
   a reader (input region) or a core worker (output region). The coordinator touches the
   output region only after the worker's ``done`` message, and reuses a slot only after it
   has written that item's row.
2. A worker that dies or hangs leaves its slots READY again: the coordinator reads the status
   board to tell the items that were inside ``inference()`` (charged one attempt) from the
   ones only queued in the worker (not charged).
3. Only the coordinator creates and unlinks segments (``SlotRing`` and ``StatusBoard`` below).
   Children attach by name with :func:`attach`, which bypasses Python's resource tracker:
   otherwise the tracker would unlink a segment when the child exits. The coordinator's own
   segments stay registered with the tracker, so even a SIGKILLed coordinator loses nothing:
   its tracker unlinks them, and :func:`sweep_dead_segments` removes what a crashed tracker
   left behind at the next start. Segment names carry the coordinator's pid and the run id.

Shutdown order (coordinator, see ``Coordinator.close``), the same on success, error and Ctrl-C:
1. stop feeding readers and dispatching to workers;
2. wait (bounded: ``min(--timeout-s, 10)`` s) for in-flight items to come back, writing
   their rows; a second Ctrl-C skips the rest of this wait;
3. send ``stop`` to every reader and worker, join them with a timeout, SIGKILL what is left
   (after a second Ctrl-C: SIGKILL at once). Children also exit by themselves when their pipe
   from the coordinator closes, so they never outlive it;
4. flush the prediction writer, write core stats, timeline and the manifest;
5. close and unlink every segment: only after every child is gone, so no child ever maps a
   segment that has been unlinked and recreated.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import re
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import psutil

from batchinfer.errors import SharedMemoryError

SEGMENT_PREFIX = "batchinfer"
SHM_DIR = "/dev/shm"
_ALIGN = 64
_NAME_RE = re.compile(rf"^{SEGMENT_PREFIX}-(\d+)-[0-9a-f]+-\w+$")


def _aligned(n: int) -> int:
    return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)


def new_run_token() -> str:
    """A short random token that, with our pid, names this run's segments."""
    return secrets.token_hex(4)


def segment_name(token: str, role: str) -> str:
    """The name of one of this coordinator's segments (see NOTE, rule 3)."""
    return f"{SEGMENT_PREFIX}-{os.getpid()}-{token}-{role}"


def attach(name: str) -> mmap.mmap:
    """Map an existing segment without registering it with the resource tracker (rule 3)."""
    import _posixshmem  # CPython's own shm_open binding, as multiprocessing uses it

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def sweep_dead_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink segments left by coordinators that are no longer alive; return their names."""
    swept = []
    with contextlib.suppress(OSError):
        for name in os.listdir(shm_dir):
            m = _NAME_RE.match(name)
            if m and not psutil.pid_exists(int(m.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(shm_dir, name))
                    swept.append(name)
    return swept


def check_free_space(nbytes: int, shm_dir: str = SHM_DIR) -> None:
    """Raise SharedMemoryError when /dev/shm cannot hold ``nbytes`` more."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return  # no /dev/shm to check (not Linux): let the allocation itself decide
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise SharedMemoryError(
            f"the input/output slots need {nbytes / 2**20:.1f} MiB of shared memory but {shm_dir} "
            f"has only {free / 2**20:.1f} MiB free; run with fewer --slots, or give the machine "
            f"a bigger {shm_dir} (docker: --shm-size)."
        )


class _Segment:
    """One segment the coordinator created (and alone unlinks), or one a child attached."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.name = name
        if create:
            try:
                self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(
                    name=name, create=True, size=size
                )
            except OSError as e:
                raise SharedMemoryError(
                    f"shared memory segment {name} ({size / 2**20:.1f} MiB) could not be "
                    f"created ({e.strerror}); run with fewer --slots or free {SHM_DIR}."
                ) from e
            self.buf: memoryview | mmap.mmap = self._shm.buf
        else:
            self._shm = None
            self._map = attach(name)
            self.buf = self._map

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            if self._shm is not None:
                self._shm.close()
            else:
                self._map.close()

    def unlink(self) -> None:
        if self._shm is not None:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()


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
class RingSpec:
    """Everything a child needs to attach to the slot ring (picklable, sent at spawn)."""

    token: str
    in_name: str
    out_name: str
    board_name: str
    slots: int
    inputs: TensorLayout
    outputs: TensorLayout
    board_rows: int


class SlotRing:
    """The input and output regions of every slot, as numpy views (see NOTE).

    ``SlotRing.create`` is for the coordinator; ``SlotRing.attach`` for readers and workers.
    """

    def __init__(self, spec: RingSpec, create: bool) -> None:
        self.spec = spec
        self._segments: list[_Segment] = []
        try:
            self._in = self._add(spec.in_name, spec.slots * spec.inputs.nbytes, create)
            self._out = self._add(spec.out_name, spec.slots * spec.outputs.nbytes, create)
            board = self._add(spec.board_name, max(_ALIGN, spec.board_rows * 16), create)
        except BaseException:
            self.close(unlink=create)
            raise
        self.board = np.ndarray((spec.board_rows, 2), dtype=np.float64, buffer=board.buf)
        if create:
            self.board[:] = 0.0
        # Views are made once: building an ndarray per item and tensor costs tens of µs,
        # which on the core worker's path is NPU time lost.
        self._in_views = [self._views(self._in, spec.inputs, s) for s in range(spec.slots)]
        self._out_views = [self._views(self._out, spec.outputs, s) for s in range(spec.slots)]

    def _add(self, name: str, size: int, create: bool) -> _Segment:
        seg = _Segment(name, size, create)
        self._segments.append(seg)
        return seg

    @classmethod
    def create(cls, spec: RingSpec) -> SlotRing:
        total = spec.slots * (spec.inputs.nbytes + spec.outputs.nbytes) + spec.board_rows * 16
        check_free_space(total)
        return cls(spec, create=True)

    @classmethod
    def attach(cls, spec: RingSpec) -> SlotRing:
        return cls(spec, create=False)

    def _views(self, seg: _Segment, layout: TensorLayout, slot: int) -> list[np.ndarray]:
        base = slot * layout.nbytes
        return [
            np.ndarray(shape, dtype=dtype, buffer=seg.buf, offset=base + off)
            for shape, dtype, off in zip(layout.shapes, layout.dtypes, layout.offsets, strict=True)
        ]

    def inputs(self, slot: int) -> list[np.ndarray]:
        """Views of slot ``slot``'s input tensors (writable, no copy)."""
        return self._in_views[slot]

    def outputs(self, slot: int) -> list[np.ndarray]:
        """Views of slot ``slot``'s output tensors (writable, no copy)."""
        return self._out_views[slot]

    def close(self, unlink: bool = False) -> None:
        """Drop our views and mappings; with ``unlink`` (coordinator only) remove the segments."""
        self.board = None  # type: ignore[assignment]
        self._in_views = self._out_views = []
        for seg in self._segments:
            seg.close()
            if unlink:
                seg.unlink()
        self._segments.clear()


def ring_spec(slots: int, inputs: TensorLayout, outputs: TensorLayout, board_rows: int) -> RingSpec:
    """A RingSpec with fresh segment names for this coordinator."""
    token = new_run_token()
    return RingSpec(
        token=token,
        in_name=segment_name(token, "in"),
        out_name=segment_name(token, "out"),
        board_name=segment_name(token, "board"),
        slots=slots,
        inputs=inputs,
        outputs=outputs,
        board_rows=board_rows,
    )
