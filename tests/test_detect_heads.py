"""Head recognition from output shapes, on shapes and on ONNX graphs run by the runtime."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import detect_outputs as D  # tests/ is on sys.path under pytest
import numpy as np
import pytest

from batchinfer.detect import (
    KNOWN_HEADS,
    Decoder,
    DetectSettings,
    Head,
    explain_no_head,
    recognise,
)
from batchinfer.detect.heads import choose, readings
from batchinfer.runtime import describe_model


def v8_zoo_shapes(size=(640, 640), classes=80, score_sum=True) -> list[tuple[int, ...]]:
    shapes = []
    for gh, gw in D.grids(size):
        shapes += [(1, 64, gh, gw), (1, classes, gh, gw)] + ([(1, 1, gh, gw)] if score_sum else [])
    return shapes


def v5_zoo_shapes(size=(640, 640), classes=80) -> list[tuple[int, ...]]:
    return [(1, 3 * (5 + classes), gh, gw) for gh, gw in D.grids(size)]


@pytest.mark.parametrize(
    ("size", "shapes", "family", "classes", "anchors"),
    [
        ((640, 640), v8_zoo_shapes(), "yolov8-zoo", 80, 1),
        ((640, 640), v8_zoo_shapes(score_sum=False), "yolov8-zoo", 80, 1),
        ((384, 640), v8_zoo_shapes((384, 640), 10), "yolov8-zoo", 10, 1),
        ((640, 640), v5_zoo_shapes(), "yolov5-zoo", 80, 3),
        ((320, 320), v5_zoo_shapes((320, 320), 1), "yolov5-zoo", 1, 3),
        ((640, 640), [(1, 84, 8400)], "yolov8-ultralytics", 80, 1),
        ((640, 640), [(1, 5, 8400)], "yolov8-ultralytics", 1, 1),
        ((640, 640), [(1, 25200, 85)], "yolov5-ultralytics", 80, 3),
        # anchor-free rows with an object score (e.g. YOLOX-style exports)
        ((640, 640), [(1, 8400, 85)], "yolov5-ultralytics", 80, 1),
        ((320, 256), [(1, 14, 1680)], "yolov8-ultralytics", 10, 1),
        # a dynamic batch axis, as the model info or ONNX Runtime report it
        ((640, 640), [(-1, 84, 8400)], "yolov8-ultralytics", 80, 1),
        ((640, 640), [("batch", 84, 8400)], "yolov8-ultralytics", 80, 1),
        ((640, 640), [(None, 25200, 85)], "yolov5-ultralytics", 80, 3),
    ],
)
def test_known_layouts_are_recognised(size, shapes, family, classes, anchors) -> None:
    head = recognise(size, shapes)
    assert head == Head(family, classes, (8, 16, 32), anchors)


def test_84_by_8400_and_8400_by_85_are_told_apart() -> None:
    assert recognise((640, 640), [(1, 84, 8400)]).family == "yolov8-ultralytics"
    assert recognise((640, 640), [(1, 8400, 85)]).family == "yolov5-ultralytics"
    # (1, 85, 8400) is 81 classes: the cell count, not the size of the other axis, decides.
    assert recognise((640, 640), [(1, 85, 8400)]).num_classes == 81


V8_ROWS = Head("yolov8-ultralytics", 80, (8, 16, 32), 1, rows=True)


def test_a_row_per_cell_fits_two_heads_and_the_class_count_picks() -> None:
    # (1, 8400, 84): a transposed YOLOv8 output of 80 classes, or rows with an object score
    # and 79 classes. Before, it was always read as the second.
    both = [Head("yolov5-ultralytics", 79, (8, 16, 32), 1), V8_ROWS]
    assert readings((640, 640), [(1, 8400, 84)]) == both
    assert recognise((640, 640), [(1, 8400, 84)], classes=80) == V8_ROWS
    assert recognise((640, 640), [(1, 8400, 84)], classes=79) == both[0]
    assert recognise((640, 640), [(1, 8400, 84)], family="yolov5-ultralytics") == both[0]
    assert recognise((640, 640), [(1, 8400, 84)], family="yolov5-zoo") is None
    # (1, 8400, 85): 80 classes with an object score, or 81 transposed
    assert recognise((640, 640), [(1, 8400, 85)]).family == "yolov5-ultralytics"
    assert recognise((640, 640), [(1, 8400, 85)], classes=81).rows
    # one class, transposed: no reading with an object score has a class left
    assert readings((640, 640), [(1, 8400, 5)]) == [dataclasses.replace(V8_ROWS, num_classes=1)]


def test_an_undecided_reading_says_it_is_ambiguous_and_how_it_chose() -> None:
    head, note = choose(readings((640, 640), [(1, 8400, 84)]))
    assert head == V8_ROWS
    assert note.startswith("The output layout is ambiguous: it fits a YOLOv8/YOLO11")
    assert "read as the first (the reading with COCO's 80 classes)" in note
    assert "detect.head yolov5-ultralytics reads it as the other" in note
    head, note = choose(readings((320, 320), [(1, 2100, 20)]))
    assert head.family == "yolov5-ultralytics" and head.num_classes == 15
    assert "read as the first (by default)" in note and "detect.head yolov8-ultralytics" in note
    assert choose(readings((640, 640), [(1, 8400, 84)]), classes=80) == (V8_ROWS, None)
    assert choose(readings((640, 640), [(1, 84, 8400)]))[1] is None  # one reading


def test_a_transposed_yolov8_output_decodes_as_the_usual_one() -> None:
    rng = np.random.default_rng(3)
    out = rng.random((1, 84, 8400)).astype(np.float32)
    out[0, :4] *= 600
    out[0, 4:] **= 8
    usual = Decoder(recognise((640, 640), [out.shape]), (640, 640), DetectSettings())([out])
    rows = np.ascontiguousarray(out.transpose(0, 2, 1))
    got = Decoder(V8_ROWS, (640, 640), DetectSettings())([rows])
    assert len(usual) > 10
    np.testing.assert_array_equal(got.boxes, usual.boxes)
    np.testing.assert_array_equal(got.scores, usual.scores)
    np.testing.assert_array_equal(got.class_ids, usual.class_ids)


def test_p6_exports_with_four_strides_are_recognised() -> None:
    # 1280x1280, strides 8/16/32/64: 25,600 + 6,400 + 1,600 + 400 cells
    head = recognise((1280, 1280), [(1, 84, 34000)])
    assert head == Head("yolov8-ultralytics", 80, (8, 16, 32, 64), 1)
    assert head.describe().endswith("strides 8/16/32/64")


@pytest.mark.parametrize(
    ("size", "shapes"),
    [
        ((640, 640), [(1, 1000)]),  # a classifier
        ((640, 640), [(1, 84, 8000)]),  # N is not the cell count of 640x640
        ((320, 320), [(1, 84, 8400)]),  # ... nor of 320x320 (2,100)
        ((640, 640), [(1, 4, 8400)]),  # no class
        ((640, 640), [(2, 84, 8400)]),  # a batch of two
        ((640, 640), [(1, 84, "anchors")]),  # a dynamic candidate axis
        ((640, 640), [(1, -1, 8400)]),
        ((640, 640), v8_zoo_shapes()[:8]),  # one output missing
        ((640, 640), v8_zoo_shapes()[::-1]),  # stride 32 first
        ((640, 640), v8_zoo_shapes((320, 320))),  # grids of another input size
        (
            (640, 640),
            [
                (1, 60, g, g) if i % 2 == 0 else (1, 80, g, g)
                for i, g in enumerate((80, 80, 40, 40, 20, 20))
            ],
        ),  # not 64 bins
        ((640, 640), [(1, 255, 80, 80), (1, 255, 40, 40), (1, 254, 20, 20)]),
        ((640, 640), [(1, 256, 80, 80), (1, 256, 40, 40), (1, 256, 20, 20)]),  # not 3 x (5+C)
        ((640, 640), [(1, 80, 80, 255), (1, 40, 40, 255), (1, 20, 20, 255)]),  # NHWC
        ((640, 640), []),
    ],
)
def test_other_layouts_are_not_recognised(size, shapes) -> None:
    assert recognise(size, shapes) is None


def test_nine_outputs_need_a_score_sum_of_one_channel() -> None:
    shapes = v8_zoo_shapes()
    shapes[2] = (1, 2, 80, 80)
    assert recognise((640, 640), shapes) is None


def test_explain_no_head_names_the_shapes_and_the_known_heads() -> None:
    text = explain_no_head((480, 640), [(1, 1000)])
    assert text.startswith("The model's outputs ((1, 1000), for a 640x480 input) are not")
    for known in KNOWN_HEADS:
        assert known in text
    assert text.count(".") == 1 and text.endswith(".")  # one sentence


def test_describe() -> None:
    assert (
        Head("yolov8-zoo", 80, (8, 16, 32), 1).describe()
        == "YOLOv8 model-zoo head, 80 classes, strides 8/16/32"
    )
    assert Head("yolov5-zoo", 1, (8, 16, 32), 3).describe() == (
        "YOLOv5/v7 model-zoo head, 1 class, strides 8/16/32"
    )


# -- ONNX graphs of each family, through the runtime ----------------------------------------

OBJECTS = [
    D.Planted(0, 3, 4, class_id=2, score=0.9, sides=(2, 1, 3, 2)),
    D.Planted(1, 2, 3, class_id=0, score=0.7, sides=(1, 2, 1, 1)),
]


def _run_onnx(path: Path, nhwc: np.ndarray) -> list[np.ndarray]:
    from batchinfer.runtime.onnx import RKNNLite

    rt = RKNNLite()
    try:
        assert rt.load_rknn(str(path)) == 0
        assert rt.init_runtime() == 0
        outputs = rt.inference(inputs=[nhwc])
        assert outputs is not None
        return outputs
    finally:
        rt.release()


@pytest.mark.parametrize(
    ("family", "score_sum", "count"),
    [
        ("yolov8-zoo", True, 9),
        ("yolov8-zoo", False, 6),
        ("yolov5-zoo", True, 3),
        ("yolov8-ultralytics", True, 1),
        ("yolov5-ultralytics", True, 1),
    ],
)
def test_onnx_head_graphs_are_recognised_and_decoded(
    tmp_path: Path, family: str, score_sum: bool, count: int
) -> None:
    size = (64, 96)
    path = D.head_model(tmp_path, family, size, classes=3, objects=OBJECTS, score_sum=score_sum)
    info = describe_model(path)
    (image,) = info.inputs
    assert image.shape == (1, 64, 96, 3)  # the RKNN view: NHWC
    input_hw = image.shape[1:3]
    from_file = recognise(input_hw, [o.shape for o in info.outputs])
    outputs = _run_onnx(path, np.zeros(image.shape, np.float32))
    assert len(outputs) == count
    head = recognise(input_hw, [o.shape for o in outputs])
    assert head is not None and head == from_file
    assert head.family == family and head.num_classes == 3
    got = Decoder(head, input_hw, DetectSettings())(outputs)
    assert got.class_ids.tolist() == [2, 0]
    np.testing.assert_allclose(got.scores, [0.9, 0.7], rtol=1e-5)
    np.testing.assert_allclose(got.boxes, [o.box() for o in OBJECTS], atol=1e-3)
