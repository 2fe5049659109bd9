"""Output writers: rows, prediction parts, the run folder, stats, manifest, resume state.

:class:`OutputFolder` (output_folder.py) owns a run's OUT from planning to its last write.

docs/reference/output.md describes the folder layout. Everything here writes atomically (tmp file,
fsync, rename), inside folders held open (folder_handle.py: a run's OUT and predictions/,
opened once), and raises OutputWriteError when the disk refuses; a value Parquet cannot
hold costs its row, not the part (storable.py). Names are imported on first use, so a
module that needs one writer does not import them all.
"""

from __future__ import annotations

from batchinfer.lazy_exports import exports

_WHERE = {
    "RunManifest": "batchinfer.sink.manifest",
    "model_sha256": "batchinfer.sink.manifest",
    "read_manifest": "batchinfer.sink.manifest",
    "write_manifest": "batchinfer.sink.manifest",
    "PredictionWriter": "batchinfer.sink.predictions",
    "prediction_schema": "batchinfer.sink.predictions",
    "top_k": "batchinfer.sink.predictions",
    "OutputFolder": "batchinfer.sink.output_folder",
    "ResumeState": "batchinfer.sink.resume",
    "prepare_resume": "batchinfer.sink.resume",
    "CoreStatsRecorder": "batchinfer.sink.stats",
    "LatencyHistogram": "batchinfer.sink.stats",
    "write_core_stats": "batchinfer.sink.stats",
    "write_timeline": "batchinfer.sink.stats",
    "Row": "batchinfer.sink.rows",
    "MemorySink": "batchinfer.sink.rows",
    "NullSink": "batchinfer.sink.rows",
}

__all__, __getattr__ = exports(_WHERE)
