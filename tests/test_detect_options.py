"""Issue 40's detection settings: class-agnostic NMS and a class filter (flags, job keys,
the manifest, resume's fingerprint), and which head an ambiguous output is (``--head``, the
class count of the labels or the metadata)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from batchinfer.errors import ConfigError
from batchinfer.options import DETECT_HEADS, DetectOptions, from_mapping
from batchinfer.tasks import plan_task

V8_ULTRALYTICS = [(1, 84, 8400)]
ROWS = [(1, 84, 15)]  # 64x64: 84 cells; 10 classes with an object score, or 11 transposed


def _plan(tmp_path: Path, shapes, labels=None, **opts):
    return plan_task(
        DetectOptions(**opts), tmp_path / "m.onnx", (64, 64) if shapes == ROWS else (640, 640),
        labels, output_shapes=shapes,
    )  # fmt: skip


def _labels(tmp_path: Path, n: int) -> Path:
    path = tmp_path / f"labels{n}.txt"
    path.write_text("".join(f"c{i}\n" for i in range(n)))
    return path


def _rows_export(path: Path, names: str | None) -> Path:
    """A 64x64 model with one (1, 84, 15) output (a row per cell), ``names`` metadata."""
    import onnx

    shape = numpy_helper.from_array(np.array([1, 84, 15], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["output0"])],
        path.stem,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 84, 15])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    if names is not None:
        helper.set_model_props(model, {"task": "detect", "names": names})
    onnx.save(model, str(path))
    return path


# ---------------------------------------------------------------- agnostic NMS, classes
def test_the_settings_as_flags_and_job_keys() -> None:
    from batchinfer.cli.options import flag_of

    assert flag_of("detect.agnostic_nms") == "--agnostic-nms"
    assert flag_of("detect.classes") == "--classes"
    assert flag_of("detect.head") == "--head"
    opts = from_mapping(
        DetectOptions,
        {"agnostic_nms": True, "classes": [0, 2], "head": "yolov8-ultralytics"},
        "device.detect",
    )
    assert (opts.agnostic_nms, opts.classes, opts.head) == (True, (0, 2), "yolov8-ultralytics")
    with pytest.raises(ConfigError, match=r"device\.detect\.classes must be a list of integers"):
        from_mapping(DetectOptions, {"classes": "0,2"}, "device.detect")
    with pytest.raises(ConfigError, match=r"device\.detect\.classes must be at least 0"):
        from_mapping(DetectOptions, {"classes": [-1]}, "device.detect")
    with pytest.raises(ConfigError, match=r"device\.detect\.head must be one of auto, yolov5-zoo"):
        from_mapping(DetectOptions, {"head": "yolov9"}, "device.detect")


def test_head_names_are_the_families_the_decoder_knows() -> None:
    from batchinfer.detect.heads import HEAD_FAMILIES

    assert ("auto", *HEAD_FAMILIES) == DETECT_HEADS


def test_they_reach_the_decoder_the_manifest_and_the_fingerprint(tmp_path) -> None:
    plain = _plan(tmp_path, V8_ULTRALYTICS)
    assert plain.settings.agnostic is False and plain.settings.classes is None
    record = plain.to_json()["settings"]
    assert record["agnostic_nms"] is False and record["classes"] is None
    # unset, they leave the fingerprint as it was: runs started before them still resume
    assert "agnostic_nms" not in plain.fingerprint()["settings"]
    assert "classes" not in plain.fingerprint()["settings"]
    assert "rows" not in plain.fingerprint()["head"]

    chosen = _plan(tmp_path, V8_ULTRALYTICS, agnostic_nms=True, classes=(0, 2))
    assert chosen.settings.agnostic is True and chosen.settings.classes == (0, 2)
    assert chosen.to_json()["settings"]["classes"] == [0, 2]
    fingerprints = {
        str(_plan(tmp_path, V8_ULTRALYTICS, **o).fingerprint())
        for o in ({}, {"agnostic_nms": True}, {"classes": (0, 2)}, {"classes": (0,)})
    }
    assert len(fingerprints) == 4  # each changes what a resume must match


def test_a_class_the_head_has_not_is_a_usage_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"detect\.classes names class 80, but the model's head"):
        _plan(tmp_path, V8_ULTRALYTICS, classes=(0, 80))


@pytest.mark.parametrize("empty", [(), []])
def test_an_empty_class_filter_is_a_usage_error(tmp_path, empty) -> None:
    # `--classes ''` (an unset shell variable) or `classes = []` in a job kept no box at
    # all: every image had 0 boxes and the run said "complete", rc 0.
    with pytest.raises(ConfigError, match=r"detect\.classes names no class"):
        _plan(tmp_path, V8_ULTRALYTICS, classes=empty)


# ---------------------------------------------------------------- an ambiguous head
def test_the_class_count_of_labels_or_metadata_tells_rows_apart(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="batchinfer"):
        assert _plan(tmp_path, ROWS, _labels(tmp_path, 11)).head.rows
        five = _plan(tmp_path, ROWS, _labels(tmp_path, 10)).head
        assert five.family == "yolov5-ultralytics" and five.num_classes == 10
    assert not caplog.records  # decided: nothing to say

    eleven = repr([f"n{i}" for i in range(11)])
    model = _rows_export(tmp_path / "m11.onnx", eleven)
    plan = plan_task(DetectOptions(), model, (64, 64))
    assert plan.head.rows and plan.names[-1] == "n10" and plan.names_source == "model-metadata"


def test_an_undecided_one_is_said_and_head_chooses(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="batchinfer"):
        plan = _plan(tmp_path, ROWS)
    assert plan.head.family == "yolov5-ultralytics" and plan.head.num_classes == 10
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("The output layout is ambiguous")
    assert "detect.head yolov8-ultralytics reads it as the other" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchinfer"):
        forced = _plan(tmp_path, ROWS, head="yolov8-ultralytics")
    assert forced.head.rows and forced.head.num_classes == 11 and not caplog.records
    assert forced.to_json()["head"]["rows"] is True
    with pytest.raises(ConfigError, match=r"detect\.head yolov8-zoo does not fit the model's"):
        _plan(tmp_path, ROWS, head="yolov8-zoo")
