"""The demo segmenter's and pose model's int8 accuracy in rknn-toolkit2's simulator
(``toolkit`` marker): ``jobs/segment-digits-toolkit.toml`` and
``jobs/pose-digits-toolkit.toml`` as shipped, on the first images of the demo's detection
set (as tests/test_detect_toolkit.py does for the detector).

Run in the toolkit's environment: ``.venv-toolkit/bin/pytest -m toolkit``. Skipped wherever
``rknn.api`` cannot be imported, or faster-coco-eval is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_detect_toolkit import _toolkit_importable

from batchinfer import demo
from batchinfer.cli import main

pytestmark = pytest.mark.toolkit
JOBS = Path(__file__).resolve().parents[1] / "jobs"


if not _toolkit_importable():
    pytest.skip(
        "rknn-toolkit2 is not installed here (bash tools/toolkit-env.sh makes its environment)",
        allow_module_level=True,
    )
pytest.importorskip("faster_coco_eval")


@pytest.mark.parametrize(
    ("task", "truth", "part"),
    [("segment", "instances-seg.json", "segm"), ("pose", "instances-pose.json", "kpt")],
)
def test_the_toolkit_job_scores_the_int8_model(tmp_path, monkeypatch, task, truth, part):
    from batchinfer.runtime import toolkit

    monkeypatch.setenv(toolkit.CACHE_ENV, str(tmp_path / "cache"))
    demo.write_demo(tmp_path / "demo")
    (tmp_path / "jobs").mkdir()
    shipped = JOBS / f"{task}-digits-toolkit.toml"
    line = f'ground_truth = "../demo/detection/{truth}"\n'
    text = shipped.read_text().replace(line, line + "limit = 40\n")
    assert "limit = 40" in text
    job = tmp_path / "jobs" / shipped.name
    job.write_text(text)
    result = CliRunner().invoke(main, ["eval", str(job), "--no-progress"])
    assert result.exit_code == 0, result.output + result.stderr
    (record_file,) = (tmp_path / "eval" / job.stem / "evals").glob("*/result.json")
    record = json.loads(record_file.read_text())
    metrics = record["metrics"]
    assert record["device"]["backend"] == "toolkit" and metrics["errors"] == 0
    # On all 500 images the int8 model scores within a point of the float one
    # (demo/assets/SEGMENTER.md, POSE.md).
    assert metrics[f"{part}_map50"] > 0.75 and abs(metrics[f"{part}_map_drop"]) < 0.03
