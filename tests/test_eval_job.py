"""Job files: every bad key gives one line naming the file and the key; good ones load.

Loading reads only the TOML and checks that named files exist, so these tests use
placeholder model files; the end-to-end tests (test_eval_end_to_end.py) run real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.evaluate import Gate, JobError, builtin_metrics, load_job
from batchinfer.evaluate.job import (
    DatasetSettings,
    GateSettings,
    MetricsSettings,
    OutputSettings,
    RaySettings,
)
from batchinfer.evaluate.scorers.instances_metrics import detection_metrics
from batchinfer.options import (
    DetectOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    SimOptions,
    options_fields,
)

GOOD = """\
name = "night"

[device]
model = "models/m.onnx"

[device.runtime]
backend = "sim"
cores = [0, 1]

[reference]
model = "models/float.onnx"

[dataset]
path = "data"

[gates.top1]
min = 0.9
max_drop = 0.01
alpha = 0.05
min_ratio_to_reference = 0.99
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "jobs" / "models").mkdir(parents=True)
    (tmp_path / "jobs" / "models" / "m.onnx").write_bytes(b"placeholder")
    (tmp_path / "jobs" / "models" / "float.onnx").write_bytes(b"placeholder")
    (tmp_path / "jobs" / "data").mkdir()
    return tmp_path / "jobs"


def write_job(folder: Path, text: str) -> Path:
    path = folder / "night.toml"
    path.write_text(text)
    return path


def load_error(folder: Path, text: str) -> str:
    path = write_job(folder, text)
    with pytest.raises(JobError) as caught:
        load_job(path)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    return message


def test_a_good_job_loads_with_paths_relative_to_the_job_file(folder):
    job = load_job(write_job(folder, GOOD))
    assert job.name == "night"
    assert job.device.model == folder / "models" / "m.onnx"
    assert job.dataset.path == folder / "data"
    assert job.device.runtime.cores == (0, 1)
    # Unset settings are the CLI's defaults: both come from batchinfer.options.
    assert job.device.runtime.instances_per_core == RuntimeOptions().instances_per_core
    assert job.reference is not None and job.reference.runtime.backend == "auto"
    assert job.outputs.dir == folder / "eval" / "night"
    assert job.outputs.history == folder / "eval" / "night" / "history.parquet"
    # Item errors always have a gate: none allowed unless the job says otherwise.
    assert Gate("errors", max=0) in job.gates
    assert Gate("top1", min=0.9, max_drop=0.01, alpha=0.05, min_ratio_to_reference=0.99) in (
        job.gates
    )


def test_a_job_saved_with_a_byte_order_mark_loads(folder):
    # Notepad's "UTF-8 with BOM": "not valid TOML (Invalid statement (at line 1, column
    # 1))", a line that looks right; labels, lists, COCO and data.yaml files take it.
    path = folder / "night.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_job(path).name == "night"


def test_output_locations_can_be_set_one_by_one(folder):
    output = '[output]\ndir = "out"\nhistory = "/srv/nightly/history.parquet"\n'
    job = load_job(write_job(folder, GOOD + output))
    assert job.outputs.dir == folder / "out"
    assert job.outputs.history == Path("/srv/nightly/history.parquet")
    assert job.outputs.report == folder / "out" / "report.html"
    assert Path("/srv/nightly") in job.outputs.folders()


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        # (what to do to the good job text, what the one line must say)
        (
            lambda t: t.replace("[dataset]", "[datset]"),
            ["datset is not a key", "did you mean dataset?"],
        ),
        (
            lambda t: t.replace("cores = [0, 1]", "cors = [0, 1]"),
            ["device.runtime.cors is not a setting", "did you mean device.runtime.cores?"],
        ),
        (
            lambda t: t.replace("cores = [0, 1]", 'cores = "0,1"'),
            ["device.runtime.cores must be a list of integers", "'0,1'"],
        ),
        (
            lambda t: t.replace('backend = "sim"', 'backend = "npu"'),
            ["device.runtime.backend must be one of auto, rknnlite, onnx, sim", "'npu'"],
        ),
        (
            lambda t: t.replace(
                'backend = "sim"', 'backend = "sim"\n[device.runtime.sim]\nnpu = 2'
            ),
            ["device.runtime.sim.npu is not a setting", "did you mean device.runtime.sim.npu_ms?"],
        ),
        (
            lambda t: t + "[reference.preprocess]\nmean = 0.5\n",
            ["reference.preprocess.mean must be a list of numbers"],
        ),
        (
            lambda t: t + '[device.ray]\naddress = "auto"\ndata = "nfs"\n',
            ["device.ray.data must be one of head, shared", "'nfs'"],
        ),
        (  # the reference always runs on this machine
            lambda t: t + '[reference.ray]\naddress = "auto"\n',
            ["reference.ray is not a setting"],
        ),
        (lambda t: t.replace('model = "models/m.onnx"', ""), ["device.model is missing"]),
        (
            lambda t: t.replace("models/m.onnx", "models/gone.onnx"),
            ["device.model", "gone.onnx does not exist", "relative to the job file"],
        ),
        (
            lambda t: t.replace("models/float.onnx", "nope.onnx"),
            ["reference.model", "nope.onnx does not exist"],
        ),
        (
            lambda t: t.replace('path = "data"', 'path = "../demo/dataset"'),
            ["dataset.path", "does not exist", "folder of images"],
        ),
        (
            lambda t: t.replace('path = "data"', 'path = "data"\nlabels = "classes.txt"'),
            ["dataset.labels", "classes.txt does not exist"],
        ),
        (
            lambda t: t.replace('path = "data"', 'path = "data"\nlimit = 0'),
            ["dataset.limit must be at least 1"],
        ),
        (
            lambda t: t + "[gates.top_1]\nmin = 0.9\n",
            ["gates.top_1", "no metric 'top_1'", "did you mean gates.top1?"],
        ),
        (
            lambda t: t + "[gates.top5]\nminimum = 0.9\n",
            ["gates.top5.minimum is not a setting", "did you mean gates.top5.min?"],
        ),
        (lambda t: t + "[gates.top5]\n", ["gates.top5 sets no limit"]),
        (
            lambda t: t + "[gates.top5]\nmin = 0.9\nmax_drop = 0.1\nalpha = 0.05\n",
            ["gates.top5.alpha applies to gates.top1"],
        ),
        (
            lambda t: t.replace("alpha = 0.05", "alpha = 5"),
            ["gates.top1.alpha must be between 0 and 1"],
        ),
        (lambda t: t + "[gates.errors]\nmax_drop = 1\n", ["gates.errors.max_drop", "use max"]),
        (
            lambda t: t + "[gates.cosine_mean]\nmin_ratio_to_reference = 0.99\n",
            ["gates.cosine_mean.min_ratio_to_reference", "no cosine_mean of its own"],
        ),
        (
            lambda t: t.replace('[reference]\nmodel = "models/float.onnx"\n', ""),
            ["gates.top1.min_ratio_to_reference needs a [reference]"],
        ),
        (
            lambda t: (
                t.replace('[reference]\nmodel = "models/float.onnx"\n', "").replace(
                    "min_ratio_to_reference = 0.99", ""
                )
                + "[gates.top1_agreement]\nmin = 0.9\n"
            ),
            ["gates.top1_agreement", "has no [reference]"],
        ),
        (
            lambda t: t + '[metrics]\ncustom = ["no_function"]\n',
            ["metrics.custom 'no_function' is not"],
        ),
        (
            lambda t: t + '[metrics]\ncustom = ["mine.py:f"]\n',
            ["metrics.custom", "mine.py does not exist"],
        ),
        (lambda t: t + "[metrics]\ntopk = 0\n", ["metrics.topk must be at least 1"]),
        (lambda t: t + "[metrics]\ntopk = 2.5\n", ["metrics.topk must be an integer", "2.5"]),
        (lambda t: t.replace('name = "night"', 'name = "my night"'), ["name must be a short name"]),
        (lambda t: t.replace("[dataset]", "[dataset"), ["not valid TOML", "line"]),
        (lambda t: t.replace("[dataset]", "dataset = 3\n[x]"), ["x is not a key"]),
        (
            lambda t: "dataset = 3\n" + t.replace('[dataset]\npath = "data"\n', ""),
            ["dataset must be a table"],
        ),
    ],
    ids=[
        "unknown-table",
        "misspelt-runtime-key",
        "wrong-type",
        "bad-choice",
        "misspelt-sim-key",
        "reference-wrong-type",
        "bad-ray-data",
        "ray-on-reference",
        "no-model",
        "missing-model",
        "missing-reference",
        "missing-dataset",
        "missing-labels",
        "bad-limit",
        "unknown-metric",
        "misspelt-gate-key",
        "gate-without-limit",
        "alpha-not-on-top1",
        "alpha-range",
        "drop-on-lower-is-better",
        "ratio-on-metric-without-reference-value",
        "ratio-without-reference",
        "reference-metric-without-reference",
        "bad-custom-spec",
        "missing-custom-file",
        "bad-topk",
        "topk-type",
        "bad-name",
        "toml-syntax",
        "unknown-top-level",
        "table-not-table",
    ],
)
def test_each_bad_job_gives_one_line_naming_the_key_and_the_file(folder, change, needles):
    message = load_error(folder, change(GOOD))
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_an_unreadable_job_file_says_what_to_pass(tmp_path):
    with pytest.raises(JobError, match=r"job file .*missing\.toml cannot be read.*TOML job file"):
        load_job(tmp_path / "missing.toml")


def test_a_gate_on_a_custom_metric_is_left_to_the_custom_metrics(folder):
    (folder / "mine.py").write_text("def f(rows):\n    return {'map50': 1.0}\n")
    job = load_job(
        write_job(folder, GOOD + '[metrics]\ncustom = ["mine.py:f"]\n[gates.map50]\nmin = 0.5\n')
    )
    assert Gate("map50", min=0.5) in job.gates


def test_jobs_readme_documents_every_key_and_metric():
    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "jobs.md").read_text()
    groups = [RuntimeOptions, SimOptions, PreprocessOptions, ReliabilityOptions, DetectOptions]
    groups += [RaySettings, DatasetSettings, MetricsSettings, GateSettings, OutputSettings]
    for cls in groups:
        for f in options_fields(cls):
            assert f"`{f.name}`" in text, (
                f"{cls.__name__}.{f.name} is not in docs/reference/jobs.md"
            )
    for name in builtin_metrics(5):
        assert f"`{name}`" in text, f"metric {name} is not in docs/reference/jobs.md"
    for name in detection_metrics():
        assert f"`{name}`" in text, f"detection metric {name} is not in docs/reference/jobs.md"
    from batchinfer.evaluate.scorers.instance_parts import part_metrics
    from batchinfer.evaluate.scorers.rotated import rotated_metrics

    for name in {**part_metrics("segm", ""), **part_metrics("kpt", ""), **rotated_metrics()}:
        assert f"`{name}`" in text, f"metric {name} is not in docs/reference/jobs.md"


@pytest.mark.parametrize("kind", ["csv", "folder", "empty"])
def test_a_history_that_is_not_parquet_is_refused_on_load_before_anything_runs(folder, kind):
    # It was read only to append the night's row: after both runs, as a run failure (3).
    history = folder / "history.parquet"
    if kind == "csv":
        history.write_text("date,top1\n2026-01-01,0.9\n")
    elif kind == "folder":
        history.mkdir()
    else:
        history.write_bytes(b"")
    message = load_error(folder, GOOD + '[output]\nhistory = "history.parquet"\n')
    assert f"output.history {history} is " in message
    assert "move it aside" in message


def test_a_parquet_history_loads(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"job": ["night"]}), folder / "h.parquet")
    job = load_job(write_job(folder, GOOD + '[output]\nhistory = "h.parquet"\n'))
    assert job.outputs.history == folder / "h.parquet"
