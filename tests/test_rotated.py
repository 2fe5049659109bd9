"""Rotated boxes: polygon IoU, ProbIoU, rotated NMS and DOTA-style mAP against plain-Python
references written apart from the library (tests/rotated_reference.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import rotated_reference as ref  # tests/ is on sys.path under pytest

from batchinfer.detect import rotated_nms as rotated_nms_module
from batchinfer.detect.rotated import (
    corners,
    polygon_iou_pairs,
    probiou_pairs,
    regularize,
    rotated_iou_matrix,
)
from batchinfer.detect.rotated_ap import ImagePredictions, ImageTruth, rotated_map, voc_ap
from batchinfer.detect.rotated_nms import rotated_nms


def _boxes(rng: np.random.Generator, n: int, spread: float = 60.0) -> np.ndarray:
    return np.column_stack(
        [
            rng.uniform(0, spread, (n, 2)),
            rng.uniform(2, 40, (n, 2)),
            rng.uniform(-4, 4, n),
        ]
    )


def test_polygon_iou_matches_the_hull_reference_on_random_pairs() -> None:
    rng = np.random.default_rng(1)
    a, b = _boxes(rng, 400), _boxes(rng, 400)
    got = polygon_iou_pairs(corners(a), corners(b))
    want = [ref.polygon_iou(ref.corners(x), ref.corners(y)) for x, y in zip(a, b, strict=True)]
    assert np.count_nonzero(np.asarray(want) > 0.05) > 50  # many pairs do overlap
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_polygon_iou_special_cases() -> None:
    square = np.array([[10, 10, 4, 4, 0.0]])
    # identical, contained, disjoint, touching, and the same square turned 90 degrees
    others = np.array(
        [[10, 10, 4, 4, 0.0], [10, 10, 2, 2, 0.3], [30, 30, 4, 4, 0.0], [14, 10, 4, 4, 0.0],
         [10, 10, 4, 4, math.pi / 2], [10, 10, 4, 4, math.pi / 4]]
    )  # fmt: skip
    got = polygon_iou_pairs(corners(np.repeat(square, len(others), 0)), corners(others))
    # a square and its 45-degree turn: the octagon 8 (sqrt(2) - 1) * 4 ... over the union
    octagon = 32 * (math.sqrt(2) - 1)
    want = [1.0, 4 / 16, 0.0, 0.0, 1.0, octagon / (32 - octagon)]
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_polygon_iou_near_degenerate_pairs() -> None:
    """Boxes equal but for float noise, boxes sharing an edge's line, a box of no area."""
    rng = np.random.default_rng(4)
    a = _boxes(rng, 300)
    a[::2, 4] = 0.0  # axis-aligned: edges exactly on the other box's lines
    noisy = a + rng.normal(0, 1e-12, a.shape)
    np.testing.assert_allclose(polygon_iou_pairs(corners(a), corners(noisy)), 1.0, atol=1e-9)
    shifted = a.copy()
    shifted[::2, 0] += shifted[::2, 2] / 2  # half a width along x: IoU 1/3 when axis-aligned
    got = polygon_iou_pairs(corners(a[::2]), corners(shifted[::2]))
    np.testing.assert_allclose(got, 1 / 3, atol=1e-9)
    flat = np.array([[a[0, 0], a[0, 1], 0, 4, 0.3]])  # no area, inside a[0]
    assert polygon_iou_pairs(corners(flat), corners(a[:1])).tolist() == [0.0]


def test_probiou_matches_ultralytics_formula() -> None:
    rng = np.random.default_rng(2)
    a, b = _boxes(rng, 200, 30), _boxes(rng, 200, 30)
    want = [ref.probiou(x, y) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(probiou_pairs(a, b), want, rtol=1e-9, atol=1e-12)
    m = rotated_iou_matrix(a[:7], b[:5], "probiou")
    np.testing.assert_allclose(m, [[ref.probiou(x, y) for y in b[:5]] for x in a[:7]], atol=1e-12)


def test_regularize_keeps_the_rectangle_and_puts_the_angle_in_range() -> None:
    rng = np.random.default_rng(3)
    boxes = _boxes(rng, 100)
    out = regularize(boxes)
    assert ((out[:, 4] >= 0) & (out[:, 4] < math.pi / 2)).all()
    for box, reg in zip(boxes, out, strict=True):
        assert reg == pytest.approx(ref.regularize(box))
    # the same rectangle: IoU 1 with the original
    np.testing.assert_allclose(polygon_iou_pairs(corners(boxes), corners(out)), 1.0, atol=1e-9)


def _clustered(rng: np.random.Generator, objects: int, per: int, classes: int) -> tuple:
    """Boxes jittered around a few objects (chains of overlaps), several classes."""
    centres = _boxes(rng, objects, 120)
    boxes = np.repeat(centres, per, axis=0)
    boxes[:, :2] += rng.normal(0, 4, (len(boxes), 2))
    boxes[:, 2:4] *= rng.uniform(0.7, 1.3, (len(boxes), 2))
    boxes[:, 4] += rng.normal(0, 0.3, len(boxes))
    scores = rng.uniform(0.2, 1.0, len(boxes)).round(2)  # ties included
    classes_ = rng.integers(0, classes, len(boxes))
    return boxes, scores, classes_


@pytest.fixture(params=[256, 7], ids=["one-block", "blocks-of-7"])
def block(request, monkeypatch) -> int:
    """NMS in one block, or in blocks of 7 ranked boxes (stopping at max_det)."""
    monkeypatch.setattr(rotated_nms_module, "_BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("iou", [0.1, 0.45, 0.7])
def test_polygon_nms_is_the_zoo_greedy_loop(iou: float, block: int) -> None:
    rng = np.random.default_rng(int(iou * 100))
    boxes, scores, classes = _clustered(rng, 8, 12, 3)
    got = rotated_nms(boxes, scores, classes, iou, 300, "polygon")
    assert list(got) == ref.greedy_nms(boxes, scores, classes, iou)
    assert 8 <= len(got) < len(boxes)


@pytest.mark.parametrize("iou", [0.0, 0.05, 0.45, 0.7])
def test_probiou_nms_is_ultralytics_fast_nms(iou: float, block: int) -> None:
    rng = np.random.default_rng(7 + int(iou * 100))
    boxes, scores, classes = _clustered(rng, 8, 10, 2)
    boxes[::3, 2] *= 4  # long thin boxes: ProbIoU reaches past touching circles
    got = rotated_nms(boxes, scores, classes, iou, 300, "probiou")
    assert list(got) == ref.fast_nms(boxes, scores, classes, iou)


def test_rotated_nms_max_det_agnostic_and_empty(block: int) -> None:
    rng = np.random.default_rng(5)
    boxes, scores, classes = _clustered(rng, 10, 5, 4)
    for method in ("polygon", "probiou"):
        full = rotated_nms(boxes, scores, classes, 0.45, 300, method)
        assert list(rotated_nms(boxes, scores, classes, 0.45, 3, method)) == list(full[:3])
        assert list(rotated_nms(boxes, scores, classes, 0.45, 20, method)) == list(full[:20])
    agnostic = rotated_nms(boxes, scores, classes, 0.45, 300, "polygon", agnostic=True)
    assert list(agnostic) == ref.greedy_nms(boxes, scores, [0] * len(boxes), 0.45)
    assert len(rotated_nms(np.zeros((0, 5)), np.zeros(0), np.zeros(0, int), 0.5, 10)) == 0
    with pytest.raises(ValueError, match="rotated NMS"):
        rotated_nms(boxes, scores, classes, 0.5, 10, "exact")


def _random_dataset(rng: np.random.Generator, images: int, classes: int) -> tuple:
    preds, truths, dets, gts = [], [], [], []
    for i in range(images):
        m = int(rng.integers(0, 6))
        truth = _boxes(rng, m, 200)
        truth[:, 2:4] += 10
        t_cls = rng.integers(0, classes, m)
        difficult = rng.random(m) < 0.15
        # predictions: most truths found (jittered), some twice, plus false ones
        keep = rng.random(m) < 0.8
        found, found_cls = truth[keep], t_cls[keep]
        twice = found[: len(found) // 2]
        pred = np.concatenate([found, twice, _boxes(rng, int(rng.integers(0, 4)), 200)])
        pred[:, :2] += rng.normal(0, 3, (len(pred), 2))
        pred[:, 4] += rng.normal(0, 0.15, len(pred))
        false = len(pred) - len(found) - len(twice)
        p_cls = np.concatenate(
            [found_cls, found_cls[: len(twice)], rng.integers(0, classes, false)]
        )
        p_score = rng.uniform(0, 1, len(pred)).round(2)
        tq, pq = corners(truth), corners(pred)
        truths.append(ImageTruth(tq, t_cls, difficult))
        preds.append(ImagePredictions(pq, p_cls, p_score))
        for q, c, d in zip(tq, t_cls, difficult, strict=True):
            gts.append((i, [tuple(v) for v in q], int(c), bool(d)))
        for q, c, s in zip(pq, p_cls, p_score, strict=True):
            dets.append((i, float(s), [tuple(v) for v in q], int(c)))
    return preds, truths, dets, gts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotated_map_matches_the_dota_devkit_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    classes = 4
    preds, truths, dets, gts = _random_dataset(rng, 40, classes)
    got = rotated_map(preds, truths, 0.5)
    want = {c: ref.dota_voc_eval(dets, gts, c, 0.5) for c in range(classes)}
    want = {c: ap for c, ap in want.items() if ap is not None}
    assert got.per_class.keys() == want.keys()
    for c in want:
        assert got.per_class[c] == pytest.approx(want[c], abs=1e-12)
    assert got.map == pytest.approx(np.mean(list(want.values())), abs=1e-12)
    assert 0.2 < got.map < 1.0


def test_rotated_map_perfect_and_empty() -> None:
    truth = corners(np.array([[50, 50, 20, 10, 0.3], [150, 80, 30, 8, 1.2]]))
    perfect = rotated_map(
        [ImagePredictions(truth, np.array([0, 1]), np.array([0.9, 0.8]))],
        [ImageTruth(truth, np.array([0, 1]))],
    )
    assert perfect.map == 1.0 and perfect.ground_truths == {0: 1, 1: 1}
    none = rotated_map(
        [ImagePredictions(np.zeros((0, 4, 2)), np.zeros(0, int), np.zeros(0))],
        [ImageTruth(truth, np.array([0, 1]))],
    )
    assert none.per_class == {0: 0.0, 1: 0.0}
    assert math.isnan(rotated_map([], []).map)


def test_voc_ap_all_point_interpolation_by_hand() -> None:
    # TP, FP, TP over 2 ground truths: recall .5 .5 1, precision 1 .5 .667
    recall = np.array([0.5, 0.5, 1.0])
    precision = np.array([1.0, 0.5, 2 / 3])
    assert voc_ap(recall, precision) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
