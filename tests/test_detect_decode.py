"""batchinfer.detect.Decoder against the model zoo's post-processing, written out slowly.

The reference (tests/detect_outputs.py) walks every cell and anchor in Python as the model
zoo's yolov5.py / yolov8.py do; the decoder must give the same boxes, scores and classes
in the same order, on random outputs (a few hundred overlapping candidates), on planted
objects, on int8 outputs and with NaN/inf in them.
"""

from __future__ import annotations

import detect_outputs as D  # tests/ is on sys.path under pytest
import numpy as np
import pytest

from batchinfer.detect import Decoder, Detections, DetectSettings, Head, recognise
from batchinfer.detect.decode import COCO_ANCHORS
from batchinfer.errors import InferenceError, UsageError

INPUT = (96, 160)  # non-square, small: the reference walks every cell in Python
YOLOV7_ANCHORS = (
    ((12, 16), (19, 36), (40, 28)),
    ((36, 75), (76, 55), (72, 146)),
    ((142, 110), (192, 243), (459, 401)),
)


def decode(family, outputs, input_hw=INPUT, quant=(), **settings) -> Detections:
    head = recognise(input_hw, [o.shape for o in outputs])
    assert head is not None and head.family == family
    return Decoder(head, input_hw, DetectSettings(**settings), quant)(outputs)


def assert_same(got: Detections, want: D.Result) -> None:
    assert got.boxes.dtype == np.float32 and got.scores.dtype == np.float32
    assert got.class_ids.dtype == np.int32
    assert got.class_ids.tolist() == want.class_ids.tolist()
    np.testing.assert_array_equal(got.scores, want.scores)
    np.testing.assert_allclose(got.boxes, want.boxes, rtol=1e-5, atol=2e-3)
    assert got.nonfinite == want.nonfinite


@pytest.mark.parametrize("family", D.FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_outputs_decode_as_the_model_zoo_does(family: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    outputs = D.random_outputs(family, rng, INPUT, classes=6)
    got = decode(family, outputs)
    want = D.reference(family, outputs, INPUT)
    assert 20 < len(want.scores) < 300  # enough boxes, none cut by max_det
    assert_same(got, want)


@pytest.mark.parametrize("family", D.FAMILIES)
def test_other_thresholds_and_max_det_follow_the_reference(family: str) -> None:
    rng = np.random.default_rng(5)
    outputs = D.random_outputs(family, rng, INPUT, classes=4)
    for conf, iou, max_det in ((0.5, 0.7, 300), (0.1, 0.3, 300), (0.25, 0.45, 7)):
        got = decode(family, outputs, conf=conf, iou=iou, max_det=max_det)
        assert_same(got, D.reference(family, outputs, INPUT, conf, iou, max_det))
    assert len(decode(family, outputs, max_det=7)) == 7


def test_yolov8_zoo_score_sum_outputs_are_optional() -> None:
    rng = np.random.default_rng(2)
    nine = D.random_outputs("yolov8-zoo", rng, INPUT, classes=5)
    six = [o for i, o in enumerate(nine) if i % 3 != 2]
    assert_same(decode("yolov8-zoo", six), D.reference("yolov8-zoo", nine, INPUT))
    np.testing.assert_array_equal(decode("yolov8-zoo", six).boxes, decode("yolov8-zoo", nine).boxes)


def test_square_640_input_with_80_classes() -> None:
    rng = np.random.default_rng(3)
    outputs = D.random_outputs("yolov8-ultralytics", rng, (640, 640), classes=80)
    scores = outputs[0][0, 4:]  # (80, 8400); a few hundred candidates: the reference is slow
    scores[...] = rng.random(scores.shape, dtype=np.float32) * np.float32(0.25)
    hits = rng.choice(scores.size, 200, replace=False)
    scores[np.unravel_index(hits, scores.shape)] = rng.uniform(0.25, 1, hits.size)
    assert outputs[0].shape == (1, 84, 8400)
    want = D.reference("yolov8-ultralytics", outputs, (640, 640))
    assert len(want.scores) > 100
    assert_same(decode("yolov8-ultralytics", outputs, (640, 640)), want)


def test_yolov5_zoo_anchors_can_be_overridden() -> None:
    rng = np.random.default_rng(4)
    outputs = D.random_outputs("yolov5-zoo", rng, INPUT, classes=3)
    got = decode("yolov5-zoo", outputs, anchors=YOLOV7_ANCHORS)
    assert_same(got, D.reference("yolov5-zoo", outputs, INPUT, anchors=YOLOV7_ANCHORS))
    default = decode("yolov5-zoo", outputs)
    assert not np.allclose(got.boxes[:5], default.boxes[:5])


def test_wrong_anchors_are_a_usage_error() -> None:
    head = Head("yolov5-zoo", 3, (8, 16, 32), 3)
    with pytest.raises(UsageError, match="3 \\(w, h\\) pairs for each of its 3 strides"):
        Decoder(head, INPUT, DetectSettings(anchors=COCO_ANCHORS[:2]))


# -- planted objects: NMS between overlapping boxes -------------------------------------

P = D.Planted


@pytest.mark.parametrize("family", D.FAMILIES)
def test_planted_objects_come_back_where_they_were(family: str) -> None:
    objects = [
        P(0, 3, 4, class_id=2, score=0.9, sides=(2, 1, 3, 2)),
        P(1, 2, 7, class_id=0, score=0.6, sides=(1, 1, 2, 1)),
        P(2, 1, 2, class_id=4, score=0.4, sides=(1, 1, 1, 1), anchor=2),
    ]
    got = decode(family, D.planted(family, INPUT, 5, objects))
    assert got.class_ids.tolist() == [2, 0, 4]
    np.testing.assert_allclose(got.scores, [0.9, 0.6, 0.4], rtol=1e-5)
    np.testing.assert_allclose(got.boxes, [o.box() for o in objects], atol=1e-3)
    assert got.nonfinite == 0


def _boxes_and_scores(family: str, objects: list) -> Detections:
    outputs = D.planted(family, INPUT, 3, objects)
    got = decode(family, outputs)
    assert_same(got, D.reference(family, outputs, INPUT))
    return got


@pytest.mark.parametrize("family", D.FAMILIES)
def test_nms_suppresses_an_overlapping_box_of_the_same_class_only(family: str) -> None:
    # Stride 8, cells side by side: boxes 6x6 cells, shifted by one cell: IoU 5/7 = 0.71.
    a = P(0, 5, 5, class_id=1, score=0.9, sides=(3, 3, 3, 3))
    b = P(0, 5, 6, class_id=1, score=0.8, sides=(3, 3, 3, 3))
    other_class = P(0, 6, 5, class_id=2, score=0.7, sides=(3, 3, 3, 3))
    got = _boxes_and_scores(family, [a, b, other_class])
    assert got.class_ids.tolist() == [1, 2]
    np.testing.assert_allclose(got.scores, [0.9, 0.7], rtol=1e-5)


@pytest.mark.parametrize("family", D.FAMILIES)
def test_nms_keeps_boxes_overlapping_less_than_the_threshold(family: str) -> None:
    # shifted by three cells: IoU 3/9 = 0.33 < 0.45
    a = P(0, 5, 5, class_id=0, score=0.9, sides=(3, 3, 3, 3))
    b = P(0, 5, 8, class_id=0, score=0.8, sides=(3, 3, 3, 3))
    got = _boxes_and_scores(family, [a, b])
    np.testing.assert_allclose(got.scores, [0.9, 0.8], rtol=1e-5)


@pytest.mark.parametrize("family", D.FAMILIES)
def test_nms_is_greedy_not_transitive(family: str) -> None:
    # a suppresses b (IoU 0.71); b would suppress c, but b is gone and a and c overlap 0.33.
    a = P(0, 5, 5, class_id=0, score=0.9, sides=(3, 3, 3, 3))
    b = P(0, 5, 6, class_id=0, score=0.8, sides=(3, 3, 3, 3))
    c = P(0, 5, 8, class_id=0, score=0.7, sides=(3, 3, 3, 3))
    got = _boxes_and_scores(family, [a, b, c])
    np.testing.assert_allclose(got.scores, [0.9, 0.7], rtol=1e-5)
    np.testing.assert_allclose(got.boxes, [a.box(), c.box()], atol=1e-3)


def test_iou_threshold_is_inclusive_of_keeping() -> None:
    # IoU exactly 0.5 at iou=0.5 keeps both (the zoo keeps IoU <= threshold).
    a = P(0, 5, 5, class_id=0, score=0.9, sides=(3, 3, 3, 3))
    b = P(0, 5, 7, class_id=0, score=0.8, sides=(3, 3, 3, 3))  # 4/8 = 0.5
    outputs = D.planted("yolov8-ultralytics", INPUT, 3, [a, b])
    assert len(decode("yolov8-ultralytics", outputs, iou=0.5)) == 2
    assert len(decode("yolov8-ultralytics", outputs, iou=0.49)) == 1


@pytest.mark.parametrize("family", D.FAMILIES)
def test_a_score_equal_to_conf_is_kept(family: str) -> None:
    a = P(0, 5, 5, class_id=0, score=0.9, sides=(3, 3, 3, 3))
    outputs = D.planted(family, INPUT, 3, [a])
    score = float(decode(family, outputs).scores[0])
    assert len(decode(family, outputs, conf=score)) == 1
    assert len(decode(family, outputs, conf=np.nextafter(score, 1))) == 0


def test_no_candidate_gives_empty_arrays_of_the_right_types() -> None:
    outputs = D.planted("yolov8-zoo", INPUT, 3, [])
    got = decode("yolov8-zoo", outputs)
    assert got.boxes.shape == (0, 4) and got.boxes.dtype == np.float32
    assert got.scores.shape == (0,) and got.class_ids.dtype == np.int32
    assert got.nonfinite == 0


# -- int8 outputs ------------------------------------------------------------------------


def quantise(outputs, dtype=np.int8):
    """Per-output affine quantisation, as rknn returns outputs when not asked for float."""
    info = np.iinfo(dtype)
    q, params = [], []
    for o in outputs:
        lo, hi = float(o.min()), float(o.max())
        scale = (hi - lo) / (info.max - info.min)
        zp = round(info.min - lo / scale)
        q.append(np.clip(np.round(o / scale + zp), info.min, info.max).astype(dtype))
        params.append((scale, zp))
    return q, params


def dequantise(q, params):
    return [
        (a.astype(np.float32) - np.float32(zp)) * np.float32(s)
        for a, (s, zp) in zip(q, params, strict=True)
    ]


@pytest.mark.parametrize("family", D.FAMILIES)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_integer_outputs_are_dequantised_with_their_scale_and_zero_point(family, dtype) -> None:
    rng = np.random.default_rng(6)
    outputs = D.random_outputs(family, rng, INPUT, classes=4)
    q, params = quantise(outputs, dtype)
    got = decode(family, q, quant=params)
    want = D.reference(family, dequantise(q, params), INPUT)
    assert len(want.scores) > 10
    assert_same(got, want)  # quantised scores tie often: the order of ties is kept too


def test_float_outputs_ignore_quantisation_parameters() -> None:
    rng = np.random.default_rng(7)
    outputs = D.random_outputs("yolov8-zoo", rng, INPUT, classes=4)
    plain = decode("yolov8-zoo", outputs)
    with_quant = decode("yolov8-zoo", outputs, quant=[(0.5, 3)] * len(outputs))
    np.testing.assert_array_equal(plain.boxes, with_quant.boxes)


def test_integer_output_without_quantisation_is_an_inference_error() -> None:
    rng = np.random.default_rng(8)
    q, _ = quantise(D.random_outputs("yolov8-zoo", rng, INPUT, classes=4))
    with pytest.raises(InferenceError, match="Output 1 is int8 but no quantisation"):
        decode("yolov8-zoo", q)


# -- NaN and inf -------------------------------------------------------------------------


def test_nonfinite_scores_and_boxes_are_dropped_and_counted_yolov8_zoo() -> None:
    objects = [
        P(0, 3, 4, class_id=2, score=0.9, sides=(2, 1, 3, 2)),
        P(0, 8, 12, class_id=1, score=0.8, sides=(1, 1, 1, 1)),
        P(1, 2, 7, class_id=0, score=0.6, sides=(1, 1, 2, 1)),
    ]
    outputs = D.planted("yolov8-zoo", INPUT, 3, objects, score_sum=False)
    outputs[1][0, 0, 0, 0] = np.nan  # a background cell: dropped, counted
    outputs[1][0, 1, 0, 1] = np.inf  # +inf would pass any threshold: dropped, counted
    outputs[1][0, 0, 3, 4] = -np.inf  # -inf beside the best class: the cell still counts
    outputs[0][0, 5, 8, 12] = np.inf  # a candidate's box goes NaN: dropped, counted
    outputs[2][0, 3:6, 0, 0] = np.nan  # a whole DFL bin group of a background cell: unread
    got = decode("yolov8-zoo", outputs)
    assert got.nonfinite == 3
    assert got.class_ids.tolist() == [2, 0]
    assert np.isfinite(got.boxes).all() and np.isfinite(got.scores).all()
    assert_same(got, D.reference("yolov8-zoo", outputs, INPUT))


@pytest.mark.parametrize("family", D.FAMILIES)
def test_nonfinite_values_match_the_reference(family: str) -> None:
    rng = np.random.default_rng(9)
    outputs = D.random_outputs(family, rng, INPUT, classes=4)
    for o in outputs:
        hit = rng.choice(o.size, size=max(2, o.size // 200), replace=False)
        values = np.array([np.nan, np.inf, -np.inf], np.float32)
        o[np.unravel_index(hit, o.shape)] = rng.choice(values, size=hit.size)
    got = decode(family, outputs)
    want = D.reference(family, outputs, INPUT)
    assert want.nonfinite > 0
    assert_same(got, want)


def test_all_nan_outputs_give_no_boxes_and_count_every_cell() -> None:
    outputs = [np.full_like(o, np.nan) for o in D.planted("yolov8-zoo", INPUT, 3, [])]
    got = decode("yolov8-zoo", outputs)
    assert len(got) == 0
    assert got.nonfinite == sum(gh * gw for gh, gw in D.grids(INPUT))


# -- outputs that do not fit the head ----------------------------------------------------


def test_outputs_of_another_shape_are_an_inference_error() -> None:
    head = Head("yolov8-ultralytics", 80, (8, 16, 32), 1)
    decoder = Decoder(head, (640, 640), DetectSettings())
    with pytest.raises(InferenceError, match=r"\(1, 85, 8400\).*needs \[\(1, 84, 8400\)\]"):
        decoder([np.zeros((1, 85, 8400), np.float32)])
    with pytest.raises(InferenceError):
        decoder([])
    # a runtime that leaves out the batch axis is fine
    assert len(decoder([np.zeros((84, 8400), np.float32)])) == 0


@pytest.mark.parametrize(
    "settings",
    [DetectSettings(conf=1.5), DetectSettings(iou=-0.1), DetectSettings(max_det=0)],
)
def test_bad_settings_are_usage_errors(settings: DetectSettings) -> None:
    with pytest.raises(UsageError):
        Decoder(Head("yolov8-zoo", 80, (8, 16, 32), 1), (640, 640), settings)
