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

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_demo_detector as det  # the detector this model extends

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

    class Segmenter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.det = Detector()
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

        def train(self, mode: bool = True):
            super().train(mode)
            self.det.eval()  # frozen: its batch norms keep the detector's statistics
            return self

    torch.manual_seed(SEED)
    model = Segmenter()
    load_detector(model.det, ASSETS / DETECTOR)
    for p in model.det.parameters():
        p.requires_grad_(False)
    return model


def load_detector(detector, path: Path) -> None:
    """Set ``detector``'s weights to those of the committed ONNX (batch norm folded there:
    here each norm becomes the identity, gamma 1, mean 0, var 1 - eps, beta the bias)."""
    import onnx
    import torch
    from onnx import numpy_helper

    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    state = detector.state_dict()
    for key in state:
        module, _, leaf = key.rpartition(".")
        name = module.replace(".", "_")
        if leaf == "weight" and f"{name}_w" in weights:  # a plain conv (the outputs)
            state[key] = torch.from_numpy(weights[f"{name}_w"].copy())
        elif leaf == "bias" and f"{name}_b" in weights:
            state[key] = torch.from_numpy(weights[f"{name}_b"].copy())
        elif module.endswith(".0") and leaf == "weight":  # conv of a ConvBnRelu
            state[key] = torch.from_numpy(weights[f"{name[:-2]}_w"].copy())
        elif module.endswith(".1"):  # its batch norm
            b = torch.from_numpy(weights[f"{name[:-2]}_b"].copy())
            state[key] = {
                "weight": torch.ones_like(b),
                "bias": b,
                "running_mean": torch.zeros_like(b),
                "running_var": torch.full_like(b, 1 - 1e-5),
            }.get(leaf, state[key])
    detector.load_state_dict(state)


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
    import math

    import torch

    torch.set_num_threads(det.THREADS)
    torch.use_deterministic_algorithms(True)
    model = build_torch_model()
    anchors = det.anchor_points()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    optimiser = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0}],
        lr=LEARNING_RATE,
    )
    warmup = 25
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda k: min(1.0, (k + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * k / steps)),
    )
    rng = np.random.default_rng(SEED)
    model.train()
    t0, cpu0 = time.perf_counter(), time.process_time()
    history, running = [], 0.0
    for step in range(steps):
        images, targets, scenes, placed = det.placed_batch(step, BATCH)
        outs, proto = model(det.to_input(images))
        loss = mask_loss(outs, proto, targets, mask_targets(scenes, placed), anchors, rng)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optimiser.step()
        schedule.step()
        running += float(loss.detach())
        if (step + 1) % log_every == 0:
            history.append({"step": step + 1, "mask": running / log_every})
            running = 0.0
            print(
                f"step {step + 1:5d} mask {history[-1]['mask']:.4f}"
                f"  {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    figures = {
        "steps": steps,
        "batch": BATCH,
        "images_seen": steps * BATCH,
        "threads": det.THREADS,
        "trained_params": sum(p.numel() for p in params),
        "train_s": time.perf_counter() - t0,
        "train_cpu_s": time.process_time() - cpu0,
        "loss_history": history,
    }
    model.eval()
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
    import onnx
    import torch

    weights = work / "weights.pt"
    if weights.is_file():
        figures = json.loads((work / "train.json").read_text())
        print(f"reusing {weights} (delete it to train again)")
    else:
        work.mkdir(parents=True, exist_ok=True)
        model, figures = train()
        torch.save(model.state_dict(), weights)
        (work / "train.json").write_text(json.dumps(figures, indent=1) + "\n")
    model = build_torch_model()
    model.load_state_dict(torch.load(weights))
    model.eval()
    proto = export_onnx(model.state_dict())
    onnx.save(proto, ASSETS / MODEL)
    figures["onnx_vs_torch_max_abs"] = check_export(proto, model)
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
    from batchinfer.detect.letterbox import Letterbox
    from batchinfer.detect.seg_decode import SegmentDecoder
    from batchinfer.detect.seg_heads import recognise_segment

    decoder = None
    results = []
    for image_id, scene in enumerate(detection.scenes("val", n), start=1):
        h, w = scene.image.shape[:2]
        canvas, scale, px, py = det.letterbox(scene.image)
        outputs = run(canvas)
        if decoder is None:
            head = recognise_segment((INPUT, INPUT), [o.shape for o in outputs])
            if head is None or head.family != "yolov8-seg-zoo":
                raise SystemExit(f"seg_heads did not recognise {MODEL} as yolov8-seg-zoo")
            decoder = SegmentDecoder(head, (INPUT, INPUT), DetectSettings(**DECODE))
        found = decoder.decode(outputs, Letterbox(w, h, scale, px, py))
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
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    items = [(f"{i:05d}.png", s) for i, s in enumerate(detection.scenes("val", n))]
    gt = COCO()
    gt.dataset = detection.coco_instances(items, masks=True)
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        dt = gt.loadRes(results) if results else None
        for kind in ("bbox", "segm"):
            ev = COCOeval(gt, dt, kind)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            out[kind] = {"map50": float(ev.stats[1]), "map50_95": float(ev.stats[0])}
    return out


def onnx_runner(path: Path):
    session = det.ort_session(path)
    names = output_names()

    def run(canvas: np.ndarray) -> list[np.ndarray]:
        x = (canvas.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)
        return session.run(names, {"images": x})

    return run


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
    import build_demo_assets  # the classifier's conversion: config, load_onnx, build, export

    from batchinfer import demo
    from batchinfer.runtime.toolkit import CACHE_ENV, toolkit_version

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "cache")
        for stem, (_, platform) in demo.rknn_stems(segmenter=True).items():
            folder = Path(tmp) / stem
            folder.mkdir()
            path = build_demo_assets.convert(stem, folder)
            shutil.copyfile(path, ASSETS / path.name)
            figures[stem] = measure_rknn(path, work, full=platform == RKNN_FIRST)
            print(f"{stem:24s} {figures[stem]}", flush=True)
    return {"toolkit": toolkit_version(), "models": figures}


def measure_rknn(path: Path, work: Path, full: bool) -> dict:
    """Size; int8 (toolkit simulator) against float outputs; val results when ``full``."""
    from batchinfer.runtime.toolkit import RKNNLite

    rknn = RKNNLite()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if rknn.load_rknn(str(path)) != 0 or rknn.init_runtime() != 0:
            raise SystemExit(f"the toolkit backend could not run {path}")
    try:

        def run(canvas: np.ndarray) -> list[np.ndarray]:
            return rknn.inference(inputs=[canvas[None]])

        float_run = onnx_runner(ASSETS / MODEL)
        cosines: dict[str, list[float]] = {name: [] for name in output_names()}
        for scene in detection.scenes("val", 8):
            canvas = det.letterbox(scene.image)[0]
            for name, q, f in zip(output_names(), run(canvas), float_run(canvas), strict=True):
                q, f = q.ravel().astype(np.float64), f.ravel().astype(np.float64)
                norms = np.linalg.norm(q) * np.linalg.norm(f)
                if norms > 0:  # an int8 output all 0 (the float one near 0) has no direction
                    cosines[name].append(float(q @ f / norms))
        figures: dict = {
            "bytes": path.stat().st_size,
            "cosine_min": {k: min(v) for k, v in cosines.items()},
        }
        if full:
            t0 = time.perf_counter()
            results = predictions(run, VAL_EVAL)
            figures["eval_s"] = time.perf_counter() - t0
            (work / f"results-{path.name}.json").write_text(json.dumps(results))
    finally:
        rknn.release()
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

There is no `jobs/segment-digits.toml` yet: `batchinfer eval` has no segment task
(issue 41, item 2); this model and `instances-seg.json` are what it will score.
"""


# --------------------------------------------------------------------------- main

WORK = Path(__file__).resolve().parents[1] / "build" / "demo-segmenter"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("train", "rknn", "score"))
    parser.add_argument("--work", type=Path, default=WORK, help=f"scratch folder ({WORK})")
    args = parser.parse_args()
    measured_path = ASSETS / "measured.json"
    measured = json.loads(measured_path.read_text()) if measured_path.is_file() else {}
    section = measured.setdefault("segmenter", {})
    args.work.mkdir(parents=True, exist_ok=True)
    if args.mode == "train":
        section["onnx"] = build_onnx(args.work)
    elif args.mode == "rknn":
        section["rknn"] = convert_all(args.work)
    else:
        section["score"] = score(args.work)
    measured_path.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    (ASSETS / "SEGMENTER.md").write_text(segmenter_md(section))
    print(f"wrote {measured_path} and {ASSETS / 'SEGMENTER.md'}")


if __name__ == "__main__":
    main()
