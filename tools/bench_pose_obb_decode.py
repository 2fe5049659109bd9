"""CPU time of pose and oriented-box post-processing per 640x640 image.

Builds outputs of each head layout for a 640x640 input (a letterboxed 1280x720 image):
``--objects`` instances, each seen by a cluster of ``--per-object`` cells around its centre
(scores 0.26-0.95, DFL logits peaked at the instance's distances from that cell, the
angle or keypoints near the instance's), every other cell's class scores low (sigmoid of
about -6) with a box about its own cell, 1-6 strides wide. Then times decode + NMS +
mapping to the original image's pixels with ``time.process_time`` (CPU time):
``--number`` calls per repeat, the median of ``--repeats``, in ms per image.

    python tools/bench_pose_obb_decode.py
    python tools/bench_pose_obb_decode.py --objects 50 --per-object 20 --int8
    python tools/bench_pose_obb_decode.py --conf 0.001   # every cell a candidate, as mAP runs
    python tools/bench_pose_obb_decode.py --map          # rotated mAP50 over 200 images

Heads: the model zoo's yolov8_pose (1 class, 17 keypoints) and yolov8_obb (15 DOTA
classes), and the Ultralytics exports of the same; OBB with each rotated NMS (ProbIoU
Fast-NMS, Ultralytics'; exact polygon greedy, the zoo's). ``--int8`` quantises the zoo
layouts' outputs (one scale and zero point per output), as a runtime returning raw int8
outputs would.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from bench_decode_timing import cpu_ms, quantise

from batchinfer.detect.decode import DetectSettings
from batchinfer.detect.heads import DFL_BINS, STRIDES, grid_sizes
from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.obb import ObbDecoder, ObbSettings, recognise_obb
from batchinfer.detect.pose import PoseDecoder, recognise_pose
from batchinfer.detect.rotated import corners
from batchinfer.detect.rotated_ap import ImagePredictions, ImageTruth, rotated_map

SIZE = 640
KEYPOINTS = (17, 3)
OBB_CLASSES = 15


def _scene(rng: np.random.Generator, classes: int, objects: int, per_object: int, rotated: bool):
    """Per cell (over all strides): class logits (C, N), DFL logits (64, N), angle (N,)
    and box (cx, cy, w, h) in input pixels; keypoints (K, 3, N)."""
    grids = grid_sizes((SIZE, SIZE), STRIDES)
    cells = sum(h * w for h, w in grids)
    offsets = np.cumsum([0] + [h * w for h, w in grids])
    logits = rng.normal(-6, 1, (classes, cells)).astype(np.float32)
    near = rng.uniform(0.5, 3, (4, 1, cells))  # background sides: 0.5-3 strides
    bins = np.arange(DFL_BINS)[None, :, None]
    dfl = (-2.0 * (bins - near) ** 2).reshape(4 * DFL_BINS, cells).astype(np.float32)
    angle = rng.uniform(-0.7, 2.3, cells).astype(np.float32)
    # background cells: a box about their own cell, 1-6 strides wide (as a trained model's
    # low-score boxes are)
    centres = np.concatenate(
        [np.stack(np.meshgrid((np.arange(gw) + 0.5) * s, (np.arange(gh) + 0.5) * s)).reshape(2, -1)
         for s, (gh, gw) in zip(STRIDES, grids, strict=True)], axis=1
    )  # fmt: skip
    sizes = np.concatenate(
        [s * rng.uniform(1, 6, (2, gh * gw)) for s, (gh, gw) in zip(STRIDES, grids, strict=True)],
        axis=1,
    )
    box = np.concatenate([centres, sizes]).astype(np.float32)
    kpts = rng.uniform(0, SIZE, (KEYPOINTS[0], 3, cells)).astype(np.float32)
    kpts[:, 2] = rng.uniform(0, 1, (KEYPOINTS[0], cells))
    for _ in range(objects):
        cls = int(rng.integers(classes))
        w, h = rng.uniform(24, 200, 2)
        cx, cy = rng.uniform(w / 2, SIZE - w / 2), rng.uniform(h / 2, SIZE - h / 2)
        a = float(rng.uniform(-0.7, 2.3)) if rotated else 0.0
        for _ in range(per_object):
            b = int(rng.integers(len(STRIDES)))
            s, (gh, gw) = STRIDES[b], grids[b]
            col = int(np.clip(cx / s + rng.normal(0, 1.0), 0, gw - 1))
            row = int(np.clip(cy / s + rng.normal(0, 1.0), 0, gh - 1))
            n = offsets[b] + row * gw + col
            logits[cls, n] = math.log(p := rng.uniform(0.26, 0.95)) - math.log(1 - p)
            ox, oy = cx / s - (col + 0.5), cy / s - (row + 0.5)
            hx = ox * math.cos(a) + oy * math.sin(a)
            hy = -ox * math.sin(a) + oy * math.cos(a)
            sides = np.clip(
                [w / 2 / s - hx, h / 2 / s - hy, w / 2 / s + hx, h / 2 / s + hy], 0, DFL_BINS - 1.01
            )
            bins = np.arange(DFL_BINS)[None, :]
            dfl[:, n] = (-2.0 * (bins - sides[:, None]) ** 2).reshape(-1)
            angle[n] = a + rng.normal(0, 0.02)
            box[:, n] = [cx + rng.normal(0, 2), cy + rng.normal(0, 2), w, h]
            kpts[:, :2, n] = rng.uniform(
                [cx - w / 2, cy - h / 2], [cx + w / 2, cy + h / 2], (17, 2)
            )
    return grids, logits, dfl, angle, box, kpts


def outputs_for(head: str, rng: np.random.Generator, objects: int, per_object: int):
    rotated = head.startswith("obb")
    classes = OBB_CLASSES if rotated else 1
    grids, logits, dfl, angle, box, kpts = _scene(rng, classes, objects, per_object, rotated)
    if head.endswith("zoo"):
        out, start = [], 0
        for gh, gw in grids:
            part = slice(start, start + gh * gw)
            out.append(np.concatenate([dfl[:, part], logits[:, part]]).reshape(1, -1, gh, gw))
            start += gh * gw
        if rotated:
            out.append((angle / np.pi + 0.25)[None, None])
        else:
            out.append(kpts[None])
        return out
    scores = 1 / (1 + np.exp(-logits))
    extra = angle[None] if rotated else kpts.reshape(-1, kpts.shape[-1])
    return [np.concatenate([box, scores, extra])[None].astype(np.float32)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=20)
    ap.add_argument("--per-object", type=int, default=15)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--int8", action="store_true", help="int8 outputs for the zoo layouts")
    ap.add_argument("--map", action="store_true", help="time rotated mAP50 instead")
    args = ap.parse_args(argv)
    if args.map:
        return bench_map()
    rng = np.random.default_rng(0)
    lb = letterbox_geometry(1280, 720, SIZE, SIZE)
    rows = [
        ("pose-zoo", None),
        ("pose-ultralytics", None),
        ("obb-zoo", "probiou"),
        ("obb-zoo", "polygon"),
        ("obb-ultralytics", "probiou"),
        ("obb-ultralytics", "polygon"),
    ]
    print(f"{'head':18} {'nms':8} {'candidates':>10} {'kept':>5} {'ms/image':>9}")
    for head, nms in rows:
        outputs = outputs_for(head, rng, args.objects, args.per_object)
        quant: list = []
        if args.int8 and head.endswith("zoo"):
            outputs, quant = quantise(outputs)
        shapes = [o.shape for o in outputs]
        decoder: PoseDecoder | ObbDecoder
        if head.startswith("pose"):
            pose_head = recognise_pose((SIZE, SIZE), shapes, kpt_shape=KEYPOINTS)
            assert pose_head is not None
            decoder = PoseDecoder(pose_head, (SIZE, SIZE), DetectSettings(conf=args.conf), quant)
        else:
            obb_head = recognise_obb((SIZE, SIZE), shapes, task="obb")
            assert obb_head is not None
            settings = ObbSettings(conf=args.conf, nms=nms or "probiou")
            decoder = ObbDecoder(obb_head, (SIZE, SIZE), settings, quant)
        result = decoder(outputs, lb)
        candidates = _candidates(head, outputs, quant, args.conf)
        ms = cpu_ms(lambda d=decoder, o=outputs: d(o, lb), args.number, args.repeats)
        print(f"{head:18} {nms or '-':8} {candidates:>10} {len(result):>5} {ms:>9.2f}")
    return 0


def bench_map(images: int = 200, truths: int = 30, detections: int = 300) -> int:
    """CPU time of rotated mAP50 over ``images`` images (15 classes; per image ``truths``
    ground truths, found again with a few pixels of error, and false detections up to
    ``detections``)."""
    rng = np.random.default_rng(0)
    preds, gts = [], []

    def boxes(n: int) -> np.ndarray:
        return np.column_stack(
            [rng.uniform(0, 1000, (n, 2)), rng.uniform(10, 80, (n, 2)), rng.uniform(0, 1.5, n)]
        )

    for _ in range(images):
        truth, cls = boxes(truths), rng.integers(0, OBB_CLASSES, truths)
        found = truth + rng.normal(0, [2, 2, 2, 2, 0.03], truth.shape)
        det = np.concatenate([found, boxes(detections - truths)])
        det_cls = np.concatenate([cls, rng.integers(0, OBB_CLASSES, detections - truths)])
        preds.append(ImagePredictions(corners(det), det_cls, rng.uniform(0, 1, detections)))
        gts.append(ImageTruth(corners(truth), cls))
    t0 = time.process_time()
    result = rotated_map(preds, gts)
    cpu = time.process_time() - t0
    print(
        f"rotated mAP50 over {images} images, {images * detections} detections: "
        f"{cpu:.2f} s CPU (mAP {result.map:.3f})"
    )
    return 0


def _candidates(head: str, outputs, quant, conf: float) -> int:
    """Cells whose best class score reaches conf (for the table)."""
    if head.endswith("ultralytics"):
        classes = 1 if head.startswith("pose") else OBB_CLASSES
        return int((outputs[0][0, 4 : 4 + classes].max(axis=0) >= conf).sum())
    total = 0
    for i, o in enumerate(outputs[:3]):
        v = o[0, 4 * DFL_BINS :].astype(np.float32)
        if quant:
            v = (v - quant[i][1]) * quant[i][0]
        total += int((1 / (1 + np.exp(-v.max(axis=0))) >= conf).sum())
    return total


if __name__ == "__main__":
    sys.exit(main())
