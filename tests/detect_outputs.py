"""YOLO head outputs for the detection tests, and a slow reference post-processing.

- ``reference(family, outputs, input_hw, ...)``: the model zoo's post-processing written
  out plainly, one cell (and anchor) at a time, as rknn_model_zoo's
  ``examples/yolov5/python/yolov5.py`` and ``examples/yolov8/python/yolov8.py`` do it:
  threshold on best class score (x object score), decode the box (DFL expectation for
  YOLOv8, the 2·sigmoid grid/anchor formulas for YOLOv5), per-class greedy NMS with the
  zoo's ``nms_boxes`` (IoU <= threshold kept), then the best ``max_det`` by score.
- ``random_outputs(family, rng, input_hw, classes)``: outputs of random values, a few
  hundred candidates above 0.25, boxes of all sizes overlapping a lot.
- ``planted(family, input_hw, classes, objects)``: outputs holding exactly the given
  objects (each at one cell), everything else far below any threshold, as logits
  (``logits=True``: before the sigmoid a model-zoo graph applies) or as model outputs.
- ``head_model(dir, family, ...)``: an ONNX graph (onnx.helper) whose outputs are the
  planted objects, in the family's layout.
Where the zoo leaves ties in score unordered (``argsort()[::-1]``), the reference keeps
the earlier candidate first, which is what the library promises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from batchinfer.detect.decode import COCO_ANCHORS

STRIDES = (8, 16, 32)
BINS = 16
FAMILIES = ("yolov5-zoo", "yolov8-zoo", "yolov8-ultralytics", "yolov5-ultralytics")


def grids(input_hw: tuple[int, int]) -> list[tuple[int, int]]:
    h, w = input_hw
    return [(math.ceil(h / s), math.ceil(w / s)) for s in STRIDES]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)


# -- the reference ----------------------------------------------------------------------


@dataclass
class Result:
    boxes: np.ndarray  # (n, 4) float64
    scores: np.ndarray  # (n,) float32
    class_ids: np.ndarray  # (n,) int
    nonfinite: int


def _zoo_nms_boxes(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    """rknn_model_zoo's nms_boxes: greedy, IoU <= threshold survives (ties: earlier first)."""
    x, y = boxes[:, 0], boxes[:, 1]
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    areas = w * h
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep = []
    while order:
        i = order[0]
        keep.append(i)
        survivors = []
        for j in order[1:]:
            xx1, yy1 = max(x[i], x[j]), max(y[i], y[j])
            xx2, yy2 = min(x[i] + w[i], x[j] + w[j]), min(y[i] + h[i], y[j] + h[j])
            # the zoo adds 1e-5 px to each side of the overlap
            inter = max(0.0, xx2 - xx1 + 0.00001) * max(0.0, yy2 - yy1 + 0.00001)
            union = areas[i] + areas[j] - inter
            if not inter / union > iou:
                survivors.append(j)
        order = survivors
    return keep


def _finish(cands: list, nonfinite: int, iou: float, max_det: int) -> Result:
    """Per-class NMS as the zoo's post_process does, then best first, at most max_det."""
    kept = []  # (score, candidate index)
    for c in sorted({cand[5] for cand in cands}):
        members = [k for k, cand in enumerate(cands) if cand[5] == c]
        boxes = np.array([cands[k][:4] for k in members], np.float64)
        scores = np.array([cands[k][4] for k in members], np.float32)
        kept += [members[i] for i in _zoo_nms_boxes(boxes, scores, iou)]
    kept.sort(key=lambda k: (-cands[k][4], k))
    kept = kept[:max_det]
    return Result(
        np.array([cands[k][:4] for k in kept], np.float64).reshape(-1, 4),
        np.array([cands[k][4] for k in kept], np.float32),
        np.array([cands[k][5] for k in kept], int),
        nonfinite,
    )


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def reference(
    family: str,
    outputs: list[np.ndarray],
    input_hw: tuple[int, int],
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    anchors=COCO_ANCHORS,
) -> Result:
    """The model zoo's post-processing, one candidate at a time (float outputs)."""
    outputs = [np.asarray(o, np.float32) for o in outputs]
    cands: list = []  # (x1, y1, x2, y2, score, class)
    bad = 0
    if family == "yolov8-zoo":
        per = len(outputs) // 3
        for b, (gh, gw) in enumerate(grids(input_hw)):
            box, cls = outputs[per * b][0], outputs[per * b + 1][0]
            sy, sx = input_hw[0] // gh, input_hw[1] // gw
            for row in range(gh):
                for col in range(gw):
                    best = np.float32(np.max(cls[:, row, col]))
                    if not _finite(best):
                        bad += 1
                        continue
                    if not best >= conf:
                        continue
                    dist = []
                    for side in range(4):
                        logits = box[side * BINS : (side + 1) * BINS, row, col].astype(np.float64)
                        with np.errstate(invalid="ignore"):
                            e = np.exp(logits - logits.max())
                        dist.append(sum(k * e[k] for k in range(BINS)) / e.sum())
                    x1, y1 = (col + 0.5 - dist[0]) * sx, (row + 0.5 - dist[1]) * sy
                    x2, y2 = (col + 0.5 + dist[2]) * sx, (row + 0.5 + dist[3]) * sy
                    if not _finite(x1, y1, x2, y2):
                        bad += 1
                        continue
                    cands.append((x1, y1, x2, y2, best, int(np.argmax(cls[:, row, col]))))
    elif family == "yolov5-zoo":
        for b, (gh, gw) in enumerate(grids(input_hw)):
            out = outputs[b][0]
            na = len(anchors[b])
            per_anchor = out.shape[0] // na
            s = STRIDES[b]
            for a in range(na):
                p = out[a * per_anchor : (a + 1) * per_anchor]
                for row in range(gh):
                    for col in range(gw):
                        v = p[:, row, col]
                        obj = np.float32(v[4])
                        if not _finite(obj):
                            bad += 1
                            continue
                        if not obj >= conf:
                            continue
                        best = np.float32(obj * np.max(v[5:]))
                        if not _finite(best):
                            bad += 1
                            continue
                        if not best >= conf:
                            continue
                        cx = (float(v[0]) * 2 - 0.5 + col) * s
                        cy = (float(v[1]) * 2 - 0.5 + row) * s
                        w = (float(v[2]) * 2) ** 2 * anchors[b][a][0]
                        h = (float(v[3]) * 2) ** 2 * anchors[b][a][1]
                        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                        if not _finite(*box):
                            bad += 1
                            continue
                        cands.append((*box, best, int(np.argmax(v[5:]))))
    elif family == "yolov8-ultralytics":
        out = outputs[0][0]
        for n in range(out.shape[1]):
            v = out[:, n]
            best = np.float32(np.max(v[4:]))
            if not _finite(best):
                bad += 1
                continue
            if not best >= conf:
                continue
            cx, cy, w, h = (float(t) for t in v[:4])
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            if not _finite(*box):
                bad += 1
                continue
            cands.append((*box, best, int(np.argmax(v[4:]))))
    elif family == "yolov5-ultralytics":
        out = outputs[0][0]
        for v in out:
            obj = np.float32(v[4])
            if not _finite(obj):
                bad += 1
                continue
            if not obj >= conf:
                continue
            best = np.float32(obj * np.max(v[5:]))
            if not _finite(best):
                bad += 1
                continue
            if not best >= conf:
                continue
            cx, cy, w, h = (float(t) for t in v[:4])
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            if not _finite(*box):
                bad += 1
                continue
            cands.append((*box, best, int(np.argmax(v[5:]))))
    else:
        raise ValueError(family)
    return _finish(cands, bad, iou, max_det)


# -- random outputs ---------------------------------------------------------------------


def _scores(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Sigmoid-like scores, mostly low: P(> 0.25) about 5% per value."""
    return (rng.random(shape, dtype=np.float32) ** 24).astype(np.float32)


def random_outputs(
    family: str,
    rng: np.random.Generator,
    input_hw: tuple[int, int],
    classes: int,
    score_sum: bool = True,
) -> list[np.ndarray]:
    """Random float32 outputs of a ``family`` head for an input of ``input_hw``."""
    gs = grids(input_hw)
    if family == "yolov8-zoo":
        out = []
        for gh, gw in gs:
            box = rng.normal(0, 2.5, (1, 4 * BINS, gh, gw)).astype(np.float32)
            cls = _scores(rng, (1, classes, gh, gw))
            out += [box, cls] + ([np.minimum(cls.sum(1, keepdims=True), 1)] if score_sum else [])
        return out
    if family == "yolov5-zoo":
        out = []
        for gh, gw in gs:
            v = rng.random((1, 3, 5 + classes, gh, gw), dtype=np.float32)
            v[:, :, 4] = rng.random((1, 3, gh, gw), dtype=np.float32) ** 3
            v[:, :, 5:] = rng.random((1, 3, classes, gh, gw), dtype=np.float32) ** 2
            out.append(v.reshape(1, 3 * (5 + classes), gh, gw))
        return out
    cells = sum(gh * gw for gh, gw in gs)
    h, w = input_hw
    cx, cy = rng.random(cells) * w, rng.random(cells) * h
    bw, bh = rng.random(cells) * w / 2 + 2, rng.random(cells) * h / 2 + 2
    boxes = np.stack([cx, cy, bw, bh]).astype(np.float32)
    if family == "yolov8-ultralytics":
        return [np.concatenate([boxes, _scores(rng, (classes, cells))])[None]]
    rows = []
    for _ in range(3):
        obj = rng.random((1, cells), dtype=np.float32) ** 3
        cls = rng.random((classes, cells), dtype=np.float32) ** 2
        rows.append(np.concatenate([boxes, obj, cls]).T)
        boxes = boxes * np.float32(1.1)
    return [np.ascontiguousarray(np.concatenate(rows)[None], np.float32)]


# -- planted objects --------------------------------------------------------------------


@dataclass(frozen=True)
class Planted:
    """An object at one cell: stride index, row, col, class, score, box sides in strides
    (left, top, right, bottom from the cell centre; whole numbers, so DFL can say them)."""

    branch: int
    row: int
    col: int
    class_id: int
    score: float
    sides: tuple[int, int, int, int]
    anchor: int = 0  # YOLOv5: which anchor of the cell

    def box(self) -> tuple[float, float, float, float]:
        s = STRIDES[self.branch]
        cx, cy = (self.col + 0.5) * s, (self.row + 0.5) * s
        left, top, right, bottom = self.sides
        return (cx - left * s, cy - top * s, cx + right * s, cy + bottom * s)


_LOW = -12.0  # logit of the background scores: sigmoid about 6e-6


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _reaches(anchor: tuple[float, float], w: float, h: float) -> bool:
    return w < 4 * anchor[0] * 0.95 and h < 4 * anchor[1] * 0.95


def planted(
    family: str,
    input_hw: tuple[int, int],
    classes: int,
    objects: list[Planted],
    logits: bool = False,
    score_sum: bool = True,
) -> list[np.ndarray]:
    """Outputs holding exactly ``objects``. ``logits``: class/object scores (and for
    YOLOv5 zoo, every value) before the sigmoid the model-zoo graphs apply."""
    gs = grids(input_hw)
    act = (lambda x: x) if logits else _sigmoid
    if family == "yolov8-zoo":
        out = []
        for b, (gh, gw) in enumerate(gs):
            box = np.zeros((4, BINS, gh, gw), np.float32)
            cls = np.full((classes, gh, gw), _LOW, np.float32)
            for o in (o for o in objects if o.branch == b):
                for side, d in enumerate(o.sides):
                    box[side, d, o.row, o.col] = 40.0  # softmax puts all weight on bin d
                cls[o.class_id, o.row, o.col] = _logit(o.score)
            out += [box.reshape(1, 4 * BINS, gh, gw), act(cls)[None]]
            if score_sum:
                out.append(np.minimum(_sigmoid(cls).sum(0), 1)[None, None].astype(np.float32))
        return out
    if family == "yolov5-zoo":
        out = []
        for b, (gh, gw) in enumerate(gs):
            v = np.full((3, 5 + classes, gh, gw), _LOW, np.float32)
            v[:, :4] = 0.0  # sigmoid 0.5: centred box the size of the anchor
            for o in (o for o in objects if o.branch == b):
                x1, y1, x2, y2 = o.box()
                s = STRIDES[b]
                # the anchor asked for, or the first whose (2 sigmoid)^2 x anchor reaches
                fits = [a for a in range(3) if _reaches(COCO_ANCHORS[b][a], x2 - x1, y2 - y1)]
                anchor = o.anchor if o.anchor in fits else fits[0]
                aw, ah = COCO_ANCHORS[b][anchor]
                tx = ((x1 + x2) / 2 / s - o.col + 0.5) / 2
                ty = ((y1 + y2) / 2 / s - o.row + 0.5) / 2
                tw, th = math.sqrt((x2 - x1) / aw) / 2, math.sqrt((y2 - y1) / ah) / 2
                assert all(0 < t < 1 for t in (tx, ty, tw, th)), "box beyond the head's reach"
                v[anchor, :4, o.row, o.col] = [_logit(t) for t in (tx, ty, tw, th)]
                v[anchor, 4, o.row, o.col] = _logit(math.sqrt(o.score))
                v[anchor, 5 + o.class_id, o.row, o.col] = _logit(math.sqrt(o.score))
            out.append(act(v).reshape(1, 3 * (5 + classes), gh, gw))
        return out
    cells = sum(gh * gw for gh, gw in gs)
    offsets = np.cumsum([0] + [gh * gw for gh, gw in gs])
    boxes = np.zeros((4, cells), np.float32)
    boxes[2:] = 4.0
    cls = np.full((classes, cells), _LOW, np.float32)
    obj = np.full(cells, _LOW, np.float32)
    for o in objects:
        n = offsets[o.branch] + o.row * gs[o.branch][1] + o.col
        x1, y1, x2, y2 = o.box()
        boxes[:, n] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        p = o.score if family == "yolov8-ultralytics" else math.sqrt(o.score)
        cls[o.class_id, n] = _logit(p)
        obj[n] = _logit(p)
    if family == "yolov8-ultralytics":
        return [np.concatenate([boxes, act(cls)])[None]]
    rows = np.concatenate([boxes, act(obj)[None], act(cls)]).T
    low = np.concatenate([boxes, np.full((1 + classes, cells), act(np.float32(_LOW)))]).T
    return [np.ascontiguousarray(np.concatenate([rows, low, low])[None], np.float32)]


# -- ONNX graphs ------------------------------------------------------------------------


def head_model(
    directory: Path,
    family: str,
    input_hw: tuple[int, int],
    classes: int,
    objects: list[Planted],
    score_sum: bool = True,
) -> Path:
    """An ONNX model (float NCHW image input) whose outputs are ``objects`` in ``family``'s
    layout, with the sigmoids in the graph where the real heads have them."""
    import models as M  # tests/ is on sys.path under pytest

    h, w = input_hw
    raw = planted(family, input_hw, classes, objects, logits=True, score_sum=score_sum)
    nodes = [
        # zero = 0 * mean(image): every output depends on the input, as a real head does.
        helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "zero_c"], ["zero"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero_c")]
    outputs = []

    def emit(name: str, values: np.ndarray, op: str | None) -> None:
        inits.append(numpy_helper.from_array(values, f"{name}_c"))
        nodes.append(helper.make_node("Add", [f"{name}_c", "zero"], [f"{name}_pre"]))
        if op:
            nodes.append(helper.make_node(op, [f"{name}_pre"], [name]))
        else:
            nodes.append(helper.make_node("Identity", [f"{name}_pre"], [name]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, values.shape))

    if family == "yolov8-zoo":
        per = 3 if score_sum else 2
        for b in range(3):
            emit(f"box{b}", raw[per * b], None)
            emit(f"cls{b}", raw[per * b + 1], "Sigmoid")
            if score_sum:
                # as the zoo's export: clamp(sum of the class scores, 0, 1)
                nodes += [
                    helper.make_node("ReduceSum", [f"cls{b}", "axis1"], [f"sum{b}_raw"]),
                    helper.make_node("Clip", [f"sum{b}_raw", "lo", "hi"], [f"sum{b}"]),
                ]
                outputs.append(
                    helper.make_tensor_value_info(
                        f"sum{b}", TensorProto.FLOAT, (1, 1, *raw[per * b].shape[2:])
                    )
                )
        inits += [
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array(0, np.float32), "lo"),
            numpy_helper.from_array(np.array(1, np.float32), "hi"),
        ]
    elif family == "yolov5-zoo":
        for b in range(3):
            emit(f"out{b}", raw[b], "Sigmoid")
    elif family == "yolov8-ultralytics":
        (out,) = raw
        emit("boxes", np.ascontiguousarray(out[:, :4]), None)
        emit("cls", np.ascontiguousarray(out[:, 4:]), "Sigmoid")
        nodes.append(helper.make_node("Concat", ["boxes", "cls"], ["output0"], axis=1))
        outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out.shape)]
    else:
        (out,) = raw
        emit("boxes", np.ascontiguousarray(out[:, :, :4]), None)
        emit("scores", np.ascontiguousarray(out[:, :, 4:]), "Sigmoid")
        nodes.append(helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=2))
        outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out.shape)]
    graph = helper.make_graph(
        nodes,
        family,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, h, w])],
        outputs,
        inits,
    )
    return M._save(graph, directory / f"{family}.onnx")
