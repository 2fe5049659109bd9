"""The images a detection report shows (issue 40 #16): before, only where device and
reference disagreed (the shipped job, the float graph on both sides, showed none), with
every box of the job's conf 0.001 drawn (117-174 per image) and no ground truth. Now every
report shows ``metrics.worst`` images, boxes from ``metrics.display_conf`` up, the ground
truth beside the predictions."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from batchinfer.evaluate.groundtruth import Category, GroundTruth
from batchinfer.evaluate.scorers.instances_examples import PANEL_SIDE, detection_examples
from batchinfer.evaluate.scorers.instances_items import DetectionItems
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs

IDS = ["a.png", "b.png", "c.png", "d.png"]
#: One object per image (class 0, "red"; category id 1), at the same place.
TRUTH = (10.0, 10.0, 30.0, 30.0)


def ground_truth() -> GroundTruth:
    images = tuple({"id": k + 1, "file_name": i, "width": 64, "height": 64}
                   for k, i in enumerate(IDS))  # fmt: skip
    x1, y1, x2, y2 = TRUTH
    annotations = tuple(
        {"id": k + 1, "image_id": k + 1, "category_id": 1, "bbox": [x1, y1, x2 - x1, y2 - y1],
         "area": (x2 - x1) * (y2 - y1), "iscrowd": 0}
        for k in range(len(IDS))
    )  # fmt: skip
    return GroundTruth(
        {"format": "coco", "path": "gt.json"}, (Category(1, "red"), Category(2, "green")),
        {i: k + 1 for k, i in enumerate(IDS)}, images, annotations, (), (),
    )  # fmt: skip


def found(extra_low: int = 0, cls: int = 0, shift: float = 0.0, score: float = 0.9) -> np.ndarray:
    """The object found (``cls``, moved by ``shift``) plus ``extra_low`` boxes at 0.01."""
    x1, y1, x2, y2 = TRUTH
    rows = [[x1 + shift, y1, x2 + shift, y2, score, cls]]
    rows += [[0.0, 0.0, 5.0 + k, 5.0, 0.01, 1] for k in range(extra_low)]
    return np.array(rows, dtype=np.float32)


def detections(boxes: list[np.ndarray]) -> DetectionItems:
    n = len(boxes)
    return DetectionItems(
        index=np.arange(n, dtype=np.int64), id=np.array(IDS[:n], dtype=object),
        core=np.zeros(n, dtype=np.int64), node=np.full(n, None, dtype=object),
        error=np.full(n, None, dtype=object), boxes=boxes,
        width=np.full(n, 64, dtype=np.int64), height=np.full(n, 64, dtype=np.int64),
        names=("red", "green"),
    )  # fmt: skip


def dataset(root: Path) -> SimpleNamespace:
    return SimpleNamespace(root=root, paths_of=lambda ids: {i: str(root / i) for i in ids})


def test_every_report_shows_images_even_where_device_and_reference_agree(tmp_path):
    # The shipped job's case: the same boxes on both sides, 150 low-score boxes per image.
    device = detections([found(150) for _ in IDS])
    reference = detections([found(150) for _ in IDS])
    inputs = DetectInputs(device, ground_truth(), [1, 2], reference)
    shown = detection_examples(inputs, dataset(tmp_path), 3, 0.25)
    assert [s["id"] for s in shown] == IDS[:3]  # none disagrees: examples in dataset order
    assert {s["why"] for s in shown} == {"example"}
    first = shown[0]
    assert first["device_all"] == 151 and first["reference_all"] == 151
    assert [b["score"] for b in first["device_boxes"]] == [pytest.approx(0.9)]  # >= 0.25 only
    assert len(first["reference_boxes"]) == 1
    assert first["truth_boxes"] == [{"class_id": 0, "label": "red", "score": None,
                                     "x1": 10.0, "y1": 10.0, "x2": 30.0, "y2": 30.0}]  # fmt: skip
    assert first["disagreement"] == 0.0 and first["truth_disagreement"] == 0.0
    assert first["path"] == str(tmp_path / "a.png")


def test_disagreements_first_then_the_images_furthest_from_the_ground_truth(tmp_path):
    device = detections([found(), found(cls=1), found(extra_low=3), found(shift=12.0)])
    reference = detections([found(), found(cls=1), found(), found(shift=12.0)])
    inputs = DetectInputs(device, ground_truth(), [1, 2], reference)
    shown = detection_examples(inputs, dataset(tmp_path), 4, 0.25)
    # c: extra low boxes the reference lacks; b: the wrong class, d: moved off the object
    # (IoU 0.25 < 0.5): both miss it; a: right.
    assert [(s["id"], s["why"]) for s in shown] == [
        ("c.png", "reference"), ("b.png", "ground truth"), ("d.png", "ground truth"),
        ("a.png", "example"),
    ]  # fmt: skip
    assert shown[1]["truth_disagreement"] == 1.0 and shown[1]["device_boxes"][0]["label"] == (
        "green"
    )
    # Fewer wanted: the reference's first, then the ground truth's; none: none.
    assert [s["id"] for s in detection_examples(inputs, dataset(tmp_path), 2, 0.25)] == [
        "c.png", "b.png"
    ]  # fmt: skip
    assert detection_examples(inputs, dataset(tmp_path), 0, 0.25) == []


def test_the_display_threshold_keeps_what_scores_at_least_it(tmp_path):
    device = detections([found(score=0.3), found(score=0.2)])
    inputs = DetectInputs(device, ground_truth(), [1, 2])
    shown = detection_examples(inputs, dataset(tmp_path), 2, 0.3)
    by_id = {s["id"]: s for s in shown}
    assert len(by_id["a.png"]["device_boxes"]) == 1 and by_id["b.png"]["device_boxes"] == []
    assert by_id["b.png"]["why"] == "ground truth"  # nothing shown where an object is
    assert by_id["a.png"]["reference_boxes"] is None and by_id["a.png"]["disagreement"] is None


def test_the_report_draws_the_ground_truth_beside_each_sides_boxes(tmp_path):
    pytest.importorskip("matplotlib")
    from batchinfer.evaluate.scorers.instances import InstancesScorer
    from batchinfer.evaluate.scorers.instances_report import _gallery
    from batchinfer.evaluate.thumbnails import PANEL_FIT, Thumbnail, picture

    for name in IDS:
        Image.new("RGB", (64, 64), (200, 200, 200)).save(tmp_path / name)
    device = detections([found(150) for _ in IDS])
    inputs = DetectInputs(device, ground_truth(), [1, 2], detections([found(150) for _ in IDS]))
    worst = detection_examples(inputs, dataset(tmp_path), 2, 0.25)
    record = {"worst": worst, "display_conf": 0.25, "reference": {"model": "r"}}
    # The pictures the report's picture child makes (here in this process: no child).
    pictures = {
        source: Thumbnail(*picture(source, PANEL_SIDE, None, None, PANEL_FIT))
        for source in InstancesScorer.shown_items(record)
    }
    page = _gallery(record, pictures)
    assert page.count("<div class=shot>") == 2
    assert page.count("src='data:image/jpeg;base64,") == 6  # truth, device, reference
    assert "ground truth: 1 box</figcaption>" in page
    assert "device: 1 box &gt;= 0.25 (of 151)" in page
    assert "reference: 1 box &gt;= 0.25 (of 151)" in page
