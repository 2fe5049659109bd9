"""The night ``--update-baseline`` accepts the first baseline (issue 40 #17): the summary
and the report said "No baseline yet: accept this evaluation with --update-baseline" on the
very evaluation that flag had just accepted. The classification job's first night is
checked end to end in test_eval_end_to_end.py; these check the detection summary and the
report's paragraph on records."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.evaluate.scorers.instances import InstancesScorer
from batchinfer.evaluate.summary import markdown_summary


def detection_summary(record: dict, report: Path) -> str:
    return markdown_summary(record, report, InstancesScorer)


def detection_record(**extra: object) -> dict:
    device = {"model": "/m/det.onnx", "model_sha256": "0" * 64, "backend": "sim",
              "cores": [0], "warnings": []}  # fmt: skip
    return {
        "job": "night", "verdict": "pass", "device": device, "reference": None,
        "metrics": {"map50_95": 0.5},
        "ground_truth": {"images": 3, "annotations": 4, "unmatched_items": 0, "unknown_images": 0},
        "dataset": {"evaluated": 3}, "eval_id": "e1", "gates": [], "per_core": [],
        "vs_reference": None, "vs_baseline": None, "errors": [], **extra,
    }  # fmt: skip


def test_the_detection_summary_of_the_accepting_night_says_it_is_the_baseline():
    accepted = detection_summary(detection_record(accepted_as_baseline=True), Path("r.html"))
    assert "No baseline yet" not in accepted
    assert (
        "No baseline before this evaluation: `--update-baseline` accepted it as the "
        "baseline, so the next evaluation is compared with it." in accepted
    )
    plain = detection_summary(detection_record(), Path("r.html"))
    assert "No baseline yet: accept this evaluation with `--update-baseline`." in plain


def test_the_report_paragraph_of_the_accepting_night_says_it_is_the_baseline():
    pytest.importorskip("matplotlib")
    from batchinfer.evaluate.report import no_baseline_html

    words = no_baseline_html({"accepted_as_baseline": True})
    assert "No baseline yet" not in words
    assert "<code>--update-baseline</code> accepted it as the baseline" in words
    assert "accept an evaluation with" in no_baseline_html({})
