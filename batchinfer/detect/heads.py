"""Which YOLO head a model has, read off its output shapes and its input size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchinfer.messages import setting

#: Strides of the standard three-scale YOLO heads.
STRIDES = (8, 16, 32)
#: The stride sets a single-output (Ultralytics) head may have: P3-P5, or P3-P6.
STRIDE_SETS = ((8, 16, 32), (8, 16, 32, 64))
#: Bins per box side of the YOLOv8/YOLO11 distribution focal loss (DFL) box output.
DFL_BINS = 16
#: Anchors per cell of the YOLOv5/v7 heads.
V5_ANCHORS = 3

_DESCRIPTIONS = {
    "yolov5-zoo": "YOLOv5/v7 model-zoo head",
    "yolov8-zoo": "YOLOv8 model-zoo head",
    "yolov8-ultralytics": "YOLOv8/YOLO11 Ultralytics ONNX head",
    "yolov5-ultralytics": "YOLOv5 Ultralytics ONNX head",
}

#: The head families, as ``detect.head`` names them.
HEAD_FAMILIES: tuple[str, ...] = tuple(_DESCRIPTIONS)

#: Human descriptions of the output layouts :func:`recognise` knows (C classes, H x W grid
#: of each stride, N cells over all strides).
KNOWN_HEADS: tuple[str, ...] = (
    "rknn_model_zoo YOLOv5/v7: 3 outputs (1, 3*(5+C), H, W) for strides 8/16/32",
    "rknn_model_zoo YOLOv8/YOLO11: 6 or 9 outputs, per stride 8/16/32 a box (1, 64, H, W), "
    "class scores (1, C, H, W) and optionally a score sum (1, 1, H, W)",
    "Ultralytics YOLOv8/YOLO11 ONNX: 1 output (1, 4+C, N), or transposed (1, N, 4+C)",
    "Ultralytics YOLOv5 ONNX: 1 output (1, 3*N, 5+C)",
)


@dataclass(frozen=True)
class Head:
    """A recognised detection head: its layout family, classes, strides and anchors."""

    family: str  # "yolov5-zoo" | "yolov8-zoo" | "yolov8-ultralytics" | "yolov5-ultralytics"
    num_classes: int
    strides: tuple[int, ...]  # (8, 16, 32) where it applies
    num_anchors: int  # anchors per cell (3 for v5/v7 zoo heads, 1 otherwise)
    # yolov8-ultralytics only: a candidate per row, (1, N, 4+C), not per column
    rows: bool = False

    def describe(self) -> str:
        """One line for people: ``YOLOv8 model-zoo head, 80 classes, strides 8/16/32``."""
        name = _DESCRIPTIONS.get(self.family, self.family)
        if self.rows:
            name += " (transposed: a row per cell)"
        return f"{name}, {classes_text(self.num_classes)}, {strides_text(self.strides)}"


def classes_text(n: int) -> str:
    """A head's class count as its description says it: ``80 classes``, ``1 class``."""
    return f"{n} class" + ("" if n == 1 else "es")


def strides_text(strides: Sequence[int]) -> str:
    """A head's strides as its description says them: ``strides 8/16/32``."""
    return "strides " + "/".join(str(s) for s in strides)


def grid_sizes(input_hw: tuple[int, int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """The (H, W) grid of each stride for an input size (a stride-2 conv rounds up)."""
    h, w = input_hw
    return [(math.ceil(h / s), math.ceil(w / s)) for s in strides]


def recognise(
    input_hw: tuple[int, int],
    output_shapes: Sequence[tuple[int, ...]],
    classes: int | None = None,
    family: str | None = None,
) -> Head | None:
    """The head whose layout the output shapes have, or None when no known head fits.

    ``input_hw`` is the model input's (height, width); ``output_shapes`` are the outputs'
    shapes as the runtime reports them, in order (NCHW for the model-zoo heads). A batch
    axis reported as -1, 0, None or a name (dynamic) counts as 1; any other unknown
    dimension fits no head. One output of a row per cell, (1, N, K), fits two heads: YOLOv5
    rows with an object score (K-5 classes) and transposed YOLOv8 (K-4 classes);
    :func:`choose` picks between the heads :func:`readings` gives, by ``family`` (a head
    family the user named), else by ``classes`` (a class count the model's metadata or a
    labels file gives).
    """
    return choose(readings(input_hw, output_shapes), classes, family)[0]


def readings(input_hw: tuple[int, int], output_shapes: Sequence[tuple[int, ...]]) -> list[Head]:
    """Every head the output shapes fit (more than one only for a row per cell)."""
    shapes = [batch_one(s) for s in output_shapes]
    if any(s is None for s in shapes) or not shapes:
        return []
    if len(shapes) == 1:
        return _recognise_single(input_hw, shapes[0])  # type: ignore[arg-type]
    if len(shapes) == len(STRIDES):
        head = _recognise_v5_zoo(input_hw, shapes)  # type: ignore[arg-type]
    elif len(shapes) in (2 * len(STRIDES), 3 * len(STRIDES)):
        head = _recognise_v8_zoo(input_hw, shapes)  # type: ignore[arg-type]
    else:
        head = None
    return [] if head is None else [head]


def choose(
    heads: Sequence[Head], classes: int | None = None, family: str | None = None
) -> tuple[Head | None, str | None]:
    """The head to read among ``heads`` (:func:`readings`), and when they were more than one
    and neither ``family`` nor ``classes`` decided, one sentence saying so: that the layout is
    ambiguous, how it was read and how to choose. ``family`` that none of ``heads`` has:
    (None, None)."""
    if family is not None:
        heads = [h for h in heads if h.family == family]
        return (heads[0] if heads else None), None
    if len(heads) < 2:
        return (heads[0] if heads else None), None
    if classes is not None:
        fits = [h for h in heads if h.num_classes == classes]
        if len(fits) == 1:
            return fits[0], None
    # Nothing said: COCO's 80 classes when one reading gives them, else the first reading
    # (rows with an object score, as batchinfer read this layout before it could choose)
    chosen = next((h for h in heads if h.num_classes == 80), heads[0])
    other = next(h for h in heads if h is not chosen)
    how = "the reading with COCO's 80 classes" if chosen.num_classes == 80 else "by default"
    return chosen, (
        f"The output layout is ambiguous: it fits a {chosen.describe()} and a "
        f"{other.describe()}; read as the first ({how}). "
        + setting("detect.head")
        + f" {other.family} reads it as the other, and class names ("
        + setting("labels")
        + " or the model's metadata) with one of the two counts decide."
    )


def explain_no_head(input_hw: tuple[int, int], output_shapes: Sequence[tuple[int, ...]]) -> str:
    """One sentence for a model whose outputs fit no known head: what was seen, what is known."""
    seen = ", ".join(str(tuple(s)) for s in output_shapes) or "none"
    h, w = input_hw
    return (
        f"The model's outputs ({seen}, for a {w}x{h} input) are not a detection head "
        f"batchinfer knows; it reads {'; '.join(KNOWN_HEADS)}."
    )


def _dim(d: object) -> int:
    """A dimension as an int; -1 for an unknown one (None, an ONNX symbol such as "N")."""
    try:
        return int(d)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return -1


def batch_one(shape: Sequence[object]) -> tuple[int, ...] | None:
    """The shape with a dynamic batch axis made 1; None when it is not batch 1."""
    dims = tuple(_dim(d) for d in shape)
    if not dims or dims[0] not in (1, 0, -1):
        return None
    return (1, *dims[1:])


def _recognise_single(input_hw: tuple[int, int], shape: tuple[int, ...]) -> list[Head]:
    if len(shape) != 3:
        return []
    _, rows, cols = shape
    for strides in STRIDE_SETS:
        cells = sum(gh * gw for gh, gw in grid_sizes(input_hw, strides))
        # (1, 4+C, N): one candidate per cell, a column each. (1, 84, 8400) and
        # (1, 8400, 85) cannot both fit: that would need 4+C == A*N and 5+C == N.
        if cols == cells and rows > 4:
            return [Head("yolov8-ultralytics", rows - 4, strides, 1)]
        if rows == V5_ANCHORS * cells and cols > 5:
            return [Head("yolov5-ultralytics", cols - 5, strides, V5_ANCHORS)]
        if rows == cells and cols > 4:
            # a row per cell: with an object score (anchor-free YOLOv5-style rows, YOLOX),
            # or a transposed YOLOv8 output; only the class count tells them apart
            found = [Head("yolov5-ultralytics", cols - 5, strides, 1)] if cols > 5 else []
            return [*found, Head("yolov8-ultralytics", cols - 4, strides, 1, rows=True)]
    return []


def _zoo_grids_fit(input_hw: tuple[int, int], shapes: Sequence[tuple[int, ...]]) -> bool:
    grids = grid_sizes(input_hw, STRIDES)
    return all(len(s) == 4 and tuple(s[2:]) == g for s, g in zip(shapes, grids, strict=True))


def _recognise_v5_zoo(input_hw: tuple[int, int], shapes: list[tuple[int, ...]]) -> Head | None:
    if not _zoo_grids_fit(input_hw, shapes):
        return None
    channels = {s[1] for s in shapes}
    if len(channels) != 1:
        return None
    (ch,) = channels
    if ch % V5_ANCHORS or ch // V5_ANCHORS <= 5:
        return None
    return Head("yolov5-zoo", ch // V5_ANCHORS - 5, STRIDES, V5_ANCHORS)


def _recognise_v8_zoo(input_hw: tuple[int, int], shapes: list[tuple[int, ...]]) -> Head | None:
    per_branch = len(shapes) // len(STRIDES)
    branches = [shapes[i * per_branch : (i + 1) * per_branch] for i in range(len(STRIDES))]
    grids = grid_sizes(input_hw, STRIDES)
    classes = set()
    for branch, grid in zip(branches, grids, strict=True):
        if not all(len(s) == 4 and tuple(s[2:]) == grid for s in branch):
            return None
        if branch[0][1] != 4 * DFL_BINS:
            return None
        if per_branch == 3 and branch[2][1] != 1:
            return None
        classes.add(branch[1][1])
    if len(classes) != 1:
        return None
    (num_classes,) = classes
    return Head("yolov8-zoo", num_classes, STRIDES, 1)
