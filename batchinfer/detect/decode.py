"""Decode one image's YOLO outputs into boxes: dequantise, filter, decode, NMS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchinfer.detect.heads import Head

#: Anchors (w, h in input pixels) of the COCO YOLOv5 models, per stride 8/16/32; the
#: model zoo's anchors_yolov5.txt.
COCO_ANCHORS: tuple[tuple[tuple[float, float], ...], ...] = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)


@dataclass(frozen=True)
class DetectSettings:
    """Thresholds of the post-processing (the model zoo's defaults)."""

    conf: float = 0.25  # keep candidates whose score is >= conf
    iou: float = 0.45  # NMS: drop a box overlapping a better one of its class by more
    max_det: int = 300  # at most this many boxes per image
    # per stride, (w, h) pixels; None = COCO defaults
    anchors: tuple[tuple[tuple[float, float], ...], ...] | None = None


@dataclass
class Detections:
    """One image's boxes, best first."""

    boxes: np.ndarray  # (n, 4) float32 x1 y1 x2 y2
    scores: np.ndarray  # (n,) float32
    class_ids: np.ndarray  # (n,) int32
    nonfinite: int  # candidates dropped for NaN/inf

    def __len__(self) -> int:
        return len(self.scores)


class Decoder:
    """Turns one image's raw outputs into :class:`Detections` for a recognised head."""

    def __init__(
        self,
        head: Head,
        input_hw: tuple[int, int],
        settings: DetectSettings,
        quant: Sequence[tuple[float, int] | None] = (),
    ) -> None:
        """``quant`` gives, per output, the (scale, zero_point) of an int8/uint8 output a
        runtime returns unconverted (None or absent: the output is float)."""
        self.head = head
        self.input_hw = input_hw
        self.settings = settings
        self.quant = tuple(quant)

    def __call__(self, outputs: Sequence[np.ndarray]) -> Detections:
        """Boxes in the model input's pixels (the letterboxed canvas), class-aware NMS
        applied, sorted by score desc, at most ``max_det``; non-finite candidates dropped
        and counted."""
        raise NotImplementedError("decoding lands in the next det-core commit")
