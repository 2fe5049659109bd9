"""Throughput benchmarking: a figure you can trust (or every reason why not), per core, with
board conditions and a diagnosis of what limits it; sweeps and comparisons.

    from batchinfer.bench import BenchConfig, bench
    result = bench(BenchConfig(model="m.rknn"))
    result.valid, result.verdict.reasons, result.figures.samples_per_s, result.diagnosis.bound

Built on the engine's parts: a synthetic source (or a dataset read again and again), a
null sink and a measuring observer (:mod:`batchinfer.bench.measure`). The rules live in
pure modules: :mod:`~batchinfer.bench.verdict`, :mod:`~batchinfer.bench.diagnosis`,
:mod:`~batchinfer.bench.sweep` (the recommendation), :mod:`~batchinfer.bench.compare`.
"""

from __future__ import annotations

from batchinfer.lazy_exports import exports

_WHERE = {
    "BenchConfig": "batchinfer.bench.runner",
    "BenchOptions": "batchinfer.bench.options",
    "BenchResult": "batchinfer.bench.result",
    "Comparison": "batchinfer.bench.compare",
    "SweepResult": "batchinfer.bench.sweep",
    "bench": "batchinfer.bench.runner",
    "compare": "batchinfer.bench.compare",
    "prepare": "batchinfer.bench.runner",
    "read_json": "batchinfer.bench.result",
    "run_bench": "batchinfer.bench.runner",
    "run_sweep": "batchinfer.bench.sweep",
    "write_json": "batchinfer.bench.result",
}
# Imported on first use, so the CLI (and `batchinfer --help`) stays quick to start.
__all__, __getattr__ = exports(_WHERE)
