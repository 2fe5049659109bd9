"""The verdict's rules over synthetic series: windows, stability, when to stop, VALID or not."""

from __future__ import annotations

import numpy as np
import pytest

from batchinfer.bench.figures import figures
from batchinfer.bench.options import BenchOptions, check_bench
from batchinfer.bench.verdict import (
    MIN_DURATION_S,
    Measured,
    judge,
    required_s,
    should_stop,
    target_s,
)
from batchinfer.bench.windows import (
    SampleLog,
    latency_summary,
    noise,
    stability,
    summed_seconds,
    union_seconds,
    window_counts,
)
from batchinfer.errors import ConfigError, render_fields

OPTS = BenchOptions(duration_s=5, warmup_s=1, min_samples=100, max_duration_s=10, window_s=1)


# ------------------------------------------------------------------------------ windows
def test_window_counts_put_a_completion_on_a_boundary_in_the_later_window():
    t = np.array([10.0, 10.5, 10.999, 11.0, 12.5, 13.0, 9.99])
    assert window_counts(t, 10.0, 3, 1.0).tolist() == [3, 1, 1]  # 13.0 and 9.99 are outside


def test_stability_judges_only_the_last_three_windows_against_their_mean():
    assert stability([10, 100, 104, 96]).stable  # the slow first window is not judged
    s = stability([100, 100, 125])  # mean 108.3: 125 is 15 % above
    assert not s.stable and s.spread == pytest.approx(125 / 108.333 - 1, rel=1e-3)
    assert stability([100, 91, 109]).stable  # within 10 % of the mean 100
    assert not stability([100, 89.9, 110.1]).stable


def test_stability_needs_three_windows_and_some_throughput():
    assert stability([100, 100]) == stability([100, 100])  # deterministic
    two = stability([100, 100])
    assert (two.stable, two.windows, two.spread) == (False, 0, None)
    assert not stability([0, 0, 0]).stable


def test_noise_is_the_std_of_the_windows_over_their_mean():
    assert noise([100, 100, 100]) == 0
    assert noise([90, 110]) == pytest.approx(np.std([90, 110], ddof=1) / 100)
    assert noise([100]) is None


def test_union_counts_overlapping_calls_once_and_clips_to_the_interval():
    begin = np.array([0.0, 0.5, 2.0, 5.0, -1.0])
    end = np.array([1.0, 1.5, 3.0, 6.0, 0.2])
    # [-1, 1.5] clipped to [0, 1.5], [2, 3], [5, 6] clipped to [5, 5.5]
    assert union_seconds(begin, end, 0.0, 5.5) == pytest.approx(1.5 + 1.0 + 0.5)
    assert summed_seconds(begin, end, 0.0, 5.5) == pytest.approx(1.0 + 1.0 + 1.0 + 0.5 + 0.2)
    assert union_seconds(begin[:0], end[:0], 0.0, 1.0) == 0.0


def test_latency_summary_is_nearest_rank_over_every_sample():
    lat = np.arange(1, 1001, dtype=float)  # 1..1000 ms
    s = latency_summary(lat)
    assert (s["min"], s["max"], s["mean"]) == (1.0, 1000.0, 500.5)
    assert (s["p50"], s["p90"], s["p95"], s["p99"], s["p999"]) == (500, 900, 950, 990, 999)
    assert latency_summary(lat[:0])["p99"] is None


def _samples(rows):
    log = SampleLog()
    for t_done, latency_ms, core, instance in rows:
        log.add(t_done, latency_ms, core, instance, 0.5, None)
    return log.freeze()


def test_figures_count_only_the_measured_interval_per_core_and_window():
    rows = [(0.5, 400.0, 0, 0)]  # warm-up: started at 0.1, done before t_start
    rows += [(1.0 + i * 0.1, 100.0, 0, 0) for i in range(1, 20)]  # core 0: 10/s for 2 s
    rows += [(1.0 + i * 0.25, 250.0, 1, 0) for i in range(1, 8)]  # core 1: 4/s
    rows += [(3.2, 100.0, 1, 0)]  # drain, after t_end
    f = figures(_samples(rows), 1.0, 3.0, 1.0, (0, 1), 1)
    assert f.measured_s == 2.0
    assert f.samples == 19 + 7
    assert [w.samples for w in f.windows] == [9 + 3, 10 + 4]
    assert f.windows[1].per_core == {0: 10.0, 1: 4.0}
    core0, core1 = f.cores
    assert (core0.samples, core1.samples) == (19, 7)
    assert core0.samples_per_s == 9.5
    # Core 0's calls tile [1.0, 2.9]; the clock counts them inside [1, 3] only.
    assert core0.utilization == pytest.approx(1.9 / 2.0)
    # Core 1's calls tile [1.0, 2.75], and the drain call [3.1, 3.2] is outside.
    assert core1.utilization == pytest.approx(1.75 / 2.0)
    assert f.wait_p50_ms == 0.5 and f.read_p50_ms is None


def test_figures_of_the_emulator_give_npu_load_from_calls_and_npu_time():
    rows = [(1.0 + i * 0.004, 2.0, 0, 0) for i in range(1, 250)]  # 249 calls in 1 s
    f = figures(_samples(rows), 1.0, 2.0, 1.0, (0,), 1, npu_ms=2.0)
    assert f.cores[0].npu_load == pytest.approx(249 * 0.002)


# ------------------------------------------------------------------------------ stopping
def test_a_run_stops_once_it_has_its_duration_samples_and_stable_windows():
    steady = [100.0] * 5
    assert not should_stop(OPTS, 4.0, 400, steady[:4])
    assert should_stop(OPTS, 5.0, 500, steady)
    assert not should_stop(OPTS, 5.0, 99, steady)  # too few samples: it extends
    wobbly = [100.0, 100.0, 100.0, 60.0, 100.0]
    assert not should_stop(OPTS, 5.0, 500, wobbly)  # unstable: it extends
    assert should_stop(OPTS, 10.0, 500, [*wobbly, 60, 100, 60, 100, 60])  # at --max-duration


def test_three_windows_are_measured_even_when_the_duration_is_shorter():
    opts = BenchOptions(duration_s=1, window_s=1, min_samples=1)
    assert target_s(opts) == 3 and required_s(opts) == MIN_DURATION_S
    assert not should_stop(opts, 2.0, 10, [5.0, 5.0])
    assert should_stop(opts, 3.0, 10, [5.0, 5.0, 5.0])


# ------------------------------------------------------------------------------ verdict
def _measured(**kw) -> Measured:
    base = dict(measured_s=5.0, samples=500, errors=0, rates=[100.0] * 5)
    return Measured(**{**base, **kw})


def test_a_long_enough_stable_quiet_run_is_valid():
    v = judge(OPTS, _measured(other_cpus_start=0.05, other_cpus=0.1))
    assert (v.valid, v.reasons) == (True, [])
    assert v.stability.stable


def test_a_short_run_is_invalid_and_says_how_long_a_valid_one_is():
    opts = BenchOptions(duration_s=2, min_samples=10)
    v = judge(opts, _measured(measured_s=3.0, rates=[100.0] * 3))
    assert not v.valid
    (reason,) = v.reasons
    assert reason.startswith("too short: measured 3.0 s; a VALID run measures at least 5 s")
    assert render_fields(reason, lambda f: "--duration").endswith("(raise --duration).")


def test_a_stopped_run_is_too_short_and_names_why_it_stopped():
    v = judge(OPTS, _measured(measured_s=2.0, rates=[100.0, 100.0], stopped="interrupted"))
    assert v.reasons == [
        "too short: measured 2.0 s of the 5 s asked for; the run stopped early (interrupted)."
    ]


def test_windows_that_never_agreed_make_the_run_invalid_with_their_spread():
    rates = [100, 60, 100, 60, 100, 60, 100, 60, 100, 60]
    v = judge(OPTS, _measured(measured_s=10.0, samples=800, rates=rates))
    assert not v.valid
    (reason,) = v.reasons
    assert reason.startswith("unstable: after 10 s the last 3 windows did not agree within 10%")
    assert "windows 60, 100, 60 samples/s" in reason


def test_unstable_windows_of_few_samples_advise_a_longer_window():
    v = judge(OPTS, _measured(measured_s=10.0, samples=800, rates=[10, 12, 9] * 3 + [13]))
    (reason,) = v.reasons
    assert "windows of ~11 samples cannot agree within 10% by counting alone" in reason
    assert reason.endswith("use a longer bench.window_s.")
    assert reason.render(lambda field: f"<{field}>").endswith("use a longer <bench.window_s>.")


def test_every_reason_is_listed_not_just_the_first():
    v = judge(
        OPTS,
        _measured(
            samples=50,
            errors=2,
            first_error="inference() returned None",
            other_cpus_start=0.5,
            other_cpus=0.3,
            failures=["core 1 restarted (worker process crashed (exit code -9))"],
            condition_reasons=["throttling: x."],
        ),
    )
    assert [r.split(":")[0] for r in v.reasons] == [
        "too few samples",
        "errors",
        "failures",
        "other load",
        "throttling",
    ]
    assert v.reasons[2].startswith("failures: core 1 restarted (worker process crashed")
    assert "0.50 CPUs during the warm-up (as it started) and" in v.reasons[3]
    assert "0.30 CPUs while it was measured" in v.reasons[3]
    assert "(first: inference() returned None)" in v.reasons[1]


def test_other_load_below_the_bound_is_not_a_reason():
    assert judge(OPTS, _measured(other_cpus_start=0.19, other_cpus=0.19)).valid


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(duration_s=0), "bench.duration_s"),
        (dict(warmup_s=-1), "bench.warmup_s"),
        (dict(min_samples=0), "bench.min_samples"),
        (dict(window_s=0), "bench.window_s"),
        (dict(duration_s=2, window_s=3), "bench.window_s"),
        (dict(duration_s=10, max_duration_s=5), "bench.max_duration_s"),
    ],
)
def test_settings_that_cannot_be_measured_are_config_errors(kw, field):
    with pytest.raises(ConfigError) as info:
        check_bench(BenchOptions(**kw))
    assert info.value.fields[0] == field
