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

How: a box's fate depends only on the boxes ranked before it, so the ranked boxes are
taken a block (256) at a time, and NMS stops once ``max_det`` are kept: at a low conf
(0.001, as mAP runs use) every cell is a candidate, but the first few hundred decide. Only
pairs of one class whose circumscribed circles meet are measured (for ProbIoU the circles
are widened to the distance at which ProbIoU can still reach ``iou``; beyond it it cannot,
see :func:`_probiou_reach_factor`); for the polygon IoU, only those whose enclosing boxes
allow an IoU above ``iou``. Fast NMS: a block's box is dropped when any better box hits
it. Greedy: a block's boxes are first compared with the boxes kept so far, then among
themselves, solved by rounds of ``kept[j] = not any(kept[i] for the hits (i, j))`` from
"all kept": box j's answer is final once those of the boxes before it are, so the rounds
stop at the first that changes nothing, the greedy answer (2-4 rounds on real outputs).
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
    ranked = _Ranked(np.asarray(xywhr, dtype=np.float64)[order], class_ids, order, agnostic)
    if method == "probiou":
        ranked.radius *= _probiou_reach_factor(iou)
    kept: list[np.ndarray] = []
    count = 0
    # A box's fate depends only on the boxes ranked before it (in both methods), so the
    # ranking is taken a block at a time and stops once max_det boxes are kept: at a low
    # conf (0.001, for mAP) thousands of candidates, but the first few hundred decide.
    for start in range(0, k, _BLOCK):
        block = np.arange(start, min(start + _BLOCK, k))
        if method == "probiou":
            survivors = _fast_block(ranked, block, iou)
        else:
            done = np.concatenate(kept) if kept else np.zeros(0, np.intp)
            survivors = _greedy_block(ranked, done, block, iou)
        kept.append(survivors)
        count += len(survivors)
        if count >= max_det:
            break
    return order[np.concatenate(kept)][:max_det]


class _Ranked:
    """The boxes in rank order, their classes, circumscribed radii and corners."""

    def __init__(self, boxes: np.ndarray, class_ids: np.ndarray, order: np.ndarray, agnostic: bool):
        self.boxes = boxes
        k = len(boxes)
        self.cls = np.zeros(k, np.int64) if agnostic else np.asarray(class_ids)[order]
        self.radius = np.hypot(boxes[:, 2], boxes[:, 3]) / 2
        self._quads: np.ndarray | None = None

    @property
    def quads(self) -> np.ndarray:
        if self._quads is None:
            self._quads = corners(self.boxes)
        return self._quads

    def pairs(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(i, j) from rows x cols, i ranked before j, one class, circles meeting."""
        b = self.boxes
        dx = b[rows, 0, None] - b[None, cols, 0]
        dy = b[rows, 1, None] - b[None, cols, 1]
        limit = self.radius[rows, None] + self.radius[None, cols]
        near = dx * dx + dy * dy <= limit * limit
        near &= self.cls[rows, None] == self.cls[None, cols]
        near &= rows[:, None] < cols[None, :]
        i, j = np.nonzero(near)
        return rows[i], cols[j]


def _fast_block(ranked: _Ranked, block: np.ndarray, iou: float) -> np.ndarray:
    """The block's boxes that no better box (dropped or not) overlaps by ProbIoU >= iou."""
    better, worse = ranked.pairs(np.arange(block[-1]), block)
    hit = probiou_pairs(ranked.boxes[better], ranked.boxes[worse]) >= iou
    dropped = np.zeros(len(ranked.boxes), bool)
    dropped[worse[hit]] = True
    return block[~dropped[block]]


def _greedy_block(ranked: _Ranked, done: np.ndarray, block: np.ndarray, iou: float) -> np.ndarray:
    """The block's boxes greedy NMS keeps, given the boxes kept before it (``done``)."""
    alive = np.ones(len(ranked.boxes), bool)
    if done.size:
        better, worse = _may_exceed(ranked, *ranked.pairs(done, block), iou)
        hit = polygon_iou_pairs(ranked.quads[better], ranked.quads[worse]) > iou
        alive[worse[hit]] = False
    block = block[alive[block]]
    if block.size < 2:
        return block
    better, worse = _may_exceed(ranked, *ranked.pairs(block, block), iou)
    hit = polygon_iou_pairs(ranked.quads[better], ranked.quads[worse]) > iou
    # positions within the block, for the rounds
    local = np.full(len(ranked.boxes), -1)
    local[block] = np.arange(block.size)
    return block[_greedy(block.size, local[better[hit]], local[worse[hit]])]


def _probiou_reach_factor(iou: float) -> float:
    """How far past touching circumscribed circles ProbIoU can still reach ``iou``.

    Ultralytics' Bhattacharyya distance is at least 1/4 d' (S1 + S2)^-1 d (its log term is
    >= 0, Minkowski's determinant inequality), and the largest eigenvalue of S1 + S2 is at
    most its trace (D1^2 + D2^2) / 12 with D a box's diagonal; so the distance is at least
    3 |d|^2 / (D1^2 + D2^2) >= 3 |d|^2 / (D1 + D2)^2. ProbIoU >= iou needs the distance <=
    :func:`probiou_reach` (iou): |d| <= sqrt(reach / 3) (D1 + D2) = sqrt(4 reach / 3) (r1 + r2).
    A margin of 1 % covers the eps terms."""
    return math.sqrt(4 * probiou_reach(iou) / 3) * 1.01 + 1e-6


def _may_exceed(
    ranked: _Ranked, better: np.ndarray, worse: np.ndarray, iou: float
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose polygon IoU could exceed ``iou``: an upper bound from the enclosing
    boxes (the intersection is at most theirs and at most the smaller area), about half
    the pairs of a crowded scene, for a few subtractions a pair."""
    enclosing = enclosing_boxes(ranked.quads)
    area = ranked.boxes[:, 2] * ranked.boxes[:, 3]
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
