"""The obb task's scorer: DOTA-style rotated mAP50 (VOC AP per class on exact polygon IoU,
:func:`batchinfer.detect.rotated_ap.rotated_map`) beside COCO ``bbox`` mAP of the enclosing
boxes (scorers/instance_parts.py has the shared steps).

Ground truth: a COCO instances file (DOTA converted to COCO, as most tools do it) where an
annotation's rotated box is its ``segmentation`` polygon of 4 corners
``[[x1, y1, x2, y2, x3, y3, x4, y4]]``; an annotation without one counts as its axis-aligned
``bbox``. ``iscrowd`` annotations are DOTA's *difficult* ones (neither found nor missed).
Metrics: the detection ones and ``rotated_map50``, ``rotated_map50_drop`` (the float
reference's minus the device's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from batchinfer.detect.rotated import corners
from batchinfer.detect.rotated_ap import ImagePredictions, ImageTruth, rotated_map
from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.metrics import Metric
from batchinfer.evaluate.scorers.instance_parts import (
    PartDicts,
    PartInputs,
    PartItems,
    PartsScorer,
)
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs, detection_metrics
from batchinfer.sink.rows import Row
from batchinfer.tasks.obb import ROTATED_FIELDS

_KEYS = ("cx", "cy", "w", "h", "angle")


class RotatedItems(PartItems):
    """Per-item boxes with their rotated boxes (cx, cy, w, h, angle; original pixels)."""

    PART_FIELDS: ClassVar[list[pa.Field]] = list(ROTATED_FIELDS)

    @staticmethod
    def part_dicts(row: Row) -> PartDicts:
        payload = row.payload
        if payload is None or payload.extra is None:
            return []
        return [dict(zip(_KEYS, box, strict=True)) for box in np.asarray(payload.extra).tolist()]


@dataclass
class RotatedScore:
    """DOTA-style mAP50 and the AP of each category that has ground truth."""

    map50: float | None
    per_class: dict[int, float] = field(default_factory=dict)  # category id -> AP50

    def metrics(self) -> dict[str, float]:
        return {} if self.map50 is None else {"map50": self.map50}


def truths(gt: GroundTruth) -> dict[int, ImageTruth]:
    """Each ground-truth image's rotated boxes (module docstring), by COCO image id."""
    rows: dict[int, list[tuple[np.ndarray, int, bool]]] = {i["id"]: [] for i in gt.images}
    for a in gt.annotations:
        poly = a.get("segmentation")
        if isinstance(poly, list) and poly and len(poly[0]) == 8:
            quad = np.asarray(poly[0], np.float64).reshape(4, 2)
        else:
            x, y, w, h = a["bbox"]
            quad = np.array([[x, y], [x + w, y], [x + w, y + h], [x, y + h]], np.float64)
        rows.setdefault(a["image_id"], []).append((quad, a["category_id"], bool(a["iscrowd"])))
    return {
        image: ImageTruth(
            np.array([q for q, _, _ in r], np.float64).reshape(-1, 4, 2),
            np.array([c for _, c, _ in r], np.int64),
            np.array([d for _, _, d in r], bool),
        )
        for image, r in rows.items()
    }


def rotated_score(
    items: PartItems, gt: GroundTruth, category_ids: Sequence[int], iou: float = 0.5
) -> RotatedScore:
    """The items' rotated mAP at ``iou`` on the ground truth's images (an error row, or an
    item without a row, finds nothing there)."""
    truth = truths(gt)
    image_of = {str(k): v for k, v in gt.image_ids.items()}
    found: dict[int, ImagePredictions] = {}
    for i, item in enumerate(items.id.tolist()):
        image = image_of.get(str(item))
        boxes, parts = items.boxes[i], items.parts[i] if i < len(items.parts) else None
        if image is None or boxes is None or parts is None or not len(boxes):
            continue
        xywhr = np.array([[p[k] for k in _KEYS] for p in parts], np.float64)
        classes = boxes[:, 5].astype(np.int64)
        cats = np.array([category_ids[c] if 0 <= c < len(category_ids) else -1 for c in classes])
        found[image] = ImagePredictions(corners(xywhr), cats, boxes[:, 4].astype(np.float64))
    empty = ImagePredictions(np.zeros((0, 4, 2)), np.zeros(0, np.int64), np.zeros(0))
    images = sorted(truth)
    result = rotated_map([found.get(i, empty) for i in images], [truth[i] for i in images], iou)
    value = None if not result.per_class else float(result.map)
    return RotatedScore(value, dict(result.per_class))


class RotatedInputs(PartInputs):
    """The instances' inputs plus the rotated mAP50 (of the device and the reference)."""

    def for_reference(self) -> DetectInputs:
        assert self.reference is not None
        return RotatedInputs(self.reference, self.gt, self.category_ids)

    @cached_property
    def part_score(self) -> RotatedScore:  # type: ignore[override]
        assert isinstance(self.device, PartItems)
        return rotated_score(self.device, self.gt, self.category_ids)

    @cached_property
    def reference_part_score(self) -> RotatedScore | None:  # type: ignore[override]
        if self.reference is None:
            return None
        assert isinstance(self.reference, PartItems)
        return rotated_score(self.reference, self.gt, self.category_ids)


def _drop(x: RotatedInputs) -> float | None:
    ref = x.reference_part_score
    if ref is None or ref.map50 is None or x.part_score.map50 is None:
        return None
    return ref.map50 - x.part_score.map50


def rotated_metrics() -> dict[str, Metric]:
    metrics = [
        Metric("rotated_map50", lambda x: x.part_score.map50, "",
               "DOTA-style mAP at polygon IoU 0.5 (VOC AP per class).", comparable=True),
        Metric("rotated_map50_drop", _drop, "reference",
               "The float reference's rotated mAP50 minus the device's.", better="lower"),
    ]  # fmt: skip
    return {**detection_metrics(), **{m.name: m for m in metrics}}


class RotatedScorer(PartsScorer):
    """Rotated mAP50 beside bbox (module docstring)."""

    task = "obb"
    iou_type = "rotated"
    prefix = "rotated"
    what = "DOTA-style, polygon IoU"
    items_type = RotatedItems
    inputs_type = RotatedInputs

    def metrics(self) -> dict[str, Metric]:
        return rotated_metrics()

    def label(self) -> str:
        return "Rotated mAP50"

    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str:
        return " (oriented boxes)"
