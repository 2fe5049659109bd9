"""Greedy NMS in blocks gives exactly the answer of the NMS before it (and of the zoo).

The reference is the NMS batchinfer had before issue 40 (tests/detect_nms_reference.py:
pair rounds, else the textbook loop): same indices in the same order, on random and planted
scenes, many classes and one, with max_det cutting and not, class-agnostic (the reference
given one class) and with a class filter (the reference given only those candidates).
"""

from __future__ import annotations

import detect_nms_reference as R  # tests/ is on sys.path under pytest
import detect_outputs as D
import numpy as np
import pytest

from batchinfer.detect import Decoder, DetectSettings, Head
from batchinfer.detect import decode as decode_module
from batchinfer.detect import nms as N


def zoo(boxes, scores, class_ids, iou, max_det=300):
    """The model zoo's per-class nms_boxes, best first (tests/detect_outputs.py)."""
    cands = [(*b, s, c) for b, s, c in zip(boxes.tolist(), scores, class_ids.tolist(), strict=True)]
    return D._finish(cands, 0, iou, max_det)


def random_boxes(rng, n, classes, clustered, ties=True):
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
    scores = (rng.integers(1, 40, n) / 40) if ties else rng.random(n)
    return boxes, scores.astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


def assert_same_as_reference(boxes, scores, class_ids, iou, max_det) -> None:
    want = R.nms(boxes, scores, class_ids, iou, max_det)
    np.testing.assert_array_equal(N.nms(boxes, scores, class_ids, iou, max_det), want)
    agnostic = R.nms(boxes, scores, np.zeros_like(class_ids), iou, max_det)
    got = N.nms(boxes, scores, class_ids, iou, max_det, agnostic=True)
    np.testing.assert_array_equal(got, agnostic)


@pytest.mark.parametrize("clustered", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_blocks_equal_the_reference_and_the_zoo(seed: int, clustered: bool) -> None:
    rng = np.random.default_rng(seed)
    boxes, scores, class_ids = random_boxes(rng, 400, classes=1 + seed, clustered=clustered)
    for iou in (0.3, 0.45, 0.7):
        for max_det in (1, 10, 300):
            assert_same_as_reference(boxes, scores, class_ids, iou, max_det)
    want = zoo(boxes, scores, class_ids, 0.45)  # the zoo's Python loops: one threshold
    got = N.nms(boxes, scores, class_ids, 0.45, 300)
    np.testing.assert_array_equal(boxes[got], want.boxes.astype(np.float32))
    assert class_ids[got].tolist() == want.class_ids.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_random_scenes_of_every_size_with_small_blocks(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks and a small first ranking: many blocks, the rest ranked later, ties
    # across the cut, kept boxes of earlier blocks suppressing later ones.
    monkeypatch.setattr(N, "_BLOCK", 8 + seed)
    monkeypatch.setattr(N, "_BLOCK_AGNOSTIC", 8 + seed)
    monkeypatch.setattr(N, "_BLOCK_MIN", 1 + seed % 4)
    monkeypatch.setattr(N, "_UPPER", np.triu(np.ones((8 + seed, 8 + seed), bool), 1))
    monkeypatch.setattr(N, "_FIRST", 5 + 3 * seed)
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 700))
    boxes, scores, class_ids = random_boxes(
        rng, n, classes=int(rng.integers(1, 30)), clustered=seed % 2 == 0, ties=seed % 3 != 0
    )
    for iou in (0.2, 0.5, 0.9):
        for max_det in (1, 3, 50, 100_000):
            assert_same_as_reference(boxes, scores, class_ids, iou, max_det)


def test_all_cells_of_a_640_output_over_80_classes() -> None:
    # conf 0.001: every cell a candidate; boxes of every size on a grid, as a detector's
    # background gives them, and a few objects each seen by a cluster of cells
    rng = np.random.default_rng(7)
    n = 8400
    centres = rng.random((n, 2)) * 640
    sizes = rng.uniform(8, 60, (n, 2))
    objects = rng.integers(0, n, 600)
    centres[objects] = centres[rng.integers(0, 15, 600)] + rng.normal(0, 3, (600, 2))
    boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).astype(np.float32)
    scores = (1 / (1 + np.exp(-rng.normal(-5, 1.5, n)))).astype(np.float32)
    class_ids = rng.integers(0, 80, n).astype(np.int32)
    assert_same_as_reference(boxes, scores, class_ids, 0.45, 300)
    one_class = np.zeros(n, np.int32)
    np.testing.assert_array_equal(
        N.nms(boxes, scores, one_class, 0.7, 300), R.nms(boxes, scores, one_class, 0.7, 300)
    )


def test_a_chain_longer_than_the_rounds_is_walked() -> None:
    # Boxes 10 wide sliding by 1: each overlaps the next by IoU 9/11 = 0.82, the one after
    # by 8/12 = 0.67: with iou 0.75 only neighbours suppress, a chain that settles one link
    # per round.
    n = 60
    x = np.arange(n, dtype=np.float32)
    boxes = np.stack([x, np.zeros(n), x + 10, np.full(n, 10)], axis=1).astype(np.float32)
    scores = np.linspace(1, 0.5, n, dtype=np.float32)
    class_ids = np.zeros(n, np.int32)
    got = N.nms(boxes, scores, class_ids, 0.75, 300)
    np.testing.assert_array_equal(got, R.nms(boxes, scores, class_ids, 0.75, 300))
    assert got.tolist() == list(range(0, n, 2))  # every other box


def test_zero_area_and_identical_boxes() -> None:
    boxes = np.array(
        [[5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], np.float32
    )
    scores = np.array([0.9, 0.8, 0.7, 0.7, 0.6], np.float32)
    class_ids = np.array([0, 0, 0, 0, 1], np.int32)
    # zero-area boxes overlap nothing (IoU 0/0); of the identical pair the earlier stays
    assert N.nms(boxes, scores, class_ids, 0.45, 300).tolist() == [0, 1, 2, 4]
    assert N.nms(boxes, scores, class_ids, 0.45, 300, agnostic=True).tolist() == [0, 1, 2]


def test_one_or_no_box() -> None:
    one = np.array([[0, 0, 1, 1]], np.float32)
    assert N.nms(one, np.ones(1, np.float32), np.zeros(1, np.int32), 0.45, 300).tolist() == [0]
    none = np.zeros((0, 4), np.float32)
    assert N.nms(none, np.zeros(0, np.float32), np.zeros(0, np.int32), 0.45, 300).size == 0


def test_a_class_filter_is_nms_over_those_classes_only() -> None:
    rng = np.random.default_rng(3)
    boxes, scores, class_ids = random_boxes(rng, 500, classes=5, clustered=True)
    wanted = (0, 2)
    mine = np.flatnonzero(np.isin(class_ids, wanted))
    fetch = lambda i: (boxes[i], class_ids[i])  # noqa: E731
    for agnostic in (False, True):
        idx, kept_boxes, kept_cls = N.nms_ranked(
            scores, fetch, 0.45, 300, agnostic=agnostic, classes=wanted
        )
        cls = np.zeros_like(class_ids[mine]) if agnostic else class_ids[mine]
        want = mine[R.nms(boxes[mine], scores[mine], cls, 0.45, 300)]
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_array_equal(kept_boxes, boxes[want])
        np.testing.assert_array_equal(kept_cls, class_ids[want])
        assert set(kept_cls.tolist()) == {0, 2}


# -- the decoder: boxes and classes on demand, the same as all computed first ------------


def reference_decode(decoder: Decoder, outputs) -> tuple:
    """Every candidate's box and class computed at once (NaN/inf dropped), then the
    reference NMS: the decoder before issue 40, in one piece."""
    boxes, scores, classes, nonfinite = [], [], [], 0
    for part in decoder._decode(outputs):
        every = np.arange(len(part.scores))
        b = part.boxes_of(every)
        ok = np.isfinite(b).all(axis=1)
        boxes.append(b[ok])
        scores.append(part.scores[ok])
        classes.append(part.classes_of(every)[ok])
        nonfinite += part.nonfinite + int((~ok).sum())
    boxes, scores, classes = (np.concatenate(x) for x in (boxes, scores, classes))
    s = decoder.settings
    if s.classes is not None:  # as Ultralytics: candidates whose best class is not wanted go
        mine = np.isin(classes, s.classes)
        boxes, scores, classes = boxes[mine], scores[mine], classes[mine]
    keep = R.nms(boxes, scores, np.zeros_like(classes) if s.agnostic else classes, s.iou, s.max_det)
    return boxes[keep], scores[keep], classes[keep], nonfinite


@pytest.mark.parametrize("family", D.FAMILIES)
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("on_demand", [True, False])
def test_the_decoder_at_conf_0_001_gives_the_reference_boxes(
    family: str, nonfinite: bool, on_demand: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # on_demand: boxes computed as NMS asks for them (many candidates), else all at once
    monkeypatch.setattr(decode_module, "_FEW_CANDIDATES", 0 if on_demand else 10**6)
    size = (160, 192)
    rng = np.random.default_rng(21)
    outputs = D.random_outputs(family, rng, size, classes=12)
    if nonfinite:  # a few NaN/inf box values: every box is computed and checked first
        for o in outputs:
            o[np.unravel_index(rng.choice(o.size, 20, replace=False), o.shape)] = np.inf
    head = Head(family, 12, (8, 16, 32), 3 if family.startswith("yolov5") else 1)
    for settings in (
        DetectSettings(conf=0.001),
        DetectSettings(conf=0.001, max_det=40, iou=0.6),
        DetectSettings(conf=0.001, agnostic=True),
        DetectSettings(conf=0.001, classes=(0, 3, 5)),
    ):
        decoder = Decoder(head, size, settings)
        got = decoder(outputs)
        boxes, scores, classes, count = reference_decode(decoder, outputs)
        assert len(got) > 30
        np.testing.assert_array_equal(got.boxes, boxes)
        np.testing.assert_array_equal(got.scores, scores)
        np.testing.assert_array_equal(got.class_ids, classes)
        assert got.nonfinite == count and (count > 0) == nonfinite


def test_the_dfl_of_a_few_boxes_is_the_dfl_of_all_of_them() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 4, (4, 16, 3000)).astype(np.float32)
    every = decode_module._dfl(logits)
    for k in (1, 2, 3, 7, 8, 9, 17, 255, 1000):
        some = np.sort(rng.choice(3000, k, replace=False))
        np.testing.assert_array_equal(decode_module._dfl(logits[:, :, some]), every[:, some])


def test_at_conf_0_001_only_the_boxes_nms_visits_are_decoded(monkeypatch) -> None:
    # 640x640, 80 classes, every cell a candidate (an mAP evaluation's conf): the few
    # hundred best fill max_det. Decoding every box (the DFL softmax of all 8,400) and the
    # one-box-at-a-time NMS made this 34-65 ms of CPU per image.
    rng = np.random.default_rng(8)
    outputs = D.random_outputs("yolov8-zoo", rng, (640, 640), classes=80)
    decoded: list[int] = []
    real = decode_module._dfl

    def counting(logits):
        decoded.append(logits.shape[-1])
        return real(logits)

    monkeypatch.setattr(decode_module, "_dfl", counting)
    head = Head("yolov8-zoo", 80, (8, 16, 32), 1)
    decoder = Decoder(head, (640, 640), DetectSettings(conf=0.001))
    got = decoder(outputs)
    assert len(decoder._decode(outputs)[0].scores) == 8400  # every cell a candidate
    assert len(got) == 300
    assert sum(decoded) <= 1024, decoded
