"""The constant-output fake models (tests/fake_heads.py) in every head layout: ONNX Runtime
returns the planted tensors exactly, whatever the image; Ultralytics' metadata is read
back; and what the runtime returns decodes as the references say (the references of
tests/test_seg_decode.py and tests/pose_obb_outputs.py: the zoo's Python post-processing
and Ultralytics' semantics), per instance within the issue's tolerances."""

from __future__ import annotations

import numpy as np
import pose_obb_outputs as F  # tests/ is on sys.path under pytest
import pytest
import rotated_reference as rr
from fake_heads import fake_model, run_fake, ultralytics_metadata, write_fake_model
from test_seg_decode import _mask, _mask_iou, _scene_outputs, reference

from batchinfer.detect.decode import DetectSettings
from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.obb import ObbDecoder, ObbSettings, recognise_obb
from batchinfer.detect.pose import PoseDecoder, recognise_pose
from batchinfer.detect.seg_decode import SegmentDecoder
from batchinfer.detect.seg_heads import recognise_segment
from batchinfer.engine.planning.model_metadata import read_model_metadata

# pycocotools' decode warns under numpy 2 (its __array__ takes no copy keyword)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

CONF, IOU = 0.25, 0.45


def _through_runtime(outputs, input_hw, **kwargs) -> list[np.ndarray]:
    """The fake model's outputs for two different images: both equal to ``outputs``."""
    model = fake_model(outputs, input_hw, **kwargs)
    first = run_fake(model)
    second = run_fake(model, np.zeros((1, 3, *input_hw), np.float32))
    for a, b, want in zip(first, second, outputs, strict=True):
        assert a.shape == want.shape
        assert np.array_equal(a, want) and np.array_equal(b, want)
    return first


@pytest.mark.parametrize(
    ("family", "input_hw", "num_classes", "src"),
    [
        ("yolov8-seg-zoo", (640, 640), 80, (960, 540)),
        ("yolov5-seg-zoo", (320, 320), 12, (480, 640)),
        ("yolov8-seg-ultralytics", (256, 320), 12, (517, 333)),
    ],
)
def test_segment_layouts_through_a_fake_model(family, input_hw, num_classes, src):
    _, planted_outputs, lb = _scene_outputs(family, input_hw, num_classes, src, seed=3)
    outputs = _through_runtime(planted_outputs, input_hw)
    head = recognise_segment(input_hw, [o.shape for o in outputs])
    assert head is not None and head.family == family
    dets = SegmentDecoder(head, input_hw, DetectSettings(CONF, IOU, 300)).decode(outputs, lb)
    boxes, scores, classes, masks = reference(family, outputs, input_hw, num_classes, lb)
    assert len(scores) >= 5 and dets.class_ids.tolist() == classes.tolist()
    np.testing.assert_allclose(dets.scores, scores, atol=1e-3)
    np.testing.assert_allclose(dets.boxes, boxes, atol=3)
    for i, mask in enumerate(masks):
        assert _mask_iou(_mask(dets.masks[i], dets.height, dets.width), mask) >= 0.85


def _planted(family, image, input_hw, seed, *, rotated, keypoints=None, classes=3):
    rng = np.random.default_rng(seed)
    lb = letterbox_geometry(image[0], image[1], input_hw[1], input_hw[0])
    planted = F.random_instances(rng, lb, 5, classes, rotated=rotated, keypoints=keypoints)
    make = F.zoo_outputs if family == "zoo" else F.ultralytics_outputs
    return lb, make(input_hw, classes, planted, keypoints=keypoints)


def _assert_found(decoded, found: list[F.Found], extra) -> None:
    assert len(decoded) == len(found) >= 3
    for i, f in enumerate(found):
        assert int(decoded.class_ids[i]) == f.cls
        assert abs(float(decoded.scores[i]) - f.score) < 1e-3
        assert np.abs(decoded.boxes[i] - np.asarray(f.box)).max() < 3
        extra(i, f)


@pytest.mark.parametrize(
    ("family", "image", "input_hw"),
    [("zoo", (1280, 720), (640, 640)), ("ultralytics", (333, 900), (384, 640))],
)
def test_pose_layouts_through_a_fake_model(family, image, input_hw, tmp_path):
    lb, planted_outputs = _planted(family, image, input_hw, 5, rotated=False, keypoints=(17, 3))
    meta = ultralytics_metadata("pose", 3, input_hw, kpt_shape=(17, 3))
    outputs = _through_runtime(planted_outputs, input_hw, metadata=meta)
    read = read_model_metadata(
        write_fake_model(tmp_path / "m.onnx", outputs, input_hw, metadata=meta)
    )
    assert read is not None and read.task == "pose" and len(read.names or ()) == 3
    head = recognise_pose(input_hw, [o.shape for o in outputs], task=read.task, kpt_shape=(17, 3))
    assert head is not None and head.family == f"yolov8-pose-{family}"
    decoded = PoseDecoder(head, input_hw, DetectSettings(CONF, IOU))(outputs, lb)
    if family == "zoo":
        ref = F.zoo_pose_reference(outputs, input_hw, 3, CONF, IOU, lb)
    else:
        ref = F.ultralytics_pose_reference(outputs, input_hw, 3, CONF, IOU, lb, (17, 3))

    def keypoints_match(i, f):
        kp = np.asarray(f.keypoints)
        assert np.abs(decoded.keypoints[i, :, :2] - kp[:, :2]).max() < 3

    _assert_found(decoded, ref, keypoints_match)


@pytest.mark.parametrize(
    ("family", "image", "input_hw"),
    [("zoo", (500, 800), (640, 640)), ("ultralytics", (1920, 1080), (640, 640))],
)
def test_obb_layouts_through_a_fake_model(family, image, input_hw):
    lb, planted_outputs = _planted(family, image, input_hw, 7, rotated=True)
    outputs = _through_runtime(
        planted_outputs, input_hw, metadata=ultralytics_metadata("obb", 3, input_hw)
    )
    head = recognise_obb(input_hw, [o.shape for o in outputs], task="obb")
    assert head is not None and head.family == f"yolov8-obb-{family}"
    decoded = ObbDecoder(head, input_hw, ObbSettings(conf=CONF, iou=IOU, nms="polygon"))(
        outputs, lb
    )
    if family == "zoo":
        ref = F.zoo_obb_reference(outputs, input_hw, 3, CONF, IOU, lb)
    else:
        ref = F.ultralytics_obb_reference(outputs, input_hw, 3, CONF, IOU, lb)

    def corners_match(i, f):
        assert np.abs(decoded.polygons[i] - np.asarray(rr.corners(f.xywhr))).max() < 3

    _assert_found(decoded, ref, corners_match)
