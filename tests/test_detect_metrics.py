"""Detection metrics on per-item boxes: COCO scores through the predictions' rows, error
rows, per core, against the reference and the baseline; and the items table round trip."""

from __future__ import annotations

import numpy as np
import pytest
from detection_data import HEIGHT, WIDTH, detector, ground_truth

from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.metrics import score
from batchinfer.evaluate.scorers.coco import score_detections
from batchinfer.evaluate.scorers.instances_items import DetectionItems, coco_predictions
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs, detection_metrics


def as_items(
    gt: GroundTruth,
    results: list[dict],
    cores: dict[str, int] | None = None,
    errors: set[str] = frozenset(),
    extra: tuple[str, ...] = (),
) -> DetectionItems:
    """The rows a detection run would give for ``results`` (category c -> class c - 1);
    ``extra`` items are in the dataset but not in the ground truth."""
    ids = [i["file_name"] for i in gt.images] + list(extra)
    by_image: dict[int, list] = {}
    for r in results:
        x, y, w, h = r["bbox"]
        by_image.setdefault(r["image_id"], []).append(
            [x, y, x + w, y + h, r["score"], r["category_id"] - 1]
        )
    boxes = []
    for item in ids:
        if item in errors:
            boxes.append(None)
            continue
        b = np.array(by_image.get(gt.image_ids.get(item), []), dtype=np.float32).reshape(-1, 6)
        boxes.append(b[np.argsort(-b[:, 4], kind="stable")])
    n = len(ids)
    return DetectionItems(
        index=np.arange(n),
        id=np.array(ids, dtype=object),
        core=np.array([(cores or {}).get(i, 0) for i in ids], dtype=np.int64),
        node=np.full(n, None, dtype=object),
        error=np.array(["failed" if i in errors else None for i in ids], dtype=object),
        boxes=boxes,
        width=np.full(n, WIDTH),
        height=np.full(n, HEIGHT),
        names=tuple(c.name for c in gt.categories),
    )


CATS = [1, 2, 3, 4, 5, 6]


def test_scores_through_the_rows_match_scoring_the_results():
    gt = ground_truth(1, images=80)
    results = detector(gt, 2)
    items = as_items(gt, results, extra=("not-annotated.jpg",))
    x = DetectInputs(items, gt, CATS)
    # coco_results rounds boxes to 3 decimals and scores to 5: the same mAP to 1e-4.
    direct = score_detections(gt, results)
    assert x.score.map50_95 == pytest.approx(direct.map50_95, abs=1e-4)
    assert x.score.map50 == pytest.approx(direct.map50, abs=1e-4)
    # The item without ground truth is not scored (and coco_results is not asked about it).
    assert len(x.results) == len(results)


def test_an_error_row_counts_as_an_image_with_no_detection():
    gt = ground_truth(1, images=80)
    results = detector(gt, 2)
    failed = {i["file_name"] for i in gt.images[:20]}
    x = DetectInputs(as_items(gt, results, errors=failed), gt, CATS)
    kept = [r for r in results if r["image_id"] > 20]
    assert x.score.map50_95 == pytest.approx(score_detections(gt, kept).map50_95, abs=1e-4)
    assert x.score.map50_95 < DetectInputs(as_items(gt, results), gt, CATS).score.map50_95
    metrics = score(x, detection_metrics(), [])
    assert metrics["errors"] == 20.0


def test_per_core_rows_name_the_core_that_computes_badly():
    gt = ground_truth(5, images=90)
    cores = {i["file_name"]: i["id"] % 3 for i in gt.images}
    good, bad = detector(gt, 1, jitter=0.03), detector(gt, 2, jitter=0.3)
    results = [r for r in good if r["image_id"] % 3 != 1] + [
        r for r in bad if r["image_id"] % 3 == 1
    ]
    stats = [{"core": c, "node": None, "items_per_s": 10.0 + c} for c in range(3)]
    stats.append({"core": None, "items_per_s": 33.0})
    x = DetectInputs(as_items(gt, results, cores), gt, CATS, core_stats=stats)
    rows = {r["core"]: r for r in x.per_core}
    assert sorted(rows) == [0, 1, 2]
    assert all(r["images"] == 30 and r["items"] == 30 for r in rows.values())
    assert min(rows, key=lambda c: rows[c]["map50_95"]) == 1
    assert rows[2]["items_per_s"] == 12.0
    metrics = score(x, detection_metrics(), [])
    assert metrics["core_map_min"] == rows[1]["map50_95"]
    assert metrics["core_map_spread"] == pytest.approx(
        max(r["map50_95"] for r in rows.values()) - rows[1]["map50_95"]
    )
    assert metrics["items_per_s"] == 33.0


def test_against_the_reference():
    gt = ground_truth(9, images=120)
    device = as_items(gt, detector(gt, 1, recall=0.7, jitter=0.1))
    reference = as_items(gt, detector(gt, 2, recall=0.95, jitter=0.03))
    x = DetectInputs(device, gt, CATS, reference, resamples=200)
    metrics = score(x, detection_metrics(), [])
    assert metrics["reference.map50_95"] == pytest.approx(x.reference_score.map50_95)
    assert metrics["map_drop"] == pytest.approx(metrics["reference.map50_95"] - metrics["map50_95"])
    assert metrics["map_drop"] > 0.1 and metrics["map_drop_p"] < 0.05
    assert 0 < metrics["box_disagreement_mean"] < 1
    same = score(DetectInputs(device, gt, CATS, device, resamples=50), detection_metrics(), [])
    assert same["map_drop"] == 0.0 and same["box_disagreement_mean"] == 0.0
    assert same["map_drop_p"] == 1.0
    assert "map_bootstrap_p" not in metrics  # no baseline


def test_against_the_baseline_on_the_images_both_have():
    gt = ground_truth(9, images=100)
    now = as_items(gt, detector(gt, 1))
    # The baseline ran on the first 60 images only.
    before_all = as_items(gt, detector(gt, 1, recall=0.5))
    keep = slice(0, 60)
    before = DetectionItems(
        before_all.index[keep], before_all.id[keep], before_all.core[keep],
        before_all.node[keep], before_all.error[keep], before_all.boxes[keep],
        before_all.width[keep], before_all.height[keep], before_all.names,
    )  # fmt: skip
    x = DetectInputs(now, gt, CATS, baseline=before, resamples=200)
    assert len(x.compared_with_baseline) == 60
    result = x.vs_baseline["map50_95"]
    first60 = range(1, 61)
    expected_now = score_detections(gt, detector(gt, 1), first60).map50_95
    assert result.a == pytest.approx(expected_now, abs=1e-4)
    assert result.images == 60 and result.difference > 0.05 and result.p_value < 0.05
    assert score(x, detection_metrics(), [])["map_bootstrap_p"] == result.p_value


def test_unmatched_and_unknown_counts_are_metrics():
    gt = ground_truth(3, images=10)
    gt = GroundTruth(gt.source, gt.categories, gt.image_ids, gt.images, gt.annotations,
                     ("a.jpg", "b.jpg"), ("gone.jpg",))  # fmt: skip
    metrics = score(DetectInputs(as_items(gt, []), gt, CATS), detection_metrics(), [])
    assert metrics["unmatched_items"] == 2.0 and metrics["unknown_images"] == 1.0
    assert metrics["map50_95"] == 0.0


def test_items_table_round_trip_keeps_boxes_errors_and_names():
    gt = ground_truth(4, images=12)
    items = as_items(gt, detector(gt, 1), errors={"3.jpg"})
    back = DetectionItems.from_table(items.to_table())
    assert back.names == items.names
    assert back.error.tolist() == items.error.tolist()
    assert back.boxes[2] is None and items.boxes[2] is None
    for a, b in zip(items.boxes, back.boxes, strict=True):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    assert back.n_boxes.tolist() == items.n_boxes.tolist()
    rows = items.to_table().column("boxes").to_pylist()
    assert rows[0][0]["label"] == items.names[int(items.boxes[0][0, 5])]
    assert coco_predictions(back, gt, CATS) == coco_predictions(items, gt, CATS)
