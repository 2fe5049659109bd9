"""Class-aware greedy NMS: the vectorised pair rounds give the textbook loop's answer."""

from __future__ import annotations

import detect_outputs as D  # tests/ is on sys.path under pytest
import numpy as np
import pytest

from batchinfer.detect import nms as N


def loop(boxes, scores, class_ids, iou, max_det=300):
    order = np.argsort(-scores, kind="stable")
    return N._nms_loop(boxes, class_ids, order, iou, max_det)


def zoo(boxes, scores, class_ids, iou, max_det=300):
    """The model zoo's per-class nms_boxes, best first (tests/detect_outputs.py)."""
    cands = [(*b, s, c) for b, s, c in zip(boxes.tolist(), scores, class_ids.tolist(), strict=True)]
    return D._finish(cands, 0, iou, max_det)


def random_boxes(rng, n, classes, clustered):
    if clustered:  # a few objects, many boxes jittered around each
        centres = rng.random((max(1, n // 15), 2)) * 600
        sizes = rng.random((len(centres), 2)) * 150 + 10
        which = rng.integers(0, len(centres), n)
        xy = centres[which] + rng.normal(0, 4, (n, 2))
        wh = sizes[which] * (1 + rng.normal(0, 0.08, (n, 2)))
    else:
        xy, wh = rng.random((n, 2)) * 600, rng.random((n, 2)) * 120 + 1
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    # quantised scores: ties are common, and ties must keep the earlier box first
    scores = (rng.integers(1, 40, n) / 40).astype(np.float32)
    return boxes, scores, rng.integers(0, classes, n).astype(np.int32)


@pytest.mark.parametrize("clustered", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_pair_rounds_equal_the_greedy_loop_and_the_zoo(seed: int, clustered: bool) -> None:
    rng = np.random.default_rng(seed)
    boxes, scores, class_ids = random_boxes(rng, 400, classes=1 + seed, clustered=clustered)
    for iou in (0.3, 0.45, 0.7):
        got = N.nms(boxes, scores, class_ids, iou, 300)
        np.testing.assert_array_equal(got, loop(boxes, scores, class_ids, iou))
        want = zoo(boxes, scores, class_ids, iou)
        np.testing.assert_allclose(boxes[got], want.boxes, rtol=0, atol=0)
        assert class_ids[got].tolist() == want.class_ids.tolist()


def test_max_det_takes_the_best_of_the_kept() -> None:
    rng = np.random.default_rng(1)
    boxes, scores, class_ids = random_boxes(rng, 300, classes=3, clustered=False)
    full = N.nms(boxes, scores, class_ids, 0.45, 300)
    assert len(full) > 10
    np.testing.assert_array_equal(N.nms(boxes, scores, class_ids, 0.45, 10), full[:10])
    np.testing.assert_array_equal(loop(boxes, scores, class_ids, 0.45, 10), full[:10])


def test_a_chain_longer_than_the_rounds_falls_back_to_the_loop() -> None:
    # Boxes 10 wide sliding by 1: each overlaps the next by IoU 9/11 = 0.82, the one after
    # by 8/12 = 0.67: with iou 0.75 only neighbours suppress, a chain that settles one link
    # per round.
    n = 60
    x = np.arange(n, dtype=np.float32)
    boxes = np.stack([x, np.zeros(n), x + 10, np.full(n, 10)], axis=1).astype(np.float32)
    scores = np.linspace(1, 0.5, n, dtype=np.float32)
    class_ids = np.zeros(n, np.int32)
    order = np.argsort(-scores, kind="stable")
    assert N._nms_pairs(boxes, class_ids, order, 0.75) is None
    got = N.nms(boxes, scores, class_ids, 0.75, 300)
    np.testing.assert_array_equal(got, loop(boxes, scores, class_ids, 0.75))
    assert got.tolist() == list(range(0, n, 2))  # every other box


def test_too_many_pairs_fall_back_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    boxes, scores, class_ids = random_boxes(rng, 200, classes=1, clustered=True)
    want = N.nms(boxes, scores, class_ids, 0.45, 300)
    monkeypatch.setattr(N, "_MAX_PAIRS", 100)
    order = np.argsort(-scores, kind="stable")
    assert N._nms_pairs(boxes, class_ids, order, 0.45) is None
    np.testing.assert_array_equal(N.nms(boxes, scores, class_ids, 0.45, 300), want)


def test_zero_area_and_identical_boxes() -> None:
    boxes = np.array(
        [[5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], np.float32
    )
    scores = np.array([0.9, 0.8, 0.7, 0.7, 0.6], np.float32)
    class_ids = np.array([0, 0, 0, 0, 1], np.int32)
    # zero-area boxes overlap nothing (IoU 0/0); of the identical pair the earlier stays
    assert N.nms(boxes, scores, class_ids, 0.45, 300).tolist() == [0, 1, 2, 4]
    assert loop(boxes, scores, class_ids, 0.45).tolist() == [0, 1, 2, 4]


def test_one_or_no_box() -> None:
    one = np.array([[0, 0, 1, 1]], np.float32)
    assert N.nms(one, np.ones(1, np.float32), np.zeros(1, np.int32), 0.45, 300).tolist() == [0]
    none = np.zeros((0, 4), np.float32)
    assert N.nms(none, np.zeros(0, np.float32), np.zeros(0, np.int32), 0.45, 300).size == 0
