"""Build the demo detector: train a tiny YOLOv8-style model on the synthetic digit scenes.

    python tools/build_demo_detector.py train   # toolkit env (torch): train, export ONNX
    python tools/build_demo_detector.py rknn    # toolkit env: convert to .rknn, run int8
    python tools/build_demo_detector.py score   # project env: COCO mAP of what was run

``train`` and ``rknn`` need torch / rknn-toolkit2, so they run in the toolkit's environment
(``bash tools/toolkit-env.sh``; torch is never a runtime dependency of batchinfer);
``score`` needs pycocotools, which the project's dev environment has.

The model (``digits-det.onnx``, input float NCHW [1, 3, 256, 256] = RGB pixels / 255,
letterboxed): a plain conv backbone to strides 8/16/32, an FPN-lite top-down neck and a
YOLOv8-style decoupled head (per stride: 4 x 16 DFL bins for the box, 10 class logits).
Its outputs are rknn_model_zoo's YOLOv8 layout, nine tensors, strides 8, 16, 32 in turn:
box (1, 64, H, W) raw DFL logits, class scores (1, 10, H, W) after a sigmoid in the graph,
score sum (1, 1, H, W) = clip(sum of the class scores, 0, 1), the quick filter the model
zoo's C demo reads. The ONNX graph is written node by node from the trained weights
(batch norm folded into the convolutions), as tools/build_demo_assets.py writes its models.

Training is deterministic for a given machine and thread count (fixed seeds, fresh scenes
generated from seeds each step, no data loader workers). Every figure measured lands in
``measured.json`` under ``"detector"``; ``score`` writes the mAPs.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo_build

from batchinfer.demo import ASSETS, DETECTOR_CALIBRATION, RKNN_PLATFORMS, detection

INPUT = detection.DETECTOR_INPUT  # 256: the 160-320 px canvases letterbox at 0.8-1.6x
STRIDES = (8, 16, 32)
REG_MAX = 16  # DFL bins per side, as YOLOv8
CLASSES = 10
PAD = 114  # letterbox grey (the model zoo pads with 0 in Python and 114 in C: both trained)

SEED = 0
STEPS = 800
BATCH = 16
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 5e-4
THREADS = 1  # the build machine is shared: one thread is steadier than two under load
CENTRE_RADIUS = 2.5  # positives: anchor points within this many strides of a box centre
# Objects go to the levels whose size range holds their longer side (input pixels).
LEVEL_RANGES = ((0, 48), (24, 96), (64, 10_000))
LOSS_WEIGHTS = {"cls": 1.0, "iou": 2.5, "dfl": 0.5}

OPSET = 17
IR_VERSION = 8
MODEL = "digits-det.onnx"
RKNN_FIRST = RKNN_PLATFORMS[0]  # the chip whose .rknn is scored on the whole val split
CALIBRATION_IMAGES = 64  # train scenes, letterboxed, for rknn.build's quantisation
VAL_EVAL = detection.VAL_IMAGES


# --------------------------------------------------------------------------- data


def letterbox(image: np.ndarray, pad: int = PAD) -> tuple[np.ndarray, float, int, int]:
    """Return (the INPUT x INPUT canvas, scale, pad_x, pad_y): aspect kept, centred."""
    return detection.letterbox(image, INPUT, pad)


def train_batch(step: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Batch ``step``: BATCH fresh train scenes letterboxed; boxes (n, 5) cls x1 y1 x2 y2."""
    return placed_batch(step)[:2]


def placed_batch(step: int, batch: int = BATCH):
    """Batch ``step`` of ``batch`` scenes: (canvases (N, 256, 256, 3) uint8, boxes per scene
    (n, 5) cls x1 y1 x2 y2 on the canvas, the scenes, their (scale, pad_x, pad_y))."""
    images, targets, placed = [], [], []
    scenes = list(detection.scenes("train", batch, seed=SEED, start=step * batch))
    for scene in scenes:
        pad = PAD if (step + len(images)) % 2 else 0
        canvas, scale, px, py = letterbox(scene.image, pad)
        boxes = scene.boxes * scale + np.array([px, py, px, py], np.float32)
        images.append(canvas)
        targets.append(np.concatenate([scene.labels[:, None].astype(np.float32), boxes], 1))
        placed.append((scale, px, py))
    return np.stack(images), targets, scenes, placed


# --------------------------------------------------------------------------- model


def build_torch_model():
    """The untrained Detector, seeded."""
    import torch

    torch.manual_seed(SEED)
    return torch_classes()[1]()


def torch_classes():
    """(ConvBnRelu, Detector): the torch modules (torch is imported only when training)."""
    from torch import nn

    class ConvBnRelu(nn.Sequential):
        def __init__(self, cin: int, cout: int, k: int = 3, s: int = 1):
            super().__init__(
                nn.Conv2d(cin, cout, k, s, k // 2, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

    class Detector(nn.Module):
        """Backbone to strides 8/16/32, FPN-lite, decoupled YOLOv8 head (DFL box, classes)."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(ConvBnRelu(3, 16, s=2), ConvBnRelu(16, 32, s=2))
            self.c3 = nn.Sequential(ConvBnRelu(32, 48, s=2), ConvBnRelu(48, 48))
            self.c4 = nn.Sequential(ConvBnRelu(48, 64, s=2), ConvBnRelu(64, 64))
            self.c5 = nn.Sequential(ConvBnRelu(64, 96, s=2), ConvBnRelu(96, 96))
            width = 48
            self.lat = nn.ModuleList(ConvBnRelu(c, width, k=1) for c in (48, 64, 96))
            self.smooth = nn.ModuleList(ConvBnRelu(width, width) for _ in STRIDES)
            self.box_stem = nn.ModuleList(ConvBnRelu(width, width) for _ in STRIDES)
            self.cls_stem = nn.ModuleList(ConvBnRelu(width, width) for _ in STRIDES)
            self.box_out = nn.ModuleList(nn.Conv2d(width, 4 * REG_MAX, 1) for _ in STRIDES)
            self.cls_out = nn.ModuleList(nn.Conv2d(width, CLASSES, 1) for _ in STRIDES)
            for conv in self.cls_out:
                nn.init.constant_(conv.bias, -math.log((1 - 0.01) / 0.01))
            for conv in self.box_out:
                nn.init.constant_(conv.bias, 1.0)

        def features(self, x):
            """(the stem's stride-4 map, the neck's smoothed maps at strides 8, 16, 32)."""
            c2 = self.stem(x)
            c3 = self.c3(c2)
            c4 = self.c4(c3)
            c5 = self.c5(c4)
            p5 = self.lat[2](c5)
            p4 = self.lat[1](c4) + nn.functional.interpolate(p5, scale_factor=2.0)
            p3 = self.lat[0](c3) + nn.functional.interpolate(p4, scale_factor=2.0)
            return c2, [self.smooth[i](p) for i, p in enumerate((p3, p4, p5))]

        def heads(self, ps):
            """Per stride: (box logits (N, 64, H, W), class logits (N, 10, H, W))."""
            return [
                (self.box_out[i](self.box_stem[i](p)), self.cls_out[i](self.cls_stem[i](p)))
                for i, p in enumerate(ps)
            ]

        def forward(self, x):
            return self.heads(self.features(x)[1])

    return ConvBnRelu, Detector


def anchor_points() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centres (A, 2) in input pixels, stride per anchor (A,), level per anchor (A,))."""
    centres, strides, levels = [], [], []
    for level, s in enumerate(STRIDES):
        n = INPUT // s
        ys, xs = np.mgrid[0:n, 0:n]
        centres.append(np.stack([(xs.ravel() + 0.5) * s, (ys.ravel() + 0.5) * s], 1))
        strides.append(np.full(n * n, s))
        levels.append(np.full(n * n, level))
    return (
        np.concatenate(centres).astype(np.float32),
        np.concatenate(strides).astype(np.float32),
        np.concatenate(levels),
    )


def assign(targets: list[np.ndarray], centres: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Per image and anchor, the index of its box (-1: background): centre sampling.

    An anchor is positive for a box when its centre lies inside the box, within
    CENTRE_RADIUS strides of the box's centre, on a level whose LEVEL_RANGES hold the
    box's longer side; among several boxes the smallest wins. Every box gets at least the
    anchor nearest its centre on its best level.
    """
    strides = np.asarray(STRIDES, np.float32)[levels]
    out = np.full((len(targets), len(centres)), -1, np.int64)
    for b, t in enumerate(targets):
        if not len(t):
            continue
        x1, y1, x2, y2 = t[:, 1], t[:, 2], t[:, 3], t[:, 4]
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        size = np.maximum(x2 - x1, y2 - y1)
        area = (x2 - x1) * (y2 - y1)
        px, py = centres[:, 0:1], centres[:, 1:2]  # (A, 1) against (n,)
        inside = (px > x1) & (px < x2) & (py > y1) & (py < y2)
        near = (np.abs(px - cx) < CENTRE_RADIUS * strides[:, None]) & (
            np.abs(py - cy) < CENTRE_RADIUS * strides[:, None]
        )
        lo = np.array([r[0] for r in LEVEL_RANGES], np.float32)[levels][:, None]
        hi = np.array([r[1] for r in LEVEL_RANGES], np.float32)[levels][:, None]
        in_range = (size >= lo) & (size < hi)
        ok = inside & near & in_range
        # Nearest anchor on the best level (the finest whose range holds the box).
        for j in range(len(t)):
            level = next(i for i, (a, z) in enumerate(LEVEL_RANGES) if a <= size[j] < z)
            mask = levels == level
            d = (px[mask, 0] - cx[j]) ** 2 + (py[mask, 0] - cy[j]) ** 2
            ok[np.flatnonzero(mask)[np.argmin(d)], j] = True
        cost = np.where(ok, area[None, :], np.inf)
        best = cost.argmin(1)
        positive = np.isfinite(cost[np.arange(len(centres)), best])
        out[b, positive] = best[positive]
    return out


def flatten_outputs(outs):
    """(box logits (N, A, 64), class logits (N, A, 10)) over all levels, row-major cells."""
    import torch

    box = torch.cat([o[0].flatten(2) for o in outs], 2).transpose(1, 2)
    cls = torch.cat([o[1].flatten(2) for o in outs], 2).transpose(1, 2)
    return box, cls


def dfl_distances(box_logits):
    """Expected ltrb distances in strides from DFL logits (..., 64) -> (..., 4)."""
    import torch

    p = box_logits.unflatten(-1, (4, REG_MAX)).softmax(-1)
    return (p * torch.arange(REG_MAX, dtype=p.dtype)).sum(-1)


def losses(outs, targets, anchors) -> dict:
    """The three losses of a batch: BCE on classes, GIoU and DFL on positives' boxes."""
    import torch
    import torch.nn.functional as F

    centres, strides, levels = anchors
    box, cls = flatten_outputs(outs)
    match = assign(targets, centres, levels)
    pos = torch.from_numpy(match >= 0)
    n_pos = max(int(pos.sum()), 1)
    cls_target = torch.zeros_like(cls)
    gt_boxes = torch.zeros((*match.shape, 4))
    for b, t in enumerate(targets):
        m = match[b]
        idx = np.flatnonzero(m >= 0)
        if len(idx):
            tb = torch.from_numpy(t[m[idx]])
            cls_target[b, idx, tb[:, 0].long()] = 1.0
            gt_boxes[b, idx] = tb[:, 1:]
    cls_loss = F.binary_cross_entropy_with_logits(cls, cls_target, reduction="sum") / n_pos
    if not pos.any():
        zero = box.sum() * 0
        return {"cls": cls_loss, "iou": zero, "dfl": zero}
    c = torch.from_numpy(centres)[None].expand(len(targets), -1, -1)[pos]
    s = torch.from_numpy(strides)[None].expand(len(targets), -1)[pos][:, None]
    g = gt_boxes[pos]
    pred_logits = box[pos]
    d = dfl_distances(pred_logits)
    pred = torch.cat([c - d[:, :2] * s, c + d[:, 2:] * s], 1)
    iou_loss = (1 - generalised_iou(pred, g)).mean()
    target_d = torch.cat([c - g[:, :2], g[:, 2:] - c], 1) / s
    target_d = target_d.clamp(0, REG_MAX - 1 - 0.01)
    left = target_d.floor().long()
    w_right = target_d - left
    logits = pred_logits.unflatten(-1, (4, REG_MAX))
    logp = logits.log_softmax(-1)
    dfl = -(
        logp.gather(-1, left[..., None])[..., 0] * (1 - w_right)
        + logp.gather(-1, (left + 1)[..., None])[..., 0] * w_right
    ).mean()
    return {"cls": cls_loss, "iou": iou_loss, "dfl": dfl}


def generalised_iou(a, b):
    """GIoU of matching rows of two (n, 4) x1 y1 x2 y2 tensors."""
    import torch

    inter_w = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp(min=0)
    inter_h = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp(min=0)
    inter = inter_w * inter_h
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a + area_b - inter + 1e-7
    hull_w = torch.maximum(a[:, 2], b[:, 2]) - torch.minimum(a[:, 0], b[:, 0])
    hull_h = torch.maximum(a[:, 3], b[:, 3]) - torch.minimum(a[:, 1], b[:, 1])
    hull = hull_w * hull_h + 1e-7
    return inter / union - (hull - union) / hull


def to_input(images: np.ndarray):
    """uint8 (N, H, W, 3) -> float NCHW / 255, the model's input."""
    import torch

    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0


def train(steps: int = STEPS, log_every: int = 25):
    """Return the trained model and the training figures."""
    import torch

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    model = build_torch_model()
    anchors = anchor_points()
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim == 1 else decay).append(p)
    optimiser = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0}],
        lr=LEARNING_RATE,
    )
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda k: min(1.0, (k + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * k / steps)),
    )
    model.train()
    t0, cpu0 = time.perf_counter(), time.process_time()
    history = []
    running = {}
    for step in range(steps):
        images, targets = train_batch(step)
        parts = losses(model(to_input(images)), targets, anchors)
        loss = sum(LOSS_WEIGHTS[k] * v for k, v in parts.items())
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimiser.step()
        schedule.step()
        for k, v in parts.items():
            running[k] = running.get(k, 0.0) + float(v)
        if (step + 1) % log_every == 0:
            mean = {k: v / log_every for k, v in running.items()}
            history.append({"step": step + 1, **mean})
            running = {}
            print(
                f"step {step + 1:5d} "
                + " ".join(f"{k} {v:.4f}" for k, v in mean.items())
                + f"  {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    figures = {
        "steps": steps,
        "batch": BATCH,
        "images_seen": steps * BATCH,
        "threads": THREADS,
        "train_s": time.perf_counter() - t0,
        "train_cpu_s": time.process_time() - cpu0,
        "loss_history": history,
    }
    model.eval()
    return model, figures


# --------------------------------------------------------------------------- ONNX export


def _fold(state: dict, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of the Conv + BatchNorm at ``prefix`` with the norm folded in."""
    w = state[f"{prefix}.0.weight"].double().numpy()
    gamma = state[f"{prefix}.1.weight"].double().numpy()
    beta = state[f"{prefix}.1.bias"].double().numpy()
    mean = state[f"{prefix}.1.running_mean"].double().numpy()
    var = state[f"{prefix}.1.running_var"].double().numpy()
    k = gamma / np.sqrt(var + 1e-5)  # torch's BatchNorm2d eps
    return (w * k[:, None, None, None]).astype(np.float32), (beta - mean * k).astype(np.float32)


def output_names() -> list[str]:
    """The nine outputs, model-zoo order: per stride box, class scores, score sum."""
    return [f"{kind}_{s}" for s in STRIDES for kind in ("box", "cls", "sum")]


class GraphWriter:
    """Writes ONNX nodes and initialisers from a torch state dict (batch norm folded)."""

    def __init__(self, state: dict) -> None:
        from onnx import numpy_helper

        self.state = state
        self.nodes: list = []
        self.inits: list = []
        for name, value in (
            ("up_scales", np.array([1, 1, 2, 2], np.float32)),
            ("sum_axes", np.array([1], np.int64)),
            ("zero", np.float32(0.0)),
            ("one", np.float32(1.0)),
        ):
            self.inits.append(numpy_helper.from_array(value, name))

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def conv(self, x: str, prefix: str, stride: int = 1, relu: bool = True, out: str = "") -> str:
        """Conv (+ folded BN) (+ Relu) of the module at ``prefix``; its output's name."""
        from onnx import numpy_helper

        state = self.state
        if f"{prefix}.0.weight" in state:
            w, b = _fold(state, prefix)
        else:
            w = state[f"{prefix}.weight"].numpy()
            b = state[f"{prefix}.bias"].numpy()
        k = w.shape[-1]
        name = prefix.replace(".", "_")
        self.inits.append(numpy_helper.from_array(w, f"{name}_w"))
        self.inits.append(numpy_helper.from_array(b, f"{name}_b"))
        y = out if out and not relu else f"{name}_conv"
        self.node(
            "Conv",
            [x, f"{name}_w", f"{name}_b"],
            y,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[k // 2] * 4,
        )
        if not relu:
            return y
        return self.node("Relu", [y], f"{name}_relu")

    def up(self, x: str, name: str) -> str:
        """Nearest 2x upsampling (torch's interpolate(scale_factor=2))."""
        return self.node(
            "Resize",
            [x, "", "up_scales"],
            name,
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )

    def features(self, prefix: str = "") -> tuple[str, list[str]]:
        """The Detector's backbone and neck from the input ``images``: (stride-4 map, the
        neck's maps at strides 8/16/32 before their smoothing, which detection_head adds);
        ``prefix`` is where the Detector sits in the state."""
        conv = self.conv
        c2 = conv(conv("images", f"{prefix}stem.0", 2), f"{prefix}stem.1", 2)
        c3 = conv(conv(c2, f"{prefix}c3.0", 2), f"{prefix}c3.1")
        c4 = conv(conv(c3, f"{prefix}c4.0", 2), f"{prefix}c4.1")
        c5 = conv(conv(c4, f"{prefix}c5.0", 2), f"{prefix}c5.1")
        p5 = conv(c5, f"{prefix}lat.2")
        self.node("Add", [conv(c4, f"{prefix}lat.1"), self.up(p5, "p5_up")], "p4")
        self.node("Add", [conv(c3, f"{prefix}lat.0"), self.up("p4", "p4_up")], "p3")
        return c2, ["p3", "p4", p5]

    def detection_head(self, p: str, i: int, s: int, prefix: str = "", scores: bool = True) -> str:
        """Stride ``s``'s box_<s>, cls_<s> (sigmoid) and sum_<s> (clipped class sum) from
        the neck's map ``p`` (smoothed here first); the smoothed map's name. Without
        ``scores``: box_<s> and the class logits cls_logits_<s> only (the zoo's pose head)."""
        conv = self.conv
        p = conv(p, f"{prefix}smooth.{i}")
        conv(conv(p, f"{prefix}box_stem.{i}"), f"{prefix}box_out.{i}", relu=False, out=f"box_{s}")
        cls_out = f"{prefix}cls_out.{i}"
        if not scores:
            conv(conv(p, f"{prefix}cls_stem.{i}"), cls_out, relu=False, out=f"cls_logits_{s}")
            return p
        logits = conv(conv(p, f"{prefix}cls_stem.{i}"), cls_out, relu=False)
        self.node("Sigmoid", [logits], f"cls_{s}")
        self.node("ReduceSum", [f"cls_{s}", "sum_axes"], f"cls_sum_{s}", keepdims=1)
        self.node("Clip", [f"cls_sum_{s}", "zero", "one"], f"sum_{s}")
        return p

    def model(self, name: str, outputs: list[tuple[str, list[int]]], doc: str, producer: str):
        """The checked ModelProto of the nodes written, input ``images``, ``outputs``."""
        import onnx
        from onnx import TensorProto, helper

        image = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, INPUT, INPUT])
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs]
        used = {i for n in self.nodes for i in n.input}  # the shared constants a graph uses
        inits = [t for t in self.inits if t.name in used]
        graph = helper.make_graph(self.nodes, name, [image], outs, inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=producer,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def export_onnx(state: dict):
    """Return digits-det.onnx (an onnx.ModelProto) written node by node from ``state``."""
    g = GraphWriter(state)
    for i, (p, s) in enumerate(zip(g.features()[1], STRIDES, strict=True)):
        g.detection_head(p, i, s)
    outputs = []
    for s in STRIDES:
        n = INPUT // s
        for kind, channels in (("box", 4 * REG_MAX), ("cls", CLASSES), ("sum", 1)):
            outputs.append((f"{kind}_{s}", [1, channels, n, n]))
    return g.model(
        "digits_det",
        outputs,
        doc=(
            "Demo digit detector: float NCHW [1,3,256,256] RGB/255, letterboxed; outputs in "
            "rknn_model_zoo's YOLOv8 layout (box DFL logits, class sigmoid, score sum per "
            "stride 8/16/32); see batchinfer/demo/assets/MODELS.md."
        ),
        producer="batchinfer tools/build_demo_detector.py",
    )


def check_export(model_proto, torch_model, n: int = 4) -> float:
    """Max |ONNX - torch| over the nine outputs on ``n`` val scenes (torch in eval mode)."""
    import torch

    session = ort_session(model_proto)
    worst = 0.0
    for scene in detection.scenes("val", n):
        x = to_input(letterbox(scene.image)[0][None])
        with torch.no_grad():
            ref = []
            for box, cls in torch_model(x):
                probs = cls.sigmoid()
                ref += [box, probs, probs.sum(1, keepdim=True).clamp(0, 1)]
        got = session.run(output_names(), {"images": x.numpy()})
        worst = max(
            worst, *(float(np.abs(g - r.numpy()).max()) for g, r in zip(got, ref, strict=True))
        )
    return worst


def ort_session(model):
    """A one-thread onnxruntime session for a ModelProto or a path."""
    return demo_build.ort_session(model)


# --------------------------------------------------------------------------- decoding


def decode(outputs: list[np.ndarray], conf: float = 0.001, iou: float = 0.6, max_det: int = 100):
    """(boxes (n, 4) input pixels, scores, classes) from the nine outputs, model-zoo style.

    Per cell: the DFL expectation of each side's 16 bins, the best class and its score;
    kept above ``conf``, then class-aware NMS at ``iou``, at most ``max_det``.
    """
    boxes, scores, classes = [], [], []
    for level, s in enumerate(STRIDES):
        box, cls = outputs[3 * level][0], outputs[3 * level + 1][0]
        n = box.shape[-1]
        logits = box.reshape(4, REG_MAX, n * n)
        e = np.exp(logits - logits.max(1, keepdims=True))
        d = (e / e.sum(1, keepdims=True) * np.arange(REG_MAX)[None, :, None]).sum(1)  # (4, A)
        ys, xs = np.mgrid[0:n, 0:n]
        gx, gy = xs.ravel() + 0.5, ys.ravel() + 0.5
        xyxy = np.stack([gx - d[0], gy - d[1], gx + d[2], gy + d[3]], 1) * s
        c = cls.reshape(CLASSES, n * n)
        best = c.argmax(0)
        score = c[best, np.arange(n * n)]
        keep = score > conf
        boxes.append(xyxy[keep])
        scores.append(score[keep])
        classes.append(best[keep])
    boxes, scores, classes = (np.concatenate(v) for v in (boxes, scores, classes))
    keep = nms(boxes + classes[:, None] * 4 * INPUT, scores, iou)[:max_det]
    return boxes[keep], scores[keep], classes[keep]


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Indices kept by greedy NMS, by score descending."""
    order = np.argsort(-scores, kind="stable")
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while len(order):
        i, rest = order[0], order[1:]
        keep.append(i)
        w = np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0])
        h = np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1])
        inter = np.clip(w, 0, None) * np.clip(h, 0, None)
        order = rest[inter / (area[i] + area[rest] - inter + 1e-9) <= iou]
    return np.asarray(keep, np.int64)


def coco_results(run, n: int = VAL_EVAL) -> list[dict]:
    """COCO result dicts of ``run(canvas uint8 (256, 256, 3)) -> nine outputs`` on val."""
    results = []
    for image_id, scene in enumerate(detection.scenes("val", n), start=1):
        h, w = scene.image.shape[:2]
        canvas, scale, px, py = letterbox(scene.image)
        boxes, scores, classes = decode(run(canvas))
        boxes = (boxes - np.array([px, py, px, py])) / scale
        boxes = np.clip(boxes, 0, [w, h, w, h])
        for (x1, y1, x2, y2), score, c in zip(boxes, scores, classes, strict=True):
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(c),
                    "bbox": [round(float(v), 3) for v in (x1, y1, x2 - x1, y2 - y1)],
                    "score": round(float(score), 5),
                }
            )
    return results


def onnx_runner(path: Path) -> demo_build.Runner:
    return demo_build.onnx_runner(path, output_names())


# --------------------------------------------------------------------------- main: train


def build_onnx(work: Path) -> dict:
    """Train (or reuse work/weights.pt), export digits-det.onnx and its settings files."""
    from batchinfer import demo

    figures, _ = demo_build.export(work, train, build_torch_model, export_onnx, check_export, MODEL)
    for platform in demo.RKNN_PLATFORMS:
        path = ASSETS / f"digits-det-{platform}.config.json"
        path.write_text(settings_json(detector_settings(platform)))
    return figures


def detector_settings(platform: str) -> dict:
    """The rknn.config() arguments: pixels / 255 on the NPU (mean 0, std 255), int8."""
    return {
        "mean_values": [[0, 0, 0]],
        "std_values": [[255, 255, 255]],
        "target_platform": platform,
        "quantized_dtype": "w8a8",
    }


def settings_json(settings: dict) -> str:
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in settings.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


# --------------------------------------------------------------------------- main: rknn


def convert_all(work: Path) -> dict:
    """Convert digits-det for every chip, copy the .rknn into the assets, run them int8."""
    from batchinfer import demo

    def measure(path: Path, platform: str) -> dict:
        return measure_rknn(path, work, full=platform == RKNN_FIRST)

    return demo_build.convert_all(demo.rknn_stems(detector=True), measure)


def measure_rknn(path: Path, work: Path, full: bool) -> dict:
    """Size; int8 (toolkit simulator) against float outputs; val results when ``full``."""
    canvases = [letterbox(scene.image)[0] for scene in detection.scenes("val", 16)]
    with demo_build.rknn_runner(path) as run:
        figures = {
            "bytes": path.stat().st_size,
            "cosine_min": demo_build.worst_cosines(
                run, onnx_runner(ASSETS / MODEL), output_names(), canvases
            ),
        }
        if full:
            t0 = time.perf_counter()
            results = coco_results(run)
            figures["eval_s"] = time.perf_counter() - t0
            (work / f"results-{path.name}.json").write_text(json.dumps(results))
    return figures


# --------------------------------------------------------------------------- main: score


def score(work: Path) -> dict:
    """COCO mAP (pycocotools) on the val split of the float model and every results-*.json.

    The int8 results (``results-<stem>.rknn.json``) come from ``rknn`` mode.
    """
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    # The float model's results are made here, in the environment the tests run in.
    (work / f"results-{MODEL}.json").write_text(
        json.dumps(coco_results(onnx_runner(ASSETS / MODEL)))
    )
    items = [(f"{i:05d}.png", s) for i, s in enumerate(detection.scenes("val", VAL_EVAL))]
    with tempfile.TemporaryDirectory() as tmp:
        gt_path = Path(tmp) / "instances.json"
        gt_path.write_text(json.dumps(detection.coco_instances(items)))
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(str(gt_path))
        out = {}
        for path in sorted(work.glob("results-*.json")):
            name = path.name.removeprefix("results-").removesuffix(".json")
            with contextlib.redirect_stdout(io.StringIO()):
                dt = gt.loadRes(str(path))
                ev = COCOeval(gt, dt, "bbox")
                ev.evaluate()
                ev.accumulate()
                ev.summarize()
            out[name] = {"map50": float(ev.stats[1]), "map50_95": float(ev.stats[0])}
            print(f"{name:28s} mAP@0.5 {ev.stats[1]:.4f}  mAP@0.5:0.95 {ev.stats[0]:.4f}")
    return {"images": VAL_EVAL, "annotations": sum(len(s.boxes) for _, s in items), "maps": out}


WORK = Path(__file__).resolve().parents[1] / "build" / "demo-detector"


def pages(section: dict, measured: dict) -> dict[str, str]:
    """DETECTOR.md and MODELS.md (the model's figures measured again first)."""
    import build_demo_assets

    section["model"] = model_figures()
    return {"DETECTOR.md": detector_md(section), "MODELS.md": build_demo_assets.models_md(measured)}


def main() -> None:
    modes = {"train": build_onnx, "rknn": convert_all, "score": score}
    demo_build.main(__doc__, "detector", modes, WORK, pages)


# --------------------------------------------------------------------------- DETECTOR.md


def model_figures() -> dict:
    """Parameters, MACs and the emulator's npu_ms estimate of the committed ONNX."""
    import onnx

    from batchinfer.runtime import timing

    model = onnx.load(ASSETS / MODEL)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    work = timing.count_work(model, {"images": [1, 3, INPUT, INPUT]})
    return {
        "params": params,
        "gmac": work.macs / 1e9,
        "npu_ms_estimate": timing.predict(work),
        "uncounted_ops": list(work.uncounted),
        "ops": sorted({n.op_type for n in model.graph.node}),
    }


def detector_md(d: dict) -> str:
    """DETECTOR.md from measured.json's "detector" section."""
    o, r, sc = d["onnx"], d.get("rknn"), d.get("score", {})
    maps = sc.get("maps", {})
    m = d.get("model") or model_figures()

    def map_line(name: str) -> str:
        if name not in maps:
            return "not scored yet (`python tools/build_demo_detector.py score`)"
        f = maps[name]
        return f"**mAP@0.5 {f['map50']:.3f}**, mAP@0.5:0.95 {f['map50_95']:.3f}"

    rows = []
    if r:
        for stem, f in r["models"].items():
            worst = min(f["cosine_min"].values())
            rows.append(f"| `{stem}.rknn` | {f['bytes']:,} | {worst:.4f} |")
    first = f"digits-det-{RKNN_FIRST}.rknn"
    last = o["loss_history"][-1]
    D = detection
    canvas = f"{D.CANVAS_MIN}-{D.CANVAS_MAX} px"
    digits = f"1-{D.MAX_DIGITS} digits each, {D.DIGIT_MIN}-{D.DIGIT_MAX} px"
    work = (
        f"{m['params']:,} parameters, {m['gmac']:.3f} GMAC; ops {', '.join(m['ops'])}; "
        f"the emulator's npu_ms estimate {m['npu_ms_estimate']:.2f} ms"
    )
    size = f"{o['onnx_bytes']:,} bytes; opset {OPSET}, ir_version {IR_VERSION}"
    steps = f"{o['steps']} steps of {o['batch']} fresh letterboxed train scenes"
    weights = "/".join(str(LOSS_WEIGHTS[k]) for k in ("cls", "iou", "dfl"))
    took = f"{o['train_s']:.0f} s ({o['train_cpu_s']:.0f} s CPU)"
    losses_end = f"cls {last['cls']:.3f}, GIoU {last['iou']:.3f}, DFL {last['dfl']:.3f}"
    return f"""# The demo detector

Made by `tools/build_demo_detector.py` (`train` and `rknn` in the toolkit's environment,
which has torch; `score` in the project's, which has pycocotools); every figure here is in
`measured.json` under `"detector"`.

## Data: the synthetic detection set
`batchinfer.demo.detection` pastes the demo's handwritten digits onto {canvas} canvases
({digits}, flat, gradient or blocky backgrounds, a quarter with sensor noise,
one in eight a 2:1-3:1 strip), deterministically from a seed. The model was trained on
fresh scenes of the **train** split (digits of the classifier's train split only) and is
scored on the first {sc.get("images", VAL_EVAL)} scenes of the **val** split (held-out digits only;
{sc.get("annotations", "?")} boxes), which
`batchinfer demo DIR` writes as `DIR/detection/images/*.png` and
`DIR/detection/instances.json` (COCO; category id = the digit).

## digits-det.onnx
- Input `images` float32 [1, 3, {INPUT}, {INPUT}] NCHW: RGB pixels / 255 of the image
  letterboxed to {INPUT}x{INPUT} (aspect kept, centred, padded; trained with 0 and 114 padding,
  as the model zoo's Python and C demos pad). {INPUT} px: the canvases are {canvas}, so
  digits keep 13 px or more, and it is 0.64x the work of 320.
- Outputs: rknn_model_zoo's YOLOv8 layout, 9 tensors, for strides 8, 16, 32 in turn:
  `box_<s>` (1, 64, H, W) raw DFL logits (4 sides x {REG_MAX} bins, distances in strides from
  the cell centre), `cls_<s>` (1, 10, H, W) class scores after a sigmoid,
  `sum_<s>` (1, 1, H, W) = clip(sum of the class scores, 0, 1).
- Graph: conv 3x3 stride 2 x5 (16, 32, 48, 64, 96 channels, an extra 3x3 at strides
  8/16/32), FPN-lite (1x1 laterals to 48, nearest 2x upsampling, add, 3x3), per stride a
  decoupled head (3x3 + 1x1 for the box, 3x3 + 1x1 for the classes); ReLU; batch norm
  folded.
  {work} (`batchinfer.runtime.timing`, every op counted).
  {size}; ONNX Runtime against torch: max |difference| {o["onnx_vs_torch_max_abs"]:.1e}.
- Training: torch on {THREADS} CPU thread(s), seed {SEED}, {steps}
  ({o["images_seen"]:,} images), AdamW lr {LEARNING_RATE} (100 warm-up steps, cosine),
  weight decay {WEIGHT_DECAY}; targets by centre sampling (cells inside a box within
  {CENTRE_RADIUS} strides of its centre, on the levels whose size range holds it, the
  smallest box wins, at least the nearest cell); losses BCE on classes, GIoU and DFL on
  the positives' boxes (weights {weights}). {took} on the shared build machine;
  last losses {losses_end}.
- Val, float (ONNX Runtime, decoded at score > 0.001, class-aware NMS 0.6, 100 boxes,
  pycocotools): {map_line("digits-det.onnx")}.

## .rknn files
`digits-det-<chip>.rknn` for rk3588, rk3576 and rk3566, converted from `digits-det.onnx`
with `digits-det-<chip>.config.json` (`mean_values` 0, `std_values` 255: the NPU takes
uint8 NHWC pixels, as the model zoo converts YOLOv8) and `build(do_quantization=True)` on
the first {DETECTOR_CALIBRATION} train scenes letterboxed (grey 114), int8 (w8a8).
Measured with rknn-toolkit2's simulator (`--backend toolkit`) against the float model on
16 val scenes (cosine of each output, the worst of the nine outputs and 16 scenes):

| file | bytes | worst cosine vs float |
|---|---|---|
{chr(10).join(rows) or "| not converted yet | | |"}

Val, int8 ({first}, toolkit simulator, same decoding):
{map_line(first)}.
"""


if __name__ == "__main__":
    main()
