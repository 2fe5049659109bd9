"""Rotated boxes: corners, Ultralytics' angle convention, ProbIoU and exact polygon IoU.

All numpy, vectorised over boxes or over pairs of boxes (no Python loop per box). A rotated
box is ``xywhr``: centre (cx, cy), width, height and angle r in radians, Ultralytics'
convention: the box's width runs along (cos r, sin r) in image pixels (y down), so a
positive r turns it clockwise on screen. :func:`regularize` puts a box in Ultralytics'
canonical form (``ops.regularize_rboxes``): r in [0, pi/2), w and h swapped when the angle
mod pi was in [pi/2, pi). The same rectangle either way; only the numbers change.

Two overlap measures, both elementwise over pairs (``a[i]`` with ``b[i]``):

- :func:`probiou_pairs`: Ultralytics' ProbIoU (``metrics.probiou``, 1 - Hellinger distance
  of the boxes' Gaussians, https://arxiv.org/abs/2106.06072), what Ultralytics' OBB NMS
  uses. Cheap (~20 flops a pair), but not an area ratio: two disjoint boxes still score
  above 0 and two boxes of one centre but different shape score below their IoU.
- :func:`polygon_iou_pairs`: the exact area of intersection over union of two convex
  quadrilaterals (the model zoo's ``Cal_IOU``, DOTA's ``polyiou``), by Sutherland-Hodgman
  clipping done for all pairs at once: polygon A is clipped by each of B's 4 edges in
  turn; a convex polygon cut by a half-plane gains at most one vertex, so the clipped
  polygon has at most 8 and each pair's vertices live in a fixed-size array with a count.
  The loops are over B's 4 edges and the <= 8 vertex slots, never over pairs.

:func:`rotated_iou_matrix` gives either as an (n, m) matrix (the exact IoU computed only
for the pairs whose enclosing boxes meet: the rest are 0).
"""

from __future__ import annotations

import math

import numpy as np

#: Ultralytics' eps in ProbIoU.
_EPS = 1e-7


def regularize(xywhr: np.ndarray) -> np.ndarray:
    """Ultralytics' ``regularize_rboxes``: angle in [0, pi/2), w/h swapped where the angle
    mod pi was >= pi/2. (n, 5) in, (n, 5) out, same dtype."""
    out = np.array(xywhr, copy=True)
    t = out[:, 4]
    swap = np.mod(t, math.pi) >= math.pi / 2
    w, h = out[:, 2].copy(), out[:, 3].copy()
    out[:, 2] = np.where(swap, h, w)
    out[:, 3] = np.where(swap, w, h)
    out[:, 4] = np.mod(t, math.pi / 2)
    return out


def corners(xywhr: np.ndarray) -> np.ndarray:
    """(n, 4, 2) corner points of (n, 5) boxes, in Ultralytics' ``xywhr2xyxyxyxy`` order:
    centre + v1 + v2, + v1 - v2, - v1 - v2, - v1 + v2 with v1 = w/2 (cos r, sin r) and
    v2 = h/2 (-sin r, cos r)."""
    b = np.asarray(xywhr, dtype=np.float64).reshape(-1, 5)
    cos, sin = np.cos(b[:, 4]), np.sin(b[:, 4])
    v1 = np.stack([cos, sin], axis=1) * (b[:, 2:3] / 2)
    v2 = np.stack([-sin, cos], axis=1) * (b[:, 3:4] / 2)
    c = b[:, :2]
    return np.stack([c + v1 + v2, c + v1 - v2, c - v1 - v2, c - v1 + v2], axis=1)


def enclosing_boxes(quads: np.ndarray) -> np.ndarray:
    """(n, 4) x1 y1 x2 y2 of the axis-aligned boxes enclosing (n, 4, 2) polygons."""
    return np.concatenate([quads.min(axis=1), quads.max(axis=1)], axis=1)


def _covariance(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ultralytics' ``_get_covariance_matrix``: the box's uniform distribution's covariance
    (a, b, c) = ([[a, c], [c, b]]) for w^2/12, h^2/12 turned by r."""
    a, bb = b[:, 2] ** 2 / 12, b[:, 3] ** 2 / 12
    cos, sin = np.cos(b[:, 4]), np.sin(b[:, 4])
    return a * cos**2 + bb * sin**2, a * sin**2 + bb * cos**2, (a - bb) * cos * sin


def probiou_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Ultralytics' ProbIoU of boxes ``a[i]`` and ``b[i]`` ((n, 5) xywhr each), float64."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 5)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 5)
    a1, b1, c1 = _covariance(a)
    a2, b2, c2 = _covariance(b)
    dx, dy = a[:, 0] - b[:, 0], a[:, 1] - b[:, 1]
    sa, sb, sc = a1 + a2, b1 + b2, c1 + c2
    det = sa * sb - sc**2
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (sa * dy**2 + sb * dx**2) / (det + _EPS) * 0.25
        t2 = (sc * -dx * dy) / (det + _EPS) * 0.5
        own = np.maximum(a1 * b1 - c1**2, 0) * np.maximum(a2 * b2 - c2**2, 0)
        t3 = np.log(det / (4 * np.sqrt(own) + _EPS) + _EPS) * 0.5
        bd = np.clip(t1 + t2 + t3, _EPS, 100.0)
        return 1 - np.sqrt(1 - np.exp(-bd) + _EPS)


def probiou_reach(iou: float) -> float:
    """The largest Bhattacharyya distance at which ProbIoU still reaches ``iou``."""
    return -math.log(max(1 - (1 - iou) ** 2 + _EPS, 1e-300))


def _area(x: np.ndarray, y: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Shoelace area of (n, m) polygons (vertex coordinates x, y), the first ``count``
    vertices of each (the slots past it are ignored)."""
    n, m = x.shape
    rows = np.arange(n)
    xn, yn = np.empty_like(x), np.empty_like(y)
    xn[:, :-1], yn[:, :-1] = x[:, 1:], y[:, 1:]
    last = np.maximum(count - 1, 0)
    xn[rows, last], yn[rows, last] = x[:, 0], y[:, 0]  # the last vertex closes on the first
    terms = np.where(np.arange(m)[None, :] < count[:, None], x * yn - xn * y, 0.0)
    return np.abs(terms.sum(axis=1)) / 2


def _clip(
    x: np.ndarray, y: np.ndarray, count: np.ndarray, p: np.ndarray, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clip (n, m) convex polygons (first ``count`` vertices) by the half-planes left of
    the directed lines p -> q ((n, 2) each): (n, m + 1) polygons and their counts.

    Sutherland-Hodgman without compaction: walking the vertices, an inside vertex is kept,
    an outside one is replaced by the point E where the polygon leaves the half-plane
    (so a run of outside vertices becomes copies of E: zero-length edges, no area), and
    before the first inside vertex after an outside one the point N where it comes back
    in is inserted: one slot more, every slot after it shifted by one. A convex polygon
    leaves and re-enters a half-plane once, so all of this is a few whole-array operations.
    """
    n, m = x.shape
    rows = np.arange(n)
    last = np.maximum(count - 1, 0)
    ex, ey = (q[:, 0] - p[:, 0])[:, None], (q[:, 1] - p[:, 1])[:, None]
    side = ex * (y - p[:, 1:2]) - ey * (x - p[:, 0:1])
    # each slot's previous vertex: the slot before, and for slot 0 the last vertex
    x_prev, y_prev, side_prev = np.empty_like(x), np.empty_like(y), np.empty_like(side)
    x_prev[:, 1:], y_prev[:, 1:], side_prev[:, 1:] = x[:, :-1], y[:, :-1], side[:, :-1]
    x_prev[:, 0], y_prev[:, 0], side_prev[:, 0] = x[rows, last], y[rows, last], side[rows, last]
    valid = np.arange(m)[None, :] < count[:, None]
    inside, inside_prev = side >= 0, side_prev >= 0
    enters = valid & inside & ~inside_prev
    leaves = valid & ~inside & inside_prev
    # Only where the edge crosses the line is the denominator sure to be non-zero.
    t = np.divide(side_prev, side_prev - side, out=np.zeros_like(side), where=enters | leaves)
    cross_x, cross_y = x_prev + t * (x - x_prev), y_prev + t * (y - y_prev)
    k, e = enters.argmax(axis=1), leaves.argmax(axis=1)
    kept_x = np.where(inside, x, cross_x[rows, e][:, None])
    kept_y = np.where(inside, y, cross_y[rows, e][:, None])
    # k: where N goes (m + 1, past every slot, when the polygon never leaves)
    k = np.where(enters.any(axis=1), k, m + 1)[:, None]
    slots = np.arange(m + 1)[None, :]
    new_x, new_y = np.empty((n, m + 1)), np.empty((n, m + 1))
    new_x[:, :m], new_y[:, :m] = kept_x, kept_y
    new_x[:, m], new_y[:, m] = kept_x[:, -1], kept_y[:, -1]
    shifted_x, shifted_y = np.empty_like(new_x), np.empty_like(new_y)
    shifted_x[:, 1:], shifted_y[:, 1:] = kept_x, kept_y
    shifted_x[:, 0], shifted_y[:, 0] = kept_x[:, 0], kept_y[:, 0]
    after = slots > k
    new_x = np.where(after, shifted_x, new_x)
    new_y = np.where(after, shifted_y, new_y)
    at = slots == k
    new_x = np.where(at, cross_x[rows, np.minimum(k[:, 0], m - 1)][:, None], new_x)
    new_y = np.where(at, cross_y[rows, np.minimum(k[:, 0], m - 1)][:, None], new_y)
    any_inside = (valid & inside).any(axis=1)
    new_count = np.where(any_inside, count + (k[:, 0] <= m), 0)
    return new_x, new_y, new_count


def polygon_iou_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact IoU of convex quadrilaterals ``a[i]`` and ``b[i]`` ((n, 4, 2) each), float64.
    Vertices in either winding. A pair whose union has no area scores 0."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4, 2)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4, 2)
    n = len(a)
    if n == 0:
        return np.zeros(0)
    # Coordinates about B's first corner: smaller numbers, less cancellation in the areas.
    origin = b[:, :1, :]
    a, b = a - origin, b - origin
    four = np.full(n, 4)
    area_a, area_b = _area(a[..., 0], a[..., 1], four), _area(b[..., 0], b[..., 1], four)
    # B's edges taken so that its inside is on their left (either winding comes in).
    b = np.where((_signed_area(b) < 0)[:, None, None], b[:, ::-1], b)
    x, y, count = a[..., 0], a[..., 1], four
    for e in range(4):
        x, y, count = _clip(x, y, count, b[:, e], b[:, (e + 1) % 4])
    inter = np.where(count >= 3, _area(x, y, count), 0.0)
    union = area_a + area_b - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def _signed_area(quads: np.ndarray) -> np.ndarray:
    x, y = quads[..., 0], quads[..., 1]
    return (x * np.roll(y, -1, axis=1) - np.roll(x, -1, axis=1) * y).sum(axis=1) / 2


def polygon_iou_matrix(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """(n, m) exact IoU of every convex quadrilateral of ``qa`` (n, 4, 2) with every one of
    ``qb`` (m, 4, 2), computed only for the pairs whose enclosing boxes meet (others: 0)."""
    qa = np.asarray(qa, dtype=np.float64).reshape(-1, 4, 2)
    qb = np.asarray(qb, dtype=np.float64).reshape(-1, 4, 2)
    ea, eb = enclosing_boxes(qa), enclosing_boxes(qb)
    meet = (
        (ea[:, None, 0] <= eb[None, :, 2])
        & (eb[None, :, 0] <= ea[:, None, 2])
        & (ea[:, None, 1] <= eb[None, :, 3])
        & (eb[None, :, 1] <= ea[:, None, 3])
    )
    i, j = np.nonzero(meet)
    out = np.zeros((len(qa), len(qb)))
    out[i, j] = polygon_iou_pairs(qa[i], qb[j])
    return out


def rotated_iou_matrix(a: np.ndarray, b: np.ndarray, method: str = "polygon") -> np.ndarray:
    """(n, m) overlap of every box of ``a`` with every box of ``b`` ((n, 5), (m, 5) xywhr),
    exact polygon IoU (``method="polygon"``) or Ultralytics' ProbIoU (``"probiou"``)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 5)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 5)
    if method == "probiou":
        i, j = np.divmod(np.arange(len(a) * len(b)), len(b))
        return probiou_pairs(a[i], b[j]).reshape(len(a), len(b))
    if method != "polygon":
        raise ValueError(f"unknown rotated overlap {method!r}: 'polygon' or 'probiou'")
    return polygon_iou_matrix(corners(a), corners(b))
