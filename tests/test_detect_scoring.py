"""Detection scores: faster-coco-eval against pycocotools, the re-weighted matching against
faster-coco-eval, per-group (per-core) scores, the paired bootstrap, and box disagreement."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pytest
from detection_data import detector, ground_truth

from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.scorers.coco import (
    IOU_THRESHOLDS,
    disagreement,
    score_detections,
    score_groups,
)
from batchinfer.evaluate.scorers.coco_bootstrap import (
    match_images,
    paired_bootstrap,
    resample_weights,
    weighted_map,
)


def pycocotools_eval(gt: GroundTruth, results: list[dict], image_ids=None):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt.coco()
        coco.createIndex()
        dets = coco.loadRes(copy.deepcopy(results))
        ev = COCOeval(coco, dets, "bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted(image_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_agrees_with_pycocotools(seed):
    pytest.importorskip("pycocotools")
    gt = ground_truth(seed, images=150)
    results = detector(gt, seed + 100)
    ours = score_detections(gt, results)
    ref = pycocotools_eval(gt, results)
    assert ours.map50_95 == pytest.approx(ref.stats[0], abs=1e-4)
    assert ours.map50 == pytest.approx(ref.stats[1], abs=1e-4)
    assert ours.map75 == pytest.approx(ref.stats[2], abs=1e-4)
    precision = ref.eval["precision"][:, :, :, 0, -1]
    assert np.abs(ours.precision - precision).max() < 1e-4
    # Per-class AP as pycocotools' array gives it.
    for k, row in enumerate(ours.per_class()):
        p = precision[:, :, k]
        assert row["ap50_95"] == pytest.approx(p[p > -1].mean(), abs=1e-4)
        assert row["ap50"] == pytest.approx(p[0][p[0] > -1].mean(), abs=1e-4)
    # The scores are not degenerate: a case where every number is 0 or 1 proves nothing.
    assert 0.1 < ours.map50_95 < ours.map50 < 0.95


def test_a_subset_of_images_agrees_with_pycocotools():
    pytest.importorskip("pycocotools")
    gt = ground_truth(7, images=120)
    results = detector(gt, 8)
    subset = list(range(1, 121, 3))
    ours = score_detections(gt, results, subset)
    ref = pycocotools_eval(gt, results, subset)
    assert ours.images == len(subset)
    assert ours.map50_95 == pytest.approx(ref.stats[0], abs=1e-4)


def test_classes_without_ground_truth_are_left_out_and_missed_classes_score_zero():
    gt = ground_truth(3, images=40, classes=4)
    # Drop every box of class 4 from the ground truth, and every detection of class 2.
    gt = GroundTruth(
        gt.source, gt.categories, gt.image_ids, gt.images,
        tuple(a for a in gt.annotations if a["category_id"] != 4), (), (),
    )  # fmt: skip
    results = [r for r in detector(gt, 4) if r["category_id"] != 2]
    rows = {r["category_id"]: r for r in score_detections(gt, results).per_class()}
    assert rows[4]["ap50_95"] is None and rows[4]["gt_boxes"] == 0
    assert rows[2]["ap50_95"] == 0.0 and rows[2]["detections"] == 0
    score = score_detections(gt, results)
    expected = np.mean([rows[c]["ap50_95"] for c in (1, 2, 3)])
    assert score.map50_95 == pytest.approx(expected, abs=1e-12)
    curves = score.pr_curves()
    assert [c["category_id"] for c in curves["per_class"]] == [1, 2, 3]
    assert len(curves["recall"]) == len(curves["overall"]) == 101


def test_no_detections_and_no_images():
    gt = ground_truth(5, images=20)
    assert score_detections(gt, []).map50_95 == 0.0
    empty = score_detections(gt, [], image_ids=[])
    assert empty.map50_95 is None and empty.metrics() == {}


def test_a_detection_on_an_image_the_ground_truth_lacks_is_refused():
    gt = ground_truth(5, images=5)
    with pytest.raises(ValueError, match="image 99"):
        score_detections(gt, [{"image_id": 99, "category_id": 1, "bbox": [0, 0, 1, 1],
                               "score": 0.5}])  # fmt: skip


# --------------------------------------------------------------------------- re-weighting
@pytest.mark.parametrize("seed", [0, 11])
def test_matching_once_and_reweighting_gives_faster_coco_evals_numbers(seed):
    gt = ground_truth(seed, images=120)
    results = detector(gt, seed + 1)
    matches = match_images(gt, results)
    ones = weighted_map(matches, np.ones(len(matches.image_ids)))[0]
    score = score_detections(gt, results)
    assert ones == pytest.approx([score.map50_95, score.map50], abs=1e-9)
    # A resample counts an image drawn k times k times: the same as scoring a dataset in
    # which that image (its boxes and detections) is copied k times.
    weights = resample_weights(len(matches.image_ids), 3, seed)
    reweighted = weighted_map(matches, weights)
    for b in range(3):
        images, annotations, copies = [], [], []
        for pos, image_id in enumerate(matches.image_ids):
            for _ in range(int(weights[b, pos])):
                new = len(images) + 1
                images.append({"id": new, "file_name": str(new)})
                annotations += [
                    {**a, "id": len(annotations) + 1 + j, "image_id": new}
                    for j, a in enumerate(a for a in gt.annotations if a["image_id"] == image_id)
                ]
                copies += [{**r, "image_id": new} for r in results if r["image_id"] == image_id]
        copied = GroundTruth({}, gt.categories, {}, tuple(images), tuple(annotations), (), ())
        expected = score_detections(copied, copies)
        assert reweighted[b] == pytest.approx([expected.map50_95, expected.map50], abs=1e-9)


def test_resample_weights_draw_n_images_each_time():
    w = resample_weights(50, 7, seed=3)
    assert w.shape == (7, 50) and (w.sum(axis=1) == 50).all()
    assert (w == resample_weights(50, 7, seed=3)).all()
    assert not (w == resample_weights(50, 7, seed=4)).all()


# --------------------------------------------------------------------------- per core
def test_per_group_scores_show_the_bad_core():
    gt = ground_truth(21, images=90)
    core_of = {image["id"]: image["id"] % 3 for image in gt.images}
    good = detector(gt, 22, jitter=0.03)
    bad = detector(gt, 23, jitter=0.25)  # core 2 computes badly
    results = [r for r in good if core_of[r["image_id"]] != 2]
    results += [r for r in bad if core_of[r["image_id"]] == 2]
    scores = score_groups(gt, results, core_of)
    assert sorted(scores) == [0, 1, 2]
    worst = min(scores, key=lambda c: scores[c].map50_95)
    assert worst == 2
    assert scores[2].map50_95 < scores[0].map50_95 - 0.15
    subset = [i for i, c in core_of.items() if c == 1]
    assert scores[1].map50_95 == score_detections(gt, results, subset).map50_95
    assert scores[1].images == 30


# --------------------------------------------------------------------------- bootstrap
def test_bootstrap_is_deterministic_for_a_seed():
    gt = ground_truth(31, images=80)
    a, b = detector(gt, 1), detector(gt, 2)
    first = paired_bootstrap(gt, a, b, resamples=60, seed=5)
    again = paired_bootstrap(gt, a, b, resamples=60, seed=5)
    other = paired_bootstrap(gt, a, b, resamples=60, seed=6)
    assert first == again
    assert first["map50_95"].low != other["map50_95"].low
    assert first["map50_95"].difference == other["map50_95"].difference  # not resampled


def test_bootstrap_finds_an_obvious_difference_significant():
    gt = ground_truth(41, images=150)
    good = detector(gt, 1, recall=0.9, jitter=0.05)
    worse = detector(gt, 2, recall=0.6, jitter=0.12)
    result = paired_bootstrap(gt, good, worse, resamples=200, seed=0)["map50_95"]
    assert result.difference > 0.1
    assert 0 < result.low <= result.difference <= result.high
    assert result.p_value == pytest.approx(2 / 201)  # no resample on the other side of 0
    assert result.images == 150 and result.resamples == 200


def test_bootstrap_does_not_call_two_equally_good_detectors_different():
    gt = ground_truth(41, images=150)
    # Two detectors of the same quality, with noise of their own.
    one, two = detector(gt, 1), detector(gt, 2)
    result = paired_bootstrap(gt, one, two, resamples=200, seed=0)["map50_95"]
    assert abs(result.difference) < 0.03
    assert result.low < 0 < result.high
    assert result.p_value > 0.05
    same = paired_bootstrap(gt, one, one, resamples=50, seed=0)["map50"]
    assert same.difference == same.low == same.high == 0.0 and same.p_value == 1.0


def test_bootstrap_on_a_subset_of_images():
    gt = ground_truth(41, images=60)
    a, b = detector(gt, 1), detector(gt, 2)
    result = paired_bootstrap(gt, a, b, image_ids=range(1, 31), resamples=20)["map50"]
    assert result.images == 30
    assert result.a == pytest.approx(score_detections(gt, a, range(1, 31)).map50, abs=1e-9)


# --------------------------------------------------------------------------- disagreement
def test_disagreement_of_two_box_sets():
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 40]], dtype=float)
    classes = np.array([0, 1])
    none = np.zeros((0, 4))
    assert disagreement(boxes, classes, boxes, classes) == 0.0
    assert disagreement(none, [], none, []) == 0.0
    assert disagreement(boxes, classes, none, []) == 1.0
    assert disagreement(boxes, classes, boxes, np.array([1, 0])) == 1.0  # classes swapped
    shifted = boxes + np.array([0, 0, 0, 2.5])  # first box IoU 0.8, second 20x20 -> 20x22.5
    d = disagreement(boxes, classes, shifted, classes)
    assert d == pytest.approx(1 - (0.8 + 400 / 450) / 2)
    # One box found by only one side: soft F1 = 2 x 1 / 3.
    assert disagreement(boxes, classes, boxes[:1], classes[:1]) == pytest.approx(1 / 3)


def test_iou_thresholds_are_cocos():
    assert IOU_THRESHOLDS.tolist() == pytest.approx([0.5 + 0.05 * i for i in range(10)])
