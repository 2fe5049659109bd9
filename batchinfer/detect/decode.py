"""Decode one image's YOLO outputs into boxes: dequantise, filter, decode, NMS.

Each head family follows the post-processing of its reference (rknn_model_zoo's
``examples/yolov5/python/yolov5.py`` and ``examples/yolov8/python/yolov8.py``, Ultralytics'
``non_max_suppression``), reordered for speed: the confidence filter runs first, on the
best class score of every cell, and only the cells that pass have their class argmax,
their box (and for YOLOv8 their DFL softmax) computed. A candidate is kept when its score
is >= ``conf`` (the model zoo's rule; Ultralytics uses >). Where a head has an object
score (YOLOv5), cells whose object score is below ``conf`` are dropped before their class
scores are read, as the model zoo's C post-processing and Ultralytics do; with class
scores in [0, 1] (sigmoids) that drops only cells whose score could not reach ``conf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchinfer.detect.heads import DFL_BINS, Head, grid_sizes
from batchinfer.detect.nms import nms
from batchinfer.errors import InferenceError, UsageError

#: Anchors (w, h in input pixels) of the COCO YOLOv5 models, per stride 8/16/32; the
#: model zoo's anchors_yolov5.txt.
COCO_ANCHORS: tuple[tuple[tuple[float, float], ...], ...] = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)

_BINS = np.arange(DFL_BINS, dtype=np.float32)


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
    """One image's boxes, best first.

    ``nonfinite`` counts the candidates (cells, or a cell's anchors for YOLOv5) dropped
    because their score or box is NaN or infinite. With an object score, class scores are
    read only where the object score reaches ``conf``; boxes only where the score does.
    """

    boxes: np.ndarray  # (n, 4) float32 x1 y1 x2 y2
    scores: np.ndarray  # (n,) float32
    class_ids: np.ndarray  # (n,) int32
    nonfinite: int  # candidates dropped for NaN/inf

    def __len__(self) -> int:
        return len(self.scores)


@dataclass
class _Candidates:
    """Candidates of one stride (or the whole output) that passed the threshold."""

    boxes: np.ndarray  # (k, 4) float32 x1 y1 x2 y2
    scores: np.ndarray  # (k,) float32
    class_ids: np.ndarray  # (k,) int32
    nonfinite: int


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
        if not 0.0 <= settings.conf <= 1.0 or not 0.0 <= settings.iou <= 1.0:
            raise UsageError(
                f"Detection thresholds must lie in 0..1 (conf {settings.conf}, "
                f"iou {settings.iou}); give fractions such as conf 0.25, iou 0.45."
            )
        if settings.max_det < 1:
            raise UsageError(f"max_det must be at least 1 (it is {settings.max_det}).")
        for q in quant:
            if q is not None and not q[0] > 0:
                raise UsageError(f"An output's quantisation scale must be > 0 (it is {q[0]}).")
        self.head = head
        self.input_hw = (int(input_hw[0]), int(input_hw[1]))
        self.settings = settings
        self.quant = tuple(quant)
        self._grids = grid_sizes(self.input_hw, head.strides)
        self._anchors = self._anchor_array() if head.family == "yolov5-zoo" else None
        self._decode = {
            "yolov5-zoo": self._yolov5_zoo,
            "yolov8-zoo": self._yolov8_zoo,
            "yolov8-ultralytics": self._yolov8_ultralytics,
            "yolov5-ultralytics": self._yolov5_ultralytics,
        }.get(head.family)
        if self._decode is None:
            raise UsageError(f"No decoder for the detection head family {head.family!r}.")

    def __call__(self, outputs: Sequence[np.ndarray]) -> Detections:
        """Boxes in the model input's pixels (the letterboxed canvas), class-aware NMS
        applied, sorted by score desc, at most ``max_det``; non-finite candidates dropped
        and counted."""
        parts = self._decode(outputs)
        nonfinite = sum(p.nonfinite for p in parts)
        parts = [p for p in parts if len(p.scores)]
        if not parts:
            return Detections(
                np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32),
                nonfinite,
            )  # fmt: skip
        if len(parts) == 1:
            boxes, scores, class_ids = parts[0].boxes, parts[0].scores, parts[0].class_ids
        else:
            boxes = np.concatenate([p.boxes for p in parts])
            scores = np.concatenate([p.scores for p in parts])
            class_ids = np.concatenate([p.class_ids for p in parts])
        keep = nms(boxes, scores, class_ids, self.settings.iou, self.settings.max_det)
        return Detections(boxes[keep], scores[keep], class_ids[keep], nonfinite)

    # -- helpers ---------------------------------------------------------------------------

    def _anchor_array(self) -> np.ndarray:
        anchors = self.settings.anchors if self.settings.anchors is not None else COCO_ANCHORS
        shape = (len(self.head.strides), self.head.num_anchors, 2)
        array = np.asarray(anchors, dtype=np.float32)
        if array.shape != shape:
            raise UsageError(
                f"The anchors give {_shape_words(array.shape)}, but the head needs "
                f"{shape[1]} (w, h) pairs for each of its {shape[0]} strides."
            )
        return array

    def _real(self, i: int, values: np.ndarray) -> np.ndarray:
        """Output ``i``'s values as float32 (int8/uint8 dequantised with its scale, zp)."""
        q = self.quant[i] if i < len(self.quant) else None
        if values.dtype.kind in "iu":
            if q is None:
                raise InferenceError(
                    f"Output {i} is {values.dtype} but no quantisation (scale, zero point) "
                    "was given for it; ask the runtime for float outputs or pass its quant."
                )
            scale, zero_point = q
            return (values.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
        return values.astype(np.float32, copy=False)

    def _check(self, outputs: Sequence[np.ndarray], expected: Sequence[tuple[int, ...]]) -> None:
        got = [tuple(o.shape) for o in outputs]
        if len(got) != len(expected) or any(
            _unbatched(g) != _unbatched(e) for g, e in zip(got, expected, strict=False)
        ):
            raise InferenceError(
                f"The model returned outputs of shapes {got}, but its "
                f"{self.head.describe()} needs {[tuple(e) for e in expected]}."
            )

    # -- one decoder per head family -------------------------------------------------------

    def _yolov8_zoo(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        per_branch = len(outputs) // len(self.head.strides)
        if per_branch not in (2, 3):
            per_branch = 3  # let _check name the mismatch
        nc = self.head.num_classes
        expected = []
        for gh, gw in self._grids:
            branch = [(1, 4 * DFL_BINS, gh, gw), (1, nc, gh, gw), (1, 1, gh, gw)]
            expected += branch[:per_branch]
        self._check(outputs, expected)
        conf = self.settings.conf
        parts = []
        for b, (stride, (gh, gw)) in enumerate(zip(self.head.strides, self._grids, strict=True)):
            i_box, i_cls = per_branch * b, per_branch * b + 1
            cls = outputs[i_cls].reshape(nc, gh * gw)
            # max then dequantise: dequantising is increasing (scale > 0).
            best = self._real(i_cls, cls.max(axis=0))
            finite = np.isfinite(best)
            cells = np.flatnonzero(finite & (best >= conf))
            nonfinite = best.size - int(np.count_nonzero(finite))
            if not cells.size:
                parts.append(_empty(nonfinite))
                continue
            class_ids = cls[:, cells].argmax(axis=0).astype(np.int32)
            logits = self._real(i_box, outputs[i_box].reshape(4, DFL_BINS, gh * gw)[:, :, cells])
            dist = _dfl(logits)  # (4, k): left, top, right, bottom in cells
            cx = (cells % gw).astype(np.float32) + 0.5
            cy = (cells // gw).astype(np.float32) + 0.5
            boxes = np.stack([cx - dist[0], cy - dist[1], cx + dist[2], cy + dist[3]], axis=1)
            boxes *= np.float32(stride)
            parts.append(_finite_boxes(boxes, best[cells], class_ids, nonfinite))
        return parts

    def _yolov5_zoo(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        na, nc = self.head.num_anchors, self.head.num_classes
        self._check(outputs, [(1, na * (5 + nc), gh, gw) for gh, gw in self._grids])
        conf = self.settings.conf
        parts = []
        for i, (stride, (gh, gw)) in enumerate(zip(self.head.strides, self._grids, strict=True)):
            raw = outputs[i].reshape(na, 5 + nc, gh * gw)
            obj = self._real(i, raw[:, 4, :])  # (A, cells)
            finite = np.isfinite(obj)
            anchor, cells = np.nonzero(finite & (obj >= conf))
            nonfinite = obj.size - int(np.count_nonzero(finite))
            if not cells.size:
                parts.append(_empty(nonfinite))
                continue
            cls = self._real(i, raw[anchor, 5:, cells])  # (k, C)
            scores, class_ids, kept, bad = _best_class(obj[anchor, cells], cls, conf)
            anchor, cells = anchor[kept], cells[kept]
            xywh = self._real(i, raw[anchor, :4, cells])  # (k, 4) sigmoids
            s = np.float32(stride)
            cx = (xywh[:, 0] * 2 - 0.5 + (cells % gw)) * s
            cy = (xywh[:, 1] * 2 - 0.5 + (cells // gw)) * s
            w = (xywh[:, 2] * 2) ** 2 * self._anchors[i, anchor, 0]
            h = (xywh[:, 3] * 2) ** 2 * self._anchors[i, anchor, 1]
            boxes = _xywh_to_xyxy(cx, cy, w, h)
            parts.append(_finite_boxes(boxes, scores, class_ids, nonfinite + bad))
        return parts

    def _yolov8_ultralytics(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        nc = self.head.num_classes
        cells = sum(gh * gw for gh, gw in self._grids)
        self._check(outputs, [(1, 4 + nc, cells)])
        raw = outputs[0].reshape(4 + nc, cells)
        best = self._real(0, raw[4:].max(axis=0))
        finite = np.isfinite(best)
        idx = np.flatnonzero(finite & (best >= self.settings.conf))
        nonfinite = best.size - int(np.count_nonzero(finite))
        if not idx.size:
            return [_empty(nonfinite)]
        class_ids = raw[4:, idx].argmax(axis=0).astype(np.int32)
        cx, cy, w, h = self._real(0, raw[:4, idx])
        boxes = _xywh_to_xyxy(cx, cy, w, h)
        return [_finite_boxes(boxes, best[idx], class_ids, nonfinite)]

    def _yolov5_ultralytics(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        nc = self.head.num_classes
        rows = self.head.num_anchors * sum(gh * gw for gh, gw in self._grids)
        self._check(outputs, [(1, rows, 5 + nc)])
        raw = outputs[0].reshape(rows, 5 + nc)
        obj = self._real(0, raw[:, 4])
        finite = np.isfinite(obj)
        idx = np.flatnonzero(finite & (obj >= self.settings.conf))
        nonfinite = obj.size - int(np.count_nonzero(finite))
        if not idx.size:
            return [_empty(nonfinite)]
        picked = self._real(0, raw[idx])
        scores, class_ids, kept, bad = _best_class(picked[:, 4], picked[:, 5:], self.settings.conf)
        cx, cy, w, h = picked[kept, :4].T
        boxes = _xywh_to_xyxy(cx, cy, w, h)
        return [_finite_boxes(boxes, scores, class_ids, nonfinite + bad)]


def _empty(nonfinite: int) -> _Candidates:
    return _Candidates(
        np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), nonfinite
    )


def _dfl(logits: np.ndarray) -> np.ndarray:
    """Expected bin of each side's 16-bin softmax: (4, 16, k) logits -> (4, k) distances."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (e * _BINS[:, None]).sum(axis=1) / e.sum(axis=1)


def _best_class(
    obj: np.ndarray, cls: np.ndarray, conf: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Score (object x best class), class, which pass ``conf``, and how many were NaN/inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        scores = obj * cls.max(axis=1)
    finite = np.isfinite(scores)
    kept = np.flatnonzero(finite & (scores >= conf))
    bad = scores.size - int(np.count_nonzero(finite))
    class_ids = cls[kept].argmax(axis=1).astype(np.int32)
    return scores[kept], class_ids, kept, bad


def _xywh_to_xyxy(cx: np.ndarray, cy: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(
            np.float32, copy=False
        )


def _finite_boxes(
    boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, nonfinite: int
) -> _Candidates:
    """The candidates whose box is finite; the others are counted in ``nonfinite``."""
    ok = np.isfinite(boxes).all(axis=1)
    if ok.all():
        return _Candidates(boxes, scores, class_ids, nonfinite)
    bad = len(ok) - int(np.count_nonzero(ok))
    return _Candidates(boxes[ok], scores[ok], class_ids[ok], nonfinite + bad)


def _unbatched(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without its leading batch axis of 1 (runtimes differ in reporting it)."""
    return shape[1:] if shape and shape[0] == 1 else shape


def _shape_words(shape: tuple[int, ...]) -> str:
    return "an array of shape " + "x".join(str(d) for d in shape)
