"""Plain-Python references for the rotated-box tests, written apart from the library.

- ``polygon_iou(p, q)``: IoU of two convex polygons (lists of (x, y)) by another method
  than the library's clipping: the intersection is the convex hull of the vertices of
  each polygon inside the other and the crossings of their edges; areas by the shoelace.
- ``probiou(a, b)``: Ultralytics' ``probiou`` for two xywhr boxes, scalar math.
- ``corners(box)``: Ultralytics' ``xywhr2xyxyxyxy`` for one box.
- ``regularize(box)``: Ultralytics' ``regularize_rboxes`` for one box.
- ``greedy_nms`` (the model zoo's loop: a kept box drops later boxes of its class with
  IoU > iou) and ``fast_nms`` (Ultralytics' ``TorchNMS.fast_nms`` with ProbIoU, on the
  full matrix: a box is dropped when any better box of its class has ProbIoU >= iou).
- ``dota_voc_eval``: the DOTA devkit's ``voc_eval`` (all-point AP), one detection at a time.
"""

from __future__ import annotations

import math

Point = tuple[float, float]


def corners(box) -> list[Point]:
    cx, cy, w, h, r = (float(v) for v in box)
    c, s = math.cos(r), math.sin(r)
    v1 = (w / 2 * c, w / 2 * s)
    v2 = (-h / 2 * s, h / 2 * c)
    return [
        (cx + v1[0] + v2[0], cy + v1[1] + v2[1]),
        (cx + v1[0] - v2[0], cy + v1[1] - v2[1]),
        (cx - v1[0] - v2[0], cy - v1[1] - v2[1]),
        (cx - v1[0] + v2[0], cy - v1[1] + v2[1]),
    ]


def regularize(box) -> tuple[float, float, float, float, float]:
    cx, cy, w, h, t = (float(v) for v in box)
    if t % math.pi >= math.pi / 2:
        w, h = h, w
    return cx, cy, w, h, t % (math.pi / 2)


def area(poly: list[Point]) -> float:
    s = 0.0
    for i, (x, y) in enumerate(poly):
        xn, yn = poly[(i + 1) % len(poly)]
        s += x * yn - xn * y
    return abs(s) / 2


def _ccw(poly: list[Point]) -> list[Point]:
    s = 0.0
    for i, (x, y) in enumerate(poly):
        xn, yn = poly[(i + 1) % len(poly)]
        s += x * yn - xn * y
    return poly if s >= 0 else poly[::-1]


def _inside(p: Point, poly: list[Point]) -> bool:
    poly = _ccw(poly)
    for i, a in enumerate(poly):
        b = poly[(i + 1) % len(poly)]
        if (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) < -1e-9:
            return False
    return True


def _crossing(a: Point, b: Point, c: Point, d: Point) -> Point | None:
    """Where segments ab and cd cross (None when they do not)."""
    den = (b[0] - a[0]) * (d[1] - c[1]) - (b[1] - a[1]) * (d[0] - c[0])
    if abs(den) < 1e-15:
        return None
    t = ((c[0] - a[0]) * (d[1] - c[1]) - (c[1] - a[1]) * (d[0] - c[0])) / den
    u = ((c[0] - a[0]) * (b[1] - a[1]) - (c[1] - a[1]) * (b[0] - a[0])) / den
    if 0 <= t <= 1 and 0 <= u <= 1:
        return (a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))
    return None


def _hull(points: list[Point]) -> list[Point]:
    """Andrew's monotone chain."""
    pts = sorted(set(points))
    if len(pts) < 3:
        return pts

    def cross(o: Point, a: Point, b: Point) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[Point] = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list[Point] = []
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return lower[:-1] + upper[:-1]


def polygon_iou(p: list[Point], q: list[Point]) -> float:
    points = [v for v in p if _inside(v, q)] + [v for v in q if _inside(v, p)]
    for i in range(len(p)):
        for j in range(len(q)):
            x = _crossing(p[i], p[(i + 1) % len(p)], q[j], q[(j + 1) % len(q)])
            if x is not None:
                points.append(x)
    hull = _hull(points)
    inter = area(hull) if len(hull) >= 3 else 0.0
    union = area(p) + area(q) - inter
    return inter / union if union > 0 else 0.0


def _cov(box) -> tuple[float, float, float]:
    _, _, w, h, r = (float(v) for v in box)
    a, b = w * w / 12, h * h / 12
    c, s = math.cos(r), math.sin(r)
    return a * c * c + b * s * s, a * s * s + b * c * c, (a - b) * c * s


def probiou(box1, box2, eps: float = 1e-7) -> float:
    x1, y1 = float(box1[0]), float(box1[1])
    x2, y2 = float(box2[0]), float(box2[1])
    a1, b1, c1 = _cov(box1)
    a2, b2, c2 = _cov(box2)
    den = (a1 + a2) * (b1 + b2) - (c1 + c2) ** 2
    t1 = ((a1 + a2) * (y1 - y2) ** 2 + (b1 + b2) * (x1 - x2) ** 2) / (den + eps) * 0.25
    t2 = ((c1 + c2) * (x2 - x1) * (y1 - y2)) / (den + eps) * 0.5
    own = max(a1 * b1 - c1 * c1, 0) * max(a2 * b2 - c2 * c2, 0)
    t3 = math.log(den / (4 * math.sqrt(own) + eps) + eps) * 0.5
    bd = min(max(t1 + t2 + t3, eps), 100.0)
    return 1 - math.sqrt(1 - math.exp(-bd) + eps)


def _ranked(scores) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))


def greedy_nms(boxes, scores, classes, iou: float) -> list[int]:
    """The model zoo's NMS with exact polygon IoU (IoU > iou drops)."""
    order = _ranked(scores)
    dropped = [False] * len(order)
    keep = []
    for n, i in enumerate(order):
        if dropped[n]:
            continue
        keep.append(i)
        for m in range(n + 1, len(order)):
            j = order[m]
            same = not dropped[m] and classes[j] == classes[i]
            if same and polygon_iou(corners(boxes[i]), corners(boxes[j])) > iou:
                dropped[m] = True
    return keep


def fast_nms(boxes, scores, classes, iou: float) -> list[int]:
    """Ultralytics' fast_nms with batch_probiou (classes apart)."""
    order = _ranked(scores)
    keep = []
    for n, j in enumerate(order):
        if not any(
            classes[i] == classes[j] and probiou(boxes[i], boxes[j]) >= iou for i in order[:n]
        ):
            keep.append(j)
    return keep


def dota_voc_eval(dets, gts, cls: int, ovthresh: float = 0.5) -> float | None:
    """DOTA's voc_eval for one class. ``dets``: (image, score, polygon, class);
    ``gts``: (image, polygon, class, difficult). None when the class has no ground truth."""
    recs: dict[int, dict] = {}
    npos = 0
    for img, poly, c, difficult in gts:
        if c != cls:
            continue
        r = recs.setdefault(img, {"polys": [], "difficult": [], "det": []})
        r["polys"].append(poly)
        r["difficult"].append(difficult)
        r["det"].append(False)
        npos += not difficult
    if npos == 0:
        return None
    mine = [d for d in dets if d[3] == cls]
    mine = [mine[i] for i in sorted(range(len(mine)), key=lambda i: (-mine[i][1], i))]
    tp, fp = [0.0] * len(mine), [0.0] * len(mine)
    for d, (img, _, poly, _) in enumerate(mine):
        r = recs.get(img)
        ovmax, jmax = -math.inf, -1
        if r is not None:
            for j, g in enumerate(r["polys"]):
                ov = polygon_iou(poly, g)
                if ov > ovmax:
                    ovmax, jmax = ov, j
        if ovmax > ovthresh:
            if not r["difficult"][jmax]:
                if not r["det"][jmax]:
                    tp[d] = 1.0
                    r["det"][jmax] = True
                else:
                    fp[d] = 1.0
        else:
            fp[d] = 1.0
    ctp = cfp = 0.0
    rec, prec = [], []
    for t, f in zip(tp, fp, strict=True):
        ctp += t
        cfp += f
        rec.append(ctp / npos)
        prec.append(ctp / max(ctp + cfp, 2.220446049250313e-16))
    mrec = [0.0, *rec, 1.0]
    mpre = [0.0, *prec, 0.0]
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    return sum(
        (mrec[i + 1] - mrec[i]) * mpre[i + 1]
        for i in range(len(mrec) - 1)
        if mrec[i + 1] != mrec[i]
    )
