"""The demo detector's int8 accuracy in rknn-toolkit2's simulator (``toolkit`` marker):
``jobs/detect-digits-toolkit.toml`` as shipped, on the first images of the demo's
detection set.

Run in the toolkit's environment: ``.venv-toolkit/bin/pytest -m toolkit``. Skipped wherever
``rknn.api`` cannot be imported, or faster-coco-eval (which scores the boxes) is missing.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchinfer import demo
from batchinfer.cli import main

pytestmark = pytest.mark.toolkit

JOB = Path(__file__).resolve().parents[1] / "jobs" / "detect-digits-toolkit.toml"


def _toolkit_importable() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import rknn.api  # noqa: F401
        except Exception:
            return False
    return True


if not _toolkit_importable():
    pytest.skip(
        "rknn-toolkit2 is not installed here (bash tools/toolkit-env.sh makes its environment)",
        allow_module_level=True,
    )
pytest.importorskip("faster_coco_eval")


def test_the_toolkit_detection_job_scores_the_int8_detector(tmp_path, monkeypatch):
    from batchinfer.runtime import toolkit

    monkeypatch.setenv(toolkit.CACHE_ENV, str(tmp_path / "cache"))
    demo.write_demo(tmp_path / "demo")
    (tmp_path / "jobs").mkdir()
    job = tmp_path / "jobs" / JOB.name
    # The job as shipped, on the first 60 of the 500 images (the build and the simulator
    # cost CPU time; 60 images still carry about 200 boxes).
    text = JOB.read_text().replace(
        'ground_truth = "../demo/detection/instances.json"\n',
        'ground_truth = "../demo/detection/instances.json"\nlimit = 60\n',
    )
    assert "limit = 60" in text
    job.write_text(text)
    result = CliRunner().invoke(main, ["eval", str(job), "--no-progress"])
    assert result.exit_code == 0, result.output + result.stderr
    assert "(detection): PASS" in result.stdout
    (record_file,) = (tmp_path / "eval" / "detect-digits-toolkit" / "evals").glob("*/result.json")
    record = json.loads(record_file.read_text())
    metrics = record["metrics"]
    assert record["device"]["backend"] == "toolkit"
    assert metrics["errors"] == 0
    # The int8 model finds the digits (on all 500 images: mAP50 0.893, docs/guide/eval.md) and loses
    # little against the float graph it was converted from.
    assert metrics["map50"] > 0.8 and metrics["reference.map50"] > 0.8
    assert abs(metrics["map_drop"]) < 0.03
    assert record["dataset"]["evaluated"] == 60 and record["ground_truth"]["images"] == 60
