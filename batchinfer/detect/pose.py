"""Pose (YOLOv8-pose): head recognition, decoding and COCO keypoints, vectorised numpy.

Design note, for the Task protocol that will call this (issue 41): the pose task

- recognises its head with :func:`recognise_pose` (input size, output shapes, and the
  model's metadata: ``task`` and ``kpt_shape``; Ultralytics' (1, 4+C+K*D, N) looks like
  a detection head with more classes, so it is taken as pose only when the metadata gives
  ``kpt_shape`` or says ``task: pose``, or the user says ``--task pose``);
- builds one :class:`PoseDecoder` per runtime instance (head, input size,
  ``DetectSettings`` for conf / iou / max_det, per-output quantisation) and calls it per
  image: ``decoder(outputs, letterbox)`` returns :class:`Poses` in the *original* image's
  pixels: boxes x1 y1 x2 y2, scores, classes and keypoints (n, K, 3) = x, y, score, for
  the Arrow column ``keypoints: list<struct<x, y, score>>`` of each box;
- scores a run through pycocotools / faster-coco-eval's ``keypoints`` evaluation, fed by
  :func:`coco_keypoint_results` (COCO result dicts with the flat ``keypoints`` list);
  :data:`COCO_PERSON_SIGMAS` are the OKS sigmas of COCO's 17 person keypoints.

Layouts:

``yolov8-pose-zoo``          rknn_model_zoo ``examples/yolov8_pose``: per stride 8/16/32 an
                             output (1, 64 + C, H, W) (DFL logits, class logits: the zoo
                             applies the sigmoid), then the keypoints (1, K, D, N), already
                             decoded by the graph: x, y in input pixels and (D = 3) the
                             visibility score after its sigmoid, read as the zoo reads them.
``yolov8-pose-ultralytics``  Ultralytics' ONNX export: (1, 4 + C + K*D, N): cx, cy, w, h
                             in input pixels, C class scores (sigmoid applied), then per
                             keypoint x, y (input pixels) and, for D = 3, its score.

With D = 2 (no visibility in the model) every keypoint's score is 1. Boxes go through the
detection NMS (axis-aligned, class-aware, greedy); keypoints follow their box. Undoing the
letterbox subtracts the padding, divides by the scale and clips to the image, for boxes
and keypoints alike (Ultralytics' ``scale_boxes`` / ``scale_coords``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from batchinfer.detect.coco import coco_results
from batchinfer.detect.decode import DetectSettings
from batchinfer.detect.head_parts import (
    Candidates,
    GridDecoder,
    Quant,
    batch_one_shapes,
    finite_extra,
    real,
    ultralytics_candidates,
    ultralytics_strides,
    xywh_to_xyxy,
    zoo_candidates,
    zoo_layout,
)
from batchinfer.detect.heads import DFL_BINS, STRIDES, classes_text, strides_text
from batchinfer.detect.letterbox import Letterbox, boxes_to_original
from batchinfer.detect.nms import nms

#: OKS sigmas of COCO's 17 person keypoints (pycocotools' ``kpt_oks_sigmas``).
COCO_PERSON_SIGMAS: tuple[float, ...] = (
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072,
    0.062, 0.062, 0.107, 0.107, 0.087, 0.087, 0.089, 0.089,
)  # fmt: skip


#: The pose head families, as people say them (the head's ``describe``).
_DESCRIPTIONS = {
    "yolov8-pose-zoo": "YOLOv8-pose model-zoo head",
    "yolov8-pose-ultralytics": "YOLOv8/YOLO11-pose Ultralytics ONNX head",
}


@dataclass(frozen=True)
class PoseHead:
    """A recognised pose head."""

    family: str  # "yolov8-pose-zoo" | "yolov8-pose-ultralytics"
    num_classes: int
    num_keypoints: int  # K
    keypoint_dims: int  # D: 3 (x, y, score) or 2 (x, y)
    strides: tuple[int, ...]

    def describe(self) -> str:
        name = _DESCRIPTIONS.get(self.family, self.family)
        classes = classes_text(self.num_classes)
        return f"{name}, {classes}, {self.num_keypoints} keypoints, {strides_text(self.strides)}"


@dataclass
class Poses:
    """One image's instances, best first."""

    boxes: np.ndarray  # (n, 4) float32 x1 y1 x2 y2
    scores: np.ndarray  # (n,) float32
    class_ids: np.ndarray  # (n,) int32
    keypoints: np.ndarray  # (n, K, 3) float32 x, y, score
    nonfinite: int  # candidates dropped for a NaN/inf score, box or keypoint

    def __len__(self) -> int:
        return len(self.scores)


def recognise_pose(
    input_hw: tuple[int, int],
    output_shapes: Sequence[Sequence[int]],
    task: str | None = None,
    kpt_shape: Sequence[int] | None = None,
) -> PoseHead | None:
    """The pose head the output shapes have, or None. ``task`` and ``kpt_shape`` (K, D) come
    from the model's metadata (or the user); the single Ultralytics output needs one of
    them (``task="pose"`` alone means COCO's (17, 3))."""
    shapes = batch_one_shapes(output_shapes)
    if shapes is None:
        return None
    if len(shapes) == 1:
        if kpt_shape is None and task != "pose":
            return None
        k, d = (int(kpt_shape[0]), int(kpt_shape[1])) if kpt_shape is not None else (17, 3)
        shape = shapes[0]
        if len(shape) != 3 or k < 1 or d not in (2, 3):
            return None
        strides = ultralytics_strides(input_hw, shape[2])
        nc = shape[1] - 4 - k * d
        if strides is not None and nc >= 1:
            return PoseHead("yolov8-pose-ultralytics", nc, k, d, strides)
        return None
    zoo = zoo_layout(input_hw, shapes)
    if zoo is not None:
        nc, cells, last = zoo
        if len(last) == 4 and last[2] in (2, 3) and last[3] == cells and last[1] >= 1:
            return PoseHead("yolov8-pose-zoo", nc, last[1], last[2], STRIDES)
    return None


class PoseDecoder(GridDecoder[PoseHead, DetectSettings]):
    """Turns one image's raw outputs into :class:`Poses`."""

    def _default_settings(self) -> DetectSettings:
        return DetectSettings()

    def __call__(self, outputs: Sequence[np.ndarray], letterbox: Letterbox | None = None) -> Poses:
        """Instances in the original image's pixels (``letterbox``: how it was placed on the
        model's canvas; None: in the model input's pixels), NMS applied, best first."""
        zoo = self.head.family == "yolov8-pose-zoo"
        cand, points = self._zoo(outputs) if zoo else self._ultralytics(outputs)
        cand, points = finite_extra(cand, points, np.isfinite(points).all(axis=(1, 2)))
        boxes = self._cell_boxes(cand.cells, cand.sides) if zoo else xywh_to_xyxy(*cand.sides)
        s = self.settings
        keep = nms(boxes, cand.scores, cand.class_ids, s.iou, s.max_det)
        boxes, points = boxes[keep].astype(np.float32), points[keep]
        if letterbox is not None:
            boxes = boxes_to_original(boxes, letterbox)
            points = keypoints_to_original(points, letterbox)
        return Poses(boxes, cand.scores[keep], cand.class_ids[keep], points, cand.nonfinite)

    def _keypoints(self, raw: np.ndarray, q: Quant, i: int, cells: np.ndarray) -> np.ndarray:
        """(k, K, 3) x, y, score from (K, D, N) values."""
        k, d = self.head.num_keypoints, self.head.keypoint_dims
        points = np.ones((len(cells), k, 3), np.float32)
        points[:, :, :d] = real(raw[:, :, cells], q, i).transpose(2, 0, 1)
        return points

    def _zoo(self, outputs: Sequence[np.ndarray]) -> tuple[Candidates, np.ndarray]:
        h = self.head
        expected = [(1, 4 * DFL_BINS + h.num_classes, gh, gw) for gh, gw in self._grids]
        expected.append((1, h.num_keypoints, h.keypoint_dims, self._cells))
        self._check_shapes(outputs, expected)
        cand = zoo_candidates(
            outputs[:3], self.quant, self._grids, self._offsets, h.num_classes, self.settings.conf
        )
        raw = outputs[3].reshape(h.num_keypoints, h.keypoint_dims, self._cells)
        q = self.quant[3] if len(self.quant) > 3 else None
        return cand, self._keypoints(raw, q, 3, cand.cells)

    def _ultralytics(self, outputs: Sequence[np.ndarray]) -> tuple[Candidates, np.ndarray]:
        h = self.head
        rows = 4 + h.num_classes + h.num_keypoints * h.keypoint_dims
        self._check_shapes(outputs, [(1, rows, self._cells)])
        raw = outputs[0].reshape(rows, self._cells)
        q = self.quant[0] if self.quant else None
        cand = ultralytics_candidates(raw, q, h.num_classes, self.settings.conf)
        kpts = raw[4 + h.num_classes :].reshape(h.num_keypoints, h.keypoint_dims, self._cells)
        return cand, self._keypoints(kpts, q, 0, cand.cells)


def keypoints_to_original(points: np.ndarray, lb: Letterbox) -> np.ndarray:
    """(n, K, 3) canvas keypoints in the original image's pixels, clipped to it (scores kept)."""
    out = np.array(points, dtype=np.float32, copy=True)
    out[..., 0] = np.clip((out[..., 0] - np.float32(lb.pad_x)) / np.float32(lb.scale), 0, lb.src_w)
    out[..., 1] = np.clip((out[..., 1] - np.float32(lb.pad_y)) / np.float32(lb.scale), 0, lb.src_h)
    return out


def coco_keypoints(points: np.ndarray | Iterable[Mapping[str, float]]) -> list[float]:
    """COCO's flat ``keypoints`` list [x1, y1, v1, x2, ...] of one instance, from (K, 3)
    x, y, score or a row's list of ``{x, y, score}``. The third value is the keypoint's
    score, as Ultralytics writes it (COCO's keypoint evaluation reads the ground truth's
    visibility, not the prediction's). Coordinates rounded to 3 decimals, scores to 5."""
    rows: Sequence[Sequence[float]]
    if isinstance(points, np.ndarray):
        rows = points.reshape(-1, 3).tolist()
    else:
        rows = [(p["x"], p["y"], p["score"]) for p in points]
    flat: list[float] = []
    for x, y, score in rows:
        score = float(score)
        v = round(score, 5) if math.isfinite(score) else 0.0
        flat += [round(float(x), 3), round(float(y), 3), v]
    return flat


def coco_keypoint_results(
    rows: Iterable[Mapping], image_ids: Mapping, category_ids: Sequence[int] | None = None
) -> list[dict]:
    """COCO keypoint result dicts: :func:`batchinfer.detect.coco_results`'s
    ``{image_id, category_id, bbox, score}`` with each box's ``keypoints`` (flat list)."""
    rows = list(rows)
    results = coco_results(rows, image_ids, category_ids)
    points = [
        coco_keypoints(box["keypoints"])
        for row in rows
        if row.get("boxes") is not None
        for box in row["boxes"]
    ]
    for result, flat in zip(results, points, strict=True):
        result["keypoints"] = flat
    return results
