"""Rotated mAP50, DOTA-style: VOC average precision per class on exact polygon IoU.

This is the DOTA devkit's ``voc_eval`` (``dota_evaluation_task1.py``), vectorised:

- per class, the detections of all images ranked by score (ties: the earlier image, then
  the earlier detection, first);
- each detection's best ground truth of its class in its image by exact polygon IoU
  (:func:`batchinfer.detect.rotated.polygon_iou_pairs`; ties: the earlier ground truth);
- above ``iou`` (strictly, as the devkit's ``ovmax > ovthresh``): a *difficult* ground truth
  makes the detection neither true nor false; otherwise it is a true positive when it is
  the first detection (in rank) to reach that ground truth, a false positive after;
  at or below ``iou``: a false positive. A detection reaches only its *best* ground truth
  (if that one is taken, the detection is false even when another would fit), as the
  devkit does;
- recall = TP / (non-difficult ground truths), precision = TP / max(TP + FP, eps), and the
  all-point interpolated AP (``voc_ap(use_07_metric=False)``): precision made monotone from
  the right, summed over the recall steps.

Classes with no non-difficult ground truth have no AP (the devkit would divide by zero) and
are left out of the mean. The only Python loop is over classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from batchinfer.detect.rotated import enclosing_boxes, polygon_iou_pairs


@dataclass
class ImageTruth:
    """One image's ground truth: convex quadrilaterals (m, 4, 2), classes, difficult flags."""

    polygons: np.ndarray
    class_ids: np.ndarray
    difficult: np.ndarray | None = None


@dataclass
class ImagePredictions:
    """One image's detections: quadrilaterals (n, 4, 2), classes and scores."""

    polygons: np.ndarray
    class_ids: np.ndarray
    scores: np.ndarray


@dataclass
class RotatedAP:
    """mAP at one IoU threshold and the AP of each class that has ground truth."""

    map: float  # mean of ``per_class`` (nan when no class has ground truth)
    per_class: dict[int, float] = field(default_factory=dict)
    ground_truths: dict[int, int] = field(default_factory=dict)  # non-difficult, per class


def rotated_map(
    predictions: Sequence[ImagePredictions], truths: Sequence[ImageTruth], iou: float = 0.5
) -> RotatedAP:
    """DOTA-style mAP over images (``predictions[i]`` and ``truths[i]`` are image i's)."""
    if len(predictions) != len(truths):
        raise ValueError(f"{len(predictions)} images of predictions, {len(truths)} of truth")
    d_img, d_cls, d_score, d_poly = _stack_predictions(predictions)
    g_img, g_cls, g_poly, g_diff = _stack_truths(truths)
    best_gt, best_iou = _best_truths(d_img, d_cls, d_poly, g_img, g_cls, g_poly)
    result = RotatedAP(float("nan"))
    for c in np.unique(np.concatenate([g_cls[~g_diff], d_cls])):
        npos = int(np.count_nonzero((g_cls == c) & ~g_diff))
        if npos == 0:
            continue
        mine = np.flatnonzero(d_cls == c)
        ranked = mine[np.argsort(-d_score[mine], kind="stable")]
        gt, ov = best_gt[ranked], best_iou[ranked]
        over = ov > iou
        difficult = over & g_diff[np.maximum(gt, 0)]
        eligible = np.flatnonzero(over & ~difficult)
        tp = np.zeros(len(ranked))
        _, first = np.unique(gt[eligible], return_index=True)
        tp[eligible[first]] = 1
        fp = 1 - tp
        fp[difficult] = 0
        tp, fp = np.cumsum(tp), np.cumsum(fp)
        recall = tp / npos
        precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
        result.per_class[int(c)] = voc_ap(recall, precision)
        result.ground_truths[int(c)] = npos
    if result.per_class:
        result.map = float(np.mean(list(result.per_class.values())))
    return result


def voc_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """All-point interpolated average precision (VOC 2010+, DOTA's default)."""
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _stack_predictions(images: Sequence[ImagePredictions]) -> tuple[np.ndarray, ...]:
    img = np.concatenate([np.full(len(p.scores), i) for i, p in enumerate(images)] + [[]])
    cls = np.concatenate([np.asarray(p.class_ids).reshape(-1) for p in images] + [[]])
    score = np.concatenate([np.asarray(p.scores, np.float64).reshape(-1) for p in images] + [[]])
    poly = np.concatenate(
        [np.asarray(p.polygons, np.float64).reshape(-1, 4, 2) for p in images]
        + [np.zeros((0, 4, 2))]
    )
    return img.astype(np.int64), cls.astype(np.int64), score, poly


def _stack_truths(images: Sequence[ImageTruth]) -> tuple[np.ndarray, ...]:
    img = np.concatenate([np.full(len(t.class_ids), i) for i, t in enumerate(images)] + [[]])
    cls = np.concatenate([np.asarray(t.class_ids).reshape(-1) for t in images] + [[]])
    diff = np.concatenate(
        [
            np.zeros(len(t.class_ids), bool)
            if t.difficult is None
            else np.asarray(t.difficult, bool).reshape(-1)
            for t in images
        ]
        + [np.zeros(0, bool)]
    )
    poly = np.concatenate(
        [np.asarray(t.polygons, np.float64).reshape(-1, 4, 2) for t in images]
        + [np.zeros((0, 4, 2))]
    )
    return img.astype(np.int64), cls.astype(np.int64), poly, diff


def _best_truths(
    d_img: np.ndarray,
    d_cls: np.ndarray,
    d_poly: np.ndarray,
    g_img: np.ndarray,
    g_cls: np.ndarray,
    g_poly: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per detection: the index of its best ground truth (same image and class; -1: none)
    and that IoU (0 when none overlaps)."""
    nd = len(d_img)
    best_gt, best_iou = np.full(nd, -1), np.zeros(nd)
    if nd == 0 or len(g_img) == 0:
        return best_gt, best_iou
    # Ground truths grouped by (image, class), annotation order kept within a group; each
    # detection is paired with every ground truth of its group.
    span = int(max(d_cls.max(), g_cls.max())) + 1
    g_key = g_img * span + g_cls
    g_order = np.argsort(g_key, kind="stable")
    keys = g_key[g_order]
    d_key = d_img * span + d_cls
    lo = np.searchsorted(keys, d_key, "left")
    counts = np.searchsorted(keys, d_key, "right") - lo
    det = np.repeat(np.arange(nd), counts)
    within = np.arange(len(det)) - np.repeat(np.cumsum(counts) - counts, counts)
    gt = g_order[lo[det] + within]
    # Only pairs whose enclosing boxes meet can overlap (the devkit's BBGT_keep).
    ed, eg = enclosing_boxes(d_poly)[det], enclosing_boxes(g_poly)[gt]
    meet = (
        (ed[:, 0] <= eg[:, 2])
        & (eg[:, 0] <= ed[:, 2])
        & (ed[:, 1] <= eg[:, 3])
        & (eg[:, 1] <= ed[:, 3])
    )
    det, gt = det[meet], gt[meet]
    ious = polygon_iou_pairs(d_poly[det], g_poly[gt])
    # Best per detection: sort by detection, then IoU desc, then ground truth index.
    order = np.lexsort((gt, -ious, det))
    det, gt, ious = det[order], gt[order], ious[order]
    first = np.flatnonzero(np.r_[True, det[1:] != det[:-1]]) if len(det) else det
    best_gt[det[first]] = gt[first]
    best_iou[det[first]] = ious[first]
    return best_gt, best_iou
