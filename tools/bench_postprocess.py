"""CPU time of post-processing per item, for every task and head layout, in one table.

What the core workers run after inference on one item's outputs, for a 640x640 model
input and an image of ``--image`` pixels letterboxed onto it:

- classify: the top ``--topk`` of 1000 class scores (``sink.predictions.top_k_batch``, as
  the collector calls it; per item here, as a batch of one);
- detect: ``detect.Decoder`` (decode, class-aware NMS, boxes to original pixels) on the 4 heads of
  tools/bench_detect_decode.py (15 objects, 20 candidate cells each, 80 classes);
- segment: ``SegmentDecoder.decode`` (boxes, NMS, masks, COCO RLE in original pixels) on
  the 3 heads of tools/bench_seg_decode.py (20 instances, 10 cells each, 80 classes);
- pose / obb: ``PoseDecoder`` / ``ObbDecoder`` (+ mapping to original pixels) on the 2
  heads each of tools/bench_pose_obb_decode.py (20 instances, 15 cells each; OBB with
  ProbIoU Fast-NMS, Ultralytics' default).

The outputs are built by those scripts (same seeds); times are CPU time
(``time.process_time``), the median of ``--repeats`` runs of ``--number`` calls.

    python tools/bench_postprocess.py
    python tools/bench_postprocess.py --image 1280x720 --number 50 --repeats 11
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_detect_decode as det_bench
import bench_pose_obb_decode as po_bench
import bench_seg_decode as seg_bench
from bench_decode_timing import cpu_ms

from batchinfer.detect import Decoder, DetectSettings, Head
from batchinfer.detect.heads import STRIDES
from batchinfer.detect.letterbox import Letterbox, boxes_to_original, letterbox_geometry
from batchinfer.detect.obb import ObbDecoder, ObbSettings, recognise_obb
from batchinfer.detect.pose import PoseDecoder, recognise_pose
from batchinfer.detect.seg_decode import SegmentDecoder
from batchinfer.detect.seg_heads import recognise_segment
from batchinfer.sink.predictions import top_k_batch

SIZE = 640
#: (task, head, the call timed, how many instances it returns)
Case = tuple[str, str, Callable[[], object], int]


def classify_cases(topk: int) -> Iterator[Case]:
    scores = np.random.default_rng(0).random((1, 1000), dtype=np.float32)
    yield "classify", f"top-{topk} of 1000", lambda: top_k_batch(scores, topk), topk


def detect_cases(lb: Letterbox) -> Iterator[Case]:
    rng = np.random.default_rng(0)
    scores, dist = det_bench.scene(rng, SIZE, 80, 15, 20)
    for name in det_bench.HEADS:
        head = Head(name, 80, STRIDES, 3 if name.startswith("yolov5") else 1)
        outputs = det_bench.outputs_for(name, scores, dist, rng)
        decoder = Decoder(head, (SIZE, SIZE), DetectSettings())

        def call(d=decoder, o=outputs) -> object:
            return boxes_to_original(d(o).boxes, lb)  # as the worker maps them

        yield "detect", name, call, len(decoder(outputs))


def segment_cases(lb: Letterbox) -> Iterator[Case]:
    rng = np.random.default_rng(0)
    proto, cells = seg_bench.scene(rng, SIZE, 80, 20, 10)
    for name in seg_bench.HEADS:
        outputs = seg_bench.outputs_for(name, SIZE, 80, proto, cells, rng)
        head = recognise_segment((SIZE, SIZE), [o.shape for o in outputs])
        assert head is not None and head.family == name, head
        decoder = SegmentDecoder(head, (SIZE, SIZE), DetectSettings())
        kept = len(decoder.decode(outputs, lb))
        yield "segment", name, lambda d=decoder, o=outputs: d.decode(o, lb), kept


def pose_obb_cases(lb: Letterbox) -> Iterator[Case]:
    rng = np.random.default_rng(0)
    for name in ("pose-zoo", "pose-ultralytics", "obb-zoo", "obb-ultralytics"):
        outputs = po_bench.outputs_for(name, rng, 20, 15)
        shapes = [o.shape for o in outputs]
        decoder: PoseDecoder | ObbDecoder
        if name.startswith("pose"):
            pose_head = recognise_pose((SIZE, SIZE), shapes, kpt_shape=po_bench.KEYPOINTS)
            assert pose_head is not None
            decoder = PoseDecoder(pose_head, (SIZE, SIZE), DetectSettings())
        else:
            obb_head = recognise_obb((SIZE, SIZE), shapes, task="obb")
            assert obb_head is not None
            decoder = ObbDecoder(obb_head, (SIZE, SIZE), ObbSettings())
        task, family = name.split("-")
        label = f"yolov8-{task}-{family}"
        yield task, label, lambda d=decoder, o=outputs: d(o, lb), len(decoder(outputs, lb))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--image", default="640x640", help="original image WxH (default 640x640)")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.image.lower().split("x"))
    lb = letterbox_geometry(w, h, SIZE, SIZE)
    print(
        f"post-processing CPU ms per item: model input {SIZE}x{SIZE}, image {w}x{h}, "
        f"median of {args.repeats} x {args.number} calls"
    )
    print("| task | head | instances | CPU ms per item |\n|---|---|---|---|")
    cases = [
        *classify_cases(args.topk),
        *detect_cases(lb),
        *segment_cases(lb),
        *pose_obb_cases(lb),
    ]
    for task, head, call, kept in cases:
        ms = cpu_ms(call, args.number, args.repeats)
        print(f"| {task} | {head} | {kept} | {ms:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
