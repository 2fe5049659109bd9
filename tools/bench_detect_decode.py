"""CPU time of decode + NMS per image for YOLO heads (``batchinfer.detect.Decoder``).

Builds realistic outputs for a 640x640 input: a few objects, each seen by a cluster of
cells around its centre (a few hundred candidates above ``conf`` in all), the other class
scores low (sigmoid of about -6), box logits peaked at each object's true distances. Then
times the decoder with ``time.process_time`` (CPU time, so a loaded machine slows it less
than it would a wall clock): ``--number`` calls per repeat, the median of ``--repeats``.

    python tools/bench_detect_decode.py
    python tools/bench_detect_decode.py --heads yolov8-zoo --int8 --objects 40
    python tools/bench_detect_decode.py --conf 0.001 --number 20   # every cell a candidate

``--int8`` quantises each output with one scale and zero point, as a runtime returning
raw int8 outputs would. The single-output Ultralytics heads then find nothing: one scale
for boxes (0..640) and scores (0..1) rounds every score to a step of about 2.5, which is
why the model zoo splits its heads into box and score outputs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from bench_decode_timing import cpu_ms, quantise

from batchinfer.detect import Decoder, DetectSettings, Head
from batchinfer.detect.decode import COCO_ANCHORS
from batchinfer.detect.heads import DFL_BINS, STRIDES, grid_sizes

HEADS = ("yolov8-zoo", "yolov5-zoo", "yolov8-ultralytics", "yolov5-ultralytics")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def scene(rng: np.random.Generator, size: int, classes: int, objects: int, per_object: int):
    """Per stride: class-score planes (C, H, W), box distances (4, H, W) in stride units
    (left, top, right, bottom) and which cells hold an object; plus the objects."""
    grids = grid_sizes((size, size), STRIDES)
    scores = [_sigmoid(rng.normal(-6, 1, (classes, gh, gw))).astype(np.float32) for gh, gw in grids]
    dist = [rng.uniform(0.5, 3, (4, gh, gw)).astype(np.float32) for gh, gw in grids]
    for _ in range(objects):
        cls = int(rng.integers(classes))
        w, h = rng.uniform(20, size / 2, 2)
        cx, cy = rng.uniform(w / 2, size - w / 2), rng.uniform(h / 2, size - h / 2)
        for _ in range(per_object):
            b = int(rng.integers(len(STRIDES)))
            s, (gh, gw) = STRIDES[b], grids[b]
            col = int(np.clip(cx / s + rng.normal(0, 1.2), 0, gw - 1))
            row = int(np.clip(cy / s + rng.normal(0, 1.2), 0, gh - 1))
            scores[b][cls, row, col] = max(scores[b][cls, row, col], rng.uniform(0.26, 0.95))
            px, py = (col + 0.5) * s, (row + 0.5) * s
            sides = np.array(
                [px - (cx - w / 2), py - (cy - h / 2), cx + w / 2 - px, cy + h / 2 - py]
            )
            dist[b][:, row, col] = np.clip(sides / s + rng.normal(0, 0.2, 4), 0, DFL_BINS - 1.01)
    return scores, dist


def _dfl_logits(dist: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(4, H, W) distances -> (64, H, W) logits peaked around each distance."""
    bins = np.arange(DFL_BINS, dtype=np.float32)[None, :, None, None]
    logits = -2.0 * (bins - dist[:, None]) ** 2 + rng.normal(0, 0.1, (4, DFL_BINS, *dist.shape[1:]))
    return logits.reshape(4 * DFL_BINS, *dist.shape[1:]).astype(np.float32)


def outputs_for(head: str, scores, dist, rng) -> list[np.ndarray]:
    """The scene as the outputs of a ``head`` family model."""
    if head == "yolov8-zoo":
        out = []
        for sc, d in zip(scores, dist, strict=True):
            out += [_dfl_logits(d, rng)[None], sc[None], np.minimum(sc.sum(0), 1)[None, None]]
        return out
    boxes = []
    for s, d in zip(STRIDES, dist, strict=True):
        gh, gw = d.shape[1:]
        px = (np.arange(gw) + 0.5)[None, :] * s
        py = (np.arange(gh) + 0.5)[:, None] * s
        x1, y1, x2, y2 = px - d[0] * s, py - d[1] * s, px + d[2] * s, py + d[3] * s
        boxes.append(np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]))
    if head == "yolov8-ultralytics":
        flat = [
            np.concatenate([b, sc]).reshape(4 + len(sc), -1)
            for b, sc in zip(boxes, scores, strict=True)
        ]
        return [np.concatenate(flat, axis=1)[None].astype(np.float32)]
    # YOLOv5: the object score carries the best class score, class scores near 1 there;
    # the first anchor of each cell holds the scene, the other two low scores.
    out = []
    for s, b, sc in zip(STRIDES, boxes, scores, strict=True):
        obj = sc.max(0, keepdims=True)
        cls = np.where(sc == obj, np.float32(0.98), sc)
        gh, gw = sc.shape[1:]
        if head == "yolov5-zoo":
            # invert the zoo's decode: x = (2 tx - 0.5 + col) s, w = (2 tw)^2 anchor_w
            anchor = np.array(COCO_ANCHORS[STRIDES.index(s)][0], np.float32)[:, None, None]
            col, row = np.arange(gw)[None, :], np.arange(gh)[:, None]
            txy = np.stack([(b[0] / s - col + 0.5) / 2, (b[1] / s - row + 0.5) / 2])
            twh = np.sqrt(b[2:] / anchor) / 2
            first = np.concatenate([np.clip(txy, 0, 1), np.clip(twh, 0, 1), obj, cls])
            low = np.full((2 * (5 + len(sc)), gh, gw), 0.01, np.float32)
            out.append(np.concatenate([first, low])[None].astype(np.float32))
        else:
            out.append(np.concatenate([b, obj, cls]).reshape(5 + len(sc), -1).T)
    if head == "yolov5-zoo":
        return out
    rows = np.concatenate(out)
    low = np.full((2 * len(rows), rows.shape[1]), 0.01, np.float32)
    return [np.concatenate([rows, low])[None].astype(np.float32)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS))
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--objects", type=int, default=15)
    p.add_argument("--per-object", type=int, default=20, help="candidate cells per object")
    p.add_argument(
        "--conf",
        type=float,
        default=DetectSettings.conf,
        help="score threshold; at 0.001 (mAP evaluations) every cell is a candidate",
    )
    p.add_argument("--int8", action="store_true", help="also time int8 outputs")
    p.add_argument("--number", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    scores, dist = scene(rng, args.size, args.classes, args.objects, args.per_object)
    settings = DetectSettings(conf=args.conf)
    print(
        f"{args.size}x{args.size}, {args.classes} classes, {args.objects} objects, "
        f"conf {args.conf:g}; "
        f"CPU ms per image (median of {args.repeats} x {args.number} calls)"
    )
    print(f"{'head':>20} {'dtype':>7} {'candidates':>10} {'boxes':>6} {'ms':>8}")
    for name in args.heads:
        head = Head(name, args.classes, STRIDES, 3 if name.startswith("yolov5") else 1)
        outputs = outputs_for(name, scores, dist, rng)
        runs = [("float32", outputs, ())]
        if args.int8:
            runs.append(("int8", *quantise(outputs)))
        for dtype, outs, quant in runs:
            decoder = Decoder(head, (args.size, args.size), settings, quant)
            above = Decoder(
                head,
                (args.size, args.size),
                DetectSettings(conf=args.conf, iou=1.0, max_det=10**6),
                quant,
            )
            candidates = len(above(outs))
            boxes = len(decoder(outs))
            ms = cpu_ms(lambda d=decoder, o=outs: d(o), args.number, args.repeats)
            print(f"{name:>20} {dtype:>7} {candidates:10d} {boxes:6d} {ms:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
