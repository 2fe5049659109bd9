"""Which YOLO instance-segmentation head a model has, read off its output shapes.

Recognised layouts (C classes, M mask coefficients, H x W the grid of each stride 8/16/32,
N the cells over the strides, Hp x Wp the prototype grid: stride 4, 160 x 160 at 640):

``yolov8-seg-zoo``          rknn_model_zoo yolov8_seg: 13 outputs; per stride a DFL box
                            (1, 64, H, W), class scores (1, C, H, W) (sigmoid applied),
                            a score sum (1, 1, H, W) (not read) and mask coefficients
                            (1, M, H, W); then the prototype (1, M, Hp, Wp).
``yolov5-seg-zoo``          rknn_model_zoo yolov5_seg: 7 outputs; per stride the
                            detection (1, 3*(5+C), H, W) (sigmoid applied, as its
                            yolov5 head) and the coefficients (1, 3*M, H, W) of its 3
                            anchors (the zoo splits Ultralytics' (1, 3N, 5+C+M) in two,
                            its README's "[1,255,80,80], [1,96,80,80]"); then the prototype.
``yolov8-seg-ultralytics``  Ultralytics ONNX export of YOLOv8/YOLO11-seg: (1, 4+C+M, N)
                            (cx, cy, w, h in input pixels, class scores sigmoided, raw
                            coefficients) and the prototype (1, M, Hp, Wp), either order.

The future Task protocol calls :func:`recognise_segment` beside the detection heads'
``recognise``: no detection head has 2, 7 or 13 outputs, so the two never both match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchinfer.detect.heads import (
    DFL_BINS,
    STRIDES,
    V5_ANCHORS,
    batch_one,
    classes_text,
    grid_sizes,
)

_DESCRIPTIONS = {
    "yolov8-seg-zoo": "YOLOv8-seg model-zoo head",
    "yolov5-seg-zoo": "YOLOv5-seg model-zoo head",
    "yolov8-seg-ultralytics": "YOLOv8/YOLO11-seg Ultralytics ONNX head",
}

#: Human descriptions of the segmentation layouts :func:`recognise_segment` knows.
KNOWN_SEG_HEADS: tuple[str, ...] = (
    "rknn_model_zoo yolov8_seg: 13 outputs, per stride 8/16/32 a box (1, 64, H, W), class "
    "scores (1, C, H, W), a score sum (1, 1, H, W) and mask coefficients (1, 32, H, W), "
    "then the prototype (1, 32, H/4, W/4)",
    "rknn_model_zoo yolov5_seg: 7 outputs, per stride (1, 3*(5+C), H, W) and "
    "(1, 3*32, H, W), then the prototype",
    "Ultralytics YOLOv8/YOLO11-seg ONNX: (1, 4+C+32, N) and the prototype (1, 32, H/4, W/4)",
)


@dataclass(frozen=True)
class SegHead:
    """A recognised segmentation head: layout family, classes, mask coefficients and
    where the prototype is among the outputs."""

    family: str  # "yolov8-seg-zoo" | "yolov5-seg-zoo" | "yolov8-seg-ultralytics"
    num_classes: int
    num_masks: int  # mask coefficients per candidate = prototype channels (32)
    proto_hw: tuple[int, int]  # the prototype's (height, width)
    proto_index: int  # which output is the prototype
    strides: tuple[int, ...] = STRIDES
    num_anchors: int = 1  # anchors per cell (3 for the YOLOv5 head)

    def describe(self) -> str:
        """One line for people: ``YOLOv8-seg model-zoo head, 80 classes, 32 masks``."""
        name = _DESCRIPTIONS.get(self.family, self.family)
        return f"{name}, {classes_text(self.num_classes)}, {self.num_masks} mask coefficients"


def proto_grid(input_hw: tuple[int, int]) -> tuple[int, int]:
    """The prototype's (height, width) for an input size: twice the stride-8 grid."""
    gh, gw = grid_sizes(input_hw, (8,))[0]
    return 2 * gh, 2 * gw


def recognise_segment(
    input_hw: tuple[int, int], output_shapes: Sequence[Sequence[object]]
) -> SegHead | None:
    """The segmentation head whose layout the output shapes have, or None.

    ``input_hw`` is the model input's (height, width); ``output_shapes`` the outputs'
    shapes in runtime order. A batch axis reported as -1, 0, None or a name counts as 1.
    """
    shapes = [batch_one(s) for s in output_shapes]
    if not shapes or any(s is None for s in shapes):
        return None
    known = [s for s in shapes if s is not None]
    if len(known) == 13:
        return _yolov8_zoo(input_hw, known)
    if len(known) == 7:
        return _yolov5_zoo(input_hw, known)
    if len(known) == 2:
        return _ultralytics(input_hw, known)
    return None


def explain_no_seg_head(
    input_hw: tuple[int, int], output_shapes: Sequence[Sequence[object]]
) -> str:
    """One sentence for a model whose outputs fit no segmentation head."""
    seen = ", ".join(str(tuple(s)) for s in output_shapes) or "none"
    h, w = input_hw
    return (
        f"The model's outputs ({seen}, for a {w}x{h} input) are not a segmentation head "
        f"batchinfer knows; it reads {'; '.join(KNOWN_SEG_HEADS)}."
    )


def _proto(input_hw: tuple[int, int], shape: tuple[int, ...]) -> int | None:
    """The prototype's channel count if ``shape`` is the prototype for this input."""
    if len(shape) != 4 or tuple(shape[2:]) != proto_grid(input_hw) or shape[1] < 1:
        return None
    return shape[1]


def _zoo_layout(
    input_hw: tuple[int, int], shapes: list[tuple[int, ...]], per: int
) -> tuple[int, list[list[tuple[int, ...]]]] | None:
    """A zoo head's prototype channels and its outputs by stride, if ``shapes`` are ``per``
    outputs on each stride's grid, stride by stride, then the prototype."""
    nm = _proto(input_hw, shapes[per * len(STRIDES)])
    branches = [shapes[per * b : per * b + per] for b in range(len(STRIDES))]
    grids = grid_sizes(input_hw, STRIDES)
    fit = all(
        len(s) == 4 and tuple(s[2:]) == g
        for branch, g in zip(branches, grids, strict=True)
        for s in branch
    )
    return (nm, branches) if nm is not None and fit else None


def _yolov8_zoo(input_hw: tuple[int, int], shapes: list[tuple[int, ...]]) -> SegHead | None:
    if (layout := _zoo_layout(input_hw, shapes, 4)) is None:
        return None
    nm, branches = layout
    classes = {br[1][1] for br in branches}
    if len(classes) != 1 or any(
        br[0][1] != 4 * DFL_BINS or br[2][1] != 1 or br[3][1] != nm for br in branches
    ):
        return None
    (nc,) = classes
    return SegHead("yolov8-seg-zoo", nc, nm, (shapes[12][2], shapes[12][3]), 12)


def _yolov5_zoo(input_hw: tuple[int, int], shapes: list[tuple[int, ...]]) -> SegHead | None:
    if (layout := _zoo_layout(input_hw, shapes, 2)) is None:
        return None
    nm, branches = layout
    det = {br[0][1] for br in branches}
    if len(det) != 1 or any(br[1][1] != V5_ANCHORS * nm for br in branches):
        return None
    (ch,) = det
    if ch % V5_ANCHORS or ch // V5_ANCHORS <= 5:
        return None
    nc = ch // V5_ANCHORS - 5
    proto_hw = (shapes[6][2], shapes[6][3])
    return SegHead("yolov5-seg-zoo", nc, nm, proto_hw, 6, STRIDES, V5_ANCHORS)


def _ultralytics(input_hw: tuple[int, int], shapes: list[tuple[int, ...]]) -> SegHead | None:
    cells = sum(gh * gw for gh, gw in grid_sizes(input_hw, STRIDES))
    for proto_index in (1, 0):
        nm = _proto(input_hw, shapes[proto_index])
        det = shapes[1 - proto_index]
        if nm is None or len(det) != 3 or det[2] != cells or det[1] <= 4 + nm:
            continue
        proto_hw = (shapes[proto_index][2], shapes[proto_index][3])
        return SegHead("yolov8-seg-ultralytics", det[1] - 4 - nm, nm, proto_hw, proto_index)
    return None
