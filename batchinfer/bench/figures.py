"""The figures of one measured interval: throughput in total, per core and per window,
latency percentiles, utilisation and (under the emulator) NPU load. Pure functions."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from batchinfer.bench.windows import (
    Samples,
    latency_summary,
    percentile,
    summed_seconds,
    union_seconds,
    window_counts,
)


@dataclass(frozen=True)
class CoreFigures:
    core: int
    samples: int
    samples_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    utilization: float  # some instance of the core was inside inference()
    instances_busy: float  # mean share of the time each instance was inside inference()
    npu_load: float | None = None

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "utilization": round(self.utilization, 4),
            "instances_busy": round(self.instances_busy, 4),
            "npu_load": None if self.npu_load is None else round(self.npu_load, 4),
        }


@dataclass(frozen=True)
class Window:
    index: int
    start_s: float  # from the start of the measurement
    samples: int
    samples_per_s: float
    per_core: dict[int, float]  # samples/s

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "start_s": self.start_s,
            "samples": self.samples,
            "samples_per_s": self.samples_per_s,
            "cores": {str(c): r for c, r in sorted(self.per_core.items())},
        }


@dataclass(frozen=True)
class Figures:
    measured_s: float
    samples: int
    samples_per_s: float
    latency_ms: dict[str, float | None]
    cores: list[CoreFigures]
    windows: list[Window]
    wait_p50_ms: float | None
    read_p50_ms: float | None

    @property
    def rates(self) -> list[float]:
        return [w.samples_per_s for w in self.windows]


def _nan_p50(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return percentile(values, 50)


def figures(
    samples: Samples,
    t_start: float,
    t_end: float,
    window_s: float,
    cores: tuple[int, ...],
    instances_per_core: int,
    npu_ms: float | None = None,
) -> Figures:
    """Figures of ``[t_start, t_end)``; ``npu_ms``: the emulator's NPU time per call, which
    gives each core's NPU load as calls × npu_ms over the interval."""
    seconds = max(0.0, t_end - t_start)
    measured = samples.between(t_start, t_end)
    n_windows = round(seconds / window_s) if window_s > 0 else 0
    total = window_counts(measured.t_done, t_start, n_windows, window_s)
    per_core_counts = {
        c: window_counts(measured.t_done[measured.core == c], t_start, n_windows, window_s)
        for c in cores
    }
    windows = [
        Window(
            i,
            round(i * window_s, 6),
            int(total[i]),
            float(total[i]) / window_s,
            {c: float(per_core_counts[c][i]) / window_s for c in cores},
        )
        for i in range(n_windows)
    ]
    begin, end = samples.t_begin, samples.t_done
    core_figures = []
    for c in cores:
        mine = measured.core == c
        lat = measured.latency_ms[mine]
        on_core = samples.core == c
        busy = union_seconds(begin[on_core], end[on_core], t_start, t_end)
        summed = summed_seconds(begin[on_core], end[on_core], t_start, t_end)
        npu = None
        if npu_ms is not None and seconds > 0:
            npu = min(1.0, int(mine.sum()) * npu_ms / 1e3 / seconds)
        core_figures.append(
            CoreFigures(
                core=c,
                samples=int(mine.sum()),
                samples_per_s=int(mine.sum()) / seconds if seconds else 0.0,
                p50_ms=percentile(lat, 50),
                p99_ms=percentile(lat, 99),
                utilization=busy / seconds if seconds else 0.0,
                instances_busy=summed / (instances_per_core * seconds) if seconds else 0.0,
                npu_load=npu,
            )
        )
    return Figures(
        measured_s=seconds,
        samples=len(measured),
        samples_per_s=len(measured) / seconds if seconds else 0.0,
        latency_ms=latency_summary(measured.latency_ms),
        cores=core_figures,
        windows=windows,
        wait_p50_ms=_nan_p50(measured.wait_ms),
        read_p50_ms=_nan_p50(measured.read_ms),
    )
