"""Measured series: per-sample arrays, measurement windows, stability, busy time, latency.

Everything here is a pure function of arrays and times (the monotonic clock of the run,
seconds), so it is tested with synthetic series. Definitions:

- A sample is one successful inference; it counts in the window its completion
  (``t_done``) falls in. Windows are ``[t_start + i·w, t_start + (i+1)·w)``.
- Stable (Triton perf_analyzer's rule): the last ``n`` windows' throughputs each lie
  within ``tolerance`` of their mean.
- A core's utilisation is the share of the interval during which at least one of its
  instances was inside ``inference()`` (the union of the calls' intervals, as the
  engine's core_stats); an instance's busy share is the sum of the calls' durations over
  ``instances × interval``.
- Percentiles are nearest-rank (the k-th smallest, k = ceil(q·n)), computed from every
  sample, not from a histogram.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import asdict, dataclass

import numpy as np

#: Latency percentiles reported (p999 is p99.9).
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


@dataclass(frozen=True)
class Samples:
    """One run's completed inferences, successes only (times: monotonic seconds)."""

    t_done: np.ndarray  # float64, when the call returned
    latency_ms: np.ndarray  # float64, the inference() call
    core: np.ndarray  # int16
    instance: np.ndarray  # int16
    wait_ms: np.ndarray  # float64: input ready -> inference start (NaN when unknown)
    read_ms: np.ndarray  # float64: decode + preprocess in a reader (NaN without readers)

    def __len__(self) -> int:
        return len(self.t_done)

    @property
    def t_begin(self) -> np.ndarray:
        """When each call started."""
        return self.t_done - self.latency_ms / 1e3

    def between(self, t0: float, t1: float) -> Samples:
        """The samples that completed in ``[t0, t1)``."""
        mask = (self.t_done >= t0) & (self.t_done < t1)
        return self.select(mask)

    def select(self, mask: np.ndarray) -> Samples:
        return Samples(
            self.t_done[mask],
            self.latency_ms[mask],
            self.core[mask],
            self.instance[mask],
            self.wait_ms[mask],
            self.read_ms[mask],
        )

    @classmethod
    def empty(cls) -> Samples:
        return SampleLog().freeze()


class SampleLog:
    """Appends samples as rows arrive (cheap per row), then freezes them into arrays."""

    def __init__(self) -> None:
        self._t = array("d")
        self._lat = array("d")
        self._core = array("h")
        self._inst = array("h")
        self._wait = array("d")
        self._read = array("d")

    def add(
        self,
        t_done: float,
        latency_ms: float,
        core: int,
        instance: int | None,
        wait_ms: float | None,
        read_ms: float | None,
    ) -> None:
        self._t.append(t_done)
        self._lat.append(latency_ms)
        self._core.append(core)
        self._inst.append(-1 if instance is None else instance)
        self._wait.append(np.nan if wait_ms is None else wait_ms)
        self._read.append(np.nan if read_ms is None else read_ms)

    def add_rows(self, rows: list) -> None:
        """Add the successful rows of an engine batch (cheap: this runs in the engine loop)."""
        t, lat, core, inst = self._t.append, self._lat.append, self._core.append, self._inst.append
        wait, read, nan = self._wait.append, self._read.append, np.nan
        for row in rows:
            if row.error is not None:
                continue
            t(row.t_done)
            lat(row.latency_ms)
            core(row.core)
            inst(-1 if row.instance is None else row.instance)
            wait(nan if row.wait_ms is None else row.wait_ms)
            read(nan if row.read_ms is None else row.read_ms)

    def __len__(self) -> int:
        return len(self._t)

    def freeze(self) -> Samples:
        def arr(a: array, dtype: str) -> np.ndarray:
            return np.frombuffer(a, dtype=dtype).copy() if len(a) else np.zeros(0, dtype)

        return Samples(
            arr(self._t, "f8"),
            arr(self._lat, "f8"),
            arr(self._core, "i2"),
            arr(self._inst, "i2"),
            arr(self._wait, "f8"),
            arr(self._read, "f8"),
        )


def window_counts(t_done: np.ndarray, t_start: float, windows: int, window_s: float) -> np.ndarray:
    """Completions in each of ``windows`` windows of ``window_s`` from ``t_start``."""
    if windows <= 0:
        return np.zeros(0, np.int64)
    index = np.floor((t_done - t_start) / window_s)
    index = index[(index >= 0) & (index < windows)].astype(np.int64)
    return np.bincount(index, minlength=windows)


@dataclass(frozen=True)
class Stability:
    """Whether the last ``n`` windows agree within ``tolerance`` of their mean."""

    stable: bool
    windows: int  # how many windows were judged (0: too few to judge)
    spread: float | None  # largest |rate - mean| / mean over those windows
    tolerance: float

    def to_json(self) -> dict:
        return asdict(self)


def stability(rates: list[float] | np.ndarray, n: int = 3, tolerance: float = 0.10) -> Stability:
    """perf_analyzer's rule over the last ``n`` window throughputs (fewer: not stable)."""
    rates = np.asarray(rates, dtype=np.float64)
    if len(rates) < n:
        return Stability(False, 0, None, tolerance)
    last = rates[-n:]
    mean = float(last.mean())
    if mean <= 0:
        return Stability(False, n, None, tolerance)
    spread = float(np.max(np.abs(last - mean)) / mean)
    return Stability(spread <= tolerance, n, spread, tolerance)


def noise(rates: list[float] | np.ndarray) -> float | None:
    """A run's noise: the standard deviation of its window throughputs over their mean
    (None with fewer than two windows)."""
    rates = np.asarray(rates, dtype=np.float64)
    if len(rates) < 2 or rates.mean() <= 0:
        return None
    return float(rates.std(ddof=1) / rates.mean())


def _clipped(begin: np.ndarray, end: np.ndarray, t0: float, t1: float):
    b = np.clip(begin, t0, t1)
    e = np.clip(end, t0, t1)
    keep = e > b
    return b[keep], e[keep]


def union_seconds(begin: np.ndarray, end: np.ndarray, t0: float, t1: float) -> float:
    """Seconds of ``[t0, t1]`` covered by at least one interval ``[begin_i, end_i]``."""
    b, e = _clipped(begin, end, t0, t1)
    if not len(b):
        return 0.0
    order = np.argsort(b, kind="stable")
    b, e = b[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new block of overlapping intervals starts where an interval begins after every
    # earlier one ended.
    starts = np.flatnonzero(np.r_[True, b[1:] > reach[:-1]])
    ends = np.r_[starts[1:], len(b)] - 1
    return float(np.sum(reach[ends] - b[starts]))


def summed_seconds(begin: np.ndarray, end: np.ndarray, t0: float, t1: float) -> float:
    """Sum of the intervals' lengths inside ``[t0, t1]``."""
    b, e = _clipped(begin, end, t0, t1)
    return float(np.sum(e - b))


def percentile(values: np.ndarray, q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-100) of ``values``: the k-th smallest, k = ceil(q·n);
    None when empty."""
    n = len(values)
    if not n:
        return None
    # The epsilon keeps q·n from rounding up past an exact rank (99.9 / 100 · 1000).
    k = min(n, max(1, math.ceil(q / 100 * n - 1e-9)))
    return float(np.partition(values, k - 1)[k - 1])


def latency_summary(latency_ms: np.ndarray) -> dict[str, float | None]:
    """min, mean, p50, p90, p95, p99, p999 (p99.9) and max of latencies in ms."""
    empty = not len(latency_ms)
    out: dict[str, float | None] = {
        "min": None if empty else float(latency_ms.min()),
        "mean": None if empty else float(latency_ms.mean()),
    }
    for name, q in PERCENTILES.items():
        out[name] = percentile(latency_ms, q)
    out["max"] = None if empty else float(latency_ms.max())
    return out
