"""The demo detector's build tool (its numpy parts: assignment, decoding) and the model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer import demo
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


# --------------------------------------------------------------------------- the model

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def session():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(demo.model_path("digits-det")), opts, providers=["CPUExecutionProvider"]
    )


def _outputs(session, canvas: np.ndarray) -> list[np.ndarray]:
    x = (canvas.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)
    return session.run(None, {"images": x})


def test_detector_has_the_model_zoo_yolov8_head(tool, session):
    from batchinfer.detect import recognise

    assert [i.shape for i in session.get_inputs()] == [[1, 3, 256, 256]]
    assert [o.name for o in session.get_outputs()] == tool.output_names()
    shapes = [tuple(o.shape) for o in session.get_outputs()]
    assert shapes == [(1, c, 256 // s, 256 // s) for s in (8, 16, 32) for c in (64, 10, 1)]
    head = recognise((256, 256), shapes)
    assert head is not None and head.family == "yolov8-zoo" and head.num_classes == 10
    canvas = detection.letterbox(next(detection.scenes("val", 1)).image, 256)[0]
    out = _outputs(session, canvas)
    for level in range(3):
        box, cls, total = out[3 * level : 3 * level + 3]
        assert cls.min() >= 0 and cls.max() <= 1  # sigmoid in the graph
        np.testing.assert_allclose(total, np.clip(cls.sum(1, keepdims=True), 0, 1), atol=1e-6)
        assert box.min() < 0 < box.max()  # raw logits, not a softmax


def test_tool_decoding_agrees_with_batchinfer_detect(tool, session):
    from batchinfer.detect import Decoder, DetectSettings, recognise

    shapes = [tuple(o.shape) for o in session.get_outputs()]
    decoder = Decoder(recognise((256, 256), shapes), (256, 256), DetectSettings(0.25, 0.6, 100))
    compared = 0
    for scene in detection.scenes("val", 20):
        out = _outputs(session, detection.letterbox(scene.image, 256)[0])
        boxes, scores, classes = tool.decode(out, conf=0.25, iou=0.6)
        ours = decoder(out)
        order = np.lexsort((-scores, classes))
        theirs = np.lexsort((-ours.scores, ours.class_ids))
        assert classes[order].tolist() == ours.class_ids[theirs].tolist()
        np.testing.assert_allclose(scores[order], ours.scores[theirs], atol=1e-5)
        np.testing.assert_allclose(boxes[order], ours.boxes[theirs], atol=1e-3)
        compared += len(scores)
    assert compared >= 20 * 2


@pytest.mark.slow  # the whole val split again; default tier: its scores in the detection eval
def test_detector_reaches_its_recorded_float_map(tool, tmp_path):
    pytest.importorskip("pycocotools")
    measured = json.loads((demo.ASSETS / "measured.json").read_text())["detector"]
    recorded = measured["score"]["maps"]["digits-det.onnx"]
    scored = tool.score(tmp_path)["maps"]["digits-det.onnx"]  # the whole val split again
    assert scored["map50"] == pytest.approx(recorded["map50"], abs=1e-6)
    assert scored["map50_95"] == pytest.approx(recorded["map50_95"], abs=1e-6)
    assert recorded["map50"] >= 0.8


def test_emulator_timing_counts_every_op_of_the_detector():
    onnx = pytest.importorskip("onnx")
    from batchinfer.runtime import timing

    model = onnx.load(demo.model_path("digits-det"))
    work = timing.count_work(model, {"images": [1, 3, 256, 256]})
    assert work.uncounted == ()
    # MACs by hand: every Conv writes out elements of weight[1:] multiply-adds each.
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in (*inferred.graph.value_info, *inferred.graph.output)
    }
    macs = sum(
        int(np.prod(shapes[n.output[0]])) * int(np.prod(weights[n.input[1]][1:]))
        for n in model.graph.node
        if n.op_type == "Conv"
    )
    assert work.macs == macs
    ops = {n.op_type for n in model.graph.node}
    assert ops == {"Conv", "Relu", "Resize", "Add", "Sigmoid", "ReduceSum", "Clip"}
    assert work.other_elements > 0 and 0.1 < timing.predict(work) < 5


# --------------------------------------------------------------------------- .rknn files


@pytest.mark.parametrize("stem", sorted(demo.rknn_stems(detector=True)))
def test_detector_rknn_files_name_their_chip_and_the_nine_outputs(tool, stem):
    from batchinfer.runtime.rknn_file import read_rknn_metadata

    _, platform = demo.rknn_recipe(stem)
    meta = read_rknn_metadata(demo.ASSETS / f"{stem}.rknn")
    assert meta is not None and meta.platforms == (platform,)
    assert [t.name for t in meta.inputs] == ["images"]
    assert meta.inputs[0].shape == (1, 3, 256, 256)
    assert [t.name for t in meta.outputs] == tool.output_names()
    settings = json.loads((demo.ASSETS / f"{stem}.config.json").read_text())
    assert settings == tool.detector_settings(platform)


def test_detector_calibration_scenes_are_letterboxed_train_scenes():
    images = demo.calibration_images("digits-det")
    assert len(images) == demo.DETECTOR_CALIBRATION
    first = next(detection.scenes("train", 1))
    assert np.array_equal(images[0][1], detection.letterbox(first.image, 256)[0])
    assert all(image.shape == (256, 256, 3) for _, image in images)


# --------------------------------------------------------- the model zoo's demo, unchanged

SCRIPT = Path(__file__).resolve().parent / "rknnlite_scripts" / "yolov8_zoo_detector.py"


def test_model_zoo_yolov8_demo_runs_unchanged_and_finds_what_batchinfer_finds(tmp_path, session):
    """The zoo's YOLOv8 Python post-processing, run under the emulator on the demo
    detector's .rknn, gives the boxes batchinfer.detect gives for the same letterbox."""
    from PIL import Image

    from batchinfer.detect import (
        Decoder,
        DetectSettings,
        boxes_to_original,
        letterbox_array,
        recognise,
    )

    rknn = demo.write_rknn_model(tmp_path, "digits-det-rk3588")
    folder = tmp_path / "images"
    folder.mkdir()
    scenes = list(detection.scenes("val", 12))
    for i, scene in enumerate(scenes):
        Image.fromarray(scene.image).save(folder / f"{i:05d}.png")
    out = tmp_path / "boxes.json"
    env = {
        **os.environ,
        "BATCHINFER_SIM_STATE": str(tmp_path / "state"),
        "BATCHINFER_SIM_FAULTS": "",
        "BATCHINFER_SIM_NPU_MS": "0",
        "BATCHINFER_SIM_HOST_MS": "0",
    }
    env.pop("BATCHINFER_SIM_CHIP", None)
    names = ",".join(detection.CLASSES)
    cmd = [sys.executable, "-m", "batchinfer.runtime.emulate", "--board", "rk3588"]
    cmd += [str(SCRIPT), str(rknn), str(folder), str(out), "256", names]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " @ (" in proc.stdout
    zoo = json.loads(out.read_text())

    shapes = [tuple(o.shape) for o in session.get_outputs()]
    decoder = Decoder(recognise((256, 256), shapes), (256, 256), DetectSettings(0.25, 0.45))
    found = 0
    for i, scene in enumerate(scenes):
        canvas, lb = letterbox_array(scene.image, 256, 256, pad=(0, 0, 0))
        ours = decoder(_outputs(session, canvas))
        boxes = boxes_to_original(ours.boxes, lb)
        theirs = zoo[f"{i:05d}.png"]
        assert len(theirs) == len(ours)
        z_order = sorted(
            range(len(theirs)), key=lambda k: (theirs[k]["class_id"], -theirs[k]["score"])
        )
        o_order = np.lexsort((-ours.scores, ours.class_ids))
        assert [theirs[k]["class_id"] for k in z_order] == ours.class_ids[o_order].tolist()
        np.testing.assert_allclose(
            [theirs[k]["score"] for k in z_order], ours.scores[o_order], atol=1e-4
        )
        # The zoo maps back with half the padding (a float) where the image sits at its
        # integer offset: up to half a canvas pixel apart on odd paddings.
        tolerance = 0.5 / lb.scale + 1e-3
        np.testing.assert_allclose(
            [theirs[k]["box"] for k in z_order], boxes[o_order], atol=tolerance
        )
        # And they are the digits: most ground-truth boxes are found at IoU >= 0.5.
        for gt, label in zip(scene.boxes, scene.labels, strict=True):
            same = boxes[ours.class_ids == label]
            if len(same):
                iw = np.clip(np.minimum(same[:, 2], gt[2]) - np.maximum(same[:, 0], gt[0]), 0, None)
                ih = np.clip(np.minimum(same[:, 3], gt[3]) - np.maximum(same[:, 1], gt[1]), 0, None)
                inter = iw * ih
                area = (same[:, 2] - same[:, 0]) * (same[:, 3] - same[:, 1])
                union = area + (gt[2] - gt[0]) * (gt[3] - gt[1]) - inter
                found += int((inter / union).max() >= 0.5)
    assert found >= 0.8 * sum(len(s.boxes) for s in scenes)
