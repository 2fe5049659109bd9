"""Today's NMS (before issue 40's blocks), kept unchanged as the tests' reference.

batchinfer/detect/nms.py at commit cb6bd65: class-aware greedy NMS by pair rounds, or the
textbook loop once per kept box. The production NMS must give exactly its answer (same
indices, same order) on every scene the tests build.
"""

from __future__ import annotations

import numpy as np

# Same-class pairs the rounds take: about 80 ns a pair here, so at most ~1.5 ms. Beyond (a
# low conf, a one-class model), the loop wins: it stops at max_det kept boxes.
_MAX_PAIRS = 1 << 14
_MAX_ROUNDS = 12


def nms(
    boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou: float, max_det: int
) -> np.ndarray:
    """Indices of the boxes kept, best first: greedy NMS within each class.

    Boxes are x1 y1 x2 y2. Ties in score keep the earlier box first. At most ``max_det``
    indices: the best of the boxes greedy NMS keeps.
    """
    order = np.argsort(-scores, kind="stable")
    if order.size < 2:
        return order[:max_det]
    kept = _nms_pairs(boxes, class_ids, order, iou)
    if kept is None:
        return _nms_loop(boxes, class_ids, order, iou, max_det)
    return order[kept][:max_det]


def _iou(
    boxes: np.ndarray, a: np.ndarray | np.intp, b: np.ndarray, areas: np.ndarray
) -> np.ndarray:
    """IoU of boxes ``a`` and ``b`` (index arrays, or one index against many)."""
    w = np.minimum(boxes[a, 2], boxes[b, 2]) - np.maximum(boxes[a, 0], boxes[b, 0])
    h = np.minimum(boxes[a, 3], boxes[b, 3]) - np.maximum(boxes[a, 1], boxes[b, 1])
    inter = np.maximum(w, 0) * np.maximum(h, 0)
    # A zero-area pair has union 0: IoU NaN, which suppresses nothing.
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (areas[a] + areas[b] - inter)


def _nms_pairs(
    boxes: np.ndarray, class_ids: np.ndarray, order: np.ndarray, iou: float
) -> np.ndarray | None:
    """Mask over ``order`` of the boxes kept, or None when this path does not apply."""
    k = len(order)
    # Positions in `order` (best first), grouped by class: within a class still best first.
    by_class = np.argsort(class_ids[order], kind="stable")
    cls = class_ids[order][by_class]
    starts = np.flatnonzero(cls[1:] != cls[:-1]) + 1  # where each class run but the first starts
    bounds = np.concatenate(([0], starts, [k]))
    run_end = np.repeat(bounds[1:], np.diff(bounds))  # end of each box's class run
    partners = run_end - np.arange(k) - 1  # boxes after it in its class
    pairs = int(partners.sum())
    if pairs > _MAX_PAIRS:
        return None
    first = np.repeat(np.arange(k), partners)
    offset = np.arange(pairs) - np.repeat(np.cumsum(partners) - partners, partners)
    second = first + 1 + offset
    # back to positions in `order`: first is better than second
    better, worse = by_class[first], by_class[second]
    ranked = boxes[order]
    areas = (ranked[:, 2] - ranked[:, 0]) * (ranked[:, 3] - ranked[:, 1])
    hit = _iou(ranked, better, worse, areas) > iou
    better, worse = better[hit], worse[hit]
    kept = np.ones(k, bool)
    for _ in range(_MAX_ROUNDS):
        now = np.ones(k, bool)
        now[worse[kept[better]]] = False
        if np.array_equal(now, kept):
            return kept
        kept = now
    return None


def _nms_loop(
    boxes: np.ndarray, class_ids: np.ndarray, order: np.ndarray, iou: float, max_det: int
) -> np.ndarray:
    """Greedy NMS one kept box at a time, each pass vectorised over the boxes left."""
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep: list[int] = []
    while order.size and len(keep) < max_det:
        i = order[0]
        keep.append(int(i))
        rest = order[1:]
        suppressed = (_iou(boxes, i, rest, areas) > iou) & (class_ids[rest] == class_ids[i])
        order = rest[~suppressed]
    return np.asarray(keep, dtype=np.intp)
