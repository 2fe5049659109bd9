"""The demo pose model (tools/build_demo_pose.py): its keypoints' ground truth, its layout,
and its mAP on the first val images as measured.json records."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer import demo
from batchinfer.demo import detection

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _measured() -> dict:
    return json.loads((demo.ASSETS / "measured.json").read_text())["pose"]


# --------------------------------------------------------------------------- ground truth


def test_keypoints_are_the_ends_of_the_ink():
    ink = np.zeros((5, 6), bool)
    ink[1, 2:4] = True  # the top row: columns 2 and 3
    ink[2:4, 1] = True  # the left column: rows 2 and 3
    ink[3, 4] = True  # the right column (4) and the bottom row (3): one pixel each
    ink[3, 1:5] = True
    got = detection.ink_keypoints(ink)
    # top, right, bottom, left; pixel centres (+0.5)
    np.testing.assert_allclose(got, [[3.0, 1.5], [4.5, 3.5], [3.0, 3.5], [1.5, 3.0]])


def test_ground_truth_keypoints_lie_on_the_ink_at_the_box_edges():
    scenes = list(detection.scenes("val", 8))
    items = [(f"{i:05d}.png", s) for i, s in enumerate(scenes)]
    coco = detection.coco_instances(items, keypoints=True)
    plain = detection.coco_instances(items)
    assert [c["keypoints"] for c in coco["categories"]] == [list(detection.KEYPOINTS)] * 10
    assert coco["categories"][0]["skeleton"] == [[1, 2], [2, 3], [3, 4], [4, 1]]
    annotations = iter(coco["annotations"])
    for scene, masks in ((s, s.masks()) for s in scenes):
        for box, mask, points in zip(scene.boxes, masks, scene.keypoints(), strict=True):
            a = next(annotations)
            assert a["num_keypoints"] == 4 and a["area"] == mask.sum()
            flat = np.array(a["keypoints"]).reshape(4, 3)
            assert (flat[:, 2] == 2).all()
            np.testing.assert_allclose(flat[:, :2], points, atol=1e-3)
            # each keypoint is the centre of an inked pixel's row or column at the box's edge
            x1, y1, x2, y2 = box
            assert points[0, 1] == y1 + 0.5 and points[2, 1] == y2 - 0.5
            assert points[1, 0] == x2 - 0.5 and points[3, 0] == x1 - (-0.5)
            for x, y in points:
                assert mask[int(y), int(np.clip(x, x1, x2 - 1))] or mask[int(y)].any()
    assert [a["bbox"] for a in coco["annotations"]] == [a["bbox"] for a in plain["annotations"]]


def test_write_detection_writes_the_keypoints(tmp_path):
    written = detection.write_detection(tmp_path / "det", n=2)
    assert written.instances_pose == tmp_path / "det" / "instances-pose.json"
    pose = json.loads(written.instances_pose.read_text())
    assert len(pose["annotations"]) == written.boxes
    assert all(len(a["keypoints"]) == 12 for a in pose["annotations"])


# --------------------------------------------------------------------------- the model

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def session():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(demo.model_path("digits-pose")), opts, providers=["CPUExecutionProvider"]
    )


def _outputs(session, canvas: np.ndarray) -> list[np.ndarray]:
    x = (canvas.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)
    return session.run(None, {"images": x})


def test_pose_model_is_the_model_zoo_yolov8_pose_layout(session):
    from batchinfer.detect import recognise
    from batchinfer.detect.pose import PoseHead, recognise_pose

    shapes = [tuple(o.shape) for o in session.get_outputs()]
    assert shapes == [(1, 74, 32, 32), (1, 74, 16, 16), (1, 74, 8, 8), (1, 4, 3, 1344)]
    assert recognise_pose((256, 256), shapes) == PoseHead("yolov8-pose-zoo", 10, 4, 3, (8, 16, 32))
    assert recognise((256, 256), shapes) is None  # not mistaken for a detector
    assert (demo.ASSETS / "digits-pose.onnx").stat().st_size <= 2_300_000
    for name in demo.rknn_stems(pose=True):
        assert (demo.ASSETS / f"{name}.rknn").stat().st_size <= 1_500_000


def test_boxes_and_classes_are_the_detectors(session):
    """The box logits are digits-det's, the class logits its scores before the sigmoid."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    detector = ort.InferenceSession(str(demo.model_path("digits-det")), opts)
    scene = next(detection.scenes("val", 1))
    canvas = detection.letterbox(scene.image, 256)[0]
    got, want = _outputs(session, canvas), _outputs(detector, canvas)
    for level in range(3):
        np.testing.assert_allclose(got[level][:, :64], want[3 * level], atol=1e-5)
        probs = 1 / (1 + np.exp(-got[level][:, 64:].astype(np.float64)))
        np.testing.assert_allclose(probs, want[3 * level + 1], atol=1e-5)


def test_first_val_images_score_as_recorded(session):
    """PoseDecoder and pycocotools on the first val images: the keypoints mAP that
    measured.json records, and the keypoints found near the ground truth's."""
    pytest.importorskip("pycocotools.cocoeval")
    sys.path.insert(0, str(TOOLS))
    try:
        spec = importlib.util.spec_from_file_location(
            "demo_pose_score", TOOLS / "demo_pose_score.py"
        )
        score = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(score)
    finally:
        sys.path.remove(str(TOOLS))
    measured = _measured()["score"]
    n = measured["first_images"]

    def run(canvas):
        return _outputs(session, canvas)

    results = score.predictions(run, n)
    recorded = measured["maps"]["digits-pose.onnx"]["first"]
    got = score.coco_maps(results, n)
    for kind in ("bbox", "keypoints"):
        assert got[kind]["map50"] == pytest.approx(recorded[kind]["map50"], abs=1e-6)
    assert got["keypoints"]["map50"] > 0.7
    assert score.keypoint_errors(results, n)["median_px"] < 4
