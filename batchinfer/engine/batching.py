"""Models built for a batch of N (``rknn_batch_size`` N): N items per runtime call.

NOTE [Batch-N models: one item per slot, N items per call]
==========================================================

Planning (engine/planning/plan.py, :func:`split_batch`): a model whose one input has a static batch
axis N > 1 (an ONNX exported with batch N, or a ``.rknn`` whose ``.onnx`` beside it has
one) is planned with ``EnginePlan.batch`` = N and an *item* shape of batch 1. Everything
before the core worker sees items, exactly as for a batch-1 model: a slot holds one item,
readers decode one image into one slot, the scheduler dispatches slots and every item ends
in its own row. Only the depth of the queues scales with N (``EnginePlan.item_lanes`` =
instances × N: a core's capacity and refill point, the default slots, the status board's
rows per core), so a core holds enough items to fill its calls. A model with several
inputs (or fed by ``.npz`` items or manifest columns) is not packed: its tensors are fed
whole, as before.

The core worker (engine/board/core_worker.py, :func:`batched_loop`), per runtime instance:

1. *Gather*: take one item from the worker's queue (waiting as long as it takes), then
   every item already queued, up to N; if still short, wait for more until
   ``GATHER_WAIT_S`` after the first was taken, then call with what it has. So a full
   queue never waits, and a short batch (the end of the dataset, a core the scheduler
   gives one suspect to retry alone, readers slower than the NPU) costs at most
   ``GATHER_WAIT_S`` of waiting. One instance gathers at a time (a lock), so two idle
   instances do not split a trickle of items into two short batches.
2. *Pack*: copy each item's input region into row j of the instance's own batch buffer
   (one per model input, N rows); rows past a short batch's items are zeros (padding).
3. *Call* the runtime once. While it runs, the instance's status-board rows (N per
   instance: row ``board_row + instance × N + j``) hold each item's (index, start): a
   hang names every item of the call, a crash finds every item of the call working.
4. *Scatter*: row j of each output goes to item j's output region (and, in a detection
   run, to the decoder as one item's outputs); the padding rows are dropped. Each item
   gets its own result in the ``Done`` message, with the call's start and end.

Failures are charged per call, by the scheduler's policy, unchanged (scheduler.py): an
item that fails to read is an error row before it reaches a worker, so it never takes a
place in a call and never fails its neighbours; a call of several items that returns None
(or raises) is split at once, in the worker: each item is inferred again alone (a batch of
one, padded), and only an item that fails alone is reported failed (charged one attempt,
as a batch-1 model's item would be); a call that hangs charges every item in it (the
watchdog names every item of the call: any may be the cause), and each is then retried
alone, as a crash's items are (so with ``reliability.max_attempts`` 1 the neighbours of a
hanging item become error rows too); a crash during a call of several items charges none
and makes each a suspect, retried alone, so a poison item ends up charged alone.

On Ray (cluster/actors.py, cluster/pool.py) a core actor is one instance with N item lanes
(the pool's Layout.instances): the driver sends calls of whole batches (its items per call
rounded up to a multiple of N), and the actor packs each call's items N to a runtime call
in order (a short remainder is padded), with the same pack, call, scatter and split
(:func:`infer_packed`, shared with the board's loop). Nothing is gathered across calls:
the driver's refills are what fill the batches. A failed call is split in the actor, as
here; a hung or crashed actor names every item of its oldest call (cluster/pool.py).

The canary (engine/canary.py) is a full batch of N, on a board and on Ray; the worker (or
actor) reports its first row's outputs and the per-item output shapes (batch 1), so the
output slots, the collector and the detection decoder see batch-1 items. Every output must
have the batch axis N first, or the core cannot start (said once,
:func:`unbatchable_outputs`).
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from batchinfer.engine.protocol import InferResult, InferTask

# How long an instance waits for more items once it has the first of a short batch. Short
# against a batch call (a few ms of NPU per item, times N), long against the coordinator's
# refills (they travel in well under a millisecond).
GATHER_WAIT_S = 0.01


def split_batch(shape: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """(N, the item's shape with batch 1) for a model input of ``shape``; N is 1 unless
    the leading (batch) axis is static and larger (a dynamic batch axis reads as 1)."""
    dims = tuple(int(d) for d in shape)
    if len(dims) >= 2 and dims[0] > 1:
        return dims[0], (1, *dims[1:])
    return 1, dims


def batch_shapes(shapes: Sequence[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    """Item shapes (batch 1) as the runtime takes them in a call of ``n``."""
    return [(n, *s[1:]) for s in shapes]


def unbatchable_outputs(outputs: Sequence[np.ndarray], n: int) -> str | None:
    """Why outputs of a batch-``n`` call cannot be split into items; None when they can."""
    bad = [list(o.shape) for o in outputs if o.ndim < 1 or o.shape[0] != n]
    if not bad:
        return None
    shapes = ", ".join(str(s) for s in bad)
    return (
        f"its outputs {shapes} do not start with the model's batch axis of {n}, so they "
        "cannot be split into one row per item; export the model with the batch axis first "
        "on every output, or use its batch-1 twin"
    )


class Held:
    """Items an instance took from the queue and has not yet handed on (gathered, in a
    call, or being scattered): the worker counts them as items it still holds (Outbox)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n


@dataclass
class BatchWork:
    """What the batched instances of one core worker share (engine/board/core_worker.py
    builds it)."""

    batch: int
    core: int
    board_row: int  # the worker's first status-board row
    work: queue.SimpleQueue  # InferTask(slot, index)s; None: stop
    inputs: Any  # SlotRegion: slot -> [one array per model input]
    outputs: Any  # SlotRegion: slot -> [one array per model output]
    board: Any  # StatusBoard
    busy: Any  # core_worker.BusyClock
    report: Callable[[InferResult], None]  # core_worker.Outbox.add
    held: Held
    gather_lock: threading.Lock = field(default_factory=threading.Lock)


def gather(work: queue.SimpleQueue, n: int) -> tuple[list[InferTask], bool]:
    """Up to ``n`` tasks by the rule of the NOTE (step 1), and whether the stop sentinel
    was taken (then the caller infers what it has and ends)."""
    first = work.get()
    if first is None:
        return [], True
    group = [first]
    deadline = None
    while len(group) < n:
        try:
            task = work.get_nowait()
        except queue.Empty:
            if deadline is None:
                deadline = time.monotonic() + GATHER_WAIT_S
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                task = work.get(timeout=remaining)
            except queue.Empty:
                break
        if task is None:
            return group, True
        group.append(task)
    return group, False


class Packer:
    """One instance's batch buffers: one array of N rows per model input (step 2)."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str], n: int):
        self.n = n
        self.buffers = [
            np.zeros(s, dtype=d) for s, d in zip(batch_shapes(shapes, n), dtypes, strict=True)
        ]
        self._padded = 0  # rows at the end that are zeros already

    def pack(self, items: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        """The batch input for ``items`` (each: its slot's input arrays, batch 1)."""
        count = len(items)
        for k, buf in enumerate(self.buffers):
            for j, tensors in enumerate(items):
                np.copyto(buf[j], tensors[k].reshape(buf.shape[1:]), casting="same_kind")
            if count < self.n and self._padded < self.n - count:
                buf[count:] = 0  # padding: zeros, never another item's pixels
        self._padded = self.n - count
        return self.buffers


T = TypeVar("T")


@dataclass
class Call(Generic[T]):
    """One runtime call that stands (steps 3-4): its items, and the outputs (row j of each
    is ``items[j]``'s; rows past the items are padding, never read) or the error (then no
    outputs), with the call's start and end."""

    items: Sequence[T]
    outputs: list[np.ndarray]
    error: str | None
    t0: float
    t1: float

    def rows(self, j: int) -> list[np.ndarray]:
        """Item ``j``'s outputs (batch 1): row j of each."""
        return [o[j : j + 1] for o in self.outputs]


class BatchRuntime(Protocol[T]):
    """Where :func:`infer_packed` runs calls: a core worker's instance (:class:`_BoardCalls`)
    or a Ray core actor (cluster/actors.py)."""

    def pack(self, items: Sequence[T]) -> list[np.ndarray]: ...  # the call's inputs
    def begin(self, items: Sequence[T], t0: float) -> None: ...  # the call starts
    def infer(self, items: Sequence[T], batch: list[np.ndarray]) -> list[np.ndarray]: ...
    def row_error(self, exc: Exception) -> str: ...  # an item's error for what infer raised
    def end(self, items: Sequence[T], t1: float) -> None: ...  # the call ended (or failed)
    def done(self, call: Call[T]) -> None: ...  # hand its items on (before the next call)


def infer_packed(runtime: BatchRuntime[T], items: Sequence[T]) -> None:
    """Steps 2-4 of the NOTE for ``items`` (at most N): pack, call the runtime once, and
    hand the call to ``runtime.done``. A call of several items that fails (raises, or
    returns None) is split at once: which item failed it is unknown, so each is called
    again alone, and only an item that fails alone is handed on with an error (charged
    one attempt, as a batch-1 model's item would be)."""
    batch = runtime.pack(items)
    t0 = time.monotonic()
    runtime.begin(items, t0)
    error = None
    outs: list[np.ndarray] = []
    try:
        outs = runtime.infer(items, batch)
    except Exception as e:  # report, never vanish: the coordinator decides what follows
        error = runtime.row_error(e)
    t1 = time.monotonic()
    runtime.end(items, t1)
    if error is not None and len(items) > 1:
        for item in items:
            infer_packed(runtime, [item])
        return
    runtime.done(Call(items, outs, error, t0, t1))


def batched_loop(
    shared: BatchWork,
    instance: int,
    adapter: Any,
    data_format: str | list[str],
    decoding: queue.SimpleQueue | None,
    copy_outputs: bool,
    gc_every: int,
) -> None:
    """One runtime instance of a batch-N model until the stop sentinel (the NOTE's steps);
    ``decoding``: a detection run's queue to this instance's decoder thread; ``gc_every``:
    calls between the worker's periodic collections (engine/board/core_worker.py: GC_EVERY)."""
    layout = shared.inputs.spec.layout
    packer = Packer(layout.shapes, layout.dtypes, shared.batch)
    runtime = _BoardCalls(shared, instance, adapter, packer, data_format, decoding, copy_outputs)
    stop, calls = False, 0
    while not stop:
        with shared.gather_lock:
            group, stop = gather(shared.work, shared.batch)
            shared.held.add(len(group))
        if not group:
            break
        infer_packed(runtime, group)
        calls += 1
        if calls % gc_every == 0:
            gc.collect()


@dataclass
class _BoardCalls:
    """One instance's calls on the board (:class:`BatchRuntime`): items are InferTasks
    (slot, index); the status board and busy clock watch each call, and the outputs go to
    the slots (or the decoder) and the results to the worker's outbox."""

    shared: BatchWork
    instance: int
    adapter: Any  # its RuntimeAdapter
    packer: Packer
    data_format: str | list[str]
    decoding: queue.SimpleQueue | None  # batched_loop's
    copy_outputs: bool

    def __post_init__(self) -> None:
        self.rows = self.shared.board_row + self.instance * self.shared.batch  # its first row
        self.row_error = self.adapter.row_error  # a None: with the runtime's own E line

    def pack(self, items: Sequence[InferTask]) -> list[np.ndarray]:
        self.adapter.set_current_items([index for _, index in items])
        return self.packer.pack([self.shared.inputs[slot] for slot, _ in items])

    def begin(self, items: Sequence[InferTask], t0: float) -> None:
        for j, (_, index) in enumerate(items):
            self.shared.board.start(self.rows + j, index, t0)
        self.shared.busy.enter(t0)

    def infer(self, items: Sequence[InferTask], batch: list[np.ndarray]) -> list[np.ndarray]:
        outs = self.adapter.infer(
            batch, data_format=self.data_format, reuse_outputs=self.decoding is None
        )
        if self.copy_outputs:  # in the call: an output that does not fit is its error
            for j, (slot, _) in enumerate(items):
                for dst, src in zip(self.shared.outputs[slot], outs, strict=True):
                    np.copyto(dst, src[j : j + 1].reshape(dst.shape), casting="same_kind")
        return outs

    def end(self, items: Sequence[InferTask], t1: float) -> None:
        for j in range(len(items)):
            self.shared.board.finish(self.rows + j)
        self.shared.busy.leave(t1)

    def done(self, call: Call[InferTask]) -> None:
        for j, (slot, index) in enumerate(call.items):
            self.shared.held.add(-1)  # handed on: the outbox counts it as finished from here
            if self.decoding is not None and call.error is None:
                self.decoding.put((slot, index, self.instance, call.t0, call.t1, call.rows(j)))
            else:
                result = InferResult(slot, index, self.instance, call.t0, call.t1, call.error, None)
                self.shared.report(result)
