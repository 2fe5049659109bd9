"""Reader processes: decode and preprocess dataset items straight into input slots.

Protocol (see NOTE in slots.py for the slot life cycle):
  coordinator -> reader: ("read", slot, index, path) | ("stop",)
  reader -> coordinator: ("loaded", slot, index, read_ms, error or None)
A reader exits on "stop" or when its pipe from the coordinator closes (the coordinator died).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from batchinfer.data.preprocess import Preprocess, load_into
from batchinfer.engine.affinity import pin_current_process
from batchinfer.engine.slots import RingSpec, SlotRing
from batchinfer.errors import InputError

_READER_NICENESS = 10


@dataclass(frozen=True)
class ReaderSpec:
    """What one reader process needs; picklable for the spawn start method."""

    reader_id: int
    ring: RingSpec
    preprocess: Preprocess
    kind: str
    cpus: tuple[int, ...] | None


def reader_main(spec: ReaderSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a reader process."""
    # Ctrl-C goes to the whole process group; only the coordinator decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pin_current_process(spec.cpus)
    # Readers are buffered by the slots; core workers are not (an idle NPU is lost time).
    # A lower priority lets a worker whose inference just ended take a CPU at once.
    with contextlib.suppress(OSError):
        os.nice(_READER_NICENESS)
    ring = SlotRing.attach(spec.ring)
    try:
        while True:
            try:
                msg = tasks.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "stop":
                return
            _, slot, index, path = msg
            t0 = time.perf_counter()
            error = None
            try:
                load_into(path, spec.preprocess, ring.inputs(slot)[0], spec.kind)
            except InputError as e:
                error = str(e)
            except Exception as e:  # a decoder bug must not kill the run: it is this item's error
                error = f"cannot read {path}: {type(e).__name__}: {e}"
            results.send(("loaded", slot, index, (time.perf_counter() - t0) * 1e3, error))
    finally:
        ring.close()
