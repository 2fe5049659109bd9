"""CPU time of instance-segmentation decoding per image: boxes + NMS + masks + COCO RLE
(``batchinfer.detect.seg_decode.SegmentDecoder``).

Builds a 640x640 model's outputs holding ``--instances`` objects (default 20) of 80
classes: each object's box is drawn with sides of 24-320 input pixels, seen by a cluster
of ``--per-object`` cells (scores 0.3-0.9, boxes a few pixels apart, so NMS keeps one),
its mask an ellipse in a prototype channel of its own (coefficients: that channel plus
noise); every other cell scores about sigmoid(-6). The outputs are then laid out as each
head family returns them. Timed with ``time.process_time`` (CPU time): ``--number`` calls
per repeat, the median of ``--repeats``; ``masks`` is the mask + RLE part alone
(``masks.mask_rles`` called with the very arguments the decoder passes it: the kept
instances' coefficients and boxes).

    python tools/bench_seg_decode.py
    python tools/bench_seg_decode.py --heads yolov8-seg-zoo --images 640x640 1920x1080 --int8
    python tools/bench_seg_decode.py --images 640x480 1920x1080 4000x3000   # bigger originals
    python tools/bench_seg_decode.py --sides 16 128   # smaller objects
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from unittest import mock

import numpy as np
from bench_decode_timing import cpu_ms, quantise

from batchinfer.detect import DetectSettings, letterbox_geometry, seg_decode
from batchinfer.detect.decode import COCO_ANCHORS
from batchinfer.detect.heads import STRIDES, grid_sizes
from batchinfer.detect.seg_decode import SegmentDecoder
from batchinfer.detect.seg_heads import proto_grid, recognise_segment

HEADS = ("yolov8-seg-zoo", "yolov5-seg-zoo", "yolov8-seg-ultralytics")
NM = 32


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def scene(
    rng: np.random.Generator,
    size: int,
    classes: int,
    instances: int,
    per_object: int,
    sides: tuple[float, float] = (24, 320),
):
    """The prototype (NM, Hp, Wp) and the candidate cells: a list of (stride index, row,
    col, class, score, box x1 y1 x2 y2, coefficients)."""
    ph, pw = proto_grid((size, size))
    qy, qx = (np.mgrid[0:ph, 0:pw] + 0.5) * (size / ph)
    proto = rng.normal(0, 0.3, (NM, ph, pw)).astype(np.float32)
    grids = grid_sizes((size, size), STRIDES)
    cells, taken = [], set()
    for k in range(instances):
        w, h = rng.uniform(*sides, 2)
        cx, cy = rng.uniform(w / 2, size - w / 2), rng.uniform(h / 2, size - h / 2)
        rx, ry = w * rng.uniform(0.35, 0.55), h * rng.uniform(0.35, 0.55)
        proto[k % NM] = np.maximum(6 * (1 - ((qx - cx) / rx) ** 2 - ((qy - cy) / ry) ** 2), -6)
        b = next(i for i, s in enumerate(STRIDES) if max(w, h) / 2 / s <= 12 or s == STRIDES[-1])
        s, (gh, gw) = STRIDES[b], grids[b]
        cls = int(rng.integers(classes))
        for j in range(per_object):
            row = int(np.clip(cy // s + rng.integers(-1, 2), 0, gh - 1))
            col = int(np.clip(cx // s + rng.integers(-1, 2), 0, gw - 1))
            if (b, row, col) in taken:
                continue
            taken.add((b, row, col))
            jitter = rng.normal(0, 2, 4) if j else np.zeros(4)
            box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) + jitter
            coefs = rng.normal(0, 0.05, NM).astype(np.float32)
            coefs[k % NM] = 1
            score = 0.9 if j == 0 else rng.uniform(0.3, 0.85)
            cells.append((b, row, col, cls, score, box, coefs))
    return proto, cells


def _dfl_logits(box: np.ndarray, row: int, col: int, s: int) -> np.ndarray:
    px, py = (col + 0.5) * s, (row + 0.5) * s
    dist = np.clip(np.array([px - box[0], py - box[1], box[2] - px, box[3] - py]) / s, 0, 14.99)
    bins = np.arange(16)[None, :]
    return (-4.0 * (bins - dist[:, None]) ** 2).reshape(64)


def outputs_for(head: str, size: int, classes: int, proto, cells, rng) -> list[np.ndarray]:
    """The scene as the raw outputs of a ``head`` family model."""
    grids = grid_sizes((size, size), STRIDES)
    if head == "yolov8-seg-ultralytics":
        n = sum(gh * gw for gh, gw in grids)
        raw = np.empty((4 + classes + NM, n), np.float32)
        raw[:2], raw[2:4] = rng.uniform(0, size, (2, n)), rng.uniform(8, 64, (2, n))
        raw[4 : 4 + classes] = _sigmoid(rng.normal(-6, 1, (classes, n)))
        raw[4 + classes :] = rng.normal(0, 1, (NM, n))
        offsets = np.cumsum([0] + [gh * gw for gh, gw in grids])
        for b, row, col, c, score, box, coefs in cells:
            j = offsets[b] + row * grids[b][1] + col
            raw[:4, j] = [(box[0] + box[2]) / 2, (box[1] + box[3]) / 2, *(box[2:] - box[:2])]
            raw[4 + c, j] = score
            raw[4 + classes :, j] = coefs
        return [raw[None], proto[None]]
    outs: list[np.ndarray] = []
    for b, (gh, gw) in enumerate(grids):
        mine = [c for c in cells if c[0] == b]
        s = STRIDES[b]
        if head == "yolov8-seg-zoo":
            box = rng.normal(0, 1, (64, gh, gw)).astype(np.float32)
            cls = _sigmoid(rng.normal(-6, 1, (classes, gh, gw))).astype(np.float32)
            seg = rng.normal(0, 1, (NM, gh, gw)).astype(np.float32)
            for _, row, col, c, score, bx, coefs in mine:
                box[:, row, col] = _dfl_logits(bx, row, col, s)
                cls[c, row, col] = score
                seg[:, row, col] = coefs
            outs += [box[None], cls[None], cls.sum(0)[None, None].clip(0, 1), seg[None]]
        else:
            det = rng.uniform(0, 1, (3, 5 + classes, gh, gw)).astype(np.float32)
            det[:, 4] = _sigmoid(rng.normal(-6, 1, (3, gh, gw)))
            seg = rng.normal(0, 1, (3, NM, gh, gw)).astype(np.float32)
            anchor = np.array(COCO_ANCHORS[b][2], np.float32)  # the widest anchor
            for _, row, col, c, score, bx, coefs in mine:
                cx, cy, w, h = (bx[0] + bx[2]) / 2, (bx[1] + bx[3]) / 2, *(bx[2:] - bx[:2])
                det[2, :4, row, col] = [
                    (cx / s - col + 0.5) / 2, (cy / s - row + 0.5) / 2,
                    np.sqrt(w / anchor[0]) / 2, np.sqrt(h / anchor[1]) / 2,
                ]  # fmt: skip
                det[2, 4, row, col] = score
                det[2, 5:, row, col] = 0.01
                det[2, 5 + c, row, col] = 1.0
                seg[2, :, row, col] = coefs
            outs += [det.reshape(1, -1, gh, gw), seg.reshape(1, -1, gh, gw)]
    return [*outs, proto[None]]


def mask_call(decoder: SegmentDecoder, outputs, lb) -> Callable[[], object]:
    """``masks.mask_rles`` on the arguments ``decoder`` gives it for these outputs."""
    real = seg_decode.mask_rles
    with mock.patch.object(seg_decode, "mask_rles", side_effect=real) as spy:
        decoder.decode(outputs, lb)
    args = spy.call_args.args
    return lambda: real(*args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS))
    p.add_argument("--images", nargs="+", default=["640x640"], help="original sizes WxH")
    p.add_argument("--size", type=int, default=640, help="model input (square)")
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--instances", type=int, default=20)
    p.add_argument("--per-object", type=int, default=10, help="candidate cells per object")
    p.add_argument(
        "--sides", type=float, nargs=2, default=(24, 320), help="box sides drawn from MIN MAX"
    )
    p.add_argument("--int8", action="store_true", help="also time int8 outputs")
    p.add_argument("--number", type=int, default=50)
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    proto, cells = scene(
        rng, args.size, args.classes, args.instances, args.per_object, tuple(args.sides)
    )
    settings = DetectSettings()
    print(
        f"model input {args.size}x{args.size}, {args.classes} classes, {args.instances} "
        f"instances (box sides {args.sides[0]:g}-{args.sides[1]:g} px), {len(cells)} "
        "candidate cells; CPU ms per image "
        f"(median of {args.repeats} x {args.number} calls)"
    )
    print(f"{'head':>24} {'image':>10} {'dtype':>7} {'kept':>5} {'total ms':>9} {'masks ms':>9}")
    for name in args.heads:
        outputs = outputs_for(name, args.size, args.classes, proto, cells, rng)
        head = recognise_segment((args.size, args.size), [o.shape for o in outputs])
        assert head is not None and head.family == name, head
        runs = [("float32", outputs, [])]
        if args.int8:
            runs.append(("int8", *quantise(outputs)))
        for image in args.images:
            w, h = (int(v) for v in image.lower().split("x"))
            lb = letterbox_geometry(w, h, args.size, args.size)
            for dtype, outs, quant in runs:
                decoder = SegmentDecoder(head, (args.size, args.size), settings, quant)
                dets = decoder.decode(outs, lb)
                total = cpu_ms(lambda d=decoder, o=outs, lb=lb: d.decode(o, lb), args.number,
                               args.repeats)  # fmt: skip
                # the masks alone: the same call the decoder makes
                masks = cpu_ms(mask_call(decoder, outs, lb), args.number, args.repeats)
                print(f"{name:>24} {image:>10} {dtype:>7} {len(dets):5d} {total:9.3f} {masks:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
