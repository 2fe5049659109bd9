"""How long and how much a benchmark measures: the ``bench`` option group.

Like the groups of :mod:`batchinfer.options`, fields carry their help and flag; messages
name them as ``{bench.duration_s}`` and the CLI renders them as ``--duration``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchinfer.errors import ConfigError
from batchinfer.options import option


@dataclass(frozen=True)
class BenchOptions:
    """The measurement: warm-up, duration, how far it may extend, its windows."""

    duration_s: float = option(
        10.0,
        "Seconds measured after the warm-up (a VALID run needs at least 5).",
        flag="--duration",
    )
    warmup_s: float = option(
        2.0, "Seconds run before measuring starts; excluded from every figure.", flag="--warmup"
    )
    min_samples: int = option(
        1000,
        "Samples a VALID run needs (1,000 make p99.9 a measured latency, not the maximum); "
        "the run extends up to --max-duration to reach them.",
    )
    max_duration_s: float | None = option(
        None,
        "How long the measurement may extend to reach --min-samples and stable windows "
        "(default: 3x --duration).",
        flag="--max-duration",
    )
    window_s: float = option(
        1.0,
        "Length of a measurement window in seconds; a run is stable when its last three "
        "windows agree within 10 %.",
        flag="--window",
    )

    @property
    def limit_s(self) -> float:
        """The longest the measurement may last."""
        return self.max_duration_s if self.max_duration_s is not None else 3 * self.duration_s


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
    """ConfigError (exit 2) for settings that cannot be measured."""
    if not opts.duration_s > 0:
        raise ConfigError(
            f"{{bench.duration_s}} must be positive seconds, not {opts.duration_s:g}.",
            "bench.duration_s",
        )
    if not opts.warmup_s >= 0:
        raise ConfigError(
            f"{{bench.warmup_s}} must be 0 or more seconds, not {opts.warmup_s:g}.",
            "bench.warmup_s",
        )
    if opts.min_samples < 1:
        raise ConfigError(
            f"{{bench.min_samples}} must be at least 1, not {opts.min_samples}.",
            "bench.min_samples",
        )
    if not opts.window_s > 0:
        raise ConfigError(
            f"{{bench.window_s}} must be positive seconds, not {opts.window_s:g}.",
            "bench.window_s",
        )
    if opts.window_s > opts.duration_s:
        raise ConfigError(
            f"{{bench.window_s}} {opts.window_s:g} s is longer than {{bench.duration_s}} "
            f"{opts.duration_s:g} s; measure at least three windows (e.g. --duration "
            f"{3 * opts.window_s:g}).",
            "bench.window_s",
        )
    if opts.max_duration_s is not None and opts.max_duration_s < opts.duration_s:
        raise ConfigError(
            f"{{bench.max_duration_s}} {opts.max_duration_s:g} s is shorter than "
            f"{{bench.duration_s}} {opts.duration_s:g} s; give at least the duration.",
            "bench.max_duration_s",
        )
