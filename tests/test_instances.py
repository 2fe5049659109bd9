"""``-k auto`` (batchinfer/engine/planning/instances.py): the rule on scripted timings, the
settling of a plan, the option's parsing (CLI and job files), and one run that records its
choice."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from runs import config

from batchinfer.engine.board.instance_probe import settle_instances
from batchinfer.engine.planning.instances import (
    AUTO_MAX,
    FALLBACK,
    Timings,
    choose,
    default_slots,
    pick_instances,
    planned_instances,
    refuse_on_cluster,
    throughput,
)
from batchinfer.errors import ConfigError, UsageError
from batchinfer.options import RuntimeOptions, SimOptions, from_mapping


# ------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize(
    ("npu_ms", "host_ms", "k"),
    [
        (2.0, 4.0, 3),  # the emulator's default: one instance keeps its core a third busy
        (2.0, 1.0, 2),
        (5.0, 5.0, 2),
        (1.0, 0.0, 1),  # nothing to overlap
        (4.0, 0.1, 1),  # 4/4.1 of the NPU already: within the tolerance
        (4.0, 0.5, 2),  # 0.89 of it with one
        (1.0, 10.0, AUTO_MAX),  # more would help still: capped
        (2.0, 2.05, 2),  # 2/4.05 is 0.988 of the NPU's rate: as good as three
    ],
)
def test_auto_picks_the_fewest_instances_within_the_tolerance_of_the_most(npu_ms, host_ms, k):
    assert pick_instances(npu_ms, host_ms) == k
    best = throughput(AUTO_MAX, npu_ms, host_ms)
    assert throughput(k, npu_ms, host_ms) >= 0.97 * best
    if k > 1:
        assert throughput(k - 1, npu_ms, host_ms) < 0.97 * best


def test_a_saturated_rate_gives_the_npu_time_and_the_rest_is_host_time():
    # 3 instances of a 6 ms call give 400 calls/s, short of 3/6 ms: the NPU was the limit,
    # so npu is 1/400 s = 2.5 ms, and the rest of a call host time.
    t = Timings(call_ms=6.0, rate_per_s=400.0, concurrent=3, calls=60, seconds=0.3)
    assert t.npu_ms == pytest.approx(2.5)
    assert t.host_ms == pytest.approx(3.5)
    c = choose(t)
    assert c.k == 3
    assert c.line() == (
        "instances per core: 3 (auto: npu 2.5 ms, host 3.5 ms per call + 0.1 ms the engine's)"
    )


def test_an_unsaturated_rate_bounds_the_npu_time_from_above():
    # 3 instances of a 6 ms call at 3/6 ms: the NPU was never the limit; npu <= 2 ms.
    t = Timings(call_ms=6.0, rate_per_s=500.0, concurrent=3, calls=60, seconds=0.3)
    assert t.npu_ms == pytest.approx(2.0)
    c = choose(t)
    assert c.k == 3 and "npu <= 2.0 ms" in c.reason


def test_an_npu_bound_call_keeps_one_instance_unless_the_engines_own_time_shows():
    t = Timings(call_ms=4.0, rate_per_s=250.0, concurrent=3, calls=60, seconds=0.3)
    assert (t.npu_ms, t.host_ms) == (pytest.approx(4.0), pytest.approx(0.0))
    assert choose(t).k == 1  # 4 / 4.1 of the NPU's rate with one
    # A 1 ms call and the engine's 0.1 ms between calls: one instance gives 0.91 of it.
    t = Timings(call_ms=1.0, rate_per_s=1000.0, concurrent=3, calls=60, seconds=0.3)
    assert choose(t).k == 2


# --------------------------------------------------------------------- settling a plan
@dataclasses.dataclass(frozen=True)
class _Reliability:
    startup_timeout_s: float = 5.0


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The fields of an EnginePlan that settle_instances reads and writes."""

    cores: tuple[int, ...] = (0, 1, 2)
    instances_per_core: int = AUTO_MAX
    instances_auto: bool = True
    instances_choice: dict | None = None
    slots: int = default_slots(3, AUTO_MAX, 2)
    max_readers: int = 2
    reliability: _Reliability = _Reliability()


def test_settling_an_auto_plan_records_the_choice_and_sizes_the_default_slots(caplog):
    timings = Timings(call_ms=3.0, rate_per_s=500.0, concurrent=3, calls=40, seconds=0.2)
    seen: list[float] = []
    with caplog.at_level(logging.INFO, logger="batchinfer"):
        plan = settle_instances(_Plan(), lambda plan, timeout: seen.append(timeout) or timings)
    assert seen == [5.0]  # measured once, with the start-up timeout
    assert plan.instances_per_core == 2 and not plan.instances_auto
    assert plan.slots == default_slots(3, 2, 2)
    assert plan.instances_choice["instances_per_core"] == 2
    assert plan.instances_choice["core"] == 0
    assert plan.instances_choice["npu_ms"] == 2.0 and plan.instances_choice["host_ms"] == 1.0
    assert "instances per core: 2 (auto: npu 2.0 ms, host 1.0 ms per call" in caplog.text


def test_slots_the_user_gave_stay_as_given():
    timings = Timings(call_ms=4.0, rate_per_s=250.0, concurrent=3, calls=40, seconds=0.2)
    plan = settle_instances(_Plan(slots=100), lambda plan, timeout: timings)
    assert (plan.instances_per_core, plan.slots) == (1, 100)


def test_a_failed_measurement_falls_back_to_the_default_and_says_why(caplog):
    def fails(plan, timeout):
        raise RuntimeError("the probe exited (code 1)")

    plan = settle_instances(_Plan(), fails)
    assert plan.instances_per_core == FALLBACK
    assert "the probe exited" in plan.instances_choice["reason"]
    assert "measuring failed" in caplog.text


def test_a_plan_with_a_number_is_not_measured():
    plan = _Plan(instances_per_core=2, instances_auto=False)
    assert settle_instances(plan, lambda *a: pytest.fail("measured")) is plan


def test_auto_is_refused_on_ray_with_what_to_do_instead():
    with pytest.raises(UsageError, match=r"not available with Ray.*give a number"):
        refuse_on_cluster(_Plan())
    refuse_on_cluster(_Plan(instances_auto=False))  # a number is fine


# ----------------------------------------------------------------------------- parsing
def test_planning_sizes_auto_for_the_most_and_refuses_other_words():
    assert planned_instances("auto") == AUTO_MAX
    assert planned_instances(2) == 2
    with pytest.raises(ConfigError, match="must be a number of instances per core or 'auto'"):
        planned_instances("three")


def test_a_job_file_takes_auto_or_a_number_and_refuses_other_words():
    assert from_mapping(RuntimeOptions, {"instances_per_core": "auto"}, "device.runtime") == (
        RuntimeOptions(instances_per_core="auto")
    )
    assert from_mapping(RuntimeOptions, {"instances_per_core": 2}, "d").instances_per_core == 2
    with pytest.raises(ConfigError, match=r"d\.instances_per_core must be an integer or 'auto'"):
        from_mapping(RuntimeOptions, {"instances_per_core": "three"}, "d")


def test_the_cli_takes_k_auto_and_says_what_else_it_takes(demo_kit, tmp_path):
    from click.testing import CliRunner

    from batchinfer.cli import main

    args = ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"])]
    args += ["--out", str(tmp_path / "out"), "--backend", "sim", "--no-progress"]
    result = CliRunner().invoke(main, [*args, "-k", "three"])
    assert result.exit_code == 2
    assert "'three' is not a number of instances (or 'auto')" in result.output


# ---------------------------------------------------------------------------- end to end
def test_a_run_with_k_auto_records_the_choice_in_its_manifest(demo_kit, tmp_path):
    from batchinfer.engine import run

    out = tmp_path / "out"
    sim = SimOptions(npu_ms=1.0, host_ms=2.0)  # 2 instances overlap; 3 are within 3 %
    result = run(
        config(demo_kit.dataset, demo_kit.models["digits"], limit=30, backend="sim",
               cores=(0, 1), instances_per_core="auto", sim=sim, out=out)
    )  # fmt: skip
    assert result.status == "complete" and result.succeeded == 30
    manifest = json.loads((out / "manifest.json").read_text())
    choice = manifest["instances_auto"]
    assert manifest["instances_per_core"] == choice["instances_per_core"]
    assert 1 <= choice["instances_per_core"] <= AUTO_MAX
    assert choice["core"] == 0 and choice["calls"] > 0 and choice["probe_cpu_s"] > 0
    assert manifest["config"]["runtime"]["instances_per_core"] == "auto"
    assert choice["instances_per_core"] in result.stats.column("instances").to_pylist()


@pytest.mark.slow  # a whole evaluation (both sides, the report): ~5 s
def test_an_eval_job_with_instances_auto_runs_and_records_the_choice(
    demo_kit, tmp_path, monkeypatch
):
    """`instances_per_core = "auto"` in a job file: the device side measures, runs with the
    number it chose, and the evaluation's record and core statistics say which."""
    from test_cli import invoke
    from test_eval_end_to_end import Workspace

    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "1")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "2")  # 2 instances overlap, as above
    ws = Workspace(tmp_path, demo_kit.root)
    text = ws.job.read_text()
    assert "instances_per_core = 2" in text and 'path = "../demo/dataset"' in text
    text = text.replace("instances_per_core = 2", 'instances_per_core = "auto"')
    small = tmp_path / "small"  # 10 digits of each class: the choice, not the accuracy
    for png in sorted(demo_kit.dataset.glob("*/*.png")):
        if len(list((small / png.parent.name).glob("*.png"))) < 10:
            (small / png.parent.name).mkdir(parents=True, exist_ok=True)
            (small / png.parent.name / png.name).symlink_to(png)
    ws.job.write_text(text.replace('path = "../demo/dataset"', f'path = "{small}"'))
    result = invoke("eval", ws.job, "--no-progress")
    assert result.exit_code in (0, 1), result.output  # a verdict, not a usage error
    (path,) = (ws.out / "evals").glob("*/result.json")
    device = json.loads(path.read_text())["device"]
    choice = device["instances_auto"]
    assert device["instances_per_core"] == choice["instances_per_core"]
    assert 1 <= choice["instances_per_core"] <= AUTO_MAX and choice["calls"] > 0
    cores = [s for s in device["core_stats"] if s["core"] is not None]  # not the "all" row
    assert [s["core"] for s in cores] == [0, 1, 2]
    assert {s["instances"] for s in cores} == {choice["instances_per_core"]}
