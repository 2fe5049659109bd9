"""The demo detector's build tool (its numpy parts: assignment, decoding) and the model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer.demo import detection

TOOL = Path(__file__).resolve().parents[1] / "tools" / "build_demo_detector.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("build_demo_detector", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _encode(tool, boxes: np.ndarray, classes: np.ndarray) -> list[np.ndarray]:
    """Nine outputs in the model-zoo layout that say ``boxes`` (input pixels) and classes.

    Each box is written at the anchor nearest its centre on the stride 16 level: a peaked
    DFL distribution per side (two neighbouring bins, so fractions come through) and a
    class score of 0.9.
    """
    outputs = []
    for s in tool.STRIDES:
        n = tool.INPUT // s
        box = np.full((1, 4, tool.REG_MAX, n, n), -20.0, np.float32)
        cls = np.zeros((1, tool.CLASSES, n, n), np.float32)
        if s == 16:
            for (x1, y1, x2, y2), c in zip(boxes, classes, strict=True):
                gx, gy = int((x1 + x2) / 2 // s), int((y1 + y2) / 2 // s)
                cx, cy = (gx + 0.5) * s, (gy + 0.5) * s
                for side, d in enumerate(
                    ((cx - x1) / s, (cy - y1) / s, (x2 - cx) / s, (y2 - cy) / s)
                ):
                    lo, frac = int(d), d - int(d)
                    # Two logits whose softmax gives (1 - frac, frac) on bins lo, lo + 1.
                    box[0, side, lo, gy, gx] = np.log(max(1 - frac, 1e-12))
                    box[0, side, lo + 1, gy, gx] = np.log(max(frac, 1e-12))
                cls[0, c, gy, gx] = 0.9
        box = box.reshape(1, 4 * tool.REG_MAX, n, n)
        outputs += [box, cls, np.clip(cls.sum(1, keepdims=True), 0, 1)]
    return outputs


def test_decode_reads_the_model_zoo_layout(tool):
    boxes = np.array([[20.0, 30.0, 60.5, 90.25], [150.0, 100.0, 200.0, 140.0]], np.float32)
    classes = np.array([3, 7])
    got_boxes, scores, got_classes = tool.decode(_encode(tool, boxes, classes), conf=0.5)
    order = np.argsort(got_boxes[:, 0])
    np.testing.assert_allclose(got_boxes[order], boxes, atol=1e-3)
    assert got_classes[order].tolist() == [3, 7]
    np.testing.assert_allclose(scores, 0.9)


def test_nms_is_per_class_in_decode_and_greedy(tool):
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60]], np.float32)
    assert tool.nms(boxes, np.array([0.5, 0.9, 0.3]), 0.5).tolist() == [1, 2]
    assert tool.nms(boxes, np.array([0.5, 0.9, 0.3]), 0.9).tolist() == [1, 0, 2]


def test_assignment_gives_every_box_positives_inside_it(tool):
    centres, _, levels = tool.anchor_points()
    assert len(centres) == sum((tool.INPUT // s) ** 2 for s in tool.STRIDES)
    for step in range(3):
        _, targets = tool.train_batch(step)
        match = tool.assign(targets, centres, levels)
        for b, t in enumerate(targets):
            m = match[b]
            assert set(m[m >= 0].tolist()) == set(range(len(t)))  # every box has a positive
            for j, (_, x1, y1, x2, y2) in enumerate(t):
                p = centres[m == j]
                assert np.all((p[:, 0] > x1) & (p[:, 0] < x2) & (p[:, 1] > y1) & (p[:, 1] < y2))


def test_train_batches_are_letterboxed_scenes_with_their_boxes(tool):
    images, targets = tool.train_batch(1)
    assert images.shape == (tool.BATCH, tool.INPUT, tool.INPUT, 3)
    scenes = list(detection.scenes("train", tool.BATCH, start=tool.BATCH))
    for image, t, scene in zip(images, targets, scenes, strict=True):
        pads = (0, tool.PAD)  # both paddings are trained: the model zoo uses each
        assert any(
            np.array_equal(image, detection.letterbox(scene.image, tool.INPUT, pad)[0])
            for pad in pads
        )
        _, scale, px, py = detection.letterbox(scene.image, tool.INPUT)
        np.testing.assert_allclose(t[:, 1:], scene.boxes * scale + [px, py, px, py], rtol=1e-6)
        assert np.all(t[:, 1:] >= 0) and np.all(t[:, 1:] <= tool.INPUT)
