"""The engine: readers, core workers and shared-memory slots, fed by a source, into a sink.

``run`` is the main job (a dataset folder into a run folder); :class:`Engine` is the part
``bench`` and ``eval`` compose with other sources, sinks and observers.

Names are imported on first use: a reader or core worker process imports
``batchinfer.engine.reader`` or ``.worker``, and must not pay for the coordinator's modules
(pyarrow among them) at start-up.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Engine": "batchinfer.engine.loop",
    "EnginePlan": "batchinfer.engine.interface",
    "EngineResult": "batchinfer.engine.interface",
    "RunConfig": "batchinfer.engine.config",
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
