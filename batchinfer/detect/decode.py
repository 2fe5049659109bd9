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

Boxes and classes are computed on demand: every candidate's score is needed to rank them,
but NMS (nms.py) stops at ``max_det`` kept boxes, and at a low ``conf`` (0.001: all 8,400
cells of a 640x640 output) the best few hundred candidates usually fill it, so only those
have their box (and DFL softmax) and their class argmax computed. Each box is computed by
elementwise operations alone, so it is the same to the last bit whichever other candidates
are decoded with it. Candidates whose box is NaN/inf are dropped before NMS and counted:
when an output's box values are so large (or non-finite) that a box could be, every
candidate's box is computed first, so the count is the same as if all were decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from batchinfer.detect.head_parts import (
    GridDecoder,
    Quant,
    passing,
    scored,
    xywh_to_xyxy,
    yolov5_boxes,
)
from batchinfer.detect.head_parts import dfl as _dfl  # by this name: tests count its calls
from batchinfer.detect.heads import DFL_BINS, Head
from batchinfer.detect.nms import nms_ranked
from batchinfer.errors import UsageError

#: Anchors (w, h in input pixels) of the COCO YOLOv5 models, per stride 8/16/32; the
#: model zoo's anchors_yolov5.txt.
COCO_ANCHORS: tuple[tuple[tuple[float, float], ...], ...] = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)

#: Box inputs whose values all lie within +-_SAFE give finite boxes in every head's formula
#: (the largest: YOLOv5's (2 x)^2 x anchor): no box then needs computing to be counted.
_SAFE = 1e15
#: Candidates whose boxes are all computed at once: checking the whole output's box values
#: (:meth:`Decoder._bounded`) costs more than computing this many boxes.
_FEW_CANDIDATES = 1024


@dataclass(frozen=True)
class DetectSettings:
    """Thresholds of the post-processing (the model zoo's defaults)."""

    conf: float = 0.25  # keep candidates whose score is >= conf
    iou: float = 0.45  # NMS: drop a box overlapping a better one of its class by more
    max_det: int = 300  # at most this many boxes per image
    agnostic: bool = False  # NMS across classes: a box suppresses overlapped boxes of any class
    classes: tuple[int, ...] | None = None  # keep only boxes of these classes (None: all)
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
    """Candidates of one stride (or the whole output) that passed the threshold: every
    score, and their boxes and classes computed on demand, by candidate index."""

    scores: np.ndarray  # (k,) float32
    boxes_of: Callable[[np.ndarray], np.ndarray]  # indices -> (n, 4) float32 x1 y1 x2 y2
    classes_of: Callable[[np.ndarray], np.ndarray]  # indices -> (n,) int32
    nonfinite: int
    # whether no box can be NaN/inf, asked only of many candidates (else every box is
    # computed and checked first)
    safe: Callable[[], bool] = lambda: True
    computed: tuple[np.ndarray, np.ndarray] | None = None  # every (box, class), when known


class Decoder(GridDecoder[Head, DetectSettings]):
    """Turns one image's raw outputs into :class:`Detections` for a recognised head."""

    def __init__(
        self,
        head: Head,
        input_hw: tuple[int, int],
        settings: DetectSettings,
        quant: Sequence[Quant] = (),
    ) -> None:
        """``quant`` gives, per output, the (scale, zero_point) of an int8/uint8 output a
        runtime returns unconverted (None or absent: the output is float)."""
        super().__init__(head, input_hw, settings, quant)
        self._anchors = None
        if head.family == "yolov5-zoo":
            self._anchors = anchor_array(settings.anchors, len(head.strides), head.num_anchors)
        methods = {
            "yolov5-zoo": self._yolov5_zoo,
            "yolov8-zoo": self._yolov8_zoo,
            "yolov8-ultralytics": self._yolov8_ultralytics,
            "yolov5-ultralytics": self._yolov5_ultralytics,
        }
        self._decode: Callable[[Sequence[np.ndarray]], list[_Candidates]] = self._by_family(
            methods, "detection"
        )

    def __call__(self, outputs: Sequence[np.ndarray]) -> Detections:
        """Boxes in the model input's pixels (the letterboxed canvas), class-aware NMS
        applied, sorted by score desc, at most ``max_det``; non-finite candidates dropped
        and counted."""
        parts = [_finite_boxes(p) for p in self._decode(outputs)]
        nonfinite = sum(p.nonfinite for p in parts)
        found = _joined([p for p in parts if len(p.scores)])
        s = self.settings
        idx, boxes, class_ids = nms_ranked(
            found.scores,
            lambda i: (found.boxes_of(i), found.classes_of(i)),
            s.iou,
            s.max_det,
            agnostic=s.agnostic,
            classes=s.classes,
        )
        return Detections(
            np.ascontiguousarray(boxes, np.float32), found.scores[idx], class_ids, nonfinite
        )

    # -- one decoder per head family -------------------------------------------------------

    def _bounded(self, i: int, values: np.ndarray) -> bool:
        """Output ``i``'s ``values`` (box inputs) all lie within +-_SAFE once real."""
        if values.dtype.kind in "iu":
            scale, zero_point = self.quant[i]  # type: ignore[misc]  # _real checked it
            return scale * (abs(zero_point) + 256) < _SAFE
        return bool(values.min() > -_SAFE and values.max() < _SAFE)  # False for NaN

    def _yolov8_zoo(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        per_branch = len(outputs) // len(self.head.strides)
        if per_branch not in (2, 3):
            per_branch = 3  # let _check name the mismatch
        nc = self.head.num_classes
        expected = []
        for gh, gw in self._grids:
            branch = [(1, 4 * DFL_BINS, gh, gw), (1, nc, gh, gw), (1, 1, gh, gw)]
            expected += branch[:per_branch]
        self._check_shapes(outputs, expected)
        conf = self.settings.conf
        # Per stride: the cells whose best class passes (max then dequantise: dequantising
        # is increasing, scale > 0); their boxes and classes on demand, all strides at once.
        boxes_in, classes_in, scores, cells, strides = [], [], [], [], []
        nonfinite = 0
        for b, (gh, gw) in enumerate(self._grids):
            i_box, i_cls = per_branch * b, per_branch * b + 1
            cls = outputs[i_cls].reshape(nc, gh * gw)
            best = self._real(i_cls, cls.max(axis=0))
            passed, bad = passing(best, conf)
            nonfinite += bad
            box = outputs[i_box].reshape(4, DFL_BINS, gh * gw)
            boxes_in.append((i_box, box))
            classes_in.append(cls)
            scores.append(best[passed])
            cells.append(passed)
            strides.append(np.full(len(passed), b, np.intp))
        where = np.concatenate(cells)  # each candidate's cell in its stride's grid
        stride = np.concatenate(strides)

        def boxes_of(i: np.ndarray) -> np.ndarray:
            logits = np.empty((4, DFL_BINS, len(i)), np.float32)
            for b, (i_box, box) in enumerate(boxes_in):
                mine = stride[i] == b
                if mine.any():
                    logits[:, :, mine] = self._real(i_box, box.take(where[i[mine]], axis=2))
            dist = _dfl(logits)  # (4, n): left, top, right, bottom in cells
            return self._cell_boxes(where[i] + np.asarray(self._offsets)[stride[i]], dist)

        def classes_of(i: np.ndarray) -> np.ndarray:
            out = np.empty(len(i), np.int32)
            for b, cls in enumerate(classes_in):
                mine = stride[i] == b
                if mine.any():
                    out[mine] = cls.take(where[i[mine]], axis=1).argmax(axis=0)
            return out

        def safe() -> bool:
            return all(self._bounded(i_box, box) for i_box, box in boxes_in)

        return [_Candidates(np.concatenate(scores), boxes_of, classes_of, nonfinite, safe)]

    def _yolov5_zoo(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        na, nc = self.head.num_anchors, self.head.num_classes
        self._check_shapes(outputs, [(1, na * (5 + nc), gh, gw) for gh, gw in self._grids])
        return [self._yolov5_zoo_stride(i, outputs[i]) for i in range(len(self._grids))]

    def _yolov5_zoo_stride(self, i: int, output: np.ndarray) -> _Candidates:
        """One stride's candidates: (anchor, cell) pairs whose object x class score passes."""
        na, nc = self.head.num_anchors, self.head.num_classes
        gh, gw = self._grids[i]
        conf = self.settings.conf
        raw = output.reshape(na, 5 + nc, gh * gw)
        obj = self._real(i, raw[:, 4, :])  # (A, cells)
        passed, nonfinite = passing(obj.ravel(), conf)
        anchor, cells = np.divmod(passed, gh * gw)
        # max then dequantise (increasing), over all cells when most pass (no gather)
        if 4 * len(cells) > obj.size:
            best_cls = self._real(i, raw[:, 5:, :].max(axis=1))[anchor, cells]
        else:
            best_cls = self._real(i, _at(raw, anchor, cells, 5, 5 + nc).max(axis=1))
        scores, kept, bad = scored(obj[anchor, cells], best_cls, conf)
        anchor, cells = anchor[kept], cells[kept]
        anchors = self._anchors
        assert anchors is not None

        def boxes_of(k: np.ndarray) -> np.ndarray:
            a, c = anchor[k], cells[k]
            xywh = self._real(i, _at(raw, a, c, 0, 4))  # (n, 4) sigmoids
            return yolov5_boxes(xywh, a, c, gw, self.head.strides[i], anchors[i])

        def classes_of(k: np.ndarray) -> np.ndarray:
            values = _at(raw, anchor[k], cells[k], 5, 5 + nc)
            return self._real(i, values).argmax(axis=1).astype(np.int32)

        def safe() -> bool:
            return self._bounded(i, raw[:, :4, :])

        return _Candidates(scores, boxes_of, classes_of, nonfinite + bad, safe)

    def _yolov8_ultralytics(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        nc = self.head.num_classes
        cells = sum(gh * gw for gh, gw in self._grids)
        if self.head.rows:  # transposed: a row per cell, read through a transposed view
            self._check_shapes(outputs, [(1, cells, 4 + nc)])
            raw = outputs[0].reshape(cells, 4 + nc).T
        else:
            self._check_shapes(outputs, [(1, 4 + nc, cells)])
            raw = outputs[0].reshape(4 + nc, cells)
        best = self._real(0, raw[4:].max(axis=0))
        idx, nonfinite = passing(best, self.settings.conf)

        def boxes_of(i: np.ndarray) -> np.ndarray:
            cx, cy, w, h = self._real(0, raw[:4].take(idx[i], axis=1))
            return xywh_to_xyxy(cx, cy, w, h)

        def classes_of(i: np.ndarray) -> np.ndarray:
            return raw[4:].take(idx[i], axis=1).argmax(axis=0).astype(np.int32)

        def safe() -> bool:
            return self._bounded(0, raw[:4])

        return [_Candidates(best[idx], boxes_of, classes_of, nonfinite, safe)]

    def _yolov5_ultralytics(self, outputs: Sequence[np.ndarray]) -> list[_Candidates]:
        nc = self.head.num_classes
        rows = self.head.num_anchors * sum(gh * gw for gh, gw in self._grids)
        self._check_shapes(outputs, [(1, rows, 5 + nc)])
        raw = outputs[0].reshape(rows, 5 + nc)
        obj = self._real(0, raw[:, 4])
        idx, nonfinite = passing(obj, self.settings.conf)
        # max then dequantise (increasing), over all rows when most pass (no gather)
        if 4 * len(idx) > rows:
            best_cls = self._real(0, raw[:, 5:].max(axis=1))[idx]
        else:
            best_cls = self._real(0, raw.take(idx, axis=0)[:, 5:].max(axis=1))
        scores, kept, bad = scored(obj[idx], best_cls, self.settings.conf)
        idx = idx[kept]

        def boxes_of(i: np.ndarray) -> np.ndarray:
            cx, cy, w, h = self._real(0, raw.take(idx[i], axis=0)[:, :4]).T
            return xywh_to_xyxy(cx, cy, w, h)

        def classes_of(i: np.ndarray) -> np.ndarray:
            return self._real(0, raw.take(idx[i], axis=0)[:, 5:]).argmax(axis=1).astype(np.int32)

        def safe() -> bool:
            return self._bounded(0, raw[:, :4])

        return [_Candidates(scores, boxes_of, classes_of, nonfinite + bad, safe)]


def anchor_array(
    anchors: Sequence[Sequence[Sequence[float]]] | None, strides: int, per_stride: int
) -> np.ndarray:
    """(strides, per_stride, 2) float32 anchors (w, h in input pixels); None: COCO's.
    UsageError when they do not give ``per_stride`` pairs for each of the ``strides``."""
    array = np.asarray(anchors if anchors is not None else COCO_ANCHORS, dtype=np.float32)
    if array.shape != (strides, per_stride, 2):
        raise UsageError(
            f"The anchors give {_shape_words(array.shape)}, but the head needs "
            f"{per_stride} (w, h) pairs for each of its {strides} strides."
        )
    return array


def _at(raw: np.ndarray, anchor: np.ndarray, cells: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``raw[anchor, lo:hi, cells]`` of an (A, channels, cells) output, as (n, hi - lo), by
    a gather on the flat array (much faster than numpy's indexing on two axes)."""
    _, channels, n = raw.shape
    flat = (anchor * channels * n + cells)[:, None] + np.arange(lo, hi) * n
    return raw.reshape(-1).take(flat)


def _finite_boxes(part: _Candidates) -> _Candidates:
    """``part`` whose boxes are sure to be finite. A few candidates (at most
    ``_FEW_CANDIDATES``) have every box computed, and those with a NaN/inf are dropped and
    counted; of more, the boxes are left to compute on demand when the output's box values
    are small enough that none can be (``safe``), else they are all computed too."""
    if not len(part.scores) or (len(part.scores) > _FEW_CANDIDATES and part.safe()):
        return part
    every = np.arange(len(part.scores))
    boxes, classes = part.boxes_of(every), part.classes_of(every)
    ok = np.isfinite(boxes).all(axis=1)
    if not ok.all():
        keep = np.flatnonzero(ok)
        part = _Candidates(part.scores[keep], part.boxes_of, part.classes_of, part.nonfinite)
        part.nonfinite += len(ok) - len(keep)
        boxes, classes = boxes[keep], classes[keep]
    return _computed(part.scores, boxes, classes, part.nonfinite)


def _computed(
    scores: np.ndarray, boxes: np.ndarray, classes: np.ndarray, nonfinite: int
) -> _Candidates:
    """Candidates whose boxes and classes are all computed already."""
    found = _Candidates(
        scores, lambda i: boxes.take(i, axis=0), lambda i: classes.take(i), nonfinite
    )
    found.computed = (boxes, classes)
    return found


def _joined(parts: Sequence[_Candidates]) -> _Candidates:
    """The candidates of several strides as one list, in stride order."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        none = np.zeros(0, np.intp)
        return _Candidates(
            np.zeros(0, np.float32),
            lambda i: np.zeros((len(i), 4), np.float32),
            lambda i: none.astype(np.int32),
            0,
        )
    scores = np.concatenate([p.scores for p in parts])
    if all(p.computed is not None for p in parts):  # a few candidates: one table
        boxes = np.concatenate([p.computed[0] for p in parts])  # type: ignore[index]
        classes = np.concatenate([p.computed[1] for p in parts])  # type: ignore[index]
        return _computed(scores, boxes, classes, 0)
    starts = np.cumsum([0] + [len(p.scores) for p in parts])

    def gather(i: np.ndarray, of: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        out: np.ndarray = np.empty((len(i), *shape), dtype)
        which = np.searchsorted(starts, i, "right") - 1
        for n, part in enumerate(parts):
            mine = which == n
            if mine.any():
                out[mine] = getattr(part, of)(i[mine] - starts[n])
        return out

    return _Candidates(
        scores,
        lambda i: gather(i, "boxes_of", (4,), np.float32),
        lambda i: gather(i, "classes_of", (), np.int32),
        0,
    )


def _shape_words(shape: tuple[int, ...]) -> str:
    return "an array of shape " + "x".join(str(d) for d in shape)
