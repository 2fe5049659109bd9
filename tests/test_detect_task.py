"""The pieces of a detection run, one at a time: which task a model gets, the detection
settings (flags, job keys, sidecar anchors), letterboxed reads and the box columns."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from batchinfer.data import load_into, preprocess_for
from batchinfer.detect import COCO80
from batchinfer.errors import ConfigError
from batchinfer.options import DetectOptions, _anchors, _colour, from_mapping
from batchinfer.sink.predictions import PredictionWriter
from batchinfer.sink.rows import Row
from batchinfer.tasks import plan_task
from batchinfer.tasks.boxes import BoxRows

V5_ZOO = [(1, 255, 80, 80), (1, 255, 40, 40), (1, 255, 20, 20)]  # 640x640, 80 classes
V8_ULTRALYTICS = [(1, 84, 8400)]
ANCHORS = "10,13,16,30,33,23/30,61,62,45,59,119/116,90,156,198,373,326"


def _plan(tmp_path: Path, shapes, **opts):
    return plan_task(DetectOptions(**opts), tmp_path / "m.onnx", (640, 640), output_shapes=shapes)


# -------------------------------------------------------------------------- the task
def test_auto_picks_detect_classify_or_raw_from_the_outputs(tmp_path):
    detect = _plan(tmp_path, V8_ULTRALYTICS)
    assert detect.detects and detect.head.family == "yolov8-ultralytics"
    assert detect.names == COCO80 and detect.names_source == "coco80"
    assert _plan(tmp_path, [(1, 1000)]).name == "classify"
    assert _plan(tmp_path, [(1, 1000, 1, 1)]).name == "classify"
    raw = _plan(tmp_path, [(1, 4), (1, 1)])
    assert raw.name == "raw" and "[1, 4], [1, 1]" in raw.reason
    assert _plan(tmp_path, V8_ULTRALYTICS, task="raw").name == "raw"
    assert _plan(tmp_path, V8_ULTRALYTICS, task="classify").name == "classify"


def test_a_bare_rknn_is_a_classifier_unless_detect_is_asked(tmp_path):
    model = tmp_path / "bare.rknn"
    model.write_bytes(b"\0" * 64)
    assert plan_task(DetectOptions(), model, (64, 64)).name == "classify"
    with pytest.raises(ConfigError, match="needs the model's output shapes"):
        plan_task(DetectOptions(task="detect"), model, (64, 64))


def test_anchors_come_from_the_option_then_the_sidecar_then_coco(tmp_path):
    assert _plan(tmp_path, V5_ZOO).anchors_source == "default"
    assert _plan(tmp_path, V5_ZOO).settings.anchors is None  # the decoder's COCO anchors
    # The model's .config.json (its conversion settings) may carry them, flat as the model
    # zoo's anchors file is.
    flat = [float(v) for v in ANCHORS.replace("/", ",").split(",")]
    doubled = [2 * v for v in flat]
    (tmp_path / "m.config.json").write_text(json.dumps({"anchors": doubled}))
    side = _plan(tmp_path, V5_ZOO)
    assert side.anchors_source == "m.config.json"
    assert side.settings.anchors[0] == ((20.0, 26.0), (32.0, 60.0), (66.0, 46.0))
    given = _plan(tmp_path, V5_ZOO, anchors=_anchors(ANCHORS))
    assert given.anchors_source == "option"
    assert given.settings.anchors[2] == ((116.0, 90.0), (156.0, 198.0), (373.0, 326.0))
    with pytest.raises(ConfigError, match=r"needs 3 \(w,h pairs\) for each of its 3 strides"):
        _plan(tmp_path, V5_ZOO, anchors=_anchors("10,13,16,30"))


def test_the_settings_as_flags_and_as_job_keys():
    assert _anchors("1,2,3,4/5,6,7,8") == ((1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0))
    with pytest.raises(ValueError, match="whole w,h pairs"):
        _anchors("1,2,3")
    assert _colour("114") == 114 and _colour("0,128,255") == (0, 128, 255)
    opts = from_mapping(
        DetectOptions,
        {"task": "detect", "conf": 0.3, "max_det": 50, "pad_colour": [0, 0, 0]},
        "device.detect",
    )
    assert (opts.task, opts.conf, opts.max_det, opts.pad_colour) == ("detect", 0.3, 50, (0, 0, 0))
    # the task is free-form (plug-ins: file.py:Class); a name that is no task is refused
    # when the run is planned, naming the built-in ones and the plug-in forms
    assert from_mapping(DetectOptions, {"task": "segment"}, "device.detect").task == "segment"
    with pytest.raises(ConfigError, match=r"'bogus' is no task: give auto, detect, "):
        _plan(Path("/nonexistent"), V8_ULTRALYTICS, task="bogus")
    with pytest.raises(ConfigError, match=r"device\.detect\.conf must be a number"):
        from_mapping(DetectOptions, {"conf": "high"}, "device.detect")


# -------------------------------------------------------------------------- reading
def test_letterboxed_reads_keep_the_aspect_and_pad(tmp_path):
    a = np.full((30, 60, 3), 200, np.uint8)  # 60 wide, 30 high: padded above and below
    Image.fromarray(a).save(tmp_path / "wide.png")
    spec = preprocess_for((1, 32, 32, 3), "uint8", resize="letterbox", pad=(1, 2, 3))
    out = np.zeros(spec.shape, np.uint8)
    placed = load_into(str(tmp_path / "wide.png"), spec, out, "images")
    assert (placed.src_w, placed.src_h, placed.pad_x, placed.pad_y) == (60, 30, 0, 8)
    assert placed.scale == pytest.approx(32 / 60)
    assert (out[0, :8] == (1, 2, 3)).all() and (out[0, 24:] == (1, 2, 3)).all()
    assert (out[0, 8:24] == 200).all()
    stretched = preprocess_for((1, 32, 32, 3), "uint8")
    assert load_into(str(tmp_path / "wide.png"), stretched, out, "images") is None


def test_the_geometry_is_the_upright_images(tmp_path):
    a = np.zeros((30, 60, 3), np.uint8)  # stored 60x30, EXIF 8: seen upright as 30x60
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.fromarray(a).save(tmp_path / "turned.jpg", exif=exif)
    spec = preprocess_for((1, 32, 32, 3), "uint8", resize="letterbox")
    out = np.zeros(spec.shape, np.uint8)
    placed = load_into(str(tmp_path / "turned.jpg"), spec, out, "images")
    assert (placed.src_w, placed.src_h, placed.pad_x, placed.pad_y) == (30, 60, 8, 0)
    assert (out[0, :, :8] == 114).all() and (out[0, :, 24:] == 114).all()


# -------------------------------------------------------------------------- the columns
def _row(index: int, boxes=None, error=None) -> Row:
    return Row(
        index=index, id=f"i{index}", id_bytes=None, label=None, label_name=None, core=0,
        instance=0, attempt=1, latency_ms=1.0, read_ms=1.0, wait_ms=0.0, error=error,
        payload=None if error else BoxRows(boxes, 40, 30),
    )  # fmt: skip


def test_box_columns_keep_order_labels_and_nulls(tmp_path):
    two = np.array([[1, 2, 3, 4, 0.9, 1], [5, 6, 7, 8, 0.5, 7]], np.float32)
    with PredictionWriter(tmp_path, task="detect", class_names=("a", "b")) as w:
        w.write([_row(0, two), _row(1, np.empty((0, 6), np.float32)), _row(2, error="bad")])
    [part] = (tmp_path / "predictions").glob("part-*.parquet")
    rows = pq.read_table(part).to_pylist()
    assert rows[0]["boxes"] == [
        {"class_id": 1, "label": "b", "score": pytest.approx(0.9), "x1": 1, "y1": 2, "x2": 3,
         "y2": 4},
        {"class_id": 7, "label": None, "score": 0.5, "x1": 5, "y1": 6, "x2": 7, "y2": 8},
    ]  # fmt: skip
    assert (rows[0]["n_boxes"], rows[0]["width"], rows[0]["height"]) == (2, 40, 30)
    assert (rows[1]["boxes"], rows[1]["n_boxes"]) == ([], 0)
    assert (rows[2]["boxes"], rows[2]["n_boxes"], rows[2]["width"]) == (None, None, None)
    assert pq.read_schema(part).metadata[b"batchinfer.task"] == b"detect"


# -------------------------------------------------------------------------- compatibility
def test_a_classification_runs_fingerprint_is_the_one_it_had_before_detection(tmp_path):
    """Runs started before detection existed can be resumed: their preprocessing record has
    no pad colour, and there is no task entry."""
    import models as M
    from runs import config

    from batchinfer.engine.planning.plan import plan_run

    data = tmp_path / "d"
    data.mkdir()
    Image.new("L", (8, 8)).save(data / "x.png")
    plan = plan_run(config(data, M.nhwc_uint8_model(tmp_path), backend="onnx", out=tmp_path / "o"))
    assert set(plan.fingerprint["preprocess"]) == {
        "shape", "dtype", "layout", "color", "mean", "std", "resize", "exif_orientation",
        "background", "max_pixels", "jpeg_draft",
    }  # fmt: skip
    assert "task" not in plan.fingerprint


# -------------------------------------------------------------------------- int8 outputs
def test_int8_outputs_are_decoded_with_the_graphs_quantisation(tmp_path):
    """A runtime that returns int8 outputs gets them dequantised with the (scale, zero point)
    planned from the model; without them the item fails with a sentence, not wrong boxes."""
    from detect_models import colour_detector

    from batchinfer.tasks import ItemDecoder

    model = colour_detector(tmp_path)
    task = plan_task(DetectOptions(), model, (64, 64))
    shapes = task.output_shapes
    rng = np.random.default_rng(0)
    floats, scales = [], []
    for i, shape in enumerate(shapes):
        if i % 3 == 0:  # DFL logits: each side peaks at a bin of its own
            f = rng.uniform(0, 2, shape).astype(np.float32)
            f[:, 1::16] += 18
            scales.append(0.2)
        else:  # class scores and their sums: all below conf
            f = rng.uniform(0, 0.1, shape).astype(np.float32)
            scales.append(1 / 127)
        floats.append(f)
    floats[1][0, 0, 2, 3] = 0.9  # one confident red cell at stride 8: (gx 3, gy 2)
    quantised = [np.round(f / s).astype(np.int8) for f, s in zip(floats, scales, strict=True)]
    want = ItemDecoder(task)(floats, np.zeros(6)).payload.rows
    with_quant = dataclasses.replace(task, quant=tuple((s, 0) for s in scales))
    got = ItemDecoder(with_quant)(quantised, np.zeros(6)).payload.rows
    assert len(want) == len(got) == 1 and got[0, 5] == want[0, 5] == 0
    np.testing.assert_allclose(got[:, :4], want[:, :4], atol=0.5)
    np.testing.assert_allclose(got[:, 4], want[:, 4], atol=0.01)
    with pytest.raises(ValueError, match="int8 outputs whose quantisation"):
        ItemDecoder(task)(quantised, np.zeros(6))


# ------------------------------------------------------ Ultralytics' metadata_props
def _ultralytics_export(path: Path, channels: int, props: dict[str, str] | None) -> Path:
    """A 64x64 model with one (1, channels, 84) output (84 cells: strides 8/16/32), the
    layout of an Ultralytics export, carrying ``props`` as its metadata_props."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, channels, 84], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["output0"])],
        path.stem,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, 84])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    if props is not None:
        helper.set_model_props(model, props)
    onnx.save(model, str(path))
    return path


POSE = {
    "description": "Ultralytics YOLOv8n-pose model",
    "task": "pose",
    "stride": "32",
    "imgsz": "[64, 64]",
    "kpt_shape": "[17, 3]",
    "names": "{0: 'person'}",
}


def test_the_graph_reader_gives_the_models_metadata_props(tmp_path):
    from batchinfer.runtime.onnx_graph import read_graph_interface

    model = _ultralytics_export(tmp_path / "pose.onnx", 56, POSE)
    assert dict(read_graph_interface(model).metadata) == POSE
    assert read_graph_interface(_ultralytics_export(tmp_path / "b.onnx", 6, None)).metadata == ()


def test_a_pose_export_is_not_taken_for_a_52_class_detector(tmp_path):
    # (1, 56, N) is also the layout of a 52-class detector: before, auto decoded it so.
    model = _ultralytics_export(tmp_path / "yolov8n-pose.onnx", 56, POSE)
    plan = plan_task(DetectOptions(), model, (64, 64))
    assert plan.name == "pose" and plan.model_task == "pose"
    assert plan.head.num_classes == 1 and plan.head.num_keypoints == 17
    assert "from the model's metadata (task: pose)" in plan.reason
    with pytest.raises(ConfigError) as asked:
        plan_task(DetectOptions(task="detect"), model, (64, 64))
    message = str(asked.value)
    assert "yolov8n-pose.onnx is an Ultralytics pose (keypoint) model, not a detector" in message
    assert "says task: pose" in message and "detect.task raw" in message
    assert "classify" not in message
    # Older exports name no task but carry keypoints.
    older = {k: v for k, v in POSE.items() if k != "task"}
    old = _ultralytics_export(tmp_path / "old-pose.onnx", 56, older)
    assert plan_task(DetectOptions(), old, (64, 64)).name == "pose"


# (1, 56, N) is an OBB head of 51 classes; no segmentation head has one output
@pytest.mark.parametrize(
    ("task", "taken"), [("segment", "raw"), ("obb", "obb"), ("classify", "raw")]
)
def test_other_ultralytics_tasks_are_not_detectors_either(tmp_path, task, taken):
    model = _ultralytics_export(tmp_path / f"{task}.onnx", 56, {"task": task})
    assert plan_task(DetectOptions(), model, (64, 64)).name == taken
    with pytest.raises(ConfigError, match=f"says task: {task}"):
        plan_task(DetectOptions(task="detect"), model, (64, 64))


def test_a_detect_export_takes_its_class_names_from_the_metadata(tmp_path):
    names = "{0: 'cat', 1: 'dog'}"
    model = _ultralytics_export(tmp_path / "det.onnx", 6, {"task": "detect", "names": names})
    plan = plan_task(DetectOptions(), model, (64, 64))
    assert plan.detects and plan.head.num_classes == 2
    assert plan.names == ("cat", "dog") and plan.names_source == "model-metadata"
    assert not plan.classes_from_shape
    # --labels still win; names that do not fit the head are not used.
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    assert plan_task(DetectOptions(), model, (64, 64), labels).names == ("a", "b")
    three = _ultralytics_export(tmp_path / "d3.onnx", 6, {"names": "{0: 'a', 1: 'b', 2: 'c'}"})
    assert plan_task(DetectOptions(), three, (64, 64)).names == ()
    # Not a literal (never evaluated as code), or ids with a gap: ignored.
    for bad in ("__import__('os').getcwd()", "{0: 'a', 2: 'b'}"):
        odd = _ultralytics_export(tmp_path / "odd.onnx", 6, {"names": bad})
        assert plan_task(DetectOptions(), odd, (64, 64)).names == ()


def test_without_metadata_info_says_the_classes_were_inferred_from_the_shape(tmp_path):
    from click.testing import CliRunner

    from batchinfer.cli import main

    bare = _ultralytics_export(tmp_path / "bare.onnx", 56, None)
    plan = plan_task(DetectOptions(), bare, (64, 64))
    assert plan.detects and plan.head.num_classes == 52 and plan.classes_from_shape
    info = CliRunner().invoke(main, ["info", str(bare), "--backend", "onnx"])
    assert info.exit_code == 0, info.output
    assert "52 classes inferred from the output shapes" in info.stdout
    pose = _ultralytics_export(tmp_path / "pose.onnx", 56, POSE)
    info = CliRunner().invoke(main, ["info", str(pose), "--backend", "onnx"])
    assert "task:    pose: YOLOv8/YOLO11-pose Ultralytics ONNX head, 1 class, 17 keypoints" in (
        info.stdout
    )
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (64, 64)).save(data / "a.png")
    run = CliRunner().invoke(
        main, ["run", str(data), "--model", str(pose), "--task", "detect",
               "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert run.exit_code == 2, run.output
    assert "--task detect: pose.onnx is an Ultralytics pose" in run.stderr
    assert "Use --task raw" in run.stderr
