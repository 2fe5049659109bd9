"""Fake pose and OBB model outputs with planted instances, and plain references.

Outputs (constant "models"): every cell is background (class logits -20, or class scores
0) except the cells holding planted instances. Each planted instance also gets a
duplicate: the same object seen from the neighbouring cell, a little shifted and with a
lower score, which NMS must drop.

- ``zoo_outputs``: rknn_model_zoo's yolov8_pose / yolov8_obb layout: per stride 8/16/32
  (1, 64 + C, H, W) (DFL logits, class logits), then keypoints (1, K, D, N) (decoded: input
  pixels, score) or the angle (1, 1, N) (sigmoid output: angle / pi + 0.25).
- ``ultralytics_outputs``: (1, 4 + C + K*D, N) or (1, 4 + C + 1, N) (angle in radians).

References, written as the zoo's Python and Ultralytics' post-processing do it, one cell
at a time (examples/yolov8_obb/python/yolov8_obb.py ``process``, examples/yolov8_pose/
python/yolov8_pose.py ``process``; Ultralytics ``non_max_suppression``, ``dist2rbox``,
``regularize_rboxes``, ``scale_boxes``, ``scale_coords``). They return instances in the
original image's pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import rotated_reference as rr

from batchinfer.detect.letterbox import Letterbox

STRIDES = (8, 16, 32)
BINS = 16


def grids(input_hw: tuple[int, int]) -> list[tuple[int, int]]:
    return [(math.ceil(input_hw[0] / s), math.ceil(input_hw[1] / s)) for s in STRIDES]


@dataclass
class Planted:
    cls: int
    score: float
    cx: float  # input (canvas) pixels
    cy: float
    w: float
    h: float
    angle: float  # radians (0 for pose)
    keypoints: np.ndarray | None  # (K, 3) x, y (canvas pixels), score


@dataclass
class Found:
    """One decoded instance in original pixels."""

    cls: int
    score: float
    box: tuple[float, float, float, float]  # x1 y1 x2 y2 (pose) / enclosing box (obb)
    xywhr: tuple[float, ...] | None = None
    keypoints: list[tuple[float, float, float]] | None = None


def random_instances(
    rng: np.random.Generator,
    lb: Letterbox,
    count: int,
    classes: int,
    rotated: bool,
    keypoints: tuple[int, int] | None = None,
) -> list[Planted]:
    """Instances centred in the image's part of the canvas, apart from each other."""
    new_w, new_h = lb.resized
    out: list[Planted] = []
    for _ in range(2000):
        if len(out) == count:
            break
        s = STRIDES[int(rng.integers(0, 3))]
        w, h = rng.uniform(4.5 * s, 12 * s, 2)
        cx = lb.pad_x + rng.uniform(0.1, 0.9) * new_w
        cy = lb.pad_y + rng.uniform(0.1, 0.9) * new_h
        radius = math.hypot(w, h) / 2
        if any(
            math.hypot(cx - p.cx, cy - p.cy) < radius + math.hypot(p.w, p.h) / 2 + 4 for p in out
        ):
            continue
        angle = float(rng.uniform(-0.7, 2.3)) if rotated else 0.0
        kp = None
        if keypoints is not None:
            k, _ = keypoints
            kp = np.column_stack(
                [
                    rng.uniform(lb.pad_x + 1, lb.pad_x + new_w - 1, k),
                    rng.uniform(lb.pad_y + 1, lb.pad_y + new_h - 1, k),
                    rng.uniform(0.05, 0.99, k),
                ]
            )
        score = float(rng.uniform(0.4, 0.95))
        out.append(Planted(int(rng.integers(0, classes)), score, cx, cy, w, h, angle, kp))
    return out


def _stride_of(p: Planted) -> int:
    """The stride whose DFL range fits the instance (as random_instances chose it)."""
    for s in STRIDES:
        if max(p.w, p.h) <= 12 * s + 1e-9 and min(p.w, p.h) >= 4.5 * s - 1e-9:
            return s
    raise AssertionError("instance fits no stride")


def _dfl_logits(d: float) -> np.ndarray:
    """16 logits whose softmax expectation is d (0 <= d <= 15)."""
    logits = np.full(BINS, -40.0)
    lo = min(math.floor(d), BINS - 1)
    frac = d - lo
    if frac <= 1e-12:
        logits[lo] = 0.0
    else:
        logits[lo] = math.log(1 - frac)
        logits[lo + 1] = math.log(frac)
    return logits


def _cells(input_hw: tuple[int, int], p: Planted) -> list[tuple[int, int, int]]:
    """(stride index, row, col) of the instance's cell and of its duplicate's."""
    s = _stride_of(p)
    b = STRIDES.index(s)
    gh, gw = grids(input_hw)[b]
    row, col = min(int(p.cy // s), gh - 1), min(int(p.cx // s), gw - 1)
    dup_col = col + 1 if col + 1 < gw else col - 1
    return [(b, row, col), (b, row, dup_col)]


def _offset(b: int, gw: int, row: int, col: int, input_hw: tuple[int, int]) -> int:
    g = grids(input_hw)
    return sum(h * w for h, w in g[:b]) + row * gw + col


def _sigmoid_inv(p: float) -> float:
    return math.log(p / (1 - p))


def _copies(p: Planted) -> list[Planted]:
    """The instance and its duplicate (shifted 2 px, score 0.15 lower)."""
    dup = Planted(p.cls, p.score - 0.15, p.cx + 2, p.cy + 1, p.w * 0.97, p.h, p.angle, p.keypoints)
    if dup.keypoints is not None:
        dup.keypoints = dup.keypoints + np.array([3.0, -2.0, 0.0])
    return [p, dup]


def zoo_outputs(
    input_hw: tuple[int, int],
    classes: int,
    instances: list[Planted],
    keypoints: tuple[int, int] | None = None,
) -> list[np.ndarray]:
    g = grids(input_hw)
    cells = sum(h * w for h, w in g)
    branches = [np.zeros((1, 64 + classes, h, w), np.float32) for h, w in g]
    for br in branches:
        br[0, 64:] = -20.0
    extra = (
        np.zeros((1, keypoints[0], keypoints[1], cells), np.float32)
        if keypoints is not None
        else np.full((1, 1, cells), 0.25, np.float32)
    )
    for p in instances:
        for copy, (b, row, col) in zip(_copies(p), _cells(input_hw, p), strict=True):
            s = STRIDES[b]
            ox, oy = copy.cx / s - (col + 0.5), copy.cy / s - (row + 0.5)
            c, sn = math.cos(copy.angle), math.sin(copy.angle)
            hx, hy = ox * c + oy * sn, -ox * sn + oy * c  # un-rotated centre offset
            sides = [
                copy.w / (2 * s) - hx,
                copy.h / (2 * s) - hy,
                copy.w / (2 * s) + hx,
                copy.h / (2 * s) + hy,
            ]
            assert all(0 <= d <= 15 for d in sides), sides
            for k, d in enumerate(sides):
                branches[b][0, k * BINS : (k + 1) * BINS, row, col] = _dfl_logits(d)
            branches[b][0, 64 + copy.cls, row, col] = _sigmoid_inv(copy.score)
            n = _offset(b, g[b][1], row, col, input_hw)
            if keypoints is not None:
                assert copy.keypoints is not None
                extra[0, :, :, n] = copy.keypoints[:, : keypoints[1]]
            else:
                extra[0, 0, n] = copy.angle / math.pi + 0.25
    return [*branches, extra]


def ultralytics_outputs(
    input_hw: tuple[int, int],
    classes: int,
    instances: list[Planted],
    keypoints: tuple[int, int] | None = None,
) -> list[np.ndarray]:
    g = grids(input_hw)
    cells = sum(h * w for h, w in g)
    extra = keypoints[0] * keypoints[1] if keypoints is not None else 1
    out = np.zeros((1, 4 + classes + extra, cells), np.float32)
    out[0, 2:4] = 10.0
    for p in instances:
        for copy, (b, row, col) in zip(_copies(p), _cells(input_hw, p), strict=True):
            n = _offset(b, g[b][1], row, col, input_hw)
            out[0, :4, n] = [copy.cx, copy.cy, copy.w, copy.h]
            out[0, 4 + copy.cls, n] = copy.score
            if keypoints is not None:
                assert copy.keypoints is not None
                out[0, 4 + classes :, n] = copy.keypoints[:, : keypoints[1]].reshape(-1)
            else:
                out[0, 4 + classes, n] = copy.angle
    return [out]


# -- references --------------------------------------------------------------------------


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _dfl(logits: np.ndarray) -> list[float]:
    """The zoo's softmax-expectation over 16 bins per side, written out."""
    out = []
    for side in range(4):
        v = [float(x) for x in logits[side * BINS : (side + 1) * BINS]]
        m = max(v)
        e = [math.exp(x - m) for x in v]
        out.append(sum(i * x for i, x in enumerate(e)) / sum(e))
    return out


def _zoo_cells(outputs: list[np.ndarray], input_hw: tuple[int, int], classes: int, conf: float):
    """The zoo's loop: every (cell, class) whose sigmoid score passes (>= here), with its
    stride, cell centre, global index and decoded DFL sides."""
    g = grids(input_hw)
    index = 0
    for b, (gh, gw) in enumerate(g):
        feature = outputs[b].reshape(64 + classes, gh * gw)
        cls_logits = feature[64:]
        hot = np.argwhere(cls_logits > -10)  # the zoo visits every cell; background skipped
        for c, cell in hot:
            score = _sigmoid(float(cls_logits[c, cell]))
            if score >= conf:
                h, w = divmod(int(cell), gw)
                yield (
                    STRIDES[b],
                    (w + 0.5, h + 0.5),
                    index + int(cell),
                    int(c),
                    score,
                    _dfl(feature[:64, cell]),
                )
        index += gh * gw


def zoo_obb_reference(outputs, input_hw, classes, conf, iou, lb: Letterbox) -> list[Found]:
    angles = outputs[3].reshape(-1)
    cands = []
    for s, (gx, gy), n, c, score, (left, top, right, bottom) in _zoo_cells(
        outputs, input_hw, classes, conf
    ):
        angle = (float(angles[n]) - 0.25) * 3.1415927410125732
        hx, hy = (right - left) / 2, (bottom - top) / 2
        cx = (hx * math.cos(angle) - hy * math.sin(angle) + gx) * s
        cy = (hx * math.sin(angle) + hy * math.cos(angle) + gy) * s
        cands.append((c, score, (cx, cy, (left + right) * s, (top + bottom) * s, angle)))
    return _obb_finish(cands, iou, lb, rr.greedy_nms)


def ultralytics_obb_reference(outputs, input_hw, classes, conf, iou, lb: Letterbox) -> list[Found]:
    raw = outputs[0][0]
    cands = []
    for n in range(raw.shape[1]):
        scores = raw[4 : 4 + classes, n]
        c = int(np.argmax(scores))
        if float(scores[c]) >= conf:
            cx, cy, w, h = (float(v) for v in raw[:4, n])
            cands.append((c, float(scores[c]), (cx, cy, w, h, float(raw[4 + classes, n]))))
    return _obb_finish(cands, iou, lb, rr.fast_nms)


def _obb_finish(cands, iou, lb: Letterbox, nms) -> list[Found]:
    boxes = [b for _, _, b in cands]
    keep = nms(boxes, [s for _, s, _ in cands], [c for c, _, _ in cands], iou)
    found = []
    for i in keep:
        c, score, (cx, cy, w, h, a) = cands[i]
        cx, cy, w, h, a = rr.regularize(
            ((cx - lb.pad_x) / lb.scale, (cy - lb.pad_y) / lb.scale, w / lb.scale, h / lb.scale, a)
        )
        pts = rr.corners((cx, cy, w, h, a))
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        box = (
            min(max(min(xs), 0), lb.src_w),
            min(max(min(ys), 0), lb.src_h),
            min(max(max(xs), 0), lb.src_w),
            min(max(max(ys), 0), lb.src_h),
        )
        found.append(Found(c, score, box, (cx, cy, w, h, a)))
    return found


def _box_iou(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _pose_finish(cands, iou, lb: Letterbox) -> list[Found]:
    """The zoo's NMS (IoU > iou drops a box of the kept one's class), then the letterbox
    undone as the zoo's demo does ((v - offset) / ratio), clipped as Ultralytics does."""
    order = sorted(range(len(cands)), key=lambda i: (-cands[i][1], i))
    dropped = set()
    found = []
    for n, i in enumerate(order):
        if i in dropped:
            continue
        c, score, box, kpts = cands[i]
        for j in order[n + 1 :]:
            if cands[j][0] == c and _box_iou(box, cands[j][2]) > iou:
                dropped.add(j)

        def fx(v: float) -> float:
            return min(max((v - lb.pad_x) / lb.scale, 0), lb.src_w)

        def fy(v: float) -> float:
            return min(max((v - lb.pad_y) / lb.scale, 0), lb.src_h)

        found.append(
            Found(
                c,
                score,
                (fx(box[0]), fy(box[1]), fx(box[2]), fy(box[3])),
                keypoints=[(fx(x), fy(y), v) for x, y, v in kpts],
            )
        )
    return found


def zoo_pose_reference(outputs, input_hw, classes, conf, iou, lb, kpt_dims=3) -> list[Found]:
    kp = outputs[3][0]  # (K, D, N)
    cands = []
    for s, (gx, gy), n, c, score, (left, top, right, bottom) in _zoo_cells(
        outputs, input_hw, classes, conf
    ):
        box = ((gx - left) * s, (gy - top) * s, (gx + right) * s, (gy + bottom) * s)
        pts = [
            (float(kp[k, 0, n]), float(kp[k, 1, n]), float(kp[k, 2, n]) if kpt_dims == 3 else 1.0)
            for k in range(kp.shape[0])
        ]
        cands.append((c, score, box, pts))
    return _pose_finish(cands, iou, lb)


def ultralytics_pose_reference(outputs, input_hw, classes, conf, iou, lb, kpt_shape) -> list[Found]:
    raw = outputs[0][0]
    k, d = kpt_shape
    cands = []
    for n in range(raw.shape[1]):
        scores = raw[4 : 4 + classes, n]
        c = int(np.argmax(scores))
        if float(scores[c]) >= conf:
            cx, cy, w, h = (float(v) for v in raw[:4, n])
            flat = raw[4 + classes :, n]
            pts = [
                (
                    float(flat[i * d]),
                    float(flat[i * d + 1]),
                    float(flat[i * d + 2]) if d == 3 else 1.0,
                )
                for i in range(k)
            ]
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            cands.append((c, float(scores[c]), box, pts))
    return _pose_finish(cands, iou, lb)
