"""``batchinfer eval`` end to end: the shipped jobs/digits.toml on the emulator, two nights
in a row, a tightened gate, a core that computes differently, bad jobs, the lock, and the
report in a real headless Chromium.

The job file is the repository's own, copied next to a ``demo`` link to the session's demo
kit, so its ``../demo/`` paths resolve as they do at the repository root. The emulator
runs with a short NPU time (BATCHINFER_SIM_* variables, which the job leaves unset).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pyarrow.parquet as pq
import pytest
from cdp import Browser, chromium_path
from click.testing import CliRunner, Result
from dataset_files import digits_3_and_7
from PIL import Image

from batchinfer.cli import main
from batchinfer.evaluate import load_job
from batchinfer.evaluate.evaluation import _write_report
from batchinfer.evaluate.files import SUMMARY_MARK
from batchinfer.sink.outdir import OutLock

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_METRIC = Path(__file__).resolve().parent / "eval_metric_example.py"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def one_error_line(result: Result, code: int) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


def independent_top1(model: Path, dataset: Path) -> float:
    """Top-1 of ``model`` over the demo images, by onnxruntime directly (no batchinfer).

    The emulator runs a .rknn through the .onnx beside it, so that is what is scored.
    """
    session = ort.InferenceSession(
        str(model.with_suffix(".onnx")), providers=["CPUExecutionProvider"]
    )
    feed = session.get_inputs()[0]
    correct = total = 0
    for png in sorted(dataset.glob("*/*.png")):
        pixels = np.asarray(Image.open(png), dtype=np.uint8).reshape(feed.shape)
        probs = session.run(None, {feed.name: pixels})[0]
        correct += int(np.argmax(probs) == int(png.parent.name))
        total += 1
    return correct / total


class Workspace:
    """A copy of the repository's jobs/ beside a link to the demo kit."""

    def __init__(self, root: Path, kit: Path) -> None:
        self.root = root
        (root / "jobs").mkdir(parents=True)
        shutil.copy(REPO / "jobs" / "digits.toml", root / "jobs" / "digits.toml")
        (root / "demo").symlink_to(kit)
        self.job = root / "jobs" / "digits.toml"
        self.out = root / "eval" / "digits"


@pytest.fixture(scope="module")
def fast_sim():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
        mp.setenv("BATCHINFER_SIM_HOST_MS", "0")
        yield


def tighten_top1(job: Path, limit: float) -> None:
    """Set the job's top-1 floor to ``limit``."""
    text = re.sub(r"(\[gates\.top1\]\s*\nmin = )[0-9.]+", rf"\g<1>{limit}", job.read_text())
    assert f"min = {limit}" in text
    job.write_text(text)


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory, demo_kit, fast_sim):
    """Night 1 of jobs/digits.toml (accepted as the baseline); night 2 of the same job
    with its top-1 floor just above what night 1 measured, which the model cannot meet."""
    ws = Workspace(tmp_path_factory.mktemp("eval"), demo_kit.root)
    first = invoke("eval", ws.job, "--update-baseline", "--no-progress")
    history_after_first = pq.read_table(ws.out / "history.parquet").num_rows
    report_after_first = (ws.out / "report.html").read_text()
    (record,) = [json.loads(p.read_text()) for p in (ws.out / "evals").glob("*/result.json")]
    limit = round(record["metrics"]["top1"] + 0.0005, 6)
    tighten_top1(ws.job, limit)
    second = invoke("eval", ws.job, "--no-progress")
    records = sorted((ws.out / "evals").glob("*/result.json"))
    return {
        "ws": ws,
        "first": first,
        "second": second,
        "limit": limit,
        "history_after_first": history_after_first,
        "report_after_first": report_after_first,
        "records": [json.loads(p.read_text()) for p in records],
    }


def trend_points(html: str, metric: str) -> int:
    """Markers in the trend plot of ``metric`` (one per evaluation)."""
    group = html.split(f'id="trend-{metric}-values"', 1)[1].split("</g>\n   </g>", 1)[0]
    return group.count("<use ")


def test_first_night_passes_with_the_models_real_accuracy(two_nights, demo_kit):
    ws, first = two_nights["ws"], two_nights["first"]
    assert first.exit_code == 0, first.output + first.stderr
    assert two_nights["history_after_first"] == 1
    assert "batchinfer eval `digits`: PASS" in first.stdout
    assert "verdict: pass" in first.stdout
    record = two_nights["records"][0]
    device_model = load_job(ws.job).device.model
    assert record["metrics"]["top1"] == pytest.approx(
        independent_top1(device_model, demo_kit.dataset), abs=1e-12
    )
    assert record["dataset"]["evaluated"] == 1797
    assert record["metrics"]["errors"] == 0
    assert record["reference"]["cached"] is False
    assert trend_points(two_nights["report_after_first"], "top1") == 1
    baseline = json.loads((ws.out / "baseline" / "baseline.json").read_text())
    assert baseline["eval_id"] == record["eval_id"]
    # The night that accepts the first baseline says so, not "accept one" (issue 40 #17).
    assert "No baseline yet" not in first.stdout and "accept one" not in first.stdout
    accepted = "`--update-baseline` accepted it as the baseline"
    assert f"No baseline before this evaluation: {accepted}" in first.stdout
    assert "no baseline before this evaluation (--update-baseline makes" in first.stdout
    assert record["accepted_as_baseline"] is True
    page = two_nights["report_after_first"]
    assert "<code>--update-baseline</code> accepted it as the baseline" in page
    assert "accepted_as_baseline" not in two_nights["records"][1]
    assert baseline["model_sha256"] == record["model_sha256"]
    assert "@" in baseline["accepted_by"] and baseline["accepted_at"] == record["date"]


def test_a_tightened_gate_exits_1_naming_the_gate_with_its_value_and_limit(two_nights):
    second, limit = two_nights["second"], two_nights["limit"]
    measured = two_nights["records"][0]["metrics"]["top1"]
    assert second.exit_code == 1, second.output + second.stderr
    assert "batchinfer eval `digits`: FAIL" in second.stdout
    line = f"FAIL        top1 >= {limit:g} (floor): value {measured:.6g}"
    assert "verdict: FAIL (1 of " in second.stdout
    assert f"\n  {line}\n" in second.stdout, second.stdout
    history = pq.read_table(two_nights["ws"].out / "history.parquet").to_pylist()
    assert [h["verdict"] for h in history] == ["pass", "fail"]
    assert history[1]["failed_gates"] == [line]


def test_second_night_compares_with_the_baseline_and_makes_a_two_point_trend(two_nights):
    ws, second = two_nights["ws"], two_nights["second"]
    # The file is the printed summary under eval's mark (which Markdown renderers hide).
    written = (ws.out / "summary.md").read_text()
    assert written == f"{SUMMARY_MARK}\n" + second.stdout.split("\nverdict:")[0]
    history = pq.read_table(ws.out / "history.parquet").to_pylist()
    assert [h["job"] for h in history] == ["digits", "digits"]
    assert history[0]["date"] < history[1]["date"]
    first, night2 = two_nights["records"]
    assert [h["eval_id"] for h in history] == [first["eval_id"], night2["eval_id"]]
    assert history[1]["baseline_eval_id"] == first["eval_id"]
    assert history[1]["top1"] == night2["metrics"]["top1"] == first["metrics"]["top1"]
    assert "2.5.0" in history[1]["runtime_version"]
    assert "emulated rk3588" in history[1]["driver_version"]
    assert len(history[1]["per_class_top1"]) == 10
    # The reference came from the cache; the same model gives the same answers.
    assert night2["reference"]["cached"] is True
    assert night2["flipped"]["lost"] == [] and night2["flipped"]["compared"] == 1797
    assert night2["metrics"]["mcnemar_p"] == 1.0
    drop = [g for g in night2["gates"] if g["check"] == "max_drop"]
    assert drop and all(g["passed"] is True for g in drop)
    html = (ws.out / "report.html").read_text()
    assert trend_points(html, "top1") == 2
    assert trend_points(html, "top1_agreement") == 2


def test_the_report_loads_in_chromium_with_its_plots(two_nights, tmp_path):
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run must install it")
        pytest.skip("chromium is not installed here (apt-get install chromium); CI runs this")
    report = two_nights["ws"].out / "report.html"
    with Browser(window=(1200, 900)) as browser:
        browser.open(report.as_uri())
        assert browser.problems() == []
        assert browser.evaluate("document.title").startswith("digits: FAIL")
        ids = browser.evaluate("[...document.querySelectorAll('svg g[id]')].map(g => g.id)")
        for plot in (
            "trend-top1",
            "confusion",
            "cores-accuracy",
            "cores-cosine",
            "cores-throughput",
        ):
            assert plot in ids, plot
        assert browser.evaluate("document.querySelectorAll('#trend-top1-values use').length") == 2
        size = browser.evaluate(
            "(() => { const r = document.querySelector('#trend svg').getBoundingClientRect();"
            " return [r.width, r.height]; })()"
        )
        assert size[0] > 400 and size[1] > 150, size
        # Every image decoded, and nothing was fetched from anywhere.
        assert browser.evaluate("document.images.length") >= 12
        assert browser.evaluate("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert browser.evaluate("performance.getEntriesByType('resource').length") == 0
        shot = browser.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True
        )
    assert len(shot["data"]) > 10_000


@pytest.mark.slow  # 3 s; default-tier sibling: the detection eval names its skewed core
def test_a_core_that_computes_differently_fails_its_gate_and_is_named(tmp_path, demo_kit, fast_sim):
    # The float model on the device too, so healthy cores match the reference exactly and
    # the test does not depend on the job's device model.
    job = tmp_path / "skew.toml"
    job.write_text(
        f"""
[device]
model = "{demo_kit.models["digits"]}"
[device.runtime]
backend = "sim"
cores = [0, 2]
[device.runtime.sim]
faults = ["skew:core=2"]
[reference]
model = "{demo_kit.models["digits"]}"
[reference.runtime]
backend = "onnx"
cores = [0]
[dataset]
path = "{demo_kit.dataset}"
limit = 60
[metrics]
custom = ["{EXAMPLE_METRIC}:confidence"]
[gates.core_cosine_min]
min = 0.9999
[gates.margin_mean]
min = 0.5
"""
    )
    result = invoke("eval", job, "--no-progress")
    assert result.exit_code == 1, result.output + result.stderr
    assert "FAIL        core_cosine_min >= 0.9999 (floor)" in result.stdout
    assert "worst core 2" in result.stdout
    record = json.loads(
        next((tmp_path / "eval" / "skew" / "evals").glob("*/result.json")).read_text()
    )
    cores = {c["core"]: c for c in record["per_core"]}
    assert cores[0]["cosine_mean"] == pytest.approx(1.0)
    assert cores[2]["cosine_mean"] < 0.9999
    # The canary saw it too, and its advice names the job's key.
    assert any(
        "core 2 gives different outputs" in w and "device.runtime.cores" in w
        for w in record["device"]["warnings"]
    )
    # The custom metric ran, was gated and went into the history.
    assert record["metrics"]["margin_mean"] > 0.5
    history = pq.read_table(tmp_path / "eval" / "skew" / "history.parquet")
    assert history.column("margin_mean").to_pylist() == [record["metrics"]["margin_mean"]]


# A whole eval; default tier: the same leftovers in `run` (test_cli.py) and `bench`.
@pytest.mark.slow
def test_a_mac_zip_s_leftovers_change_neither_the_labels_nor_the_accuracy(
    tmp_path, demo_kit, fast_sim
):
    records = {}
    for name, junk in (("clean", False), ("unzipped", True)):
        data = digits_3_and_7(demo_kit.dataset, tmp_path / name, junk)
        job = tmp_path / f"{name}.toml"
        job.write_text(
            f"""
[device]
model = "{demo_kit.models["digits"]}"
[device.runtime]
backend = "sim"
cores = [0]
[dataset]
path = "{data}"
[gates.top1]
min = 0.99
"""
        )
        result = invoke("eval", job, "--no-progress")
        assert result.exit_code == 0, result.output + result.stderr
        record = next((tmp_path / "eval" / name / "evals").glob("*/result.json"))
        records[name] = (json.loads(record.read_text()), result.stderr)
    (clean, _), (unzipped, said) = records["clean"], records["unzipped"]
    assert unzipped["metrics"]["top1"] == clean["metrics"]["top1"] == 1.0
    items = pq.read_table(next((tmp_path / "eval" / "unzipped" / "evals").glob("*/items.parquet")))
    assert set(items.column("label").to_pylist()) == {3, 7}
    assert said.count("labels: class folders are integers: label = folder name") == 1
    leftovers = "other tools leave behind (never items or classes): ._* 1, Thumbs.db 1, __MACOSX 1"
    assert leftovers in said


# --------------------------------------------------------------------------- refusals
@pytest.fixture
def ws(tmp_path, demo_kit):
    return Workspace(tmp_path, demo_kit.root)


def test_a_misspelt_key_exits_2_and_names_it(ws):
    ws.job.write_text(ws.job.read_text().replace("instances_per_core", "instances_per_cor"))
    line = one_error_line(invoke("eval", ws.job), 2)
    assert str(ws.job) in line
    assert "device.runtime.instances_per_cor is not a setting" in line
    assert "did you mean device.runtime.instances_per_core?" in line
    assert not ws.out.exists()


def test_a_bad_ray_address_exits_2_naming_the_flag_or_the_key(ws):
    """Checked before anything runs; the message names what the user wrote."""
    line = one_error_line(invoke("eval", ws.job, "--ray", "local:x"), 2)
    assert "--ray 'local:x' is not a number of simulated nodes" in line
    assert not ws.out.exists()
    ws.job.write_text(ws.job.read_text() + '[device.ray]\naddress = "local:0"\n')
    line = one_error_line(invoke("eval", ws.job), 2)
    assert "device.ray.address 'local:0' is not a number of simulated nodes" in line
    assert not ws.out.exists()


def test_a_missing_dataset_exits_2_with_one_sentence(ws, demo_kit):
    (ws.root / "demo").unlink()  # the models are there, the dataset is not
    (ws.root / "demo").mkdir()
    (ws.root / "demo" / "models").symlink_to(demo_kit.root / "models")
    line = one_error_line(invoke("eval", ws.job), 2)
    assert f"{ws.job}: dataset.path {ws.root / 'demo' / 'dataset'} does not exist" in line
    assert not ws.out.exists()


def test_engine_settings_are_named_as_job_keys(ws):
    ws.job.write_text(ws.job.read_text().replace("cores = [0, 1, 2]", "cores = [0, 7]"))
    line = one_error_line(invoke("eval", ws.job), 2)
    assert f"{ws.job}: device.runtime.cores 0,7 is not a list of distinct NPU cores" in line
    assert "--cores" not in line
    ws.job.write_text(
        ws.job.read_text().replace("cores = [0, 7]", "cores = [0, 1, 2]")
        + "\n[reference.preprocess]\nsize = [4, 4]\n"
    )
    line = one_error_line(invoke("eval", ws.job), 2)
    assert "reference.preprocess.size 4x4 does not fit the model" in line
    assert not ws.out.exists()


def test_an_evaluation_running_on_the_same_outputs_is_refused_with_exit_3(ws):
    with OutLock(ws.out, command="batchinfer eval jobs/digits.toml"):
        line = one_error_line(invoke("eval", ws.job), 3)
    assert "in use by another evaluation" in line
    assert f"pid {os.getpid()}" in line and "batchinfer eval jobs/digits.toml" in line
    assert not (ws.out / "history.parquet").exists()


def test_deleting_the_lock_file_of_a_held_history_folder_does_not_let_a_second_one_in(ws):
    with OutLock(ws.out, command="batchinfer eval jobs/digits.toml"):
        (ws.out / ".batchinfer.lock").unlink()  # the lock is on the folder itself
        line = one_error_line(invoke("eval", ws.job), 3)
    assert "in use by another evaluation" in line
    assert not (ws.out / "history.parquet").exists()


def test_without_matplotlib_there_is_no_report_and_a_warning_says_why(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.delitem(sys.modules, "batchinfer.evaluate.report", raising=False)
    job = SimpleNamespace(name="x", outputs=SimpleNamespace(report=tmp_path / "report.html"))
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("batchinfer").addHandler(handler)
    try:
        assert _write_report(job, {}, None, tmp_path) is None
    finally:
        logging.getLogger("batchinfer").removeHandler(handler)
    (warning,) = [r.getMessage() for r in seen]
    assert "no HTML report: matplotlib is not installed" in warning
    assert "pip install 'batchinfer[plot]'" in warning
    assert not list(tmp_path.iterdir())
