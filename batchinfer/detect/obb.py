"""Oriented boxes (YOLOv8-OBB): head recognition and decoding, vectorised numpy.

Design note, for the Task protocol that will call this (issue 41): the OBB task

- recognises its head with :func:`recognise_obb` (input size, output shapes, and the
  model's metadata ``task``: Ultralytics' (1, 4+C+1, N) looks like a detection head with
  one more class, so it is taken as OBB only when the metadata (or ``--task obb``) says so);
- builds one :class:`ObbDecoder` per runtime instance (head, input size, :class:`ObbSettings`,
  per-output quantisation) and calls it per image: ``decoder(outputs, letterbox)`` returns
  :class:`OrientedBoxes` in the *original* image's pixels: ``xywhr`` (cx, cy, w, h, angle
  in radians, Ultralytics' convention, regularised: angle in [0, pi/2)), the corner
  ``polygons`` and ``boxes``, the enclosing axis-aligned x1 y1 x2 y2 clipped to the image
  (what detection readers use);
- scores a run with :func:`batchinfer.detect.rotated_ap.rotated_map` (DOTA-style mAP50 on
  exact polygon IoU).

Layouts:

``yolov8-obb-zoo``          rknn_model_zoo ``examples/yolov8_obb``: per stride 8/16/32 an
                            output (1, 64 + C, H, W) (DFL logits, class logits), then the
                            angle (1, 1, N) after the graph's sigmoid; the angle in radians
                            is (a - 0.25) pi (the zoo's ``process``).
``yolov8-obb-ultralytics``  Ultralytics' ONNX export: (1, 4 + C + 1, N): cx, cy, w, h in
                            input pixels, C class scores (sigmoid applied), the angle in
                            radians last.

Decoding follows the zoo's Python (and Ultralytics' ``dist2rbox``): from the DFL distances
l, t, r, b (cells) and the angle a, the centre moves by ((r - l)/2, (b - t)/2) turned by a,
w = l + r, h = t + b, all times the stride. Then rotated NMS (:mod:`rotated_nms`, ProbIoU
Fast-NMS as Ultralytics by default, the zoo's exact greedy polygon NMS by setting), the
best ``max_det``, and the letterbox undone (centre minus padding, all lengths over the
scale; the angle is unchanged by a uniform scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchinfer.detect.head_parts import (
    Candidates,
    GridDecoder,
    batch_one_shapes,
    finite_extra,
    real,
    ultralytics_candidates,
    ultralytics_strides,
    zoo_candidates,
    zoo_layout,
)
from batchinfer.detect.heads import DFL_BINS, STRIDES, classes_text, strides_text
from batchinfer.detect.letterbox import Letterbox
from batchinfer.detect.rotated import corners, enclosing_boxes, regularize
from batchinfer.detect.rotated_nms import METHODS, rotated_nms
from batchinfer.errors import UsageError

#: The oriented-box head families, as people say them (the head's ``describe``).
_DESCRIPTIONS = {
    "yolov8-obb-zoo": "YOLOv8-OBB model-zoo head",
    "yolov8-obb-ultralytics": "YOLOv8/YOLO11-OBB Ultralytics ONNX head",
}


@dataclass(frozen=True)
class ObbHead:
    """A recognised oriented-box head."""

    family: str  # "yolov8-obb-zoo" | "yolov8-obb-ultralytics"
    num_classes: int
    strides: tuple[int, ...]

    def describe(self) -> str:
        name = _DESCRIPTIONS.get(self.family, self.family)
        return f"{name}, {classes_text(self.num_classes)}, {strides_text(self.strides)}"


@dataclass(frozen=True)
class ObbSettings:
    conf: float = 0.25  # keep candidates whose score is >= conf
    iou: float = 0.45  # NMS threshold (ProbIoU >= iou, or polygon IoU > iou, drops)
    max_det: int = 300
    nms: str = "probiou"  # "probiou" (Ultralytics) or "polygon" (the model zoo)
    agnostic: bool = False


@dataclass
class OrientedBoxes:
    """One image's oriented boxes, best first."""

    xywhr: np.ndarray  # (n, 5) float32 cx, cy, w, h, angle (radians, in [0, pi/2))
    boxes: np.ndarray  # (n, 4) float32 enclosing x1 y1 x2 y2
    scores: np.ndarray  # (n,) float32
    class_ids: np.ndarray  # (n,) int32
    nonfinite: int  # candidates dropped for NaN/inf

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def polygons(self) -> np.ndarray:
        """(n, 4, 2) float32 corners (Ultralytics' ``xywhr2xyxyxyxy`` order)."""
        return corners(self.xywhr).astype(np.float32)


def recognise_obb(
    input_hw: tuple[int, int], output_shapes: Sequence[Sequence[int]], task: str | None = None
) -> ObbHead | None:
    """The OBB head the output shapes have, or None. ``task``: the model metadata's task
    (or the user's ``--task``); Ultralytics' single output is OBB only with ``task="obb"``."""
    shapes = batch_one_shapes(output_shapes)
    if shapes is None:
        return None
    if len(shapes) == 1 and task == "obb":
        shape = shapes[0]
        if len(shape) != 3:
            return None
        strides = ultralytics_strides(input_hw, shape[2])
        if strides is not None and shape[1] > 5:
            return ObbHead("yolov8-obb-ultralytics", shape[1] - 5, strides)
        return None
    zoo = zoo_layout(input_hw, shapes)
    if zoo is not None:
        nc, cells, last = zoo
        if max(last) == cells and math.prod(last) == cells:
            return ObbHead("yolov8-obb-zoo", nc, STRIDES)
    return None


class ObbDecoder(GridDecoder[ObbHead, ObbSettings]):
    """Turns one image's raw outputs into :class:`OrientedBoxes`."""

    def _default_settings(self) -> ObbSettings:
        return ObbSettings()

    def _check_settings(self, settings: ObbSettings) -> None:
        super()._check_settings(settings)
        if settings.nms not in METHODS:
            raise UsageError(
                f"The rotated NMS is one of {', '.join(METHODS)}, not {settings.nms!r}."
            )

    def __call__(
        self, outputs: Sequence[np.ndarray], letterbox: Letterbox | None = None
    ) -> OrientedBoxes:
        """Boxes in the original image's pixels (``letterbox``: how it was placed on the
        model's canvas; None: in the model input's pixels), NMS applied, best first."""
        if self.head.family == "yolov8-obb-zoo":
            cand, angle = self._zoo(outputs)
        else:
            cand, angle = self._ultralytics(outputs)
        cand, angle = finite_extra(cand, angle, np.isfinite(angle))
        if self.head.family == "yolov8-obb-zoo":
            xywhr = self._zoo_boxes(cand, angle)
        else:
            xywhr = np.concatenate([cand.sides.T.astype(np.float64), angle[:, None]], axis=1)
        s = self.settings
        keep = rotated_nms(xywhr, cand.scores, cand.class_ids, s.iou, s.max_det, s.nms, s.agnostic)
        scores, class_ids = cand.scores[keep], cand.class_ids[keep]
        return _finish(xywhr[keep], scores, class_ids, cand.nonfinite, letterbox)

    def _zoo(self, outputs: Sequence[np.ndarray]) -> tuple[Candidates, np.ndarray]:
        nc = self.head.num_classes
        expected = [(1, 4 * DFL_BINS + nc, h, w) for h, w in self._grids]
        # The angle's shape may be (1, 1, N) or any other holding the N cells in order.
        angle_shape = (1, 1, self._cells)
        if len(outputs) == 4 and outputs[3].size == self._cells:
            angle_shape = tuple(outputs[3].shape)
        self._check_shapes(outputs, [*expected, angle_shape])
        conf = self.settings.conf
        cand = zoo_candidates(outputs[:3], self.quant, self._grids, self._offsets, nc, conf)
        q = self.quant[3] if len(self.quant) > 3 else None
        raw = real(outputs[3].reshape(-1)[cand.cells], q, 3).astype(np.float64)
        return cand, (raw - 0.25) * math.pi

    def _ultralytics(self, outputs: Sequence[np.ndarray]) -> tuple[Candidates, np.ndarray]:
        nc = self.head.num_classes
        self._check_shapes(outputs, [(1, 5 + nc, self._cells)])
        raw = outputs[0].reshape(5 + nc, self._cells)
        q = self.quant[0] if self.quant else None
        cand = ultralytics_candidates(raw, q, nc, self.settings.conf)
        return cand, real(raw[4 + nc, cand.cells], q, 0).astype(np.float64)

    def _zoo_boxes(self, cand: Candidates, angle: np.ndarray) -> np.ndarray:
        """cx, cy, w, h, angle in input pixels from DFL distances (the zoo's ``process``)."""
        left, top, right, bottom = cand.sides.astype(np.float64)
        half_x, half_y = (right - left) / 2, (bottom - top) / 2
        cos, sin = np.cos(angle), np.sin(angle)
        centre = self._centres[:, cand.cells].astype(np.float64)
        stride = self._strides[cand.cells].astype(np.float64)
        cx = (half_x * cos - half_y * sin + centre[0]) * stride
        cy = (half_x * sin + half_y * cos + centre[1]) * stride
        return np.stack([cx, cy, (left + right) * stride, (top + bottom) * stride, angle], axis=1)


def _finish(
    xywhr: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    nonfinite: int,
    letterbox: Letterbox | None,
) -> OrientedBoxes:
    """Regularised, un-letterboxed boxes and their enclosing axis-aligned boxes."""
    out = regularize(np.asarray(xywhr, dtype=np.float64).reshape(-1, 5))
    if letterbox is not None:
        out[:, 0] -= letterbox.pad_x
        out[:, 1] -= letterbox.pad_y
        out[:, :4] /= letterbox.scale
    boxes = enclosing_boxes(corners(out))
    if letterbox is not None:
        np.clip(boxes[:, 0::2], 0, letterbox.src_w, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, letterbox.src_h, out=boxes[:, 1::2])
    return OrientedBoxes(
        out.astype(np.float32), boxes.astype(np.float32), scores.astype(np.float32),
        class_ids.astype(np.int32), nonfinite,
    )  # fmt: skip
