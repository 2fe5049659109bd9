"""The images a detection report shows, with the boxes it draws (``result.json``'s ``worst``).

Every detection report shows ``metrics.worst`` images (none only when no image has a
result), chosen in this order:

1. ``reference``: where the device and the reference disagree most (1 - soft F1 of all
   their boxes, above 0), the images a quantisation or a core changed;
2. ``ground truth``: then the images whose shown boxes differ most from the ground truth
   (1 - soft F1 of the device's boxes scoring at least ``display_conf`` and the truth);
3. ``example``: then any other image with a result, in dataset order, those with ground truth first.

Boxes are kept and drawn from ``display_conf`` (``metrics.display_conf``, 0.25) up: a job
scores mAP at ``detect.conf`` 0.001, which keeps every low-score box, and they would hide
the image. The ground truth's boxes come beside them, named by category.

Each image's entry holds where it is (evaluate/steps.py ``item_places``): its file, and for
a video's frame the frame's index too, from which the report's picture child makes its
picture (:data:`PANEL_SIDE` on its long side; the report never opens an item itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batchinfer.data.dataset import Dataset
from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.scorers.coco import disagreement
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs
from batchinfer.evaluate.steps import item_places

#: The longest side of one panel of the report's images, in CSS pixels.
PANEL_SIDE = 240

#: What brought an image into the report, as the report says it.
WHY = {
    "reference": "device and reference disagree",
    "ground truth": "the shown boxes differ from the ground truth",
    "example": "an example",
}


def _truth_of(gt: GroundTruth, items: Sequence[str]) -> dict[str, np.ndarray]:
    """Per item with ground truth: its boxes as (n, 5) ``x1 y1 x2 y2 category_id``."""
    image_of = {gt.image_ids[i]: i for i in items if i in gt.image_ids}
    rows: dict[str, list[list[float]]] = {i: [] for i in image_of.values()}
    for a in gt.annotations:
        item = image_of.get(a["image_id"])
        if item is not None:
            x, y, w, h = a["bbox"]
            rows[item].append([x, y, x + w, y + h, a["category_id"]])
    return {i: np.array(r, dtype=np.float64).reshape(-1, 5) for i, r in rows.items()}


def _shown(boxes: np.ndarray | None, display_conf: float) -> np.ndarray | None:
    return None if boxes is None else boxes[boxes[:, 4] >= display_conf]


def _box_dicts(boxes: np.ndarray, label_of: Any) -> list[dict[str, Any]]:
    return [
        {"class_id": int(c), "label": label_of(int(c)), "score": float(s),
         "x1": float(x1), "y1": float(y1), "x2": float(x2), "y2": float(y2)}
        for x1, y1, x2, y2, s, c in boxes.tolist()
    ]  # fmt: skip


def detection_examples(
    inputs: DetectInputs, dataset: Dataset, n: int, display_conf: float
) -> list[dict[str, Any]]:
    """The ``n`` images the report shows (see the module docstring), each with where it
    is, why it is shown, and its boxes from ``display_conf`` up: the device's, the
    reference's (None without one) and the ground truth's (None: the image has none)."""
    d, r = inputs.device, inputs.reference
    ok = [i for i in range(len(d)) if d.boxes[i] is not None]
    if n == 0 or not ok:
        return []
    ids = d.id.tolist()
    truth = _truth_of(inputs.gt, [ids[i] for i in ok])
    class_of = {c: k for k, c in enumerate(inputs.category_ids)}  # category -> model class
    names = inputs.gt.category_names

    chosen: dict[int, str] = {}
    if r is not None:
        score = inputs.disagreement
        for i in np.argsort(-np.nan_to_num(score, nan=-1), kind="stable").tolist():
            if len(chosen) >= n or not score[i] > 0:
                break
            chosen[i] = "reference"
    against_truth: dict[int, float] = {}
    for i in ok:
        t = truth.get(ids[i])
        if t is not None:
            shown = _shown(d.boxes[i], display_conf)
            assert shown is not None
            t_classes = np.array([class_of.get(int(c), -1) for c in t[:, 4]], dtype=np.int64)
            against_truth[i] = disagreement(shown[:, :4], shown[:, 5], t[:, :4], t_classes)
    for i in sorted(against_truth, key=lambda k: -against_truth[k]):  # stable: dataset order
        if len(chosen) >= n or against_truth[i] <= 0:
            break
        chosen.setdefault(i, "ground truth")
    # Then examples in dataset order, those with ground truth first: beside its truth an
    # image says more (an image the ground truth lacks is counted elsewhere).
    for i in sorted(ok, key=lambda k: truth.get(ids[k]) is None):
        if len(chosen) >= n:
            break
        chosen.setdefault(i, "example")

    places = item_places(dataset, [ids[i] for i in chosen])
    out = []
    for i, why in chosen.items():
        t = truth.get(ids[i])
        device_boxes = _shown(d.boxes[i], display_conf)
        ref_all = None if r is None else r.boxes[i]
        ref_boxes = None if r is None else _shown(ref_all, display_conf)
        assert device_boxes is not None
        out.append(
            {
                "index": int(d.index[i]),
                "id": ids[i],
                # its file, and a video frame's index (the report's picture of it)
                **places.get(ids[i], {"path": str(dataset.root / ids[i])}),
                "why": why,
                "disagreement": None if r is None else _finite(inputs.disagreement[i]),
                "truth_disagreement": against_truth.get(i),
                "core": int(d.core[i]),
                "node": d.node[i],
                "device_boxes": _box_dicts(device_boxes, d.label_of),
                "device_all": len(d.boxes[i] if d.boxes[i] is not None else ()),
                "reference_boxes": None
                if r is None or ref_boxes is None
                else _box_dicts(ref_boxes, r.label_of),
                "reference_all": None if ref_all is None else len(ref_all),
                "truth_boxes": None if t is None else _truth_dicts(t, class_of, names),
            }
        )
    return out


def _truth_dicts(
    truth: np.ndarray, class_of: dict[int, int], names: dict[int, str]
) -> list[dict[str, Any]]:
    """An image's ground truth as box dicts: the model's class (-1: none maps onto the
    category), the category's name, no score."""
    return [
        {"class_id": class_of.get(int(c), -1), "label": names.get(int(c), str(int(c))),
         "score": None, "x1": x1, "y1": y1, "x2": x2, "y2": y2}
        for x1, y1, x2, y2, c in truth.tolist()
    ]  # fmt: skip


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


__all__ = ["PANEL_SIDE", "WHY", "detection_examples"]
