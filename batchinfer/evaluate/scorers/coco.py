"""Instance scores: COCO mAP by faster-coco-eval, per class and per core, PR curves, and how
much two box sets of one image disagree.

Scores follow the COCO protocol exactly (pycocotools' numbers, to 1e-4; tested):
``map50_95`` is AP averaged over IoU 0.50:0.05:0.95, ``map50`` and ``map75`` at one IoU,
all areas, at most 100 detections per image and class, averaged over the classes that have
ground truth. A class with ground truth and no detection scores 0; a class without ground
truth is left out (not 0). :func:`score_detections` runs faster-coco-eval (the ``detect``
extra), a C++ port of pycocotools' matching and accumulation.

The paired bootstrap of the mAP difference is :mod:`.coco_bootstrap`'s. Scores are
computed for COCO's ``iouType`` ``bbox`` today; :func:`score_detections` takes the
``iou_type`` (``segm``, ``keypoints``: the same faster-coco-eval machinery), and keeps the
results' ``segmentation`` and ``keypoints`` for it.
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchinfer.errors import UsageError
from batchinfer.evaluate.groundtruth import GroundTruth

#: COCO's IoU thresholds (0.50:0.05:0.95) and recall points (0:0.01:1), as pycocotools
#: makes them (linspace: arange drifts past 0.95).
IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
#: Detections kept per image and class (COCO's maxDets for AP).
MAX_DETS = 100
#: Area range "all" (pycocotools' [0, 1e5**2]).
AREA_ALL = (0.0, 1e5**2)


class DetectEvalUnavailable(UsageError):
    """faster-coco-eval is not installed (exit 2: nothing can be scored)."""


def _coco_api() -> tuple[Any, Any]:
    try:
        from faster_coco_eval import COCO, COCOeval_faster
    except ImportError:
        raise DetectEvalUnavailable(
            "scoring detections needs faster-coco-eval, which is not installed; "
            "pip install 'batchinfer[detect]'."
        ) from None
    return COCO, COCOeval_faster


def require_scoring() -> None:
    """DetectEvalUnavailable now when faster-coco-eval is missing: checked when a detection
    job is loaded, so a user does not wait for both sides' runs to learn it."""
    _coco_api()


# --------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class DetectionScore:
    """COCO scores of one set of detections against the ground truth.

    ``precision`` is COCO's interpolated precision, shape (IoU thresholds, recall points,
    classes), for area "all" and 100 detections; -1 where a class has no ground truth.
    """

    map50_95: float | None  # None: no class has ground truth among the scored images
    map50: float | None
    map75: float | None
    category_ids: tuple[int, ...]
    names: tuple[str, ...]
    precision: np.ndarray
    recall: np.ndarray  # (IoU thresholds, classes): the highest recall reached, -1 as above
    gt_boxes: np.ndarray  # (classes,) ground-truth boxes (crowd boxes not counted)
    detections: np.ndarray  # (classes,) detections scored
    images: int

    def ap(self, iou: float | None = None) -> np.ndarray:
        """AP per class (NaN for a class without ground truth), at one IoU or 0.50:0.95."""
        p = self.precision if iou is None else self.precision[[_iou_index(iou)]]
        valid = (p > -1).all(axis=(0, 1))
        out = np.full(p.shape[2], np.nan)
        if valid.any():
            out[valid] = p[:, :, valid].mean(axis=(0, 1))
        return out

    def per_class(self) -> list[dict[str, Any]]:
        """One row per class: id, name, boxes, detections, AP50:95, AP50, recall at 0.5."""
        ap, ap50 = self.ap(), self.ap(0.5)
        recall50 = self.recall[_iou_index(0.5)]
        rows = []
        for k, (cid, name) in enumerate(zip(self.category_ids, self.names, strict=True)):
            rows.append(
                {
                    "category_id": cid,
                    "name": name,
                    "gt_boxes": int(self.gt_boxes[k]),
                    "detections": int(self.detections[k]),
                    "ap50_95": _value(ap[k]),
                    "ap50": _value(ap50[k]),
                    "recall50": _value(recall50[k]) if recall50[k] > -1 else None,
                }
            )
        return rows

    def pr_curves(self, iou: float = 0.5) -> dict[str, Any]:
        """Precision at COCO's 101 recall points, per class and averaged over the classes
        with ground truth ("overall", COCO's own average), at IoU ``iou``."""
        p = self.precision[_iou_index(iou)]  # (R, K)
        valid = (p > -1).all(axis=0)
        overall = p[:, valid].mean(axis=1) if valid.any() else np.full(p.shape[0], np.nan)
        return {
            "iou": float(iou),
            "recall": RECALL_POINTS.tolist(),
            "overall": [_value(v) for v in overall],
            "per_class": [
                {"name": name, "category_id": cid, "precision": p[:, k].tolist()}
                for k, (cid, name) in enumerate(zip(self.category_ids, self.names, strict=True))
                if valid[k]
            ],
        }

    def metrics(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (("map50_95", self.map50_95), ("map50", self.map50), ("map75", self.map75))
            if v is not None
        }


def _value(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _iou_index(iou: float) -> int:
    hits = np.flatnonzero(np.isclose(IOU_THRESHOLDS, iou))
    if not hits.size:
        raise ValueError(f"IoU {iou} is not one of COCO's thresholds 0.50:0.05:0.95")
    return int(hits[0])


def _mean_valid(p: np.ndarray) -> float | None:
    valid = p[p > -1]
    return float(valid.mean()) if valid.size else None


def check_results(gt: GroundTruth, results: Sequence[Mapping[str, Any]]) -> None:
    """ValueError if a result names an image or category the ground truth does not have."""
    images = {i["id"] for i in gt.images}
    cats = {c.id for c in gt.categories}
    for r in results:
        if r["image_id"] not in images:
            raise ValueError(f"a detection names image {r['image_id']}, not in the ground truth")
        if r["category_id"] not in cats:
            raise ValueError(
                f"a detection names category {r['category_id']}, not in the ground truth"
            )


def score_detections(
    gt: GroundTruth,
    results: Sequence[Mapping[str, Any]],
    image_ids: Collection[int] | None = None,
    iou_type: str = "bbox",
    sigmas: Sequence[float] | None = None,
) -> DetectionScore:
    """COCO scores of ``results`` (COCO result dicts) on ``image_ids`` (default: all the
    ground truth's images), by faster-coco-eval, for COCO's ``iou_type`` (``bbox``;
    ``segm`` and ``keypoints`` need the ground truth's masks or keypoints too; ``sigmas``:
    the OKS sigma of each keypoint, default COCO's 17 person keypoints')."""
    COCO, COCOeval_faster = _coco_api()
    check_results(gt, results)
    ids = sorted({i["id"] for i in gt.images} if image_ids is None else set(image_ids))
    cats = sorted(c.id for c in gt.categories)
    names = [gt.category_names[c] for c in cats]
    T, R, K = len(IOU_THRESHOLDS), len(RECALL_POINTS), len(cats)
    keep = set(ids)
    gt_boxes = np.zeros(K, dtype=np.int64)
    dets = np.zeros(K, dtype=np.int64)
    index = {c: k for k, c in enumerate(cats)}
    for a in gt.annotations:
        if a["image_id"] in keep and not a["iscrowd"]:
            gt_boxes[index[a["category_id"]]] += 1
    for r in results:
        if r["image_id"] in keep:
            dets[index[r["category_id"]]] += 1
    if not ids or not K:
        empty = np.full((T, R, K), -1.0)
        return DetectionScore(
            None, None, None, tuple(cats), tuple(names), empty, np.full((T, K), -1.0),
            gt_boxes, dets, len(ids),
        )  # fmt: skip
    quiet = lambda *args, **kwargs: None  # noqa: E731 - faster-coco-eval's log hook
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(gt.coco())
        coco_gt.print_function = quiet
        coco_dt = coco_gt.loadRes([_result(r) for r in results])
        ev = COCOeval_faster(coco_gt, coco_dt, iou_type, print_function=quiet)
        ev.params.imgIds = ids
        if sigmas is not None:
            ev.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
        ev.params.catIds = cats
        ev.evaluate()
        ev.accumulate()
    # (T, R, K, area, maxDets): area "all" is the first, 100 detections the last.
    precision = np.asarray(ev.eval["precision"])[:, :, :, 0, -1].copy()
    recall = np.asarray(ev.eval["recall"])[:, :, 0, -1].copy()
    return DetectionScore(
        map50_95=_mean_valid(precision),
        map50=_mean_valid(precision[_iou_index(0.5)]),
        map75=_mean_valid(precision[_iou_index(0.75)]),
        category_ids=tuple(cats),
        names=tuple(names),
        precision=precision,
        recall=recall,
        gt_boxes=gt_boxes,
        detections=dets,
        images=len(ids),
    )


def _result(r: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh result dict (the COCO API adds keys to what it gets), with what each
    ``iouType`` reads: the box, and a mask (RLE) or keypoints when the result has them."""
    out = {
        "image_id": r["image_id"],
        "category_id": r["category_id"],
        "bbox": [float(v) for v in r["bbox"]],
        "score": float(r["score"]),
    }
    if "segmentation" in r:
        out["segmentation"] = dict(r["segmentation"])
    if "keypoints" in r:
        out["keypoints"] = [float(v) for v in r["keypoints"]]
    return out


def score_groups(
    gt: GroundTruth,
    results: Sequence[Mapping[str, Any]],
    groups: Mapping[int, Hashable],
    iou_type: str = "bbox",
) -> dict[Hashable, DetectionScore]:
    """Scores per group of images (``groups``: image id -> group, e.g. the NPU core that
    ran it): a core that computes differently shows as a lower mAP of its own."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for image_id, group in groups.items():
        members[group].append(image_id)
    return {g: score_detections(gt, results, ids, iou_type) for g, ids in members.items()}


# --------------------------------------------------------------------------- disagreement
def box_iou_xyxy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4) with every box of ``b`` (m, 4), x1 y1 x2 y2."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    iw, ih = np.clip(hi - lo, 0, None).transpose(2, 0, 1)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def disagreement(
    boxes_a: np.ndarray,
    classes_a: np.ndarray,
    boxes_b: np.ndarray,
    classes_b: np.ndarray,
    min_iou: float = 0.5,
) -> float:
    """How differently two detectors saw one image: 1 - soft F1 of their box sets, in 0..1.

    Boxes of the same class are paired greedily by IoU (highest first, each box once,
    IoU at least ``min_iou``); soft F1 = 2 x (sum of the pairs' IoUs) / (boxes of a +
    boxes of b). 0: the same boxes; 1: no box in common (or one side saw nothing the
    other saw). Two empty sets agree (0).
    """
    na, nb = len(boxes_a), len(boxes_b)
    if na + nb == 0:
        return 0.0
    iou = box_iou_xyxy(boxes_a, boxes_b)
    same = np.asarray(classes_a)[:, None] == np.asarray(classes_b)[None, :]
    iou = np.where(same & (iou >= min_iou), iou, 0.0)
    total = 0.0
    if iou.size:
        order = np.argsort(-iou, axis=None, kind="stable")
        used_a, used_b = np.zeros(na, bool), np.zeros(nb, bool)
        for flat in order:
            value = iou.flat[flat]
            if value <= 0:
                break
            i, j = divmod(int(flat), nb)
            if used_a[i] or used_b[j]:
                continue
            used_a[i] = used_b[j] = True
            total += float(value)
    return 1.0 - 2.0 * total / (na + nb)


__all__ = [
    "AREA_ALL",
    "IOU_THRESHOLDS",
    "MAX_DETS",
    "RECALL_POINTS",
    "DetectEvalUnavailable",
    "DetectionScore",
    "box_iou_xyxy",
    "check_results",
    "disagreement",
    "require_scoring",
    "score_detections",
    "score_groups",
]
