"""Build the demo segmenter: the demo detector with a YOLOv8-seg mask head, on the digit scenes.

    python tools/build_demo_segmenter.py train   # toolkit env (torch): train, export ONNX
    python tools/build_demo_segmenter.py rknn    # toolkit env: convert to .rknn, run int8
    python tools/build_demo_segmenter.py score   # project env: COCO bbox and segm mAP

The model (``digits-seg.onnx``, input float NCHW [1, 3, 256, 256] = RGB pixels / 255,
letterboxed, as ``digits-det.onnx``) is the demo detector (tools/build_demo_detector.py),
its weights read from the committed ``digits-det.onnx`` and frozen, plus what YOLOv8-seg
adds: per stride a mask-coefficient branch (3x3 conv + 1x1 conv to 32 coefficients) and a
prototype branch (the stride-8 map, 3x3 conv, 2x upsampled, plus a 1x1 lateral of the
backbone's stride-4 map, 3x3 conv, 1x1 conv to 32 prototypes at stride 4, 64 x 64).
Only those are trained, so training takes minutes and the boxes are the detector's.

Its outputs are rknn_model_zoo's yolov8_seg layout, 13 tensors: per stride 8, 16, 32 the
detector's box (1, 64, H, W), class scores (1, 10, H, W) and score sum (1, 1, H, W), then
the mask coefficients (1, 32, H, W); last the prototype (1, 32, 64, 64).
``batchinfer.detect.seg_heads`` recognises it as ``yolov8-seg-zoo``.

A digit's mask is its glyph's own ink, the pixels whose alpha is >= INK_ALPHA
(``Scene.masks``, the pixels its box is tight around); the mask loss is Ultralytics':
per positive cell, BCE of coefficients . prototype against the instance's mask at
prototype resolution (the fraction of each 4 x 4 block of canvas pixels that is ink),
inside its box, over the box's area. ``score`` decodes the val scenes with batchinfer's
own ``SegmentDecoder`` and scores them with pycocotools. Deterministic for a machine and
thread count (fixed seeds, scenes generated from seeds); figures land in ``measured.json``
under ``"segmenter"``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_demo_detector as det  # the detector this model extends
import demo_build

from batchinfer.demo import ASSETS, RKNN_PLATFORMS, detection

INPUT, STRIDES, CLASSES = det.INPUT, det.STRIDES, det.CLASSES
MASKS = 32  # coefficients per cell = prototypes, as YOLOv8-seg
PROTO = INPUT // 4  # the prototype's side: stride 4
WIDTH = 48  # the neck's channels (the Detector's)

SEED = 0
STEPS = 300
BATCH = 8
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 5e-4
MAX_POSITIVES = 384  # positive cells per batch whose masks are scored (a seeded sample)

MODEL = "digits-seg.onnx"
DETECTOR = "digits-det.onnx"
RKNN_FIRST = RKNN_PLATFORMS[0]
VAL_EVAL = detection.VAL_IMAGES
#: The first val images the tests rescore (tests/test_demo_segmenter.py).
FIRST_IMAGES = 16
DECODE = {"conf": 0.001, "iou": 0.6, "max_det": 100}


# --------------------------------------------------------------------------- model


def build_torch_model():
    """The Segmenter: the detector (weights from digits-det.onnx, frozen) + mask branches."""
    import torch
    from torch import nn

    ConvBnRelu, Detector = det.torch_classes()

    class Segmenter(demo_build.on_frozen_detector(Detector)):
        def __init__(self) -> None:
            super().__init__()
            self.coef_stem = nn.ModuleList(ConvBnRelu(WIDTH, 32) for _ in STRIDES)
            self.coef_out = nn.ModuleList(nn.Conv2d(32, MASKS, 1) for _ in STRIDES)
            self.proto_1 = ConvBnRelu(WIDTH, 32)
            self.proto_lat = ConvBnRelu(32, 32, k=1)
            self.proto_2 = ConvBnRelu(32, 32)
            self.proto_out = nn.Conv2d(32, MASKS, 1)

        def forward(self, x):
            """(per stride (box logits, class logits, coefficients), prototype)."""
            with torch.no_grad():
                c2, ps = self.det.features(x)
                heads = self.det.heads(ps)
            up = nn.functional.interpolate(self.proto_1(ps[0]), scale_factor=2.0)
            proto = self.proto_out(self.proto_2(up + self.proto_lat(c2)))
            outs = [
                (box, cls, self.coef_out[i](self.coef_stem[i](ps[i])))
                for i, (box, cls) in enumerate(heads)
            ]
            return outs, proto

    torch.manual_seed(SEED)
    model = demo_build.freeze_detector(Segmenter(), ASSETS / DETECTOR)
    return model


def mask_targets(scenes, placed) -> list[np.ndarray]:
    """Per scene, (n, PROTO, PROTO) float32: the fraction of each 4 x 4 block of canvas
    pixels that is the instance's ink (canvas pixel -> nearest original pixel)."""
    out = []
    for scene, (scale, px, py) in zip(scenes, placed, strict=True):
        h, w = scene.image.shape[:2]
        label = np.zeros((h + 1, w + 1), np.int16)  # row/column h, w: outside the image
        for i, m in enumerate(scene.masks()):
            label[:h, :w][m] = i + 1
        u = np.arange(INPUT) + 0.5
        xs = np.floor((u - px) / scale).astype(np.int64)
        ys = np.floor((u - py) / scale).astype(np.int64)
        xs = np.where((xs >= 0) & (xs < w), xs, w)
        ys = np.where((ys >= 0) & (ys < h), ys, h)
        canvas = label[ys][:, xs]  # (INPUT, INPUT)
        n = len(scene.ink)
        onehot = canvas[None] == np.arange(1, n + 1, dtype=np.int16)[:, None, None]
        pooled = onehot.reshape(n, PROTO, 4, PROTO, 4).mean((2, 4), dtype=np.float32)
        out.append(pooled)
    return out


def mask_loss(outs, proto, targets, masks, anchors, rng: np.random.Generator):
    """Ultralytics' mask loss on a seeded sample of at most MAX_POSITIVES positive cells."""
    import torch
    import torch.nn.functional as F

    centres, _, levels = anchors
    coefs = torch.cat([o[2].flatten(2) for o in outs], 2).transpose(1, 2)  # (N, A, M)
    match = det.assign(targets, centres, levels)
    b_idx, a_idx = np.nonzero(match >= 0)
    if len(b_idx) > MAX_POSITIVES:
        pick = np.sort(rng.choice(len(b_idx), MAX_POSITIVES, replace=False))
        b_idx, a_idx = b_idx[pick], a_idx[pick]
    j = match[b_idx, a_idx]
    logits = torch.einsum("pm,pmhw->phw", coefs[b_idx, a_idx], proto[b_idx])
    target = torch.from_numpy(np.stack([masks[b][k] for b, k in zip(b_idx, j, strict=True)]))
    boxes = np.stack([targets[b][k, 1:] for b, k in zip(b_idx, j, strict=True)]) / 4
    grid = np.arange(PROTO) + 0.5
    inside_x = (grid[None] >= boxes[:, 0:1]) & (grid[None] < boxes[:, 2:3])
    inside_y = (grid[None] >= boxes[:, 1:2]) & (grid[None] < boxes[:, 3:4])
    crop = torch.from_numpy((inside_y[:, :, None] & inside_x[:, None, :]).astype(np.float32))
    area = crop.sum((1, 2)).clamp(min=1)
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return ((bce * crop).sum((1, 2)) / area).mean()


def train(steps: int = STEPS, log_every: int = 25):
    """Return the trained Segmenter and the training figures."""
    import torch

    torch.set_num_threads(det.THREADS)
    torch.use_deterministic_algorithms(True)
    model = build_torch_model()
    anchors = det.anchor_points()
    rng = np.random.default_rng(SEED)

    def step_loss(step: int):
        images, targets, scenes, placed = det.placed_batch(step, BATCH)
        outs, proto = model(det.to_input(images))
        loss = mask_loss(outs, proto, targets, mask_targets(scenes, placed), anchors, rng)
        return loss, float(loss.detach())

    figures = demo_build.fit(
        model, step_loss, steps=steps, batch=BATCH, threads=det.THREADS,
        learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, logged="mask",
        log_every=log_every,
    )  # fmt: skip
    return model, figures


# --------------------------------------------------------------------------- ONNX export


def output_names() -> list[str]:
    """The 13 outputs, model-zoo yolov8_seg order."""
    per_stride = [f"{k}_{s}" for s in STRIDES for k in ("box", "cls", "sum", "coef")]
    return [*per_stride, "proto"]


def output_shapes() -> list[list[int]]:
    shapes = []
    for s in STRIDES:
        n = INPUT // s
        shapes += [[1, c, n, n] for c in (4 * det.REG_MAX, CLASSES, 1, MASKS)]
    return [*shapes, [1, MASKS, PROTO, PROTO]]


def export_onnx(state: dict):
    """Return digits-seg.onnx (an onnx.ModelProto) written node by node from ``state``."""
    g = det.GraphWriter(state)
    c2, neck = g.features(prefix="det.")
    smoothed = []
    for i, (p, s) in enumerate(zip(neck, STRIDES, strict=True)):
        p = g.detection_head(p, i, s, prefix="det.")
        g.conv(g.conv(p, f"coef_stem.{i}"), f"coef_out.{i}", relu=False, out=f"coef_{s}")
        smoothed.append(p)
    up = g.up(g.conv(smoothed[0], "proto_1"), "proto_up")
    g.node("Add", [up, g.conv(c2, "proto_lat")], "proto_sum")
    g.conv(g.conv("proto_sum", "proto_2"), "proto_out", relu=False, out="proto")
    return g.model(
        "digits_seg",
        list(zip(output_names(), output_shapes(), strict=True)),
        doc=(
            "Demo digit segmenter: float NCHW [1,3,256,256] RGB/255, letterboxed; outputs in "
            "rknn_model_zoo's yolov8_seg layout (per stride 8/16/32 box DFL logits, class "
            "sigmoid, score sum, 32 mask coefficients; then the prototype (1,32,64,64)); "
            "see batchinfer/demo/assets/SEGMENTER.md."
        ),
        producer="batchinfer tools/build_demo_segmenter.py",
    )


def torch_outputs(model, x) -> list:
    """The 13 outputs of the torch model, as the ONNX graph computes them."""
    import torch

    with torch.no_grad():
        outs, proto = model(x)
    ref = []
    for box, cls, coef in outs:
        probs = cls.sigmoid()
        ref += [box, probs, probs.sum(1, keepdim=True).clamp(0, 1), coef]
    return [t.numpy() for t in [*ref, proto]]


def check_export(proto, model, n: int = 4) -> float:
    """Max |ONNX - torch| over the 13 outputs on ``n`` val scenes."""
    session = det.ort_session(proto)
    worst = 0.0
    for scene in detection.scenes("val", n):
        x = det.to_input(det.letterbox(scene.image)[0][None])
        got = session.run(output_names(), {"images": x.numpy()})
        for g, r in zip(got, torch_outputs(model, x), strict=True):
            worst = max(worst, float(np.abs(g - r).max()))
    return worst


def check_detector(proto, n: int = 4) -> float:
    """Max |digits-seg - digits-det| over the detector's nine outputs on ``n`` val scenes."""
    seg, ref = det.ort_session(proto), det.ort_session(ASSETS / DETECTOR)
    worst = 0.0
    for scene in detection.scenes("val", n):
        x = det.to_input(det.letterbox(scene.image)[0][None]).numpy()
        got = seg.run(det.output_names(), {"images": x})
        want = ref.run(det.output_names(), {"images": x})
        worst = max(worst, *(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)))
    return worst


def build_onnx(work: Path) -> dict:
    """Train (or reuse work/weights.pt), export digits-seg.onnx and its settings files."""
    figures, proto = demo_build.export(
        work, train, build_torch_model, export_onnx, check_export, MODEL
    )
    figures["detector_outputs_vs_digits_det_max_abs"] = check_detector(proto)
    figures["onnx_bytes"] = (ASSETS / MODEL).stat().st_size
    for platform in RKNN_PLATFORMS:
        path = ASSETS / f"digits-seg-{platform}.config.json"
        path.write_text(det.settings_json(det.detector_settings(platform)))
    return figures


# --------------------------------------------------------------------------- scoring


def predictions(run, n: int) -> list[dict]:
    """COCO results (bbox and RLE segmentation) of the first ``n`` val scenes, decoded by
    batchinfer's SegmentDecoder from ``run(canvas uint8 (256, 256, 3)) -> 13 outputs``."""
    from batchinfer.detect.decode import DetectSettings
    from batchinfer.detect.seg_decode import SegmentDecoder
    from batchinfer.detect.seg_heads import recognise_segment

    def make_decoder(shapes):
        head = recognise_segment((INPUT, INPUT), shapes)
        if head is None or head.family != "yolov8-seg-zoo":
            raise SystemExit(f"seg_heads did not recognise {MODEL} as yolov8-seg-zoo")
        return SegmentDecoder(head, (INPUT, INPUT), DetectSettings(**DECODE)).decode

    results = []
    for image_id, found in demo_build.decoded_val(run, n, det.letterbox, make_decoder):
        for box, score, c, rle in zip(
            found.boxes, found.scores, found.class_ids, found.mask_structs(), strict=True
        ):
            x1, y1, x2, y2 = (float(v) for v in box)
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(c),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(score),
                    "segmentation": {
                        "size": [rle["height"], rle["width"]],
                        "counts": rle["counts"],
                    },
                }
            )
    return results


def coco_maps(results: list[dict], n: int) -> dict:
    """pycocotools' bbox and segm mAP@0.5 and mAP@0.5:0.95 of ``results`` on the first
    ``n`` val scenes' ground truth (detection.coco_instances with masks)."""
    return demo_build.coco_maps(results, n, ("bbox", "segm"), masks=True)


def onnx_runner(path: Path) -> demo_build.Runner:
    return demo_build.onnx_runner(path, output_names())


def score(work: Path) -> dict:
    """mAPs of the float model (run here) and of every results-*.json ``rknn`` wrote, on
    the whole val split and on its first FIRST_IMAGES images (what the tests recompute)."""
    run = onnx_runner(ASSETS / MODEL)
    out = {"images": VAL_EVAL, "first_images": FIRST_IMAGES, "decode": DECODE, "maps": {}}
    runs = {MODEL: predictions(run, VAL_EVAL)}
    for path in sorted(work.glob("results-*.json")):
        runs[path.name.removeprefix("results-").removesuffix(".json")] = json.loads(
            path.read_text()
        )
    for name, results in runs.items():
        first = [r for r in results if r["image_id"] <= FIRST_IMAGES]
        out["maps"][name] = {
            "all": coco_maps(results, VAL_EVAL),
            "first": coco_maps(first, FIRST_IMAGES),
        }
        a = out["maps"][name]["all"]
        print(
            f"{name:28s} bbox mAP@0.5 {a['bbox']['map50']:.4f} ({a['bbox']['map50_95']:.4f})"
            f"  segm mAP@0.5 {a['segm']['map50']:.4f} ({a['segm']['map50_95']:.4f})"
        )
    items = list(detection.scenes("val", VAL_EVAL))
    out["annotations"] = sum(len(s.boxes) for s in items)
    return out


# --------------------------------------------------------------------------- rknn


def convert_all(work: Path) -> dict:
    """Convert digits-seg for every chip, copy the .rknn into the assets, run them int8."""
    from batchinfer import demo

    def measure(path: Path, platform: str) -> dict:
        return measure_rknn(path, work, full=platform == RKNN_FIRST)

    return demo_build.convert_all(demo.rknn_stems(segmenter=True), measure)


def measure_rknn(path: Path, work: Path, full: bool) -> dict:
    """Size; int8 (toolkit simulator) against float outputs; val results when ``full``."""
    canvases = [det.letterbox(scene.image)[0] for scene in detection.scenes("val", 8)]
    with demo_build.rknn_runner(path) as run:
        figures: dict = {
            "bytes": path.stat().st_size,
            "cosine_min": demo_build.worst_cosines(
                run, onnx_runner(ASSETS / MODEL), output_names(), canvases
            ),
        }
        if full:
            t0 = time.perf_counter()
            results = predictions(run, VAL_EVAL)
            figures["eval_s"] = time.perf_counter() - t0
            (work / f"results-{path.name}.json").write_text(json.dumps(results))
    return figures


# --------------------------------------------------------------------------- SEGMENTER.md


def segmenter_md(d: dict) -> str:
    """SEGMENTER.md from measured.json's "segmenter" section."""
    o, r, sc = d.get("onnx", {}), d.get("rknn"), d.get("score", {})
    maps = sc.get("maps", {})

    def map_line(name: str) -> str:
        if name not in maps:
            return "not scored yet (`python tools/build_demo_segmenter.py score`)"
        f = maps[name]["all"]
        return (
            f"bbox **mAP@0.5 {f['bbox']['map50']:.3f}**, mAP@0.5:0.95 "
            f"{f['bbox']['map50_95']:.3f}; segm **mAP@0.5 {f['segm']['map50']:.3f}**, "
            f"mAP@0.5:0.95 {f['segm']['map50_95']:.3f}"
        )

    rows = []
    for stem, f in (r or {}).get("models", {}).items():
        worst = min(f["cosine_min"].values())
        proto = f["cosine_min"]["proto"]
        rows.append(f"| `{stem}.rknn` | {f['bytes']:,} | {worst:.4f} | {proto:.4f} |")
    first = f"digits-seg-{RKNN_FIRST}.rknn"
    nan = float("nan")
    history = o.get("loss_history") or [{"mask": nan}]
    took = f"{o['train_s']:.0f} s ({o['train_cpu_s']:.0f} s CPU)" if "train_s" in o else "not yet"
    return f"""# The demo segmenter

Made by `tools/build_demo_segmenter.py` (`train` and `rknn` in the toolkit's environment,
which has torch; `score` in the project's, which has pycocotools); every figure here is in
`measured.json` under `"segmenter"`.

## Data
The synthetic digit scenes of the demo detector (`DETECTOR.md`,
`batchinfer.demo.detection`). A digit's mask is its glyph's own ink: the pixels the
pasted glyph covers with alpha >= {detection.INK_ALPHA} (`Scene.masks()`), the same pixels
its box is tight around. `batchinfer demo DIR` writes them, beside
`DIR/detection/instances.json`, as `DIR/detection/instances-seg.json`: the same COCO
annotations, each with `segmentation` (compressed RLE, `{{"size": [h, w], "counts": str}}`)
and `area` = the mask's pixels. Scored on the first {sc.get("images", VAL_EVAL)} val scenes
({sc.get("annotations", "?")} digits).

## digits-seg.onnx
- Input `images` float32 [1, 3, {INPUT}, {INPUT}] NCHW: RGB pixels / 255 of the image
  letterboxed to {INPUT}x{INPUT}, as `digits-det.onnx`.
- Outputs: rknn_model_zoo's yolov8_seg layout, 13 tensors: for strides 8, 16, 32 in turn
  `box_<s>` (1, 64, H, W) DFL logits, `cls_<s>` (1, 10, H, W) class scores after a sigmoid,
  `sum_<s>` (1, 1, H, W) their clipped sum, `coef_<s>` (1, {MASKS}, H, W) mask
  coefficients; then `proto` (1, {MASKS}, {PROTO}, {PROTO}), the prototypes at stride 4.
  `batchinfer.detect.seg_heads` recognises it as `yolov8-seg-zoo`.
- Graph: `digits-det.onnx` unchanged (its weights, frozen: the nine detector outputs are
  the detector's, max |difference| {o.get("detector_outputs_vs_digits_det_max_abs", nan):.1e}),
  plus per stride a coefficient branch (3x3 conv 48->32, ReLU, 1x1 conv to {MASKS}) and a
  prototype branch (the stride-8 map: 3x3 conv to 32, nearest 2x up, plus a 1x1 conv of the
  backbone's stride-4 map, 3x3 conv, 1x1 conv to {MASKS}); batch norm folded.
  {o.get("onnx_bytes", 0):,} bytes; ONNX Runtime against torch: max |difference|
  {o.get("onnx_vs_torch_max_abs", nan):.1e}.
- Training (the new branches only, {o.get("trained_params", 0):,} parameters): torch on
  {o.get("threads", "?")} CPU thread(s), seed {SEED}, {o.get("steps", STEPS)} steps of
  {o.get("batch", BATCH)} fresh letterboxed train scenes, AdamW lr {LEARNING_RATE}
  (25 warm-up steps, cosine), weight decay {WEIGHT_DECAY}; the positives of the detector's
  assignment (centre sampling), at most {MAX_POSITIVES} per batch; Ultralytics' mask loss
  (BCE of coefficients . prototypes against the ink fraction of each 4x4 block, inside the
  box, over its area). {took} on the shared build machine; last loss
  {history[-1]["mask"]:.3f}.
- Val, float (ONNX Runtime, decoded by batchinfer's `SegmentDecoder` at score >=
  {DECODE["conf"]}, class-aware NMS {DECODE["iou"]}, {DECODE["max_det"]} instances, masks as
  RLE in the original pixels; pycocotools): {map_line(MODEL)}.

## .rknn files
`digits-seg-<chip>.rknn` for rk3588, rk3576 and rk3566, converted from `digits-seg.onnx`
with `digits-seg-<chip>.config.json` (as the detector: `mean_values` 0, `std_values` 255,
int8 w8a8) on the detector's calibration scenes. Against the float model on 8 val scenes
(cosine per output, the worst over the 13 outputs and scenes, and the prototype's):

| file | bytes | worst cosine vs float | prototype |
|---|---|---|---|
{chr(10).join(rows) or "| not converted yet | | | |"}

Val, int8 ({first}, toolkit simulator, same decoding): {map_line(first)}.

`jobs/segment-digits.toml` scores this model with `batchinfer eval` (COCO segm beside
bbox, on the emulator against ONNX Runtime); `jobs/segment-digits-toolkit.toml` the int8
.rknn in rknn-toolkit2's simulator.
"""


# --------------------------------------------------------------------------- main

WORK = Path(__file__).resolve().parents[1] / "build" / "demo-segmenter"


def main() -> None:
    demo_build.main(
        __doc__,
        "segmenter",
        {"train": build_onnx, "rknn": convert_all, "score": score},
        WORK,
        lambda section, _: {"SEGMENTER.md": segmenter_md(section)},
    )


if __name__ == "__main__":
    main()
