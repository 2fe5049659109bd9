"""The engine: readers, core workers and shared-memory slots, fed by a source, into a sink.

Where to start reading:
- ``run`` (runner.py) is the main job: a dataset folder into a run folder (planning in
  plan.py, the output folder's life in batchinfer.sink);
- :class:`Engine` (loop.py) is the one loop every front end runs (``run``, ``bench``,
  ``eval``, the library's ``infer``, a Ray cluster): source in, rows out, through a worker
  pool, the interface in pools.py: this board's processes (board.py; children.py starts
  and watches them, worker.py and reader.py are what runs in them, protocol.py their
  messages, slots.py the shared memory) or a cluster's Ray actors (batchinfer.cluster);
- the policy the loop applies: scheduler.py (slots, retries, error rows), collector.py
  (rows and statistics), canary.py; EnginePlan and EngineResult are in interface.py.

Names are imported on first use: a reader or core worker process imports
``batchinfer.engine.reader`` or ``.worker``, and must not pay for the coordinator's modules
(pyarrow among them) at start-up.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Engine": "batchinfer.engine.loop",
    "EnginePlan": "batchinfer.engine.planning.interface",
    "EngineResult": "batchinfer.engine.planning.interface",
    "RunConfig": "batchinfer.engine.planning.config",
    "RunResult": "batchinfer.engine.runner",
    "run": "batchinfer.engine.runner",
    "OutputOptions": "batchinfer.options",
    "PreprocessOptions": "batchinfer.options",
    "ReliabilityOptions": "batchinfer.options",
    "RuntimeOptions": "batchinfer.options",
    "SimOptions": "batchinfer.options",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
