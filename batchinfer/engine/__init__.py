"""The engine: readers, core workers and shared-memory slots, fed by a source, into a sink.

``run`` is the main job (a dataset folder into a run folder); :class:`Engine` is the part
``bench`` and ``eval`` compose with other sources, sinks and observers.
"""

from batchinfer.engine.config import RunConfig
from batchinfer.engine.interface import EnginePlan, EngineResult
from batchinfer.engine.loop import Engine
from batchinfer.engine.run import RunResult, run
from batchinfer.options import (
    OutputOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    SimOptions,
)

__all__ = [
    "Engine",
    "EnginePlan",
    "EngineResult",
    "OutputOptions",
    "PreprocessOptions",
    "ReliabilityOptions",
    "RunConfig",
    "RunResult",
    "RuntimeOptions",
    "SimOptions",
    "run",
]
