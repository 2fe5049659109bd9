"""Core workers: one process per NPU core, ``instances`` runtime threads pinned to that core.

Protocol (the types: protocol.py; slot life cycle: NOTE in slots.py; the coordinator's
side: engine/board.py):
  worker -> coordinator  InitFailed(reason)             a runtime could not start; then exit
                                                        (reason: runtime/adapter.py's CoreReason)
                         Failed(traceback)              any other start-up failure; then exit
                         Initialised()                  runtimes up; the canary runs next
                         WorkerReady(sdk_version, outputs, canary, pid, cpu_s)
                                                        canary done: output shapes, canary
                                                        outputs, start-up CPU seconds
  coordinator -> worker  Attach(outputs RegionSpec)     once, before any task
                         Infer([InferTask(slot, item_index), ...])
                         Stop()                         finish queued work, release, exit
  worker -> coordinator  Done([InferResult(slot, item_index, instance, t0, t1, error, decoded),
                         ...], busy_s, cpu_s)
                         error None: outputs are in the slot's output region (a run whose
                         task decodes here copies none without --save-outputs); else one
                         sentence. decoded: None, or for a task that decodes in the worker
                         (batchinfer/tasks: Task.decodes_in_worker) a tasks.Decoded: the
                         task's small payload (a detection run's boxes in the original
                         image's pixels) and the decode's CPU seconds.
                         busy_s: cumulative seconds during which some instance was in inference();
                         cpu_s: the worker's CPU seconds so far (for CPU per item by role).
Each instance thread takes the next item from one queue (the main thread fills it from the
task pipe); results leave in batches (_Outbox decides when, a sender thread writes the
message, or the thread that finished them when it has nothing left to infer): one thread
hand-off per item (the queue) and at most one per message. The main thread
also sends results that have waited BATCH_WAIT_S, so a hung call holds back none. While an
instance infers, its row on the status board holds (index, start time). Runtimes are
created here, after the fork (the fork server never imports a runtime:
engine/fork_server.py); the worker exits with the coordinator.
Tasks that decode in the worker (detection, plug-ins) decode here: each instance has a
decoder thread of its own (one tasks.ItemDecoder each) to which it hands the outputs of each
inference (fresh arrays, not the runtime's reused buffers) and goes on to its next item at
once, so the NPU does not wait for the decoding (with one instance per core it did: 15 ms of
NPU then 0.5 ms of decode per item). The decoder reads the slot's letterbox geometry
(written by the reader, engine/detection.py) and puts the result in the outbox; only the
task's payload travels back, never the raw tensors. A decode that raises makes that item an
error row. An item being decoded still holds its slot.
A batch-N model (WorkerSpec.batch > 1): each instance gathers up to N queued items, packs
them into one call and scatters the outputs back to each item's slot; the rule (how long
it waits for a full batch, padding, board rows, what a failure charges) is the NOTE of
engine/batching.py. The messages do not change: one result per item.
"""

from __future__ import annotations

import gc
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from batchinfer.engine.batching import (
    BatchWork,
    Held,
    batch_shapes,
    batched_loop,
    unbatchable_outputs,
)
from batchinfer.engine.canary import canary_input, infer_canary
from batchinfer.engine.child import cpu_seconds, report_failure, send_or_exit, setup_child
from batchinfer.engine.protocol import (
    Attach,
    Done,
    Infer,
    InferResult,
    InitFailed,
    Initialised,
    Stop,
    WorkerReady,
    decode,
)
from batchinfer.engine.slots import BoardSpec, RegionSpec, SlotRegion, StatusBoard
from batchinfer.errors import BatchinferError, InferenceError
from batchinfer.runtime.adapter import CoreError, CoreReason, RuntimeAdapter
from batchinfer.runtime.backends import Backend
from batchinfer.runtime.rknn_log import quiet_instance_logs
from batchinfer.tasks import ItemDecoder, Task

# Results per message and how long one may wait for others (see _Outbox). 10 ms lets a
# refill's worth of 2 ms inferences (REFILL_AT per instance) go back in one message; at 4 ms
# most went alone at npu 2 ms (1.56 results per message), each a wake-up of the coordinator.
# The refill is never later for it: the result that starts one is sent at once.
BATCH_MAX = 16
BATCH_WAIT_S = 0.01

# Python-side reference cycles pile up in long inference loops on the real runtime
# (~42 kB per call, airockchip/rknn-toolkit2#42); a periodic collection keeps memory flat.
_GC_EVERY = 512


@dataclass(frozen=True)
class WorkerSpec:
    """What one core worker needs; picklable (it travels to the forked child)."""

    core: int
    board_row: int  # first of this worker's `instances` rows on the status board
    instances: int
    backend: Backend
    inputs: RegionSpec
    board: BoardSpec
    # RKNNLite's data_format: the one input's layout, or one per input (EnginePlan.data_format)
    input_layout: str | tuple[str, ...]
    cpus: tuple[int, ...] | None
    parent_pid: int
    refill_at: int  # the coordinator refills this worker when it holds this many (_Outbox)
    task: Task | None = None  # a task that decodes in the worker (Task.decodes_in_worker)
    geometry: RegionSpec | None = None  # each slot's letterbox geometry (letterboxing tasks)
    save_outputs: bool = False  # a task decoding here: copy the raw outputs to the slots too
    batch: int = 1  # items per runtime call (engine/batching.py); board rows: instances × batch


class _BusyClock:
    """Seconds during which at least one instance was inside inference() (a union, not a sum)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self.total = 0.0

    def enter(self, t: float) -> None:
        with self._lock:
            if self._active == 0:
                self._since = t
            self._active += 1

    @property
    def active(self) -> int:
        """Instances inside inference() now."""
        return self._active

    def leave(self, t: float) -> float:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self.total += t - self._since
            return self.total


class _Sender:
    """Writes Done messages on a thread of its own, so the instance that decided to send goes
    straight to its next inference: one thread hand-off per message, none per result.

    A thread with nothing left to infer sends itself (``direct``), when no message waits for
    the sender thread (messages keep their order): it loses no inference time by it, and an
    instance fed one item at a time (the cores wait for the readers) saves a hand-off per item.
    """

    def __init__(self, results: Connection) -> None:
        self._results = results
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # one writer of the pipe at a time
        self._queued = 0  # messages given to the sender thread and not sent yet
        self._thread = threading.Thread(target=self._loop, name="sender", daemon=True)
        self._thread.start()

    def deliver(self, batch: list[InferResult], busy_s: float, direct: bool = False) -> None:
        with self._lock:
            if direct and not self._queued:
                send_or_exit(self._results, Done(batch, busy_s, cpu_seconds()))
                return
            self._queued += 1
        self._outgoing.put((batch, busy_s))

    def close(self) -> None:
        """Return once everything delivered has been sent."""
        self._outgoing.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (item := self._outgoing.get()) is not None:
            batch, busy_s = item
            with self._lock:
                send_or_exit(self._results, Done(batch, busy_s, cpu_seconds()))
                self._queued -= 1


class _Outbox:
    """Finished results waiting to be reported to the coordinator in one message.

    The coordinator refills a worker once the items it has not heard back about are down to
    ``refill_at`` (REFILL_AT per instance: scheduler.py). So a result waits for company (one
    message then carries several) unless reporting it now is what starts a refill: the
    items this worker still has (queued or being inferred) are at most ``refill_at`` while,
    counting the waiting results, the coordinator sees more. Results also go at once when
    no item is left (the instance goes idle), when BATCH_MAX wait, or when the oldest would
    be older than BATCH_WAIT_S by the time the next inference is expected to end (judged by
    the one that just ended: with long inferences each result goes alone). That judgement
    is a guess: when the next inference runs longer, or never returns, the worker's main
    thread sends what has waited BATCH_WAIT_S (:meth:`due_in`, :meth:`send_due`), so a slow
    or hung call never holds back results that are finished.
    """

    def __init__(
        self,
        deliver: Callable[[list[InferResult], float, bool], None],
        busy: _BusyClock,
        left: Callable[[], int],
        refill_at: int,
    ) -> None:
        # (results, busy seconds so far, direct: the caller has nothing left): _Sender.deliver
        self._deliver = deliver
        self._busy = busy
        self._left = left  # items queued or being inferred, the just-finished one excluded
        self._refill_at = refill_at
        self._lock = threading.Lock()
        self._batch: list[InferResult] = []
        self._oldest = 0.0

    def add(self, result: InferResult) -> None:
        """Queue one result; send it (and those waiting) if it is time."""
        t0, t1 = result.t0, result.t1
        with self._lock:
            if not self._batch:
                self._oldest = t1
            self._batch.append(result)
            left = self._left()
            wait = (
                len(self._batch) < BATCH_MAX
                and (t1 - self._oldest) + (t1 - t0) < BATCH_WAIT_S
                and left > 0
                and not left <= self._refill_at < left + len(self._batch)
            )
            if not wait:
                self._send_locked(direct=left == 0)

    def due_in(self, now: float) -> float | None:
        """Seconds until the oldest waiting result has waited BATCH_WAIT_S; BATCH_WAIT_S when
        none waits but an item is queued or being inferred (one may come to wait); None when
        this worker has nothing."""
        with self._lock:
            if self._batch:
                return max(0.0, self._oldest + BATCH_WAIT_S - now)
        return BATCH_WAIT_S if self._left() else None

    def send_due(self, now: float) -> None:
        """Send what waits if the oldest result has waited BATCH_WAIT_S."""
        with self._lock:
            if self._batch and now - self._oldest >= BATCH_WAIT_S:
                self._send_locked()

    def send(self) -> None:
        """Send whatever waits."""
        with self._lock:
            self._send_locked()

    def _send_locked(self, direct: bool = False) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._deliver(batch, self._busy.total, direct)


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a core worker process."""
    setup_child(spec.parent_pid, spec.cpus)
    quiet_instance_logs()
    adapters: list[RuntimeAdapter] = []
    try:
        try:
            for _ in range(spec.instances):
                adapters.append(spec.backend.instance(spec.core))
        except (BatchinferError, OSError) as e:
            send_or_exit(results, InitFailed(_reason(e)))
            return
        send_or_exit(results, Initialised())
        inputs = SlotRegion.attach(spec.inputs)
        layout = inputs.spec.layout
        call_shapes = list(layout.shapes)
        if spec.batch > 1:  # a full batch of N items, each of the slot's shape
            call_shapes = batch_shapes(layout.shapes, spec.batch)
        canary = [canary_input(s, d) for s, d in zip(call_shapes, layout.dtypes, strict=True)]
        try:
            outs = infer_canary(
                lambda: adapters[0].infer(
                    canary, data_format=_data_format(spec), reuse_outputs=False
                )
            )
        except InferenceError as e:
            reason = _reason(e).after("the canary inference failed: ")
            send_or_exit(results, InitFailed(reason))
            return
        if spec.batch > 1:  # a batch-N model: its first item stands for every item
            unsplittable = unbatchable_outputs(outs, spec.batch)
            if unsplittable is not None:
                send_or_exit(results, InitFailed(CoreReason.of(unsplittable)))
                return
            outs = [o[:1] for o in outs]
        decoders: list[ItemDecoder] = []
        if spec.task is not None:
            decoders = [ItemDecoder(spec.task) for _ in adapters]
            try:  # outputs that do not fit the planned head fail here, once, not per item
                if not spec.task.plugin:  # a plug-in's decode failing is an item's error
                    decoders[0](outs, np.zeros(6))
            except Exception as e:
                shapes = ", ".join(str(list(o.shape)) for o in outs)
                send_or_exit(
                    results,
                    InitFailed(
                        CoreReason.of(f"its outputs ({shapes}) cannot be decoded as planned: {e}")
                    ),
                )
                return
        ready = WorkerReady(
            sdk_version=adapters[0].sdk_version(),
            outputs=[(tuple(o.shape), str(o.dtype)) for o in outs],
            canary=[np.asarray(o) for o in outs],
            pid=os.getpid(),
            cpu_s=cpu_seconds(),  # start-up's share, kept apart from the run's
        )
        send_or_exit(results, ready)
        try:
            msg = decode(tasks.recv())
        except (EOFError, OSError):
            return
        if not isinstance(msg, Attach):
            return
        outputs = SlotRegion.attach(msg.outputs)
        board = StatusBoard.attach(spec.board)
        geometry = SlotRegion.attach(spec.geometry) if spec.geometry is not None else None
    except BaseException as exc:
        report_failure(results, exc)
        for a in adapters:
            a.release()
        return
    # Everything alive now (modules, runtimes, segments) lives as long as the process: keep
    # it out of the periodic collections below, which then scan only what inference made.
    # A full collection here otherwise stalled the NPU every _GC_EVERY calls. (What the
    # fork server imported is frozen already, so this collection scans only the runtime.)
    gc.collect()
    gc.freeze()
    _serve(spec, adapters, inputs, outputs, board, tasks, results, decoders, geometry)
    for a in adapters:
        a.release()
    for region in (inputs, outputs, geometry):
        if region is not None:
            region.close()
    board.close()


def _data_format(spec: WorkerSpec) -> str | list[str]:
    """RKNNLite's data_format: a string for one input, a list with one per input."""
    layout = spec.input_layout
    return layout if isinstance(layout, str) else list(layout)


def _reason(e: BaseException) -> CoreReason:
    """Why the core could not start, as the coordinator compares and says it: the adapter's
    reason naming the core, or an error's message (its settings kept as references)."""
    if isinstance(e, CoreError):
        return e.reason
    return CoreReason.of(e.message if isinstance(e, BatchinferError) else str(e))


def _serve(
    spec: WorkerSpec,
    adapters: list[RuntimeAdapter],
    inputs: SlotRegion,
    outputs: SlotRegion,
    board: StatusBoard,
    tasks: Connection,
    results: Connection,
    decoders: list[ItemDecoder] | None = None,
    geometry: SlotRegion | None = None,
) -> None:
    """Feed the instance threads from the task pipe until Stop."""
    work: queue.SimpleQueue = queue.SimpleQueue()
    busy = _BusyClock()
    sender = _Sender(results)
    # Tasks decoding here: per instance, the inferred items waiting for its decoder thread.
    to_decode: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in decoders or ()]

    held = Held()  # a batch-N model's items taken and not yet handed on (batching.py)

    def left() -> int:
        inferring = held.count if spec.batch > 1 else busy.active
        return work.qsize() + inferring + sum(q.qsize() for q in to_decode)

    outbox = _Outbox(sender.deliver, busy, left, spec.refill_at)

    def decode_loop(decode: ItemDecoder, waiting: queue.SimpleQueue) -> None:
        while (item := waiting.get()) is not None:
            slot, index, instance, t0, t1, outs = item
            error = decoded = None
            try:
                decoded = decode(outs, None if geometry is None else geometry[slot][0])
            except Exception as e:
                error = f"decoding the outputs failed: {type(e).__name__}: {e}"
            outbox.add(InferResult(slot, index, instance, t0, t1, error, decoded))

    # ---- the instances' part: runtime calls (one item each, or a batch-N model's groups)
    batches = BatchWork(
        spec.batch, spec.core, spec.board_row, work, inputs, outputs, board, busy, outbox.add, held
    )

    def instance_loop(instance: int, adapter: RuntimeAdapter) -> None:
        row = spec.board_row + instance
        calls = 0
        decoding = to_decode[instance] if to_decode else None
        copy_outputs = decoding is None or spec.save_outputs
        data_format = _data_format(spec)
        if spec.batch > 1:
            batched_loop(batches, instance, adapter, data_format, decoding, copy_outputs, _GC_EVERY)
            return
        while (task := work.get()) is not None:
            slot, index = task
            adapter.set_current_item(index)
            t0 = time.monotonic()
            board.start(row, index, t0)
            busy.enter(t0)
            error = None
            try:
                outs = adapter.infer(
                    inputs[slot],
                    data_format=data_format,
                    # The decoder reads the outputs while the next inference runs: those
                    # must not be the runtime's buffers, which that inference writes.
                    reuse_outputs=decoding is None,
                )
                if copy_outputs:
                    # The one copy of each output: from the runtime's staging buffer into
                    # the slot.
                    for dst, src in zip(outputs[slot], outs, strict=True):
                        np.copyto(dst, src.reshape(dst.shape), casting="same_kind")
            except Exception as e:  # report, never vanish: the coordinator decides what follows
                error = adapter.row_error(e)  # a None: with the runtime's own E line
            t1 = time.monotonic()
            board.finish(row)
            busy.leave(t1)
            if decoding is not None and error is None:
                decoding.put((slot, index, instance, t0, t1, outs))
            else:
                outbox.add(InferResult(slot, index, instance, t0, t1, error, None))
            calls += 1
            if calls % _GC_EVERY == 0:
                gc.collect()

    decoder_threads = [
        threading.Thread(target=decode_loop, args=(d, q), name=f"core{spec.core}-d{i}", daemon=True)
        for i, (d, q) in enumerate(zip(decoders or (), to_decode, strict=True))
    ]
    threads = [
        threading.Thread(
            target=instance_loop, args=(i, a), name=f"core{spec.core}-i{i}", daemon=True
        )
        for i, a in enumerate(adapters)
    ]
    for t in [*decoder_threads, *threads]:
        t.start()
    # Connection.poll() builds a selector on every call (tens of µs, and this loop polls
    # every BATCH_WAIT_S while it holds items): a poll object made once costs one system call.
    readable = select.poll()
    readable.register(tasks.fileno(), select.POLLIN)
    while True:
        try:
            # While this worker holds items, look at the outbox at least every BATCH_WAIT_S:
            # a result waiting for company must not wait for an inference that hangs.
            wait = outbox.due_in(time.monotonic())
            if wait is not None and not readable.poll(wait * 1e3):
                outbox.send_due(time.monotonic())
                continue
            msg = decode(tasks.recv())
        except (EOFError, OSError):
            os._exit(0)  # the coordinator is gone: nobody will read our results
        if isinstance(msg, Infer):
            for task in msg.tasks:
                work.put(task)
        elif isinstance(msg, Stop):
            break
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    for q in to_decode:  # after the instances: nothing more comes to decode
        q.put(None)
    for t in decoder_threads:
        t.join()
    outbox.send()  # normally nothing waits: an instance with nothing left sends at once
    sender.close()
