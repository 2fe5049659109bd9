"""Fake constant-output segmentation "models": planted instances written as the raw outputs
of each head layout (rknn_model_zoo yolov8_seg and yolov5_seg, Ultralytics export).

A scene is a list of instances on the model's canvas: class, score, box (x1 y1 x2 y2,
canvas pixels) and an ellipse mask. Prototype channel k holds instance k's ellipse as a
logit field (positive inside); its coefficients are channel k's one-hot plus a little
cross-talk. Each instance is written at the cell holding its box centre, with a
duplicate at the next cell (lower score, box 2 px off) for NMS to remove; every other
cell scores low. One extra instance scores under ``conf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STRIDES = (8, 16, 32)
ANCHORS = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)
NM = 32


@dataclass
class Planted:
    cls: int
    score: float
    box: np.ndarray  # (4,) canvas pixels
    ellipse: tuple[float, float, float, float]  # cx, cy, rx, ry canvas pixels
    coefs: np.ndarray  # (NM,)


@dataclass
class Scene:
    input_hw: tuple[int, int]
    num_classes: int
    instances: list[Planted]  # the last one scores under 0.25
    proto: np.ndarray  # (NM, Hp, Wp)


def grids(input_hw: tuple[int, int]) -> list[tuple[int, int]]:
    return [(-(-input_hw[0] // s), -(-input_hw[1] // s)) for s in STRIDES]


def make_scene(
    rng: np.random.Generator,
    input_hw: tuple[int, int],
    area: tuple[int, int, int, int],
    num_classes: int,
    count: int,
) -> Scene:
    """``count`` instances (distinct classes) with boxes inside ``area`` (x0, y0, x1, y1 on
    the canvas: where the letterboxed image lies), plus one under conf."""
    h, w = input_hw
    ph, pw = 2 * grids(input_hw)[0][0], 2 * grids(input_hw)[0][1]
    qy, qx = (np.mgrid[0:ph, 0:pw] + 0.5) * np.array([h / ph, w / pw])[:, None, None]
    proto = rng.normal(0, 0.3, (NM, ph, pw)).astype(np.float32)
    classes = rng.permutation(num_classes)[: count + 1]
    scores = [*np.sort(rng.uniform(0.3, 0.95, count))[::-1].tolist(), 0.2]
    ax0, ay0, ax1, ay1 = area
    instances = []
    for k in range(count + 1):
        bw = rng.uniform(48, max(49, 0.45 * (ax1 - ax0)))
        bh = rng.uniform(48, max(49, 0.45 * (ay1 - ay0)))
        x1 = rng.uniform(ax0, ax1 - bw)
        y1 = rng.uniform(ay0, ay1 - bh)
        box = np.array([x1, y1, x1 + bw, y1 + bh], np.float32)
        # an ellipse a little off the box centre, so that the box crops it on one side
        ecx = x1 + bw * rng.uniform(0.4, 0.6)
        ecy = y1 + bh * rng.uniform(0.4, 0.6)
        rx, ry = bw * rng.uniform(0.35, 0.6), bh * rng.uniform(0.35, 0.6)
        field = 6 * (1 - ((qx - ecx) / rx) ** 2 - ((qy - ecy) / ry) ** 2)
        proto[k] = np.maximum(field, -6)
        coefs = rng.normal(0, 0.02, NM).astype(np.float32)
        coefs[k] = 1.0
        instances.append(Planted(int(classes[k]), float(scores[k]), box, (ecx, ecy, rx, ry), coefs))
    return Scene(input_hw, num_classes, instances, proto)


def _home(p: Planted, grid_list, taken: set) -> tuple[int, int, int]:
    """(stride index, row, col) of the cell for an instance: the smallest stride whose DFL
    range holds the box from the cell's neighbours too."""
    x1, y1, x2, y2 = p.box
    half = max(x2 - x1, y2 - y1) / 2
    low = min(x2 - x1, y2 - y1) / 2
    for b, s in enumerate(STRIDES):
        if half / s <= 12 and (low / s >= 2 or b == 2):
            break
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    gh, gw = grid_list[b]
    col = min(int(cx // STRIDES[b]), gw - 2)
    for step in (0, 1, -1, 2, -2, 3, -3):  # another row near the centre if one is taken
        row = min(max(int(cy // STRIDES[b]) + step, 0), gh - 1)
        if not {(b, row, col), (b, row, col + 1)} & taken:
            taken.update({(b, row, col), (b, row, col + 1)})
            return b, row, col
    raise ValueError("no free cell near the instance's centre")


def _entries(scene: Scene):
    """Per written cell: (stride index, row, col, class, score, box, coefs)."""
    taken: set = set()
    out = []
    g = grids(scene.input_hw)
    for p in scene.instances:
        b, row, col = _home(p, g, taken)
        out.append((b, row, col, p.cls, p.score, p.box, p.coefs))
        dup = p.box + np.array([2, 0, 2, 0], np.float32)
        out.append((b, row, col + 1, p.cls, p.score * 0.9, dup, p.coefs))
    return out


def _dfl_logits(dist: np.ndarray) -> np.ndarray:
    """(4,) distances in cells -> (64,) logits whose softmax expectation is the distance."""
    logits = np.full((4, 16), -30.0)
    for side, d in enumerate(dist):
        lo = int(np.floor(d))
        frac = d - lo
        logits[side, lo] = np.log(max(1 - frac, 1e-13))
        if lo + 1 < 16:
            logits[side, lo + 1] = np.log(max(frac, 1e-13))
    return logits.reshape(64)


def yolov8_zoo_outputs(scene: Scene, rng: np.random.Generator) -> list[np.ndarray]:
    nc = scene.num_classes
    outs = []
    planes = []
    for gh, gw in grids(scene.input_hw):
        box = rng.normal(0, 1, (1, 64, gh, gw)).astype(np.float32)
        cls = rng.uniform(0, 0.1, (1, nc, gh, gw)).astype(np.float32)
        seg = rng.normal(0, 1, (1, NM, gh, gw)).astype(np.float32)
        planes.append((box, cls, seg))
    for b, row, col, c, score, bx, coefs in _entries(scene):
        box, cls, seg = planes[b]
        s = STRIDES[b]
        px, py = (col + 0.5) * s, (row + 0.5) * s
        dist = np.array([px - bx[0], py - bx[1], bx[2] - px, bx[3] - py]) / s
        box[0, :, row, col] = _dfl_logits(dist)
        cls[0, c, row, col] = score
        seg[0, :, row, col] = coefs
    for box, cls, seg in planes:
        outs += [box, cls, np.minimum(cls.sum(1, keepdims=True), 1), seg]
    return [*outs, scene.proto[None].copy()]


def yolov5_zoo_outputs(scene: Scene, rng: np.random.Generator) -> list[np.ndarray]:
    nc = scene.num_classes
    planes = []
    for gh, gw in grids(scene.input_hw):
        det = rng.uniform(0, 1, (3, 5 + nc, gh, gw)).astype(np.float32)
        det[:, 4] = rng.uniform(0, 0.05, (3, gh, gw))
        seg = rng.normal(0, 1, (3, NM, gh, gw)).astype(np.float32)
        planes.append((det, seg))
    for b, row, col, c, score, bx, coefs in _entries(scene):
        det, seg = planes[b]
        s = STRIDES[b]
        w, h = bx[2] - bx[0], bx[3] - bx[1]
        # the anchor of this stride whose shape needs the least stretching
        anchors = np.array(ANCHORS[b], np.float64)
        a = int(np.argmin(np.abs(np.log(w / anchors[:, 0])) + np.abs(np.log(h / anchors[:, 1]))))
        cx, cy = (bx[0] + bx[2]) / 2, (bx[1] + bx[3]) / 2
        det[a, 0, row, col] = (cx / s - col + 0.5) / 2
        det[a, 1, row, col] = (cy / s - row + 0.5) / 2
        det[a, 2, row, col] = np.sqrt(w / anchors[a, 0]) / 2
        det[a, 3, row, col] = np.sqrt(h / anchors[a, 1]) / 2
        det[a, 4, row, col] = score / 0.98
        det[a, 5:, row, col] = 0.01
        det[a, 5 + c, row, col] = 0.98
        seg[a, :, row, col] = coefs
    outs = []
    for (gh, gw), (det, seg) in zip(grids(scene.input_hw), planes, strict=True):
        outs += [det.reshape(1, -1, gh, gw), seg.reshape(1, -1, gh, gw)]
    return [*outs, scene.proto[None].copy()]


def ultralytics_outputs(scene: Scene, rng: np.random.Generator) -> list[np.ndarray]:
    nc = scene.num_classes
    g = grids(scene.input_hw)
    cells = sum(gh * gw for gh, gw in g)
    raw = np.empty((4 + nc + NM, cells), np.float32)
    raw[:2] = rng.uniform(0, max(scene.input_hw), (2, cells))
    raw[2:4] = rng.uniform(4, 100, (2, cells))
    raw[4 : 4 + nc] = rng.uniform(0, 0.1, (nc, cells))
    raw[4 + nc :] = rng.normal(0, 1, (NM, cells))
    offsets = np.cumsum([0] + [gh * gw for gh, gw in g])
    for b, row, col, c, score, bx, coefs in _entries(scene):
        j = offsets[b] + row * g[b][1] + col
        raw[:4, j] = [(bx[0] + bx[2]) / 2, (bx[1] + bx[3]) / 2, bx[2] - bx[0], bx[3] - bx[1]]
        raw[4 + c, j] = score
        raw[4 + nc :, j] = coefs
    return [raw[None], scene.proto[None].copy()]


OUTPUTS = {
    "yolov8-seg-zoo": yolov8_zoo_outputs,
    "yolov5-seg-zoo": yolov5_zoo_outputs,
    "yolov8-seg-ultralytics": ultralytics_outputs,
}
