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

_WHERE = {
    "BenchConfig": "runner",
    "BenchOptions": "options",
    "BenchResult": "result",
    "Comparison": "compare",
    "SweepResult": "sweep",
    "bench": "runner",
    "compare": "compare",
    "prepare": "runner",
    "read_json": "result",
    "run_bench": "runner",
    "run_sweep": "sweep",
    "write_json": "result",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    # Imported on first use, so the CLI (and `batchinfer --help`) stays quick to start.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"batchinfer.bench.{_WHERE[name]}"), name)
    raise AttributeError(name)
