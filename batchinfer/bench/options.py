"""How long and how much a benchmark measures: the ``bench`` option group.

Like the groups of :mod:`batchinfer.options`, fields carry their help and flag; messages
name them as ``{bench.duration_s}`` and the CLI renders them as ``--duration``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchinfer.bounds import Bounds
from batchinfer.errors import ConfigError
from batchinfer.messages import setting
from batchinfer.options import check_group, option

#: A measurement lasts an hour at most: every sample is kept in memory until the end.
MEASURE_MAX_S = 3600.0
MEASURE = Bounds(0, MEASURE_MAX_S, above=True, why="one hour; every sample is kept in memory")


@dataclass(frozen=True)
class BenchOptions:
    """The measurement: warm-up, duration, how far it may extend, its windows."""

    duration_s: float = option(
        10.0,
        "Seconds measured after the warm-up (a VALID run needs at least 5).",
        flag="--duration",
        bounds=MEASURE,
    )
    warmup_s: float = option(
        2.0,
        "Seconds run before measuring starts; excluded from every figure.",
        flag="--warmup",
        bounds=Bounds(0, 3600, why="one hour"),
    )
    min_samples: int = option(
        1000,
        "Samples a VALID run needs (1,000 make p99.9 a measured latency, not the maximum); "
        "the run extends up to --max-duration to reach them.",
        bounds=Bounds(1, 10_000_000),
    )
    max_duration_s: float | None = option(
        None,
        "How long the measurement may extend to reach --min-samples and stable windows "
        "(default: 3x --duration, an hour at most).",
        flag="--max-duration",
        bounds=MEASURE,
    )
    window_s: float = option(
        1.0,
        "Length of a measurement window in seconds; a run is stable when its last three "
        "windows agree within 10 %.",
        flag="--window",
        bounds=MEASURE,
    )

    @property
    def limit_s(self) -> float:
        """The longest the measurement may last."""
        if self.max_duration_s is not None:
            return self.max_duration_s
        return min(3 * self.duration_s, max(self.duration_s, MEASURE_MAX_S))


#: Settings of a bench command that are not measurement options.
_OTHER_FLAGS = {"bench.sweep": "--sweep", "bench.max_p99_ms": "--max-p99-ms"}


def bench_flag(field_name: str) -> str | None:
    """The CLI flag of a ``bench.*`` setting, None for other names."""
    group, _, name = field_name.partition(".")
    if group != "bench":
        return None
    if field_name in _OTHER_FLAGS:
        return _OTHER_FLAGS[field_name]
    for f in dataclasses.fields(BenchOptions):
        if f.name == name:
            return f.metadata.get("flag") or "--" + name.replace("_", "-")
    return None


def check_bench(opts: BenchOptions) -> None:
    """ConfigError (exit 2) for settings that cannot be measured (out of their ``bounds``,
    not finite, or not fitting each other)."""
    check_group(opts, "bench")
    if opts.window_s > opts.duration_s:
        raise ConfigError(
            setting("bench.window_s")
            + f" {opts.window_s:g} s is longer than "
            + setting("bench.duration_s")
            + " "
            f"{opts.duration_s:g} s; measure at least three windows (e.g. --duration "
            f"{3 * opts.window_s:g}).",
            "bench.window_s",
        )
    if opts.max_duration_s is not None and opts.max_duration_s < opts.duration_s:
        raise ConfigError(
            setting("bench.max_duration_s")
            + f" {opts.max_duration_s:g} s is shorter than "
            + setting("bench.duration_s")
            + f" {opts.duration_s:g} s; give at least the duration.",
            "bench.max_duration_s",
        )
