"""Pose decoding against the model zoo's and Ultralytics' post-processing, on constant fake
outputs with planted instances (tests/pose_obb_outputs.py), images of several sizes and
aspect ratios letterboxed onto the model input; and COCO keypoint results."""

from __future__ import annotations

import json

import numpy as np
import pose_obb_outputs as F  # tests/ is on sys.path under pytest
import pytest

from batchinfer.detect.decode import DetectSettings
from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.pose import (
    COCO_PERSON_SIGMAS,
    PoseDecoder,
    PoseHead,
    coco_keypoint_results,
    coco_keypoints,
    recognise_pose,
)
from batchinfer.errors import InferenceError

SIZES = [  # (image w, h), (model input h, w)
    ((640, 480), (640, 640)),
    ((333, 900), (640, 640)),
    ((1280, 720), (640, 640)),
    ((500, 500), (640, 640)),
    ((1280, 720), (384, 640)),
]


def _shapes(outputs: list[np.ndarray]) -> list[tuple[int, ...]]:
    return [tuple(o.shape) for o in outputs]


def _scene(family, image, input_hw, seed, classes=1, kpt_shape=(17, 3)):
    rng = np.random.default_rng(seed)
    lb = letterbox_geometry(image[0], image[1], input_hw[1], input_hw[0])
    planted = F.random_instances(rng, lb, 5, classes, rotated=False, keypoints=kpt_shape)
    assert len(planted) >= 3
    make = F.zoo_outputs if family == "zoo" else F.ultralytics_outputs
    return lb, planted, make(input_hw, classes, planted, keypoints=kpt_shape)


def _assert_same(decoded, found: list[F.Found]) -> None:
    assert len(decoded) == len(found)
    for i, f in enumerate(found):
        assert int(decoded.class_ids[i]) == f.cls
        assert abs(float(decoded.scores[i]) - f.score) < 1e-3
        assert np.abs(decoded.boxes[i] - np.asarray(f.box)).max() < 3
        kp = np.asarray(f.keypoints)
        assert np.abs(decoded.keypoints[i, :, :2] - kp[:, :2]).max() < 3
        assert np.abs(decoded.keypoints[i, :, 2] - kp[:, 2]).max() < 1e-3


def _assert_planted(decoded, planted: list[F.Planted], lb, dims: int = 3) -> None:
    """Every planted instance found once (its duplicate dropped), in original pixels."""
    assert len(decoded) == len(planted)
    for p in planted:
        want = np.array(
            [p.cx - p.w / 2, p.cy - p.h / 2, p.cx + p.w / 2, p.cy + p.h / 2], np.float64
        )
        want[0::2] = np.clip((want[0::2] - lb.pad_x) / lb.scale, 0, lb.src_w)
        want[1::2] = np.clip((want[1::2] - lb.pad_y) / lb.scale, 0, lb.src_h)
        dist = np.abs(decoded.boxes - want).max(axis=1)
        i = int(np.argmin(dist))
        assert dist[i] < 3
        assert int(decoded.class_ids[i]) == p.cls
        assert abs(float(decoded.scores[i]) - p.score) < 1e-3
        assert p.keypoints is not None
        kx = (p.keypoints[:, 0] - lb.pad_x) / lb.scale
        ky = (p.keypoints[:, 1] - lb.pad_y) / lb.scale
        assert np.abs(decoded.keypoints[i, :, 0] - kx).max() < 3
        assert np.abs(decoded.keypoints[i, :, 1] - ky).max() < 3
        want_scores = p.keypoints[:, 2] if dims == 3 else np.ones(len(kx))
        np.testing.assert_allclose(decoded.keypoints[i, :, 2], want_scores, atol=1e-3)


@pytest.mark.parametrize(("image", "input_hw"), SIZES)
def test_zoo_layout_matches_the_zoo_python(image, input_hw) -> None:
    lb, planted, outputs = _scene("zoo", image, input_hw, seed=sum(image))
    assert _shapes(outputs)[0] == (1, 65, input_hw[0] // 8, input_hw[1] // 8)
    head = recognise_pose(input_hw, _shapes(outputs))
    assert head == PoseHead("yolov8-pose-zoo", 1, 17, 3, (8, 16, 32))
    settings = DetectSettings(conf=0.25, iou=0.45)
    decoded = PoseDecoder(head, input_hw, settings)(outputs, lb)
    _assert_same(decoded, F.zoo_pose_reference(outputs, input_hw, 1, 0.25, 0.45, lb))
    _assert_planted(decoded, planted, lb)


@pytest.mark.parametrize(("image", "input_hw"), SIZES)
def test_ultralytics_layout_matches_ultralytics(image, input_hw) -> None:
    lb, planted, outputs = _scene("ultralytics", image, input_hw, seed=sum(image) + 1)
    assert _shapes(outputs)[0][1] == 5 + 17 * 3
    assert recognise_pose(input_hw, _shapes(outputs)) is None  # a detection head, unless told
    head = recognise_pose(input_hw, _shapes(outputs), kpt_shape=[17, 3])
    assert head == PoseHead("yolov8-pose-ultralytics", 1, 17, 3, (8, 16, 32))
    assert recognise_pose(input_hw, _shapes(outputs), task="pose") == head
    decoded = PoseDecoder(head, input_hw)(outputs, lb)
    ref = F.ultralytics_pose_reference(outputs, input_hw, 1, 0.25, 0.45, lb, (17, 3))
    _assert_same(decoded, ref)
    _assert_planted(decoded, planted, lb)


@pytest.mark.parametrize("family", ["zoo", "ultralytics"])
def test_other_keypoint_shapes_and_several_classes(family: str) -> None:
    input_hw = (640, 640)
    kpt_shape = (5, 2)  # x, y only: every keypoint's score is 1
    lb, planted, outputs = _scene(family, (900, 500), input_hw, 21, classes=3, kpt_shape=kpt_shape)
    head = recognise_pose(input_hw, _shapes(outputs), kpt_shape=kpt_shape)
    assert head is not None
    assert (head.num_classes, head.num_keypoints, head.keypoint_dims) == (3, 5, 2)
    decoded = PoseDecoder(head, input_hw)(outputs, lb)
    _assert_planted(decoded, planted, lb, dims=2)
    if family == "zoo":
        ref = F.zoo_pose_reference(outputs, input_hw, 3, 0.25, 0.45, lb, kpt_dims=2)
    else:
        ref = F.ultralytics_pose_reference(outputs, input_hw, 3, 0.25, 0.45, lb, kpt_shape)
    _assert_same(decoded, ref)


def test_int8_outputs_are_dequantised() -> None:
    input_hw = (640, 640)
    lb, planted, outputs = _scene("zoo", (640, 480), input_hw, seed=5)
    head = recognise_pose(input_hw, _shapes(outputs))
    assert head is not None
    quant, q_outputs = [], []
    for o in outputs:
        scale = float(np.abs(o).max()) / 127
        quant.append((scale, 0))
        q_outputs.append(np.clip(np.round(o / scale), -128, 127).astype(np.int8))
    decoded = PoseDecoder(head, input_hw, quant=quant)(q_outputs, lb)
    float_decoded = PoseDecoder(head, input_hw)(outputs, lb)
    assert len(decoded) == len(float_decoded) == len(planted)
    assert np.abs(decoded.keypoints[..., :2] - float_decoded.keypoints[..., :2]).max() < 6
    with pytest.raises(InferenceError, match="no quantisation"):
        PoseDecoder(head, input_hw)(q_outputs, lb)


def test_nonfinite_keypoints_drop_their_instance_and_are_counted() -> None:
    input_hw = (640, 640)
    lb, planted, outputs = _scene("ultralytics", (640, 640), input_hw, seed=9)
    head = recognise_pose(input_hw, _shapes(outputs), kpt_shape=(17, 3))
    assert head is not None
    raw = outputs[0][0]
    hot = np.flatnonzero(raw[4] > 0.25)
    best = hot[np.argmax(raw[4, hot])]
    raw[5 + 3 * 4, best] = np.nan  # keypoint 4's x of the best instance
    decoded = PoseDecoder(head, input_hw)(outputs, lb)
    assert decoded.nonfinite == 1
    assert np.isfinite(decoded.keypoints).all()
    # its duplicate (the next cell) now stands in for it
    assert len(decoded) == len(planted)


def test_recognition_refuses_other_layouts() -> None:
    input_hw = (640, 640)
    _, _, zoo = _scene("zoo", (640, 640), input_hw, seed=1)
    shapes = _shapes(zoo)
    assert recognise_pose(input_hw, [*shapes[:3], (1, 1, 8400)]) is None  # an OBB head
    assert recognise_pose(input_hw, [*shapes[:3], (1, 17, 3, 8000)]) is None
    assert recognise_pose(input_hw, [(1, 56, 8400)], kpt_shape=(17, 4)) is None
    assert recognise_pose(input_hw, [(1, 55, 8400)], kpt_shape=(17, 3)) is None  # no class
    # a P6 export (strides 8-64: 8,500 cells for 640x640)
    p6 = recognise_pose(input_hw, [(1, 56, 8500)], kpt_shape=(17, 3))
    assert p6 == PoseHead("yolov8-pose-ultralytics", 1, 17, 3, (8, 16, 32, 64))
    raw = np.zeros((1, 56, 8500), np.float32)
    raw[0, :4, -1] = [600, 600, 40, 60]  # the last cell of stride 64
    raw[0, 4, -1] = 0.8
    found = PoseDecoder(p6, input_hw)([raw])
    assert found.boxes.tolist() == [[580, 570, 620, 630]]
    assert found.scores.tolist() == pytest.approx([0.8])
    head = recognise_pose(input_hw, shapes)
    assert head is not None
    with pytest.raises(InferenceError, match="model-zoo head"):
        PoseDecoder(head, input_hw)(zoo[:3])


def test_coco_keypoints_and_results() -> None:
    points = np.array([[10.12345, 20.5, 0.912345], [1, 2, 0.5]], np.float32)
    flat = coco_keypoints(points)
    assert flat == pytest.approx([10.123, 20.5, 0.91234, 1.0, 2.0, 0.5], abs=1e-5)
    as_rows = [{"x": 10.12345, "y": 20.5, "score": 0.912345}, {"x": 1, "y": 2, "score": 0.5}]
    assert coco_keypoints(as_rows) == pytest.approx(flat, abs=1e-5)
    assert len(COCO_PERSON_SIGMAS) == 17
    rows = [
        {"id": "a.jpg", "boxes": [{"class_id": 0, "score": 0.9, "x1": 1, "y1": 2, "x2": 11,
                                   "y2": 22, "keypoints": as_rows}]},
        {"id": "b.jpg", "boxes": None},
    ]  # fmt: skip
    results = coco_keypoint_results(rows, {"a.jpg": 7, "b.jpg": 8}, category_ids=[1])
    assert results == [
        {"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 10.0, 20.0], "score": 0.9,
         "keypoints": coco_keypoints(as_rows)}
    ]  # fmt: skip


def test_coco_keypoint_results_score_perfectly_in_pycocotools(tmp_path) -> None:
    """Decoded poses written as COCO results score OKS mAP 1.0 against themselves as truth."""
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    input_hw = (640, 640)
    lb, _, outputs = _scene("ultralytics", (800, 600), input_hw, seed=4)
    head = recognise_pose(input_hw, _shapes(outputs), kpt_shape=(17, 3))
    assert head is not None
    poses = PoseDecoder(head, input_hw)(outputs, lb)
    boxes = [
        {"class_id": int(c), "score": float(s), "x1": float(b[0]), "y1": float(b[1]),
         "x2": float(b[2]), "y2": float(b[3]),
         "keypoints": [{"x": float(x), "y": float(y), "score": float(v)} for x, y, v in k]}
        for b, s, c, k in zip(poses.boxes, poses.scores, poses.class_ids, poses.keypoints,
                              strict=True)
    ]  # fmt: skip
    results = coco_keypoint_results([{"id": "im", "boxes": boxes}], {"im": 1}, [1])
    truth = {
        "images": [{"id": 1, "width": 800, "height": 600}],
        "categories": [{"id": 1, "name": "person", "keypoints": [str(i) for i in range(17)],
                        "skeleton": []}],
        "annotations": [
            {"id": i + 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
             "bbox": r["bbox"], "area": r["bbox"][2] * r["bbox"][3], "num_keypoints": 17,
             "keypoints": [v if n % 3 < 2 else 2 for n, v in enumerate(r["keypoints"])]}
            for i, r in enumerate(results)
        ],
    }  # fmt: skip
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(truth))
    gt = coco.COCO(str(path))
    dt = gt.loadRes(results)
    ev = cocoeval.COCOeval(gt, dt, "keypoints")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[0] == pytest.approx(1.0)
