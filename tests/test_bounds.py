"""Every numeric setting is bounded and finite, on the command line, in job files and in bench.

A value that would hang the machine (a timeout of nan or inf switches hang detection off)
or exhaust it (100,000 readers forked until the OOM killer fired; 10^13 slots or 10^8
instances per core) is one usage error (exit 2) that names the setting as its front end
spells it and the limit, before any process starts.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from batchinfer.bench.options import BenchOptions
from batchinfer.bounds import Bounds, check_value, readers_ceiling, usable_cpus
from batchinfer.cli import main
from batchinfer.errors import ConfigError
from batchinfer.evaluate import JobError, load_job
from batchinfer.evaluate.job import DatasetSettings, GateSettings, MetricsSettings
from batchinfer.options import GROUPS, OutputOptions, check_group, options_fields

FAST_SIM = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def one_error_line(result: Result, *needles: str) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}"
    )
    assert "Traceback" not in result.output
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test if any engine starts (a bad setting must stop everything before)."""
    import batchinfer.engine.loop as loop

    def refuse(*args, **kwargs):
        raise AssertionError("the engine started for a bad setting")

    monkeypatch.setattr(loop.Engine, "run", refuse)


# ------------------------------------------------------------------------- the CLI
_MOST_READERS = str(readers_ceiling()[0])

RUN_CASES = [
    # (flags, what the one error line must say)
    (["--readers", "100000"], ["--readers must be at most " + _MOST_READERS, "per CPU"]),
    (["--slots", "10000000000000"], ["--slots must be at most 65,536"]),
    (["-k", "100000000"], ["--instances-per-core must be at most 16"]),
    (["--inference-timeout-s", "nan"], ["--inference-timeout-s must be a finite number", "nan"]),
    (["--inference-timeout-s", "inf"], ["--inference-timeout-s", "86,400 (one day)", "inf"]),
    (["--decode-timeout-s", "1e9"], ["--decode-timeout-s must be at most 86,400 (one day)"]),
    (["--startup-timeout-s", "-inf"], ["--startup-timeout-s must be a finite number", "-inf"]),
    (["--drain-timeout-s", "nan"], ["--drain-timeout-s must be a finite number, from 0"]),
    (["--max-attempts", "1000000"], ["--max-attempts must be at most 10"]),
    (["--topk", "100000000000000000000"], ["--topk must be at most 1000"]),
    (["--part-rows", "1000000000"], ["--part-rows must be at most 1,000,000"]),
    (["--max-pixels", "10" + "0" * 30], ["--max-pixels must be at most", "memory"]),
    (["--size", "100000x8"], ["--size must be at most 16,384"]),
    (["--dtype", "float32", "--mean", "0,nan,0"], ["--mean must be a finite number"]),
    (["--dtype", "float32", "--std", "inf"], ["--std must be a finite number"]),
    (["--sim-host-ms", "inf"], ["--sim-host-ms must be a finite number"]),
    (["--limit", "100000000000000000000"], ["--limit must be at most"]),
]


@pytest.mark.parametrize(("flags", "needles"), RUN_CASES, ids=[" ".join(c[0]) for c in RUN_CASES])
def test_run_refuses_a_setting_out_of_its_range_naming_flag_and_limit(
    demo_kit, tmp_path, no_engine, flags, needles
):
    out = tmp_path / "o"
    args = ["run", demo_kit.dataset, "-m", demo_kit.models["digits"], "-o", out, *FAST_SIM]
    one_error_line(invoke(*args, *flags), *needles)
    assert not out.exists(), "a usage error must leave no output folder"


BENCH_CASES = [
    (["--duration", "nan"], ["--duration must be a finite number", "3600 (one hour"]),
    (["--warmup", "inf"], ["--warmup must be a finite number"]),
    (["--min-samples", "100000000000"], ["--min-samples must be at most 10,000,000"]),
    (["--max-duration", "1e9"], ["--max-duration must be at most 3600"]),
    (["--window", "nan"], ["--window must be a finite number"]),
    (["--sweep", "instances", "--max-p99-ms", "nan"], ["--max-p99-ms must be a finite"]),
    (["--readers", "100000"], ["--readers must be at most " + _MOST_READERS]),
    (["--inference-timeout-s", "inf"], ["--inference-timeout-s must be a finite number"]),
]


@pytest.mark.parametrize(
    ("flags", "needles"), BENCH_CASES, ids=[" ".join(c[0]) for c in BENCH_CASES]
)
def test_bench_refuses_a_setting_out_of_its_range(no_engine, flags, needles):
    from batchinfer.demo import model_path

    one_error_line(
        invoke("bench", "--model", model_path("pool224"), *FAST_SIM[:-1], *flags), *needles
    )


def test_slots_whose_inputs_cannot_fit_dev_shm_are_refused_with_the_most_that_fit(
    demo_kit, tmp_path, no_engine, monkeypatch
):
    import batchinfer.engine.planning.plan as plan

    # pool224's input is 224x224x3 uint8: 147 KiB a slot; 10 MiB free holds 69 of them.
    monkeypatch.setattr(plan, "free_space", lambda: 10 * 2**20)
    out = tmp_path / "o"
    args = ["run", demo_kit.dataset, "-m", demo_kit.models["pool224"], "-o", out, *FAST_SIM]
    one_error_line(invoke(*args, "--slots", "1000"), "--slots 1000 needs", "give at most 69")
    assert not out.exists()


# ------------------------------------------------------------------------- job files
JOB = """\
[device]
model = "m.onnx"
[device.runtime]
backend = "sim"
[reference]
model = "m.onnx"
[dataset]
path = "data"
[gates.top1]
min = 0.5
"""

JOB_CASES = [
    # (a table of JOB, the lines added under it (at the end without one), what to say)
    ("[device.runtime]", "readers = 100000", ["device.runtime.readers must be at most"]),
    ("[device.runtime]", "slots = 10000000000000", ["device.runtime.slots must be at most"]),
    ("[device.runtime]", "instances_per_core = 100000000", ["instances_per_core must be at"]),
    ("", "[device.runtime.sim]\nnpu_ms = inf", ["device.runtime.sim.npu_ms must be a finite"]),
    ("[reference]", "[reference.reliability]\ninference_timeout_s = nan",
     ["reference.reliability.inference_timeout_s must be a finite number", "nan"]),
    ("[reference]", "[reference.preprocess]\nstd = [1.0, -inf, 1.0]",
     ["reference.preprocess.std must be a finite number"]),
    ("[dataset]", "limit = 0", ["dataset.limit must be at least 1, not 0"]),
    ("[gates.top1]", "max = nan", ["gates.top1.max must be a finite number, not nan"]),
    ("[gates.top1]", "max_drop = inf", ["gates.top1.max_drop must be a finite number"]),
    ("[gates.top1]", "min_ratio_to_reference = -inf", ["min_ratio_to_reference must be a finite"]),
    ("[gates.top1]", "max_drop = 0.1\nalpha = nan", ["gates.top1.alpha must be a finite number"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "line", "needles"), JOB_CASES, ids=[c[1].split("\n")[-1] for c in JOB_CASES]
)
def test_a_job_file_setting_out_of_its_range_is_refused_on_load(tmp_path, table, line, needles):
    (tmp_path / "m.onnx").write_bytes(b"placeholder")
    (tmp_path / "data").mkdir()
    path = tmp_path / "night.toml"
    path.write_text(JOB.replace(f"{table}\n", f"{table}\n{line}\n", 1) if table else JOB + line)
    with pytest.raises(JobError) as caught:
        load_job(path)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_the_metrics_tables_are_bounded_in_job_files(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"placeholder")
    (tmp_path / "data").mkdir()
    path = tmp_path / "night.toml"
    for line, needle in (("topk = 100000", "metrics.topk must be at most 1000"),
                         ("worst = 100000000", "metrics.worst must be at most 1000")):  # fmt: skip
        path.write_text(JOB + f"[metrics]\n{line}\n")
        with pytest.raises(JobError, match=needle):
            load_job(path)


# ------------------------------------------------------------------ the declarations
def _numeric(hint: typing.Any) -> bool:
    """True when a field's type holds a number (int, float, tuples of them, optional)."""
    if hint in (int, float):
        return True
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType, tuple):
        return any(_numeric(a) for a in args if a is not Ellipsis)
    return False


ALL_GROUPS = {**GROUPS, "bench": BenchOptions, "dataset": DatasetSettings}
ALL_GROUPS |= {"metrics": MetricsSettings, "gates.top1": GateSettings}


@pytest.mark.parametrize("where", sorted(ALL_GROUPS))
def test_every_numeric_setting_declares_its_range(where):
    cls = ALL_GROUPS[where]
    hints = typing.get_type_hints(cls)
    for f in options_fields(cls) if where != "bench" else dataclasses.fields(cls):
        if not _numeric(hints[f.name]) or f.name == "cores":  # cores: the chip's, by name
            continue
        assert isinstance(f.metadata.get("bounds"), Bounds), f"{where}.{f.name} has no bounds"


@pytest.mark.parametrize("where", sorted(ALL_GROUPS))
def test_every_default_is_within_its_range(where):
    check_group(ALL_GROUPS[where](), where)


# ---------------------------------------------------------------------- the messages
@pytest.mark.parametrize(
    ("bounds", "value", "says"),
    [
        (Bounds(0, 10, above=True), 0, "{x} must be positive, not 0."),
        (Bounds(1, 10), 0, "{x} must be at least 1, not 0."),
        (Bounds(1, 10, why="a reason"), 11, "{x} must be at most 10 (a reason), not 11."),
        (Bounds(0, 1, above=True, below=True), 1.0, "{x} must be between 0 and 1, not 1."),
        (Bounds(0, 1, above=True, below=True), math.nan,
         "{x} must be a finite number, between 0 and 1, not nan."),
        (Bounds(1, 20_000), math.inf, "{x} must be a finite number, from 1 to 20,000, not inf."),
        (None, -math.inf, "{x} must be a finite number, not -inf."),
        (Bounds(1, lambda: (4, "this machine")), 5, "{x} must be at most 4 (this machine), not 5."),
        (Bounds(1, 10), (3, 12), "{x} must be at most 10, not 12."),
    ],
)  # fmt: skip
def test_a_value_out_of_range_is_one_sentence_with_the_limit(bounds, value, says):
    with pytest.raises(ConfigError) as caught:
        check_value(bounds, value, "x")
    # The setting is a reference in the message (batchinfer.messages), shown here as {x}.
    assert caught.value.render(lambda field: f"{{{field}}}") == says
    assert caught.value.fields == ("x",) and caught.value.exit_code == 2


@pytest.mark.parametrize("value", [None, "estimate", "none", True, 5, (1, 2), 2.5])
def test_none_words_and_values_in_range_pass(value):
    check_value(Bounds(1, 10), value, "x")


def test_the_readers_ceiling_follows_the_cpus_this_process_may_use():
    most, why = readers_ceiling()
    assert 1 <= most <= 4 * usable_cpus()
    assert str(usable_cpus()) in why or "memory" in why


# ---------------------------------------------------------------------- other numbers
def test_more_simulated_ray_nodes_than_the_machine_holds_are_refused():
    from batchinfer.bounds import local_nodes_ceiling
    from batchinfer.cluster.connect import parse_address
    from batchinfer.errors import UsageError

    most, _ = local_nodes_ceiling()
    assert parse_address(f"local:{most}") == ("local", most)
    with pytest.raises(UsageError, match=rf"^ray 'local:100000' .* at most {most} \("):
        parse_address("local:100000")


def test_the_library_refuses_a_nan_timeout_before_anything_starts(demo_kit, tmp_path, no_engine):
    from batchinfer.engine import RunConfig, run
    from batchinfer.options import ReliabilityOptions

    config = RunConfig(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        reliability=ReliabilityOptions(inference_timeout_s=math.nan),
        output=dataclasses.replace(OutputOptions(), out=tmp_path / "o"),
    )
    with pytest.raises(ConfigError) as caught:
        run(config)
    assert caught.value.fields == ("reliability.inference_timeout_s",)
    assert not (tmp_path / "o").exists()
