"""Core workers: one process per NPU core, ``instances`` runtime threads pinned to that core.

Protocol (the types: protocol.py; slot life cycle: NOTE in slots.py; the coordinator's
side: engine/board/pool.py):
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
Serving (engine/board/core_worker.py: CoreWorker): each instance thread takes the next item from
one queue (the main thread fills it from the task pipe); results leave in batches (Outbox
decides when, a sender thread writes the message, or the thread that finished them when it
has nothing left to infer): one thread hand-off per item (the queue) and at most one per
message. The main thread also sends results that have waited BATCH_WAIT_S, so a hung call
holds back none. While an instance infers, its row on the status board holds (index, start
time). Runtimes are created here, after the fork (the fork server never imports a runtime:
engine/plumbing/fork_server.py); the worker exits with the coordinator.
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
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from batchinfer.engine.batching import batch_shapes, unbatchable_outputs
from batchinfer.engine.board.core_worker import CoreSlots, CoreWorker, Sender, Serving
from batchinfer.engine.canary import canary_input, infer_canary
from batchinfer.engine.plumbing.child import cpu_seconds, report_failure, send_or_exit, setup_child
from batchinfer.engine.protocol import Attach, InitFailed, Initialised, WorkerReady, decode
from batchinfer.engine.slots import BoardSpec, RegionSpec, SlotRegion, StatusBoard, TensorLayout
from batchinfer.errors import BatchinferError, InferenceError
from batchinfer.runtime.adapter import CoreError, CoreReason, RuntimeAdapter
from batchinfer.runtime.backends import Backend
from batchinfer.runtime.rknn_log import quiet_instance_logs
from batchinfer.tasks import ItemDecoder, Task


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


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a core worker process: start (the messages up to Attach), serve, end."""
    setup_child(spec.parent_pid, spec.cpus)
    quiet_instance_logs()
    adapters: list[RuntimeAdapter] = []
    try:
        started = _start(spec, adapters, tasks, results)
    except BaseException as exc:
        report_failure(results, exc)
        for a in adapters:
            a.release()
        return
    if started is None:  # InitFailed said why, or the coordinator is gone
        return
    slots, decoders = started
    # Everything alive now (modules, runtimes, segments) lives as long as the process: keep
    # it out of the periodic collections below, which then scan only what inference made.
    # A full collection here otherwise stalled the NPU every GC_EVERY calls. (What the
    # fork server imported is frozen already, so this collection scans only the runtime.)
    gc.collect()
    gc.freeze()
    sender = Sender(results)
    serving = Serving(
        spec.core,
        spec.board_row,
        spec.refill_at,
        _data_format(spec),
        spec.batch,
        spec.save_outputs,
    )
    CoreWorker(adapters, slots, sender.deliver, serving, decoders).serve(tasks)
    sender.close()
    for a in adapters:
        a.release()
    slots.close()


def _start(
    spec: WorkerSpec, adapters: list[RuntimeAdapter], tasks: Connection, results: Connection
) -> tuple[CoreSlots, list[ItemDecoder]] | None:
    """Make the instances (into ``adapters``), infer the canary, say WorkerReady and take
    Attach: the worker's slots and decoders; None after an InitFailed, or when the
    coordinator is gone before Attach."""
    reason = _make_instances(spec, adapters)
    if reason is not None:
        send_or_exit(results, InitFailed(reason))
        return None
    send_or_exit(results, Initialised())
    inputs = SlotRegion.attach(spec.inputs)
    outs, reason = _canary(spec, adapters[0], inputs.spec.layout)
    decoders: list[ItemDecoder] = []
    if reason is None:
        decoders, reason = _decoders(spec, len(adapters), outs)
    if reason is not None:
        send_or_exit(results, InitFailed(reason))
        return None
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
        return None
    if not isinstance(msg, Attach):
        return None
    outputs = SlotRegion.attach(msg.outputs)
    board = StatusBoard.attach(spec.board)
    geometry = SlotRegion.attach(spec.geometry) if spec.geometry is not None else None
    return CoreSlots(inputs, outputs, board, geometry), decoders


def _make_instances(spec: WorkerSpec, adapters: list[RuntimeAdapter]) -> CoreReason | None:
    """Append ``spec.instances`` runtimes on the worker's core; why not, if one fails."""
    try:
        for _ in range(spec.instances):
            adapters.append(spec.backend.instance(spec.core))
    except (BatchinferError, OSError) as e:
        return _reason(e)
    return None


def _canary(
    spec: WorkerSpec, adapter: RuntimeAdapter, layout: TensorLayout
) -> tuple[list[np.ndarray], CoreReason | None]:
    """The canary's outputs (a batch-N model's: its first item's), or why the core fails."""
    call_shapes = list(layout.shapes)
    if spec.batch > 1:  # a full batch of N items, each of the slot's shape
        call_shapes = batch_shapes(layout.shapes, spec.batch)
    canary = [canary_input(s, d) for s, d in zip(call_shapes, layout.dtypes, strict=True)]
    try:
        outs = infer_canary(
            lambda: adapter.infer(canary, data_format=_data_format(spec), reuse_outputs=False)
        )
    except InferenceError as e:
        return [], _reason(e).after("the canary inference failed: ")
    if spec.batch > 1:  # a batch-N model: its first item stands for every item
        unsplittable = unbatchable_outputs(outs, spec.batch)
        if unsplittable is not None:
            return [], CoreReason.of(unsplittable)
        outs = [o[:1] for o in outs]
    return outs, None


def _decoders(
    spec: WorkerSpec, instances: int, outs: list[np.ndarray]
) -> tuple[list[ItemDecoder], CoreReason | None]:
    """One decoder per instance for a task that decodes here (none otherwise), or why the
    canary's outputs cannot be decoded: outputs that do not fit the planned head fail
    here, once, not per item (a plug-in's decode failing is an item's error)."""
    if spec.task is None:
        return [], None
    decoders = [ItemDecoder(spec.task) for _ in range(instances)]
    try:
        if not spec.task.plugin:
            decoders[0](outs, np.zeros(6))
    except Exception as e:
        shapes = ", ".join(str(list(o.shape)) for o in outs)
        return [], CoreReason.of(f"its outputs ({shapes}) cannot be decoded as planned: {e}")
    return decoders, None


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
