"""Oriented-box decoding against the model zoo's and Ultralytics' post-processing, on
constant fake outputs with planted instances (tests/pose_obb_outputs.py), images of several
sizes and aspect ratios letterboxed onto the model input."""

from __future__ import annotations

import math

import numpy as np
import pose_obb_outputs as F  # tests/ is on sys.path under pytest
import pytest
import rotated_reference as rr

from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.obb import ObbDecoder, ObbHead, ObbSettings, recognise_obb
from batchinfer.errors import InferenceError, UsageError

SIZES = [  # (image w, h), (model input h, w)
    ((640, 480), (640, 640)),
    ((333, 900), (640, 640)),
    ((1280, 720), (640, 640)),
    ((500, 500), (640, 640)),
    ((1280, 720), (384, 640)),
]
CLASSES = 3


def _shapes(outputs: list[np.ndarray]) -> list[tuple[int, ...]]:
    return [tuple(o.shape) for o in outputs]


def _scene(family: str, image: tuple[int, int], input_hw: tuple[int, int], seed: int):
    rng = np.random.default_rng(seed)
    lb = letterbox_geometry(image[0], image[1], input_hw[1], input_hw[0])
    planted = F.random_instances(rng, lb, 5, CLASSES, rotated=True)
    assert len(planted) >= 3
    make = F.zoo_outputs if family == "zoo" else F.ultralytics_outputs
    return lb, planted, make(input_hw, CLASSES, planted)


def _corners(xywhr) -> np.ndarray:
    return np.asarray(rr.corners(xywhr))


def _assert_same(decoded, found: list[F.Found]) -> None:
    assert len(decoded) == len(found)
    for i, f in enumerate(found):
        assert int(decoded.class_ids[i]) == f.cls
        assert abs(float(decoded.scores[i]) - f.score) < 1e-3
        assert np.abs(_corners(decoded.xywhr[i]) - _corners(f.xywhr)).max() < 3
        assert np.abs(np.asarray(decoded.boxes[i]) - np.asarray(f.box)).max() < 3
        assert np.abs(decoded.polygons[i] - _corners(f.xywhr)).max() < 3


def _assert_planted(decoded, planted: list[F.Planted], lb) -> None:
    """Every planted instance is found once (its duplicate dropped), in original pixels."""
    assert len(decoded) == len(planted)
    for p in planted:
        want = rr.regularize(
            ((p.cx - lb.pad_x) / lb.scale, (p.cy - lb.pad_y) / lb.scale,
             p.w / lb.scale, p.h / lb.scale, p.angle)
        )  # fmt: skip
        dist = [np.abs(decoded.polygons[i] - _corners(want)).max() for i in range(len(decoded))]
        i = int(np.argmin(dist))
        assert dist[i] < 3
        assert int(decoded.class_ids[i]) == p.cls
        assert abs(float(decoded.scores[i]) - p.score) < 1e-3
        assert 0 <= decoded.xywhr[i, 4] < math.pi / 2


@pytest.mark.parametrize(("image", "input_hw"), SIZES)
def test_zoo_layout_matches_the_zoo_python(image, input_hw) -> None:
    lb, planted, outputs = _scene("zoo", image, input_hw, seed=sum(image))
    head = recognise_obb(input_hw, _shapes(outputs))
    assert head == ObbHead("yolov8-obb-zoo", CLASSES, (8, 16, 32))
    settings = ObbSettings(conf=0.25, iou=0.45, nms="polygon")
    decoded = ObbDecoder(head, input_hw, settings)(outputs, lb)
    _assert_same(decoded, F.zoo_obb_reference(outputs, input_hw, CLASSES, 0.25, 0.45, lb))
    _assert_planted(decoded, planted, lb)


@pytest.mark.parametrize(("image", "input_hw"), SIZES)
def test_ultralytics_layout_matches_ultralytics(image, input_hw) -> None:
    lb, planted, outputs = _scene("ultralytics", image, input_hw, seed=sum(image) + 1)
    assert recognise_obb(input_hw, _shapes(outputs)) is None  # a detection head, unless told
    head = recognise_obb(input_hw, _shapes(outputs), task="obb")
    assert head == ObbHead("yolov8-obb-ultralytics", CLASSES, (8, 16, 32))
    decoded = ObbDecoder(head, input_hw)(outputs, lb)  # ProbIoU Fast-NMS by default
    ref = F.ultralytics_obb_reference(outputs, input_hw, CLASSES, 0.25, 0.45, lb)
    _assert_same(decoded, ref)
    _assert_planted(decoded, planted, lb)


def test_both_nms_methods_on_both_layouts_agree_on_planted_scenes() -> None:
    input_hw = (640, 640)
    for family in ("zoo", "ultralytics"):
        lb, planted, outputs = _scene(family, (800, 600), input_hw, seed=11)
        head = recognise_obb(input_hw, _shapes(outputs), task="obb")
        assert head is not None
        for nms in ("probiou", "polygon"):
            decoded = ObbDecoder(head, input_hw, ObbSettings(nms=nms))(outputs, lb)
            _assert_planted(decoded, planted, lb)


def test_without_letterbox_boxes_stay_in_input_pixels() -> None:
    input_hw = (640, 640)
    lb, planted, outputs = _scene("zoo", (640, 640), input_hw, seed=3)
    head = recognise_obb(input_hw, _shapes(outputs))
    assert head is not None
    decoded = ObbDecoder(head, input_hw)(outputs)
    _assert_planted(decoded, planted, lb)  # a 640x640 image: scale 1, no padding


def test_int8_outputs_are_dequantised() -> None:
    input_hw = (640, 640)
    lb, planted, outputs = _scene("zoo", (640, 480), input_hw, seed=5)
    head = recognise_obb(input_hw, _shapes(outputs))
    assert head is not None
    quant = []
    q_outputs = []
    for o in outputs:
        scale = float(np.abs(o).max()) / 127
        quant.append((scale, 0))
        q_outputs.append(np.clip(np.round(o / scale), -128, 127).astype(np.int8))
    decoded = ObbDecoder(head, input_hw, ObbSettings(), quant)(q_outputs, lb)
    assert len(decoded) == len(planted)
    float_decoded = ObbDecoder(head, input_hw)(outputs, lb)
    # int8 steps of DFL logits move a box by a fraction of a cell
    assert np.abs(decoded.polygons - float_decoded.polygons).max() < 12
    with pytest.raises(InferenceError, match="no quantisation"):
        ObbDecoder(head, input_hw)(q_outputs, lb)


def test_nonfinite_angle_or_score_is_dropped_and_counted() -> None:
    input_hw = (640, 640)
    lb, _, outputs = _scene("ultralytics", (640, 640), input_hw, seed=8)
    head = recognise_obb(input_hw, _shapes(outputs), task="obb")
    assert head is not None
    raw = outputs[0][0]
    hot = np.flatnonzero(raw[4 : 4 + CLASSES].max(axis=0) > 0.25)
    raw[4 + CLASSES, hot[0]] = np.nan
    raw[4, -1] = np.inf
    decoded = ObbDecoder(head, input_hw)(outputs, lb)
    assert decoded.nonfinite == 2
    assert np.isfinite(decoded.xywhr).all()


def test_recognition_refuses_other_layouts_and_wrong_shapes_are_named() -> None:
    input_hw = (640, 640)
    _, _, zoo = _scene("zoo", (640, 640), input_hw, seed=1)
    shapes = _shapes(zoo)
    assert recognise_obb(input_hw, shapes[:3]) is None
    assert recognise_obb(input_hw, [*shapes[:3], (1, 17, 3, 8400)]) is None  # pose
    assert recognise_obb(input_hw, [*shapes[:3], (1, 1, 8000)]) is None
    # a runtime may report the angle's (1, 1, 8400) with another axis: the cells decide
    for angle_shape in [(1, 8400), (1, 1, 8400, 1), (1, 1, 1, 8400)]:
        head = recognise_obb(input_hw, [*shapes[:3], angle_shape])
        assert head is not None and head.family == "yolov8-obb-zoo"
        reshaped = [*zoo[:3], zoo[3].reshape(angle_shape)]
        assert len(ObbDecoder(head, input_hw)(reshaped)) == len(ObbDecoder(head, input_hw)(zoo))
    assert recognise_obb(input_hw, [(1, 5, 8400)], task="obb") is None  # no class
    assert recognise_obb((640, 640), [(-1, 20, 8400)], task="obb") == ObbHead(
        "yolov8-obb-ultralytics", 15, (8, 16, 32)
    )
    head = recognise_obb(input_hw, shapes)
    assert head is not None
    with pytest.raises(InferenceError, match="model-zoo head"):
        ObbDecoder(head, input_hw)(zoo[:3])
    with pytest.raises(UsageError):
        ObbDecoder(head, input_hw, ObbSettings(nms="shapely"))
