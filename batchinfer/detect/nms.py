"""Greedy non-maximum suppression (NMS), a block of ranked candidates at a time.

Greedy NMS goes down the scores (ties: the earlier candidate first) and keeps a box unless a
kept box of its class overlaps it by IoU > ``iou`` (the model zoo keeps IoU <= threshold);
with ``agnostic``, a kept box of any class. It stops at ``max_det`` kept boxes.

Here the ranked candidates are taken a block (a few hundred) at a time. A block's boxes are compared
with the boxes kept so far (at most ``max_det``: one kept x block IoU matrix) and those
overlapped are dropped; the rest are compared among themselves (one upper-triangular
matrix: box i can suppress box j only if it ranks before it) and greedy is solved on that
matrix by rounds of ``kept[j] = not any(kept[i] and overlaps[i, j])`` from "all kept": box
j's answer is final once the answers of the boxes before it are, so the rounds stop at the
first that changes nothing, which is the greedy answer (the only assignment that is its own
round). Boxes on one object settle in 2-4 rounds; a chain of boxes each overlapping the
next (rare) is solved by walking the matrix's rows in order instead.

Why blocks: at a low ``conf`` (0.001, as mAP evaluations use) every cell of a 640x640 YOLO
output is a candidate (8,400), but with many classes the few hundred best already give
``max_det`` kept boxes. Only the blocks visited are ranked exactly (the best first), and
only their boxes and classes are asked for (``fetch``): a decoder computes those on demand.

Classes are told apart by comparing ids rather than by the usual trick of offsetting each
class's boxes by class x (max coordinate): in float32 an offset of tens of thousands of
pixels costs the IoU its precision (the spacing of float32 at 50,000 is 0.004 px). The IoU
is computed with the same float operations, in the same order, as the textbook loop's, so
it decides the same way to the last bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

#: Ranked candidates compared at a time. Class-aware, only the pairs of one class are
#: compared (few with many classes): large blocks, few rounds. Agnostic (or with few
#: classes), every pair, in matrices (kept x block, block x block) that stay in the caches.
_BLOCK = 512
_BLOCK_AGNOSTIC = 256
_BLOCK_MIN = 32
#: The candidates ranked exactly at first: the best ``max(_FIRST, 4 * max_det)``; the rest
#: are sorted only if NMS gets to them.
_FIRST = 1024
_MAX_ROUNDS = 8

#: ``fetch(indices) -> (boxes (n, 4), class ids (n,))`` of candidates by index.
Fetch = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    iou: float,
    max_det: int,
    agnostic: bool = False,
) -> np.ndarray:
    """Indices of the boxes kept, best first: greedy NMS within each class (across classes
    with ``agnostic``). Boxes are x1 y1 x2 y2. Ties in score keep the earlier box first. At
    most ``max_det`` indices: the best of the boxes greedy NMS keeps."""
    return nms_ranked(
        scores, lambda i: (boxes[i], class_ids[i]), iou, max_det, agnostic, dtype=boxes.dtype
    )[0]


def nms_ranked(
    scores: np.ndarray,
    fetch: Fetch,
    iou: float,
    max_det: int,
    agnostic: bool = False,
    classes: Sequence[int] | None = None,
    dtype: np.dtype | type = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy NMS over candidates known by their ``scores``, their boxes and class ids
    asked of ``fetch`` a block at a time: (indices, boxes, class ids) of the kept, best
    first, at most ``max_det``. ``classes``: only candidates of these classes take part
    (the others are left out before NMS, as if they were not candidates)."""
    wanted = None if classes is None else np.asarray(classes)
    kept_idx: list[np.ndarray] = []
    kept_boxes: list[np.ndarray] = []
    kept = _Boxes(np.zeros((5, 0), dtype), np.zeros(0, np.int32))
    size = _BLOCK_AGNOSTIC if agnostic else _BLOCK
    visited = 0

    def next_size() -> int:
        # After the first block, about as many as the boxes still wanted need at the rate
        # boxes were kept so far (and a quarter more): each visited box is decoded.
        if not visited:
            return size
        need = (max_det - len(kept.cls)) * visited / max(len(kept.cls), 1) * 1.25
        return int(min(size, max(_BLOCK_MIN, need)))

    for block in _blocks(scores, max(_FIRST, 4 * max_det), next_size):
        visited += len(block)
        boxes, cls = fetch(block)
        here = _Boxes.of(boxes, cls)
        mine = None if wanted is None else np.isin(cls, wanted)
        if len(kept.cls) and block.size:
            _, worse = _hits(kept, here, iou, agnostic)
            alive = np.ones(len(block), bool) if mine is None else mine
            alive[worse] = False
            mine = alive
        if mine is not None:
            block, boxes, here = block[mine], boxes[mine], here.pick(mine)
        if not block.size:
            continue
        keep = _greedy(len(block), *_hits(here, here, iou, agnostic, upper=True))
        kept_idx.append(block[keep])
        kept_boxes.append(boxes[keep])
        kept = kept.join(here.pick(keep))
        if len(kept.cls) >= max_det:
            break
    if not kept_idx:
        return np.zeros(0, np.intp), np.zeros((0, 4), dtype), np.zeros(0, np.int32)
    idx, boxes = np.concatenate(kept_idx), np.concatenate(kept_boxes)
    return idx[:max_det], boxes[:max_det], kept.cls[:max_det]


class _Boxes:
    """Boxes as columns (x1, y1, x2, y2, area: 1-D gathers are fast, rows of a 2-D array
    are not) and their classes."""

    def __init__(self, cols: np.ndarray, cls: np.ndarray) -> None:
        self.cols, self.cls = cols, cls

    @classmethod
    def of(cls, boxes: np.ndarray, classes: np.ndarray) -> _Boxes:
        cols = np.empty((5, len(boxes)), boxes.dtype)
        cols[:4] = boxes.T
        np.multiply(cols[2] - cols[0], cols[3] - cols[1], out=cols[4])
        return cls(cols, np.asarray(classes))

    def pick(self, which: np.ndarray) -> _Boxes:
        if which.dtype == bool:
            return _Boxes(self.cols.compress(which, axis=1), self.cls[which])
        return _Boxes(self.cols.take(which, axis=1), self.cls.take(which))

    def join(self, other: _Boxes) -> _Boxes:
        return _Boxes(
            np.concatenate([self.cols, other.cols], axis=1), np.concatenate([self.cls, other.cls])
        )


def _blocks(scores: np.ndarray, first: int, next_size: Callable[[], int]) -> Iterator[np.ndarray]:
    """Candidate indices by score, best first (ties: the lower index first), in blocks of
    ``next_size()`` (asked before each block).

    The same order as ``np.argsort(-scores, kind="stable")``: the best ``first`` (all
    candidates scoring at least the ``first``-th best score, ties included) are sorted
    first, the others only when asked for; every one of the first scores more than any
    of the others.
    """
    k = len(scores)
    if k <= first:
        parts: Iterator[np.ndarray] = iter((np.arange(k),))
    else:
        cut = np.partition(scores, k - first)[k - first]
        above = scores >= cut
        parts = iter((np.flatnonzero(above), np.flatnonzero(~above)))
    ranked = np.zeros(0, np.intp)
    while True:
        size = next_size()
        while len(ranked) < size:
            part = next(parts, None)
            if part is None:
                break
            ranked = np.concatenate([ranked, part[np.argsort(-scores[part], kind="stable")]])
        if not len(ranked):
            return
        yield ranked[:size]
        ranked = ranked[size:]


def _hits(
    better: _Boxes, worse: _Boxes, iou: float, agnostic: bool, upper: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (i, j) where box ``better[i]`` overlaps box ``worse[j]`` by IoU > ``iou``:
    of one class unless ``agnostic``, with i < j when ``upper`` (boxes against themselves).
    Few pairs of one class (many classes): only those are compared; else every pair, in
    one matrix."""
    m, n = len(better.cls), len(worse.cls)
    if not agnostic:
        i, j = _class_pairs(better.cls, worse.cls)
        if upper:
            i, j = i[i < j], j[i < j]
        if 4 * len(i) < m * n:
            hit = _pair_iou(better.cols, i, worse.cols, j) > iou
            return i[hit], j[hit]
    mask = _overlaps(better.cols, worse.cols, iou)
    if not agnostic:
        mask &= np.equal.outer(better.cls, worse.cls)
    if upper:
        mask &= _upper(n)
    i, j = np.divmod(np.flatnonzero(mask), n)
    return i, j


def _class_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i, j) with ``a[i] == b[j]``, grouped by j, from a sort of ``a``."""
    order = np.argsort(a, kind="stable")
    ranked = a[order]
    lo = np.searchsorted(ranked, b, "left")
    counts = np.searchsorted(ranked, b, "right") - lo
    j = np.repeat(np.arange(len(b)), counts)
    # pair p of j is at lo[j] + (p - the first pair of j) in the sorted a
    shift = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return order.take(shift + np.arange(len(j))), j


_UPPER = np.triu(np.ones((_BLOCK, _BLOCK), bool), 1)


def _upper(n: int) -> np.ndarray:
    """(n, n) mask of i < j."""
    return _UPPER[:n, :n] if n <= len(_UPPER) else np.triu(np.ones((n, n), bool), 1)


# The IoU below is the textbook loop's float operations in its order (``inter / (area_i +
# area_j - inter)``, areas ``(x2 - x1) * (y2 - y1)``), so the same pairs pass. A zero-area
# pair has union 0: IoU NaN, which suppresses nothing.


def _overlaps(better: np.ndarray, worse: np.ndarray, iou: float) -> np.ndarray:
    """(m, n) mask: box column i of ``better`` overlaps column j of ``worse`` by > ``iou``."""
    inter = np.minimum.outer(better[2], worse[2])
    inter -= np.maximum.outer(better[0], worse[0])
    height = np.minimum.outer(better[3], worse[3])
    height -= np.maximum.outer(better[1], worse[1])
    np.maximum(inter, 0, out=inter)
    np.maximum(height, 0, out=height)
    inter *= height
    union = np.add.outer(better[4], worse[4])
    union -= inter
    with np.errstate(divide="ignore", invalid="ignore"):
        inter /= union
    return inter > iou


def _pair_iou(a: np.ndarray, i: np.ndarray, b: np.ndarray, j: np.ndarray) -> np.ndarray:
    """IoU of box column ``i[k]`` of ``a`` and column ``j[k]`` of ``b``, for every k."""
    w = np.minimum(a[2].take(i), b[2].take(j))
    w -= np.maximum(a[0].take(i), b[0].take(j))
    h = np.minimum(a[3].take(i), b[3].take(j))
    h -= np.maximum(a[1].take(i), b[1].take(j))
    np.maximum(w, 0, out=w)
    np.maximum(h, 0, out=h)
    w *= h
    union = a[4].take(i) + b[4].take(j)
    union -= w
    with np.errstate(divide="ignore", invalid="ignore"):
        return w / union


def _greedy(n: int, better: np.ndarray, worse: np.ndarray) -> np.ndarray:
    """Mask of the n boxes (ranked best first) greedy NMS keeps, given the pairs where
    ``better[p]`` (ranked before ``worse[p]``) overlaps ``worse[p]`` enough to suppress it."""
    kept = np.ones(n, bool)
    if not better.size:
        return kept
    for _ in range(_MAX_ROUNDS):
        now = np.ones(n, bool)
        now[worse[kept[better]]] = False
        if np.array_equal(now, kept):
            return kept
        kept = now
    # A chain: walk the suppressing boxes in rank order; box i's answer is final when it
    # is reached (only better boxes suppress it).
    by_better = np.argsort(better, kind="stable")
    better, worse = better[by_better], worse[by_better]
    starts = np.flatnonzero(np.r_[True, better[1:] != better[:-1]])
    ends = np.r_[starts[1:], len(better)]
    kept = np.ones(n, bool)
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if kept[better[s]]:
            kept[worse[s:e]] = False
    return kept
