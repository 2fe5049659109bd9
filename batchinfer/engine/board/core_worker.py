"""The core worker's serving part: its runtime instances' threads, fed from the task pipe
until Stop (the messages: engine/board/worker.py, which starts the worker and then hands over to
:class:`CoreWorker`).

Threads of one core worker process:
- the main thread (:meth:`CoreWorker.serve`): reads Infer messages into one queue of
  items, and sends what has waited BATCH_WAIT_S in the outbox (a hung call holds back no
  finished result);
- one instance thread per runtime instance (:meth:`CoreWorker.instance_loop`): takes the
  next item, infers it, puts the result in the outbox (or, for a task that decodes in the
  worker, the outputs in its decoder's queue); a batch-N model's instances run
  engine/batching.py's loop instead;
- one decoder thread per instance, for a task that decodes in the worker
  (:meth:`CoreWorker.decode_loop`): decodes and puts the result in the outbox;
- the sender thread (:class:`Sender`): writes the Done messages the outbox decides on.

What a failed call's row says comes from the runtime's adapter (RuntimeAdapter.row_error:
for a None, "inference() returned None" and the runtime's own last E line).
"""

from __future__ import annotations

import gc
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from batchinfer.engine.batching import BatchWork, Held, batched_loop
from batchinfer.engine.plumbing.child import cpu_seconds, send_or_exit
from batchinfer.engine.protocol import Done, Infer, InferResult, InferTask, Stop, decode
from batchinfer.engine.slots import SlotRegion, StatusBoard
from batchinfer.runtime.adapter import RuntimeAdapter
from batchinfer.tasks import ItemDecoder

# Results per message and how long one may wait for others (see Outbox). 10 ms lets a
# refill's worth of 2 ms inferences (REFILL_AT per instance) go back in one message; at 4 ms
# most went alone at npu 2 ms (1.56 results per message), each a wake-up of the coordinator.
# The refill is never later for it: the result that starts one is sent at once.
BATCH_MAX = 16
BATCH_WAIT_S = 0.01

# Python-side reference cycles pile up in long inference loops on the real runtime
# (~42 kB per call, airockchip/rknn-toolkit2#42); a periodic collection keeps memory flat.
GC_EVERY = 512

#: Sends a message's results: (results, busy seconds so far, direct: the caller has
#: nothing left to infer): Sender.deliver.
Deliver = Callable[[list[InferResult], float, bool], None]


class BusyClock:
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


class Sender:
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


class Outbox:
    """Finished results waiting to be reported to the coordinator in one message.

    The coordinator refills a worker once the items it has not heard back about are down to
    ``refill_at`` (REFILL_AT per instance: queue_depth.py). So a result waits for company (one
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
        deliver: Deliver,
        busy: BusyClock,
        left: Callable[[], int],
        refill_at: int,
    ) -> None:
        # (results, busy seconds so far, direct: the caller has nothing left): Sender.deliver
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


@dataclass(frozen=True)
class CoreSlots:
    """The shared memory a core worker serves from."""

    inputs: SlotRegion  # slot -> one array per model input
    outputs: SlotRegion  # slot -> one array per model output
    board: StatusBoard  # the worker's rows: (index, start) while an instance infers
    geometry: SlotRegion | None = None  # slot -> (letterbox geometry,): letterboxing tasks

    def close(self) -> None:
        for region in (self.inputs, self.outputs, self.geometry):
            if region is not None:
                region.close()
        self.board.close()


@dataclass(frozen=True)
class Serving:
    """How a core worker serves its items (worker.py makes it from the WorkerSpec)."""

    core: int
    board_row: int  # first of this worker's status-board rows (instances × batch)
    refill_at: int  # the coordinator refills this worker when it holds this many (Outbox)
    data_format: str | list[str]  # RKNNLite's data_format (worker.py: _data_format)
    batch: int = 1  # items per runtime call (engine/batching.py)
    save_outputs: bool = False  # a task decoding here: copy the outputs to the slots too


# An item whose outputs wait for its instance's decoder: (slot, index, instance, t0, t1,
# outputs: fresh arrays, not the runtime's reused buffers).
_Inferred = tuple[int, int, int, float, float, list[np.ndarray]]


class CoreWorker:
    """One core worker's runtime instances serving the items it is given (the module's
    threads); the outputs go to the slots, the results to ``deliver`` in Done-sized batches.

    Its loops are methods, each testable alone with fake adapters and regions:
    :meth:`instance_loop` and :meth:`decode_loop` end at the None their queue is given
    (:attr:`work`, :attr:`to_decode`), :meth:`serve` runs them all from a task pipe.
    """

    def __init__(
        self,
        adapters: Sequence[RuntimeAdapter],
        slots: CoreSlots,
        deliver: Deliver,
        serving: Serving,
        decoders: Sequence[ItemDecoder] = (),  # one per instance: a task decoding here
    ) -> None:
        self.adapters = list(adapters)
        self.slots = slots
        self.serving = serving
        self.decoders = list(decoders)
        self.work: queue.SimpleQueue[InferTask | None] = queue.SimpleQueue()
        # Per instance, the inferred items waiting for its decoder thread.
        self.to_decode: list[queue.SimpleQueue[_Inferred | None]] = [
            queue.SimpleQueue() for _ in self.decoders
        ]
        self.busy = BusyClock()
        self.held = Held()  # a batch-N model's items taken and not yet handed on
        self.outbox = Outbox(deliver, self.busy, self.left, serving.refill_at)
        self.clock = time.monotonic  # the instances' clock, read around each call
        self._batches = BatchWork(
            serving.batch,
            serving.core,
            serving.board_row,
            self.work,
            slots.inputs,
            slots.outputs,
            slots.board,
            self.busy,
            self.outbox.add,
            self.held,
        )

    def left(self) -> int:
        """Items queued, being inferred or waiting to be decoded (the outbox's refill rule)."""
        inferring = self.held.count if self.serving.batch > 1 else self.busy.active
        return self.work.qsize() + inferring + sum(q.qsize() for q in self.to_decode)

    def instance_loop(self, instance: int) -> None:
        """Infer queued items on instance ``instance`` until the stop sentinel."""
        adapter = self.adapters[instance]
        decoding = self.to_decode[instance] if self.to_decode else None
        serving = self.serving
        copy_outputs = decoding is None or serving.save_outputs
        data_format = serving.data_format
        if serving.batch > 1:
            batched_loop(
                self._batches, instance, adapter, data_format, decoding, copy_outputs, GC_EVERY
            )
            return
        # Locals: this loop runs once per item.
        row, work, busy, clock = serving.board_row + instance, self.work, self.busy, self.clock
        inputs, outputs, board, report = (
            self.slots.inputs,
            self.slots.outputs,
            self.slots.board,
            self.outbox.add,
        )
        # The decoder reads the outputs while the next inference runs: those must not be
        # the runtime's buffers, which that inference writes.
        reuse = decoding is None
        calls = 0
        while (task := work.get()) is not None:
            slot, index = task
            adapter.set_current_item(index)
            t0 = clock()
            board.start(row, index, t0)
            busy.enter(t0)
            error = None
            try:
                outs = adapter.infer(inputs[slot], data_format=data_format, reuse_outputs=reuse)
                if copy_outputs:
                    # The one copy of each output: from the runtime's staging buffer into
                    # the slot.
                    for dst, src in zip(outputs[slot], outs, strict=True):
                        np.copyto(dst, src.reshape(dst.shape), casting="same_kind")
            except Exception as e:  # report, never vanish: the coordinator decides what follows
                error = adapter.row_error(e)  # a None: with the runtime's own E line
            t1 = clock()
            board.finish(row)
            busy.leave(t1)
            if decoding is not None and error is None:
                decoding.put((slot, index, instance, t0, t1, outs))
            else:
                report(InferResult(slot, index, instance, t0, t1, error, None))
            calls += 1
            if calls % GC_EVERY == 0:
                gc.collect()

    def decode_loop(self, instance: int) -> None:
        """Decode instance ``instance``'s inferred items until the stop sentinel; a decode
        that raises makes its item an error row."""
        decode_item, waiting = self.decoders[instance], self.to_decode[instance]
        geometry, report = self.slots.geometry, self.outbox.add
        while (item := waiting.get()) is not None:
            slot, index, inst, t0, t1, outs = item
            error = decoded = None
            try:
                decoded = decode_item(outs, None if geometry is None else geometry[slot][0])
            except Exception as e:
                error = f"decoding the outputs failed: {type(e).__name__}: {e}"
            report(InferResult(slot, index, inst, t0, t1, error, decoded))

    def serve(self, tasks: Connection) -> None:
        """Run the threads, feeding them from ``tasks`` until Stop; return once every item
        given is inferred (and decoded) and its result delivered."""
        name = f"core{self.serving.core}"
        decoders = [
            threading.Thread(target=self.decode_loop, args=(i,), name=f"{name}-d{i}", daemon=True)
            for i in range(len(self.decoders))
        ]
        instances = [
            threading.Thread(target=self.instance_loop, args=(i,), name=f"{name}-i{i}", daemon=True)
            for i in range(len(self.adapters))
        ]
        for t in [*decoders, *instances]:
            t.start()
        self._feed(tasks)
        for _ in instances:
            self.work.put(None)
        for t in instances:
            t.join()
        for q in self.to_decode:  # after the instances: nothing more comes to decode
            q.put(None)
        for t in decoders:
            t.join()
        self.outbox.send()  # normally nothing waits: an instance with nothing left sends at once

    def _feed(self, tasks: Connection) -> None:
        """Queue each Infer's items until Stop; exit the process if the coordinator is gone."""
        outbox, work = self.outbox, self.work
        # Connection.poll() builds a selector on every call (tens of µs, and this loop polls
        # every BATCH_WAIT_S while it holds items): a poll object made once costs one system
        # call.
        readable = select.poll()
        readable.register(tasks.fileno(), select.POLLIN)
        while True:
            try:
                # While this worker holds items, look at the outbox at least every
                # BATCH_WAIT_S: a result waiting for company must not wait for an inference
                # that hangs.
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
                return
