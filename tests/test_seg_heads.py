"""Segmentation heads recognised from output shapes (batchinfer.detect.seg_heads)."""

from __future__ import annotations

import pytest

from batchinfer.detect.heads import recognise
from batchinfer.detect.seg_heads import explain_no_seg_head, proto_grid, recognise_segment


def v8_zoo(nc=80, nm=32, hw=(640, 640)):
    h, w = hw
    out = []
    for s in (8, 16, 32):
        g = (-(-h // s), -(-w // s))
        out += [(1, 64, *g), (1, nc, *g), (1, 1, *g), (1, nm, *g)]
    return [*out, (1, nm, *proto_grid(hw))]


def v5_zoo(nc=80, nm=32, hw=(640, 640)):
    h, w = hw
    out = []
    for s in (8, 16, 32):
        g = (-(-h // s), -(-w // s))
        out += [(1, 3 * (5 + nc), *g), (1, 3 * nm, *g)]
    return [*out, (1, nm, *proto_grid(hw))]


def test_the_model_zoo_and_ultralytics_layouts_are_recognised():
    head = recognise_segment((640, 640), v8_zoo())
    assert (head.family, head.num_classes, head.num_masks) == ("yolov8-seg-zoo", 80, 32)
    assert (head.proto_hw, head.proto_index) == ((160, 160), 12)
    assert recognise_segment((640, 640), v8_zoo(nc=32)).num_classes == 32  # C == M is fine
    head = recognise_segment((640, 640), v5_zoo())
    assert (head.family, head.num_classes, head.num_anchors) == ("yolov5-seg-zoo", 80, 3)
    assert head.describe() == "YOLOv5-seg model-zoo head, 80 classes, 32 mask coefficients"
    head = recognise_segment((640, 640), [(1, 116, 8400), (1, 32, 160, 160)])
    assert (head.family, head.num_classes, head.proto_index) == ("yolov8-seg-ultralytics", 80, 1)
    head = recognise_segment((480, 640), [("batch", 32, 120, 160), (-1, 37, 6300)])
    assert (head.family, head.num_classes, head.proto_index) == ("yolov8-seg-ultralytics", 1, 0)
    assert recognise_segment((736, 1280), v8_zoo(hw=(736, 1280))).proto_hw == (184, 320)


@pytest.mark.parametrize(
    "shapes",
    [
        [*v8_zoo()[:-1], (1, 32, 80, 80)],  # prototype of the wrong size
        [*v8_zoo()[:3], (1, 31, 80, 80), *v8_zoo()[4:]],  # coefficients != prototype channels
        [*v5_zoo()[:1], (1, 95, 80, 80), *v5_zoo()[2:]],
        [(1, 116, 8400), (1, 32, 160, 160), (1, 1)],
        [(1, 36, 8400), (1, 32, 160, 160)],  # no room for a class
        [(1, 116, 8000), (1, 32, 160, 160)],
        [(2, 116, 8400), (1, 32, 160, 160)],  # batch 2
        [(1, 84, 8400)],  # detection heads are not segmentation heads
        [
            (1, 64, 80, 80),
            (1, 80, 80, 80),
            (1, 64, 40, 40),
            (1, 80, 40, 40),
            (1, 64, 20, 20),
            (1, 80, 20, 20),
        ],
        [],
    ],
)
def test_other_layouts_are_not_segmentation_heads(shapes):
    assert recognise_segment((640, 640), shapes) is None


def test_segmentation_outputs_are_no_detection_head_and_the_refusal_names_what_is_known():
    for shapes in (v8_zoo(), v5_zoo(), [(1, 116, 8400), (1, 32, 160, 160)]):
        assert recognise((640, 640), shapes) is None
    sentence = explain_no_seg_head((640, 640), [(1, 84, 8400)])
    assert "(1, 84, 8400)" in sentence and "yolov8_seg" in sentence and "yolov5_seg" in sentence
