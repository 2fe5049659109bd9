"""Issue 41's "done when": constant-output fake models (tests/fake_heads.py) in every
segment, pose and obb layout, run end to end through ``batchinfer run --task ...`` on images
of several sizes and aspect ratios; each row matches the independent references (the zoo's
Python post-processing and Ultralytics' semantics: tests/test_seg_decode.py's
``reference``, tests/pose_obb_outputs.py) per instance: class, score within 1e-3, box
corners within 3 px, mask IoU >= 0.85, keypoints within 3 px, polygon corners within 3 px.

The model's outputs are the same whatever the image, but each image is letterboxed
differently, so each row is compared with the references computed for its own geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pose_obb_outputs as F  # tests/ is on sys.path under pytest
import pytest
import rotated_reference as rr
from fake_heads import ultralytics_metadata, write_fake_model
from PIL import Image
from test_cli import assert_error, invoke
from test_seg_decode import _mask, _mask_iou, _scene_outputs, reference

from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.rotated import corners
from batchinfer.results import read_run

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

CONF, IOU = 0.25, 0.45
#: Original images (width, height): wide, tall, odd, small.
IMAGES = ((960, 540), (300, 500), (517, 333), (97, 200))


def _images(root: Path) -> Path:
    data = root / "images"
    data.mkdir()
    for w, h in IMAGES:
        Image.new("RGB", (w, h), (w % 255, h % 255, 90)).save(data / f"{w}x{h}.png")
    return data


def _run(tmp_path: Path, model: Path, task: str) -> dict[tuple[int, int], dict]:
    out = tmp_path / "out"
    result = invoke(
        "run", _images(tmp_path), "--model", model, "--out", out, "--task", task,
        "--backend", "onnx", "--no-progress", "--mean", "0", "--std", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert f"task: {task} (" in result.stderr
    rows = read_run(out).predictions().to_pylist()
    assert len(rows) == len(IMAGES) and all(r["error"] is None for r in rows)
    return {(r["width"], r["height"]): r for r in rows}


def _lb(size: tuple[int, int], input_hw: tuple[int, int]):
    return letterbox_geometry(size[0], size[1], input_hw[1], input_hw[0])


def _same_boxes(boxes: list[dict], classes, scores, xyxy) -> None:
    assert [b["class_id"] for b in boxes] == [int(c) for c in classes]
    np.testing.assert_allclose([b["score"] for b in boxes], scores, atol=1e-3)
    got = np.array([[b[k] for k in ("x1", "y1", "x2", "y2")] for b in boxes]).reshape(-1, 4)
    np.testing.assert_allclose(got, np.asarray(xyxy).reshape(-1, 4), atol=3)


@pytest.mark.parametrize(
    ("family", "input_hw", "num_classes"),
    [
        ("yolov8-seg-zoo", (320, 320), 12),
        ("yolov5-seg-zoo", (320, 320), 12),
        ("yolov8-seg-ultralytics", (256, 320), 12),
    ],
)
def test_segment_rows_match_the_reference(tmp_path, family, input_hw, num_classes):
    _, outputs, _ = _scene_outputs(family, input_hw, num_classes, (517, 333), seed=3)
    model = write_fake_model(tmp_path / "seg.onnx", outputs, input_hw)
    rows = _run(tmp_path, model, "segment")
    seen = 0
    for size in IMAGES:
        boxes = rows[size]["boxes"]
        want, scores, classes, masks = reference(
            family, outputs, input_hw, num_classes, _lb(size, input_hw)
        )
        _same_boxes(boxes, classes, scores, want)
        for box, mask in zip(boxes, masks, strict=True):
            m = box["mask"]
            assert (m["height"], m["width"]) == (size[1], size[0])
            assert _mask_iou(_mask(m["counts"], m["height"], m["width"]), mask) >= 0.85
        seen += len(boxes)
    assert seen >= 10


def _pose_outputs(family: str, input_hw, kpt) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    planted = F.random_instances(rng, _lb((517, 333), input_hw), 5, 3, False, keypoints=kpt)
    make = F.zoo_outputs if family == "zoo" else F.ultralytics_outputs
    return make(input_hw, 3, planted, keypoints=kpt)


@pytest.mark.parametrize(
    ("family", "input_hw", "kpt", "metadata"),
    [
        ("zoo", (640, 640), (17, 3), False),
        ("ultralytics", (384, 640), (17, 3), False),  # --task pose alone: COCO's 17 x 3
        ("ultralytics", (640, 480), (5, 2), True),  # the metadata's kpt_shape
    ],
)
def test_pose_rows_match_the_reference(tmp_path, family, input_hw, kpt, metadata):
    outputs = _pose_outputs(family, input_hw, kpt)
    meta = ultralytics_metadata("pose", 3, input_hw, kpt_shape=kpt) if metadata else None
    model = write_fake_model(tmp_path / "pose.onnx", outputs, input_hw, metadata=meta)
    rows = _run(tmp_path, model, "pose")
    seen = 0
    for size in IMAGES:
        lb = _lb(size, input_hw)
        if family == "zoo":
            ref = F.zoo_pose_reference(outputs, input_hw, 3, CONF, IOU, lb, kpt[1])
        else:
            ref = F.ultralytics_pose_reference(outputs, input_hw, 3, CONF, IOU, lb, kpt)
        boxes = rows[size]["boxes"]
        _same_boxes(boxes, [f.cls for f in ref], [f.score for f in ref], [f.box for f in ref])
        for box, f in zip(boxes, ref, strict=True):
            got = np.array([[p["x"], p["y"]] for p in box["keypoints"]])
            assert got.shape == (kpt[0], 2)
            assert np.abs(got - np.asarray(f.keypoints)[:, :2]).max() < 3
            if kpt[1] == 2:  # no visibility in the model: every keypoint scores 1
                assert {p["score"] for p in box["keypoints"]} == {1.0}
        seen += len(boxes)
    assert seen >= 10
    if metadata:  # the labels come from the metadata's names
        assert rows[IMAGES[0]]["boxes"][0]["label"].startswith("class")


@pytest.mark.parametrize(("family", "input_hw"), [("zoo", (640, 640)), ("ultralytics", (640, 640))])
def test_obb_rows_match_the_reference(tmp_path, family, input_hw):
    rng = np.random.default_rng(7)
    planted = F.random_instances(rng, _lb((517, 333), input_hw), 5, 3, rotated=True)
    make = F.zoo_outputs if family == "zoo" else F.ultralytics_outputs
    outputs = make(input_hw, 3, planted)
    model = write_fake_model(tmp_path / "obb.onnx", outputs, input_hw)
    rows = _run(tmp_path, model, "obb")
    seen = 0
    for size in IMAGES:
        lb = _lb(size, input_hw)
        if family == "zoo":  # the zoo's exact polygon NMS; Ultralytics' ProbIoU for its own
            ref = F.zoo_obb_reference(outputs, input_hw, 3, CONF, IOU, lb)
        else:
            ref = F.ultralytics_obb_reference(outputs, input_hw, 3, CONF, IOU, lb)
        boxes = rows[size]["boxes"]
        _same_boxes(boxes, [f.cls for f in ref], [f.score for f in ref], [f.box for f in ref])
        for box, f in zip(boxes, ref, strict=True):
            xywhr = np.array([[box[k] for k in ("cx", "cy", "w", "h", "angle")]])
            assert 0 <= box["angle"] < np.pi / 2
            assert np.abs(corners(xywhr)[0] - np.asarray(rr.corners(f.xywhr))).max() < 3
        seen += len(boxes)
    assert seen >= 10


def test_auto_takes_zoo_layouts_from_their_shapes_and_refuses_a_wrong_task(tmp_path):
    data = _images(tmp_path)
    outputs = _pose_outputs("zoo", (320, 320), (17, 3))
    model = write_fake_model(tmp_path / "pose.onnx", outputs, (320, 320))
    info = invoke("info", model, "--backend", "onnx")
    assert "task:    pose: YOLOv8-pose model-zoo head, 3 classes, 17 keypoints" in info.stdout
    result = invoke("run", data, "--model", model, "--out", tmp_path / "o", "--task", "segment")
    assert_error(result, 2, "--task segment:", "not a segmentation head", "--task raw")
    meta = ultralytics_metadata("obb", 3, (320, 320))
    obb = write_fake_model(tmp_path / "obb.onnx", outputs, (320, 320), metadata=meta)
    result = invoke("run", data, "--model", obb, "--out", tmp_path / "o2", "--task", "pose")
    assert_error(result, 2, "--task pose:", "Ultralytics oriented-box model", "--task obb")
