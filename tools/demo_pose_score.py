"""The demo pose model's figures (tools/build_demo_pose.py ``rknn`` and ``score``) and
its page, POSE.md: .rknn conversion and int8 agreement, COCO bbox and keypoints mAP."""

from __future__ import annotations

import json
import time
from pathlib import Path

import build_demo_detector as det
import build_demo_pose as pose
import demo_build
import numpy as np

from batchinfer import demo
from batchinfer.demo import ASSETS, detection

FIRST_IMAGES = 16  # the first val images the tests rescore (tests/test_demo_pose.py)


def predictions(run: demo_build.Runner, n: int) -> list[dict]:
    """COCO results (bbox and keypoints) of the first ``n`` val scenes, decoded by
    batchinfer's PoseDecoder from ``run(canvas uint8 (256, 256, 3)) -> 4 outputs``."""
    from batchinfer.detect.decode import DetectSettings
    from batchinfer.detect.pose import PoseDecoder, coco_keypoints, recognise_pose

    side = (pose.INPUT, pose.INPUT)

    def make_decoder(shapes):
        head = recognise_pose(side, shapes)
        if head is None or head.family != "yolov8-pose-zoo":
            raise SystemExit(f"batchinfer did not recognise {pose.MODEL} as yolov8-pose-zoo")
        return PoseDecoder(head, side, DetectSettings(**pose.DECODE))

    results = []
    for image_id, found in demo_build.decoded_val(run, n, det.letterbox, make_decoder):
        for box, score, c, points in zip(
            found.boxes, found.scores, found.class_ids, found.keypoints, strict=True
        ):
            x1, y1, x2, y2 = (float(v) for v in box)
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(c),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(score),
                    "keypoints": coco_keypoints(points),
                }
            )
    return results


def coco_maps(results: list[dict], n: int) -> dict:
    """pycocotools' bbox and keypoints (OKS, sigmas pose.SIGMAS) mAP@0.5 and mAP@0.5:0.95
    of ``results`` on the first ``n`` val scenes' ground truth (with keypoints)."""
    return demo_build.coco_maps(
        results, n, ("bbox", "keypoints"), keypoints=True, sigmas=pose.SIGMAS
    )


def keypoint_errors(results: list[dict], n: int) -> dict:
    """Median and 90th percentile distance (original pixels) from each ground-truth
    keypoint to the same keypoint of the best-scoring prediction of its class whose box
    centre lies inside the digit's box."""
    by_image: dict[int, list[dict]] = {}
    for r in results:
        by_image.setdefault(r["image_id"], []).append(r)
    distances = []
    for image_id, scene in enumerate(detection.scenes("val", n), start=1):
        found = sorted(by_image.get(image_id, []), key=lambda r: -r["score"])
        for box, label, points in zip(scene.boxes, scene.labels, scene.keypoints(), strict=True):
            for r in found:
                bx, by, bw, bh = r["bbox"]
                cx, cy = bx + bw / 2, by + bh / 2
                if r["category_id"] == label and box[0] <= cx < box[2] and box[1] <= cy < box[3]:
                    got = np.array(r["keypoints"]).reshape(-1, 3)[:, :2]
                    distances += np.hypot(*(got - points).T).tolist()
                    break
    d = np.array(distances)
    return {
        "points": len(d),
        "median_px": float(np.median(d)),
        "p90_px": float(np.quantile(d, 0.9)),
    }


def score(work: Path) -> dict:
    """mAPs of the float model (run here) and of every results-*.json ``rknn`` wrote, on
    the whole val split and its first FIRST_IMAGES images (what the tests recompute)."""
    run = demo_build.onnx_runner(ASSETS / pose.MODEL, pose.output_names())
    out = {
        "images": pose.VAL_EVAL,
        "first_images": FIRST_IMAGES,
        "decode": pose.DECODE,
        "sigmas": list(pose.SIGMAS),
        "maps": {},
    }
    runs = {pose.MODEL: predictions(run, pose.VAL_EVAL)}
    for path in sorted(work.glob("results-*.json")):
        runs[path.name.removeprefix("results-").removesuffix(".json")] = json.loads(
            path.read_text()
        )
    for name, results in runs.items():
        first = [r for r in results if r["image_id"] <= FIRST_IMAGES]
        out["maps"][name] = {
            "all": coco_maps(results, pose.VAL_EVAL),
            "first": coco_maps(first, FIRST_IMAGES),
            "errors": keypoint_errors(results, pose.VAL_EVAL),
        }
        a = out["maps"][name]["all"]
        print(
            f"{name:28s} bbox mAP@0.5 {a['bbox']['map50']:.4f} ({a['bbox']['map50_95']:.4f})"
            f"  keypoints mAP@0.5 {a['keypoints']['map50']:.4f}"
            f" ({a['keypoints']['map50_95']:.4f})  {out['maps'][name]['errors']}"
        )
    out["annotations"] = sum(len(s.boxes) for s in detection.scenes("val", pose.VAL_EVAL))
    return out


def convert_all(work: Path) -> dict:
    """Convert digits-pose for every chip, copy the .rknn into the assets, run them int8."""

    def measure(path: Path, platform: str) -> dict:
        float_run = demo_build.onnx_runner(ASSETS / pose.MODEL, pose.output_names())
        canvases = [det.letterbox(s.image)[0] for s in detection.scenes("val", 8)]
        with demo_build.rknn_runner(path) as run:
            figures: dict = {
                "bytes": path.stat().st_size,
                "cosine_min": demo_build.worst_cosines(
                    run, float_run, pose.output_names(), canvases
                ),
            }
            if platform == pose.RKNN_FIRST:
                t0 = time.perf_counter()
                results = predictions(run, pose.VAL_EVAL)
                figures["eval_s"] = time.perf_counter() - t0
                (work / f"results-{path.name}.json").write_text(json.dumps(results))
        return figures

    return demo_build.convert_all(demo.rknn_stems(pose=True), measure)


def pose_md(d: dict) -> str:
    """POSE.md from measured.json's "pose" section."""
    o, r, sc = d.get("onnx", {}), d.get("rknn"), d.get("score", {})
    maps = sc.get("maps", {})
    nan = float("nan")

    def map_line(name: str) -> str:
        if name not in maps:
            return "not scored yet (`python tools/build_demo_pose.py score`)"
        f, e = maps[name]["all"], maps[name]["errors"]
        return (
            f"bbox **mAP@0.5 {f['bbox']['map50']:.3f}**, mAP@0.5:0.95 "
            f"{f['bbox']['map50_95']:.3f}; keypoints **mAP@0.5 {f['keypoints']['map50']:.3f}**, "
            f"mAP@0.5:0.95 {f['keypoints']['map50_95']:.3f}; keypoint error (found digits, "
            f"original pixels) median {e['median_px']:.2f} px, 90th percentile "
            f"{e['p90_px']:.2f} px"
        )

    rows = []
    for stem, f in (r or {}).get("models", {}).items():
        worst = min(f["cosine_min"].values())
        rows.append(
            f"| `{stem}.rknn` | {f['bytes']:,} | {worst:.4f} | {f['cosine_min']['keypoints']:.4f} |"
        )
    history = o.get("loss_history") or [{"l1_strides": nan}]
    took = f"{o['train_s']:.0f} s ({o['train_cpu_s']:.0f} s CPU)" if "train_s" in o else "not yet"
    names = ", ".join(detection.KEYPOINTS)
    return f"""# The demo pose model

Made by `tools/build_demo_pose.py` (`train` and `rknn` in the toolkit's environment,
which has torch; `score` in the project's, which has pycocotools; the figures and this
page by `tools/demo_pose_score.py`); every figure here is in `measured.json` under
`"pose"`.

## Data
The synthetic digit scenes of the demo detector (`DETECTOR.md`,
`batchinfer.demo.detection`). A digit has {pose.K} keypoints, the ends of its ink at the
{names} (`KEYPOINTS`, `Scene.keypoints()`): the centre of the inked pixels of its first
(last) inked row (column), so they lie on the edges of its box. `batchinfer demo DIR`
writes them, beside `DIR/detection/instances.json`, as `DIR/detection/instances-pose.json`:
the same COCO annotations, each with `keypoints` (x, y, v = 2 each), `num_keypoints` {pose.K}
and `area` = the ink's pixels (the scale of COCO's OKS); each category lists the keypoint
names and the `skeleton` (the diamond {detection.SKELETON}). Scored on the first
{sc.get("images", pose.VAL_EVAL)} val scenes ({sc.get("annotations", "?")} digits) with OKS
sigma {pose.SIGMAS[0]} for every keypoint (COCO's person sigmas are for people: set the
evaluation's sigmas to these).

## digits-pose.onnx
- Input `images` float32 [1, 3, {pose.INPUT}, {pose.INPUT}] NCHW: RGB pixels / 255 of the
  image letterboxed to {pose.INPUT}x{pose.INPUT}, as `digits-det.onnx`.
- Outputs: rknn_model_zoo's yolov8_pose layout, 4 tensors: for strides 8, 16, 32 in turn
  `pose_<s>` (1, 74, H, W), the detector's 64 DFL box logits then its 10 class logits (no
  sigmoid: the post-processing applies it); then `keypoints` (1, {pose.K}, 3, {pose.CELLS})
  decoded in the graph as Ultralytics' `kpts_decode`: x = (2 r + column) x stride, y
  likewise, in input pixels, and the score after a sigmoid. `batchinfer.detect.pose`
  recognises it as `yolov8-pose-zoo`.
- Graph: `digits-det.onnx`'s weights, frozen (its boxes and classes), plus per stride a
  keypoint branch (3x3 conv 48->48, 3x3 conv to 32, ReLU each, 1x1 conv to {3 * pose.K});
  batch norm folded. {o.get("onnx_bytes", 0):,} bytes; ONNX Runtime against torch: max
  |difference| {o.get("onnx_vs_torch_max_abs", nan):.1e}.
- Training (the keypoint branches only, {o.get("trained_params", 0):,} parameters): torch on
  {o.get("threads", "?")} CPU thread(s), seed {pose.SEED}, {o.get("steps", pose.STEPS)} steps of
  {o.get("batch", pose.BATCH)} fresh letterboxed train scenes, AdamW lr {pose.LEARNING_RATE}
  (25 warm-up steps, cosine), weight decay {pose.WEIGHT_DECAY}; the positives of the
  detector's assignment (centre sampling); loss: L1 of each keypoint in strides plus
  {pose.SCORE_WEIGHT} x BCE of its score against 1. {took} on the shared build machine;
  last L1 {history[-1]["l1_strides"]:.3f} strides.
- Val, float (ONNX Runtime, decoded by batchinfer's `PoseDecoder` at score >=
  {pose.DECODE["conf"]}, class-aware NMS {pose.DECODE["iou"]}, {pose.DECODE["max_det"]}
  instances; pycocotools): {map_line(pose.MODEL)}.

## .rknn files
`digits-pose-<chip>.rknn` for rk3588, rk3576 and rk3566, converted from
`digits-pose.onnx` with `digits-pose-<chip>.config.json` (as the detector: `mean_values` 0,
`std_values` 255, int8 w8a8) on the detector's calibration scenes. Against the float model
on 8 val scenes (cosine per output, the worst over the 4 outputs and scenes, and the
keypoints'):

| file | bytes | worst cosine vs float | keypoints |
|---|---|---|---|
{chr(10).join(rows) or "| not converted yet | | | |"}

Val, int8 (digits-pose-{pose.RKNN_FIRST}.rknn, rknn-toolkit2's simulator, same decoding):
{map_line(f"digits-pose-{pose.RKNN_FIRST}.rknn")}.

`jobs/pose-digits.toml` scores this model with `batchinfer eval` (COCO keypoints, OKS
sigma 0.1 per keypoint: `metrics.keypoint_sigmas`, beside bbox, on the emulator against
ONNX Runtime); `jobs/pose-digits-toolkit.toml` the int8 .rknn in rknn-toolkit2's simulator.
"""
