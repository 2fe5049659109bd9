"""The verdict: is a measured throughput VALID, and if not, every reason why.

MLPerf LoadGen's offline discipline with Triton perf_analyzer's stability rule. A run is
VALID only when all of these hold (pure functions, tested with synthetic series):

- long enough: it measured at least ``max(--duration, MIN_DURATION_S, 3 windows)``;
- enough samples: at least ``--min-samples`` successful inferences were measured;
- stable: its last ``STABLE_WINDOWS`` windows lie within ``STABLE_TOLERANCE`` of their
  mean (the run extends, up to ``--max-duration``, until they do);
- no errors: no inference failed, and no core worker was restarted or retired, while
  measuring;
- quiet: other processes used less than ``OTHER_LOAD_CPUS`` CPUs on average, during the
  warm-up (when it started) and during the measurement;
- steady board: no throttling and no CPU or NPU frequency change was seen while measuring
  (see :mod:`batchinfer.bench.conditions`).

Reasons name settings as data (``setting("bench.duration_s")``, batchinfer.messages);
front ends render them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchinfer.bench.options import BenchOptions
from batchinfer.bench.windows import Stability, stability
from batchinfer.messages import setting

MIN_DURATION_S = 5.0
STABLE_WINDOWS = 3
STABLE_TOLERANCE = 0.10
#: Below this many samples per window, one sample more or less moves a window's rate by
#: over 1 %: the advice for unstable windows is then a longer window.
FEW_PER_WINDOW = 100
#: Other processes' mean CPU use (in CPUs) from which a run counts as disturbed.
OTHER_LOAD_CPUS = 0.2
_EPS = 1e-9


def target_s(opts: BenchOptions) -> float:
    """How long a run measures before it may stop: the duration, and three windows."""
    return max(opts.duration_s, STABLE_WINDOWS * opts.window_s)


def required_s(opts: BenchOptions) -> float:
    """The shortest measurement that can be VALID."""
    return max(target_s(opts), MIN_DURATION_S)


def should_stop(opts: BenchOptions, elapsed_s: float, samples: int, rates: list[float]) -> bool:
    """After a window closes: stop measuring now?

    Stop at ``--max-duration`` whatever happened; before that, once the run measured its
    duration and ``--min-samples`` and its last windows are stable.
    """
    if elapsed_s >= opts.limit_s - _EPS:
        return True
    return (
        elapsed_s >= target_s(opts) - _EPS
        and samples >= opts.min_samples
        and stability(rates, STABLE_WINDOWS, STABLE_TOLERANCE).stable
    )


@dataclass(frozen=True)
class Measured:
    """What the verdict looks at."""

    measured_s: float
    samples: int
    errors: int
    rates: list[float]  # samples/s of each measured window
    stopped: str | None = None  # why the run stopped early (a signal, a failure), if it did
    other_cpus_start: float | None = None  # other processes' CPUs during the warm-up
    other_cpus: float | None = None  # ... during the measurement
    first_error: str | None = None
    failures: list[str] = field(default_factory=list)  # worker restarts, retired cores
    condition_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reasons: list[str]
    stability: Stability


def judge(opts: BenchOptions, m: Measured) -> Verdict:
    """VALID or INVALID, with every reason (see the module docstring)."""
    reasons = []
    need = required_s(opts)
    short = m.measured_s < need - _EPS
    if m.stopped is not None:
        reasons.append(
            f"too short: measured {m.measured_s:.1f} s of the {target_s(opts):g} s asked for; "
            f"the run stopped early ({m.stopped})."
        )
    elif short:
        reasons.append(
            f"too short: measured {m.measured_s:.1f} s; a VALID run measures at least "
            f"{need:g} s (raise " + setting("bench.duration_s") + ")."
        )
    if m.samples < opts.min_samples:
        reasons.append(
            f"too few samples: {m.samples} measured, {opts.min_samples} needed "
            "("
            + setting("bench.min_samples")
            + "); allow a longer "
            + setting("bench.max_duration_s")
            + " (it was "
            f"{opts.limit_s:g} s) or lower " + setting("bench.min_samples") + "."
        )
    steady = stability(m.rates, STABLE_WINDOWS, STABLE_TOLERANCE)
    if not steady.stable and not (short or m.stopped):
        if steady.spread is None:
            what = "no samples completed in them"
        else:
            what = f"they differ by up to {steady.spread:.1%} from their mean"
        per_window = sum(m.rates[-STABLE_WINDOWS:]) * opts.window_s / STABLE_WINDOWS
        if per_window < FEW_PER_WINDOW:
            fix = (
                f"windows of ~{per_window:.0f} samples cannot agree within "
                f"{STABLE_TOLERANCE:.0%} by counting alone: use a longer "
                + setting("bench.window_s")
            )
        else:
            fix = (
                "remove what disturbs the run (other load, throttling) or allow a longer "
                + setting("bench.max_duration_s")
            )
        reasons.append(
            f"unstable: after {m.measured_s:.0f} s the last {STABLE_WINDOWS} windows did not "
            f"agree within {STABLE_TOLERANCE:.0%} ({what}; windows "
            f"{', '.join(f'{r:.0f}' for r in m.rates[-STABLE_WINDOWS:])} samples/s); " + fix + "."
        )
    if m.errors:
        first = f" (first: {m.first_error.rstrip('.')})" if m.first_error else ""
        reasons.append(f"errors: {m.errors} items failed while measuring{first}.")
    if m.failures:
        reasons.append(
            f"failures: {'; '.join(m.failures)} while measuring; the figure includes the recovery."
        )
    loads = [
        (f"{cpus:.2f} CPUs during the warm-up (as it started)", cpus)
        for cpus in [m.other_cpus_start]
        if cpus is not None and cpus >= OTHER_LOAD_CPUS
    ] + [
        (f"{cpus:.2f} CPUs while it was measured", cpus)
        for cpus in [m.other_cpus]
        if cpus is not None and cpus >= OTHER_LOAD_CPUS
    ]
    if loads:
        reasons.append(
            f"other load: other processes used {' and '.join(t for t, _ in loads)} "
            f"(at most {OTHER_LOAD_CPUS:g} allowed); run again on a quiet machine."
        )
    reasons += m.condition_reasons
    return Verdict(not reasons, reasons, steady)
