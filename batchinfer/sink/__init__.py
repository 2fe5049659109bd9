"""Output writers: prediction parts, core stats, timeline, manifest, and --resume state.

See design.md "Output" for the folder layout. Everything here writes atomically
(tmp file, fsync, rename) and raises OutputWriteError when the disk refuses.
"""

from __future__ import annotations

from batchinfer.sink.manifest import RunManifest, model_sha256, read_manifest, write_manifest
from batchinfer.sink.predictions import PredictionWriter, prediction_schema, top_k
from batchinfer.sink.resume import ResumeState, prepare_resume
from batchinfer.sink.stats import (
    CoreStatsRecorder,
    LatencyHistogram,
    write_core_stats,
    write_timeline,
)

__all__ = [
    "CoreStatsRecorder",
    "LatencyHistogram",
    "PredictionWriter",
    "ResumeState",
    "RunManifest",
    "model_sha256",
    "prediction_schema",
    "prepare_resume",
    "read_manifest",
    "top_k",
    "write_core_stats",
    "write_manifest",
    "write_timeline",
]
