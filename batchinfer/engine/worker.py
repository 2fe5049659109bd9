"""Core workers: one process per NPU core, ``instances`` runtime threads pinned to that core.

Protocol (slot life cycle: see NOTE in slots.py):
  worker -> coordinator  ("init_failed", core, message)      a runtime could not start; then exit
                         ("initialised", core)               runtimes up; the canary runs next
                         ("ready", core, info)               canary done; info has the sdk
                                                             version, output shapes, canary outputs
  coordinator -> worker  ("attach", RingSpec)                once, before any task
                         ("infer", slot, index)              input is in slot's input region
                         ("stop",)                           finish queued work, release, exit
  worker -> coordinator  ("done", slot, index, instance, t_start, t_end, error, busy_s)
                         error None: outputs are in the slot's output region; else one sentence.
                         busy_s: cumulative seconds during which some instance was in inference().
The worker exits at once when its pipe from the coordinator closes (the coordinator died), so it
never outlives it. Runtimes are created here, in the spawned process (never forked).
"""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from batchinfer.engine.affinity import pin_current_process
from batchinfer.engine.slots import SlotRing
from batchinfer.errors import BatchinferError, InferenceError
from batchinfer.runtime import runtime_class
from batchinfer.runtime.adapter import RuntimeAdapter
from batchinfer.runtime.constants import core_mask

# Python-side reference cycles pile up in long inference loops on the real runtime
# (~42 kB per call, airockchip/rknn-toolkit2#42); a periodic collection keeps memory flat.
_GC_EVERY = 512


@dataclass(frozen=True)
class WorkerSpec:
    """What one core worker needs; picklable for the spawn start method."""

    core: int
    board_row: int  # first of this worker's `instances` rows on the status board
    instances: int
    backend: str
    model: str
    input_shape: tuple[int, ...]
    input_dtype: str
    input_layout: str
    sim: dict = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None


def canary_input(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The fixed input every core infers before the run, so cores can be compared."""
    rng = np.random.default_rng(20240229)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    lo, hi = (0, 2) if info is None else (max(info.min, 0), min(info.max, 255) + 1)
    return rng.integers(lo, hi, size=shape).astype(dtype)


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

    def leave(self, t: float) -> float:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self.total += t - self._since
            return self.total


def _start_runtimes(spec: WorkerSpec) -> list[RuntimeAdapter]:
    cls = runtime_class(spec.backend)
    adapters = []
    for _ in range(spec.instances):
        rknn = cls(**spec.sim) if spec.backend == "sim" else cls()
        adapter = RuntimeAdapter(rknn, core=spec.core, model=Path(spec.model))
        adapters.append(adapter)
        adapter.load()
        adapter.init(core_mask(spec.core))
    return adapters


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a core worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pin_current_process(spec.cpus)
    adapters: list[RuntimeAdapter] = []
    try:
        adapters = _start_runtimes(spec)
        # From here on the coordinator bounds us by --timeout-s, as for any inference.
        results.send(("initialised", spec.core))
        canary = canary_input(spec.input_shape, spec.input_dtype)
        outs = adapters[0].infer([canary], data_format=spec.input_layout, reuse_outputs=False)
    except (BatchinferError, OSError) as e:
        results.send(("init_failed", spec.core, str(e)))
        for a in adapters:
            a.release()
        return
    results.send(
        (
            "ready",
            spec.core,
            {
                "sdk_version": adapters[0].sdk_version(),
                "outputs": [(tuple(o.shape), str(o.dtype)) for o in outs],
                "canary": [np.asarray(o) for o in outs],
                "pid": os.getpid(),
            },
        )
    )
    try:
        msg = tasks.recv()
    except (EOFError, OSError):
        os._exit(0)
    if msg[0] != "attach":
        return
    ring = SlotRing.attach(msg[1])
    # Everything alive now (modules, runtimes, the ring) lives as long as the process: keep
    # it out of the periodic collections below, which then scan only what inference made.
    # A full collection here otherwise took 35-45 ms, an NPU stall every _GC_EVERY calls.
    gc.collect()
    gc.freeze()
    _serve(spec, adapters, ring, tasks, results)
    for a in adapters:
        a.release()
    ring.close()


def _serve(
    spec: WorkerSpec,
    adapters: list[RuntimeAdapter],
    ring: SlotRing,
    tasks: Connection,
    results: Connection,
) -> None:
    """Feed the instance threads from the task pipe until "stop"."""
    work: queue.SimpleQueue = queue.SimpleQueue()
    # Results leave through one sender thread, so an instance goes straight from one
    # inference to the next instead of paying for pickling and a pipe write in between.
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    busy = _BusyClock()

    def sender_loop() -> None:
        while (msg := outbox.get()) is not None:
            try:
                results.send(msg)
            except OSError:
                os._exit(0)  # the coordinator is gone

    def instance_loop(instance: int, adapter: RuntimeAdapter) -> None:
        row = spec.board_row + instance
        board = ring.board
        calls = 0
        while (task := work.get()) is not None:
            slot, index = task
            adapter.set_current_item(index)
            board[row, 0] = index
            t0 = time.monotonic()
            board[row, 1] = t0
            busy.enter(t0)
            error = None
            try:
                outs = adapter.infer(
                    ring.inputs(slot), data_format=spec.input_layout, reuse_outputs=True
                )
                # The one copy of each output: from the runtime's staging buffer into the slot.
                for dst, src in zip(ring.outputs(slot), outs, strict=True):
                    np.copyto(dst, src.reshape(dst.shape), casting="same_kind")
            except InferenceError:
                # The runtime logged why (its E RKNN line); the row says what and where.
                error = "inference() returned None"
            except Exception as e:  # report, never vanish: the coordinator decides what follows
                error = f"inference failed on core {spec.core}: {type(e).__name__}: {e}"
            t1 = time.monotonic()
            board[row, 1] = 0.0
            busy_s = busy.leave(t1)
            outbox.put(("done", slot, index, instance, t0, t1, error, busy_s))
            calls += 1
            if calls % _GC_EVERY == 0:
                gc.collect()

    threads = [
        threading.Thread(
            target=instance_loop, args=(i, a), name=f"core{spec.core}-i{i}", daemon=True
        )
        for i, a in enumerate(adapters)
    ]
    sender = threading.Thread(target=sender_loop, name=f"core{spec.core}-sender", daemon=True)
    sender.start()
    for t in threads:
        t.start()
    while True:
        try:
            msg = tasks.recv()
        except (EOFError, OSError):
            os._exit(0)  # the coordinator is gone: nobody will read our results
        if msg[0] == "infer":
            work.put((msg[1], msg[2]))
        elif msg[0] == "stop":
            break
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    outbox.put(None)
    sender.join()
    with contextlib.suppress(Exception):
        gc.collect()
