"""Non-maximum suppression of rotated boxes, vectorised (no Python loop per box).

Two semantics, named by ``method``:

``"probiou"`` (the default): Ultralytics' rotated NMS as its ``non_max_suppression(...,
    rotated=True)`` does it: ``TorchNMS.fast_nms`` with ``batch_probiou``. Boxes are
    ranked by score; a box is dropped when a better box of its class has ProbIoU >= ``iou``
    with it, whether or not that better box was itself dropped ("Fast NMS",
    https://arxiv.org/abs/1904.02689; it drops a little more than greedy NMS when boxes
    chain). ProbIoU, not the area IoU: see :mod:`batchinfer.detect.rotated`.
``"polygon"``: the model zoo's rotated NMS (``examples/yolov8_obb``, C++ ``Cal_IOU`` and
    Python shapely ``intersection``): greedy, a box is dropped when a *kept* better box of
    its class has exact polygon IoU > ``iou``.

Why ProbIoU by default: that is what the boxes of an Ultralytics OBB model were validated
with (its mAP figures come from this NMS), and it costs ~20 flops a pair where the exact
polygon clipping costs a few hundred; the zoo's exact rule is one setting away.

How: the ranked boxes are taken a block of rows at a time; in each block, the pairs (i, j)
with i ranked before j, of one class, whose circumscribed circles could overlap are listed
(for ProbIoU the circles are widened to the distance at which ProbIoU can still reach
``iou``; beyond it it cannot, see :func:`_probiou_reach_factor`), and only those pairs are
measured. Fast NMS is then "dropped = any hit with a better box". Greedy is solved by rounds
of ``kept[j] = not any(kept[i] for the hits (i, j))`` from "all kept": box j's answer is
final once those of the boxes before it are, so the rounds stop at the first that changes
nothing, the greedy answer (2-4 rounds on real outputs, at most k + 1).
"""

from __future__ import annotations

import math

import numpy as np

from batchinfer.detect.rotated import (
    corners,
    enclosing_boxes,
    polygon_iou_pairs,
    probiou_pairs,
    probiou_reach,
)

METHODS = ("probiou", "polygon")
#: Ranked boxes whose pairs are listed at a time (a block x k matrix of distances).
_BLOCK = 256


def rotated_nms(
    xywhr: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    iou: float,
    max_det: int,
    method: str = "probiou",
    agnostic: bool = False,
) -> np.ndarray:
    """Indices of the rotated boxes kept, best first, at most ``max_det``.

    ``xywhr`` (n, 5): centre, size, angle in radians. Ties in score keep the earlier box
    first. ``agnostic``: boxes of any class suppress each other."""
    if method not in METHODS:
        raise ValueError(f"unknown rotated NMS {method!r}: one of {', '.join(METHODS)}")
    order = np.argsort(-np.asarray(scores), kind="stable")
    k = order.size
    if k < 2:
        return order[:max_det]
    ranked = np.asarray(xywhr, dtype=np.float64)[order]
    cls = np.zeros(k, np.int64) if agnostic else np.asarray(class_ids)[order]
    reach = _probiou_reach_factor(iou) if method == "probiou" else 1.0
    better, worse = _candidate_pairs(ranked, cls, reach)
    if method == "probiou":
        hit = probiou_pairs(ranked[better], ranked[worse]) >= iou
        dropped = np.zeros(k, bool)
        dropped[worse[hit]] = True
        kept = ~dropped
    else:
        quads = corners(ranked)
        better, worse = _may_exceed(quads, ranked, better, worse, iou)
        hit = polygon_iou_pairs(quads[better], quads[worse]) > iou
        kept = _greedy(k, better[hit], worse[hit])
    return order[kept][:max_det]


def _probiou_reach_factor(iou: float) -> float:
    """How far past touching circumscribed circles ProbIoU can still reach ``iou``.

    Ultralytics' Bhattacharyya distance is at least 1/4 d' (S1 + S2)^-1 d (its log term is
    >= 0, Minkowski's determinant inequality), and the largest eigenvalue of S1 + S2 is at
    most its trace (D1^2 + D2^2) / 12 with D a box's diagonal; so the distance is at least
    3 |d|^2 / (D1^2 + D2^2) >= 3 |d|^2 / (D1 + D2)^2. ProbIoU >= iou needs the distance <=
    :func:`probiou_reach` (iou): |d| <= sqrt(reach / 3) (D1 + D2) = sqrt(4 reach / 3) (r1 + r2).
    A margin of 1 % covers the eps terms."""
    return math.sqrt(4 * probiou_reach(iou) / 3) * 1.01 + 1e-6


def _candidate_pairs(
    ranked: np.ndarray, cls: np.ndarray, reach: float
) -> tuple[np.ndarray, np.ndarray]:
    """(better, worse) positions in the ranking, better < worse, same class, whose
    circumscribed circles (radii times ``reach``) meet."""
    k = len(ranked)
    x, y = ranked[:, 0], ranked[:, 1]
    radius = np.hypot(ranked[:, 2], ranked[:, 3]) / 2 * reach
    firsts, seconds = [np.zeros(0, np.intp)], [np.zeros(0, np.intp)]
    for start in range(0, k - 1, _BLOCK):
        rows = np.arange(start, min(start + _BLOCK, k))
        cols = np.arange(start + 1, k)
        dx = x[rows, None] - x[None, cols]
        dy = y[rows, None] - y[None, cols]
        limit = radius[rows, None] + radius[None, cols]
        near = dx * dx + dy * dy <= limit * limit
        near &= cls[rows, None] == cls[None, cols]
        near &= rows[:, None] < cols[None, :]
        i, j = np.nonzero(near)
        firsts.append(rows[i])
        seconds.append(cols[j])
    return np.concatenate(firsts), np.concatenate(seconds)


def _may_exceed(
    quads: np.ndarray, boxes: np.ndarray, better: np.ndarray, worse: np.ndarray, iou: float
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose polygon IoU could exceed ``iou``: an upper bound from the enclosing
    boxes (the intersection is at most theirs and at most the smaller area), about half
    the pairs of a crowded scene, for two subtractions a pair."""
    enclosing = enclosing_boxes(quads)
    area = boxes[:, 2] * boxes[:, 3]
    lo, hi = enclosing[better], enclosing[worse]
    w = np.minimum(lo[:, 2], hi[:, 2]) - np.maximum(lo[:, 0], hi[:, 0])
    h = np.minimum(lo[:, 3], hi[:, 3]) - np.maximum(lo[:, 1], hi[:, 1])
    inter = np.minimum(np.maximum(w, 0) * np.maximum(h, 0), np.minimum(area[better], area[worse]))
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = inter / (area[better] + area[worse] - inter)
    # NaN (no area at all) stays: the exact IoU says 0 for it.
    maybe = ~(bound <= iou * (1 - 1e-9))
    return better[maybe], worse[maybe]


def _greedy(k: int, better: np.ndarray, worse: np.ndarray) -> np.ndarray:
    """Greedy NMS's kept mask over k ranked boxes, given the overlapping pairs."""
    kept = np.ones(k, bool)
    for _ in range(k + 1):
        now = np.ones(k, bool)
        now[worse[kept[better]]] = False
        if np.array_equal(now, kept):
            break
        kept = now
    return kept
