"""Sweep settings and the recommendation; comparing two results (pure, from JSON)."""

from __future__ import annotations

import copy
import re

import pytest

from batchinfer.bench.compare import compare, format_comparison
from batchinfer.bench.diagnosis import Diagnosis
from batchinfer.bench.figures import Figures
from batchinfer.bench.result import BenchResult
from batchinfer.bench.sweep import Row, Setting, recommend, rows, settings
from batchinfer.bench.verdict import Verdict
from batchinfer.bench.windows import Stability
from batchinfer.errors import ConfigError, UsageError


# ------------------------------------------------------------------------------ sweeps
def test_a_cores_sweep_runs_prefixes_of_the_cores_and_an_instances_sweep_k_1_to_4():
    assert settings("cores", (0, 1, 2), 2) == [
        Setting("cores=0", (0,), 2),
        Setting("cores=0,1", (0, 1), 2),
        Setting("cores=0,1,2", (0, 1, 2), 2),
    ]
    assert [(s.name, s.instances_per_core) for s in settings("instances", (1, 2), 1)] == [
        ("k=1", 1),
        ("k=2", 1 + 1),
        ("k=3", 3),
        ("k=4", 4),
    ]
    with pytest.raises(ConfigError):
        settings("readers", (0,), 1)


def _result(rate: float, valid: bool = True, p99: float = 5.0, bound: str = "npu"):
    fig = Figures(
        measured_s=5.0,
        samples=int(rate * 5),
        samples_per_s=rate,
        latency_ms={"p99": p99},
        cores=[],
        windows=[],
        wait_p50_ms=None,
        read_p50_ms=None,
    )
    return BenchResult(
        label="test",
        backend={"name": "sim"},
        verdict=Verdict(valid, [] if valid else ["unstable: x."], Stability(valid, 3, 0.0, 0.1)),
        diagnosis=Diagnosis(bound, "", ""),
        figures=fig,
        cpu=None,
        other_cpus_start=None,
        errors=0,
        config={"cores": [0, 1, 2], "instances_per_core": 1},
        versions={},
    )


def test_sweep_rows_give_speed_up_and_scaling_efficiency_against_the_first_setting():
    chosen = settings("cores", (0, 1, 2), 1)
    table = rows(
        "cores", list(zip(chosen, [_result(500), _result(950), _result(1200)], strict=True))
    )
    assert [r.relative for r in table] == pytest.approx([1.0, 1.9, 2.4])
    assert [r.efficiency for r in table] == pytest.approx([1.0, 0.95, 0.8])
    k = rows("instances", list(zip(settings("instances", (0,), 1), [_result(1)] * 4, strict=True)))
    assert all(r.efficiency is None for r in k)


def row(name: str, rate: float, k: int, valid: bool = True, p99: float | None = 5.0) -> Row:
    return Row(name, (0, 1, 2), k, rate, valid, p99, "npu")


def test_the_fewest_instances_within_3_percent_of_the_best_are_recommended():
    table = [row("k=1", 740, 1), row("k=2", 1450, 2), row("k=3", 1480, 3), row("k=4", 1470, 4)]
    rec = recommend(table)
    assert rec.row.name == "k=2"
    assert "within 3% of the best (k=3, 1480.0) with fewer instances" in rec.reason


def test_the_best_is_recommended_when_nothing_else_comes_close():
    table = [row("k=1", 370, 1), row("k=2", 730, 2), row("k=3", 1090, 3), row("k=4", 1450, 4)]
    rec = recommend(table)
    assert rec.row.name == "k=4" and "the highest" in rec.reason


def test_invalid_settings_are_passed_over_while_a_valid_one_exists():
    table = [row("k=1", 740, 1), row("k=2", 1450, 2, valid=False), row("k=3", 1300, 3)]
    assert recommend(table).row.name == "k=3"
    none_valid = [row("k=1", 740, 1, valid=False), row("k=2", 1450, 2, valid=False)]
    rec = recommend(none_valid)
    assert rec.row.name == "k=2" and "No setting was VALID" in rec.reason


def test_a_p99_limit_keeps_only_settings_under_it():
    table = [row("k=1", 740, 1, p99=3), row("k=2", 1450, 2, p99=6), row("k=3", 1480, 3, p99=9)]
    rec = recommend(table, max_p99_ms=7)
    assert rec.row.name == "k=2" and "p99 6.00 ms <= 7 ms" in rec.reason
    nothing = recommend(table, max_p99_ms=2)
    assert nothing.row is None
    assert "the lowest was 3.00 ms, k=1" in nothing.reason
    assert nothing.to_json()["name"] is None


# ------------------------------------------------------------------------------ compare
def result_json(rate: float, windows: list[float], **config) -> dict:
    return {
        "kind": "batchinfer-bench",
        "valid": True,
        "reasons": [],
        "samples_per_s": rate,
        "windows": [{"samples_per_s": w} for w in windows],
        "latency_ms": {"p50": 2.0, "p99": 3.0, "p999": 4.0},
        "cores": [{"core": 0, "samples_per_s": rate}],
        "diagnosis": {"bound": "npu"},
        "backend": {"name": "sim", "npu_ms": 2.0, "host_ms": 0.0},
        "config": {
            "backend": "sim",
            "cores": [0],
            "instances_per_core": 1,
            "source": {"kind": "synthetic"},
            "model": "/m/pool224.onnx",
            **config,
        },
    }


A = result_json(1000, [1000, 990, 1010, 1000, 1000])  # noise 0.7 %


def test_a_drop_beyond_both_runs_window_noise_is_a_regression():
    b = result_json(700, [690, 700, 710, 700, 700])
    c = compare(A, b)
    assert c.regression and c.change == pytest.approx(-0.3)
    text = format_comparison(c, "A", "B")
    assert "REGRESSION: B is 30.0% slower than A" in text
    assert "samples/s" in text and "-30.0%" in text


def test_a_rerun_within_the_noise_is_not_a_regression():
    b = result_json(995, [985, 1000, 1005, 995, 990])
    c = compare(A, b)
    assert not c.regression
    assert "no regression: B is 0.5% slower than A" in format_comparison(c, "A", "B")


def test_the_noisier_run_sets_the_threshold():
    noisy = result_json(900, [700, 1100, 900, 800, 1000])  # std/mean 17.6 %
    c = compare(A, noisy)
    assert c.threshold == pytest.approx(c.noise_b) and c.noise_b > 0.17
    assert not c.regression  # a 10 % drop is within what B's own windows varied


def test_drops_under_one_percent_are_never_regressions():
    steady = result_json(1000, [1000] * 5)
    c = compare(steady, result_json(992, [992] * 5))
    assert c.threshold == 0.01 and not c.regression
    assert compare(steady, result_json(985, [985] * 5)).regression


def test_an_invalid_run_is_compared_with_a_warning():
    b = copy.deepcopy(A)
    b["valid"], b["reasons"] = False, ["other load: lots."]
    (warning,) = compare(A, b, "A", "B").warnings
    assert warning == "B is INVALID, so the comparison is only indicative: other load: lots."


@pytest.mark.parametrize(
    ("b", "needle"),
    [
        (result_json(1000, [1000] * 5, cores=[0, 1]), "cores [0] vs [0, 1]"),
        (result_json(1000, [1000] * 5, instances_per_core=2), "instances per core 1 vs 2"),
        (result_json(1000, [1000] * 5, backend="onnx"), "backend sim vs onnx"),
        (result_json(1000, [1000] * 5, source={"kind": "dataset"}), "inputs synthetic vs dataset"),
        (result_json(1000, [1000]), "1 measurement window(s), too few"),
        ({**A, "sweep": []}, "is a sweep"),
    ],
)
def test_runs_that_cannot_be_compared_are_usage_errors(b, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        compare(A, b)
