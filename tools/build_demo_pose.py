"""Build the demo pose model: the demo detector with a YOLOv8-pose keypoint head.

    python tools/build_demo_pose.py train   # toolkit env (torch): train, export ONNX
    python tools/build_demo_pose.py rknn    # toolkit env: convert to .rknn, run int8
    python tools/build_demo_pose.py score   # project env: COCO bbox and keypoints mAP

The model (``digits-pose.onnx``, input float NCHW [1, 3, 256, 256] = RGB pixels / 255,
letterboxed, as ``digits-det.onnx``) is the demo detector (tools/build_demo_detector.py),
its weights read from the committed ``digits-det.onnx`` and frozen, plus a keypoint branch
per stride (3x3 conv, 3x3 conv, 1x1 conv to K x 3 values per cell). Only the branch is
trained, so training takes minutes and the boxes are the detector's.

Its outputs are rknn_model_zoo's yolov8_pose layout, four tensors: per stride 8, 16, 32
``pose_<s>`` (1, 64 + 10, H, W), the detector's DFL box logits then its class *logits*
(the zoo's pose head leaves the sigmoid to the post-processing); then ``keypoints``
(1, K, 3, N), decoded in the graph as Ultralytics' ``kpts_decode`` does: x = (2 r + col) *
stride, y likewise, score = sigmoid. ``batchinfer.detect.pose`` recognises it as
``yolov8-pose-zoo``.

A digit's K = 4 keypoints are the ends of its ink at the top, right, bottom and left
(``batchinfer.demo.detection.KEYPOINTS``). The loss: for each positive cell of the
detector's assignment, the L1 distance of each keypoint in strides, plus BCE of its score
against 1 (every keypoint is visible). ``score`` decodes the val scenes with batchinfer's
own ``PoseDecoder`` and scores them with pycocotools (OKS sigmas :data:`SIGMAS`).
Deterministic for a machine and thread count; figures land in ``measured.json`` under
``"pose"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_demo_detector as det  # the detector this model extends
import demo_build

from batchinfer.demo import ASSETS, RKNN_PLATFORMS, detection

INPUT, STRIDES, CLASSES = det.INPUT, det.STRIDES, det.CLASSES
K = len(detection.KEYPOINTS)
CELLS = sum((INPUT // s) ** 2 for s in STRIDES)
WIDTH = 48  # the neck's channels (the Detector's)
#: OKS sigma per keypoint: a stroke's end is found to about a tenth of the digit's scale
#: (COCO's person sigmas run 0.025 for eyes to 0.107 for hips).
SIGMAS = (0.1,) * K

SEED = 0
STEPS = 800
BATCH = 8
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 5e-4
SCORE_WEIGHT = 0.1  # the visibility BCE against the keypoints' L1

MODEL = "digits-pose.onnx"
RKNN_FIRST = RKNN_PLATFORMS[0]
VAL_EVAL = detection.VAL_IMAGES
DECODE = {"conf": 0.001, "iou": 0.6, "max_det": 100}


# --------------------------------------------------------------------------- model


def build_torch_model():
    """The Poser: the detector (weights from digits-det.onnx, frozen) + keypoint branches."""
    import torch
    from torch import nn

    ConvBnRelu, Detector = det.torch_classes()

    class Poser(demo_build.on_frozen_detector(Detector)):
        def __init__(self) -> None:
            super().__init__()
            self.kpt_stem = nn.ModuleList(ConvBnRelu(WIDTH, WIDTH) for _ in STRIDES)
            self.kpt_mid = nn.ModuleList(ConvBnRelu(WIDTH, 32) for _ in STRIDES)
            self.kpt_out = nn.ModuleList(nn.Conv2d(32, 3 * K, 1) for _ in STRIDES)

        def forward(self, x):
            """(per stride (box logits, class logits), per stride raw keypoints (N, 3K, H, W))."""
            with torch.no_grad():
                _, ps = self.det.features(x)
                heads = self.det.heads(ps)
            kpts = [self.kpt_out[i](self.kpt_mid[i](self.kpt_stem[i](p))) for i, p in enumerate(ps)]
            return heads, kpts

    torch.manual_seed(SEED)
    model = demo_build.freeze_detector(Poser(), ASSETS / det.MODEL)
    return model


def decode_keypoints(raw, centres, strides):
    """Ultralytics' kpts_decode: raw (N, A, K, 3) -> x, y (input pixels), score logit."""
    import torch

    cell = torch.from_numpy(centres / strides[:, None] - 0.5)  # (A, 2) the cell's column, row
    s = torch.from_numpy(strides)[:, None, None]
    xy = (raw[..., :2] * 2 + cell[:, None, :]) * s
    return xy, raw[..., 2]


def keypoint_targets(scenes, placed) -> list[np.ndarray]:
    """Per scene, (n, K, 2) float32: its digits' keypoints on the letterboxed canvas."""
    return [
        s.keypoints() * np.float32(scale) + np.array([px, py], np.float32)
        for s, (scale, px, py) in zip(scenes, placed, strict=True)
    ]


def keypoint_loss(kpts, targets, points, anchors):
    """L1 of the positives' keypoints in strides, plus SCORE_WEIGHT x BCE(score, 1)."""
    import torch
    import torch.nn.functional as F

    centres, strides, levels = anchors
    raw = torch.cat([k.flatten(2) for k in kpts], 2).transpose(1, 2)  # (N, A, 3K)
    raw = raw.unflatten(-1, (K, 3))
    match = det.assign(targets, centres, levels)
    b_idx, a_idx = np.nonzero(match >= 0)
    j = match[b_idx, a_idx]
    want = torch.from_numpy(np.stack([points[b][k] for b, k in zip(b_idx, j, strict=True)]))
    xy, score = decode_keypoints(raw[b_idx, a_idx], centres[a_idx], strides[a_idx])
    l1 = ((xy - want).abs().sum(-1) / torch.from_numpy(strides[a_idx])[:, None]).mean()
    bce = F.binary_cross_entropy_with_logits(score, torch.ones_like(score))
    return l1 + SCORE_WEIGHT * bce, float(l1.detach())


def train(steps: int = STEPS, log_every: int = 25):
    """Return the trained Poser and the training figures."""
    import torch

    torch.set_num_threads(det.THREADS)
    torch.use_deterministic_algorithms(True)
    model = build_torch_model()
    anchors = det.anchor_points()

    def step_loss(step: int):
        images, targets, scenes, placed = det.placed_batch(step, BATCH)
        _, kpts = model(det.to_input(images))
        return keypoint_loss(kpts, targets, keypoint_targets(scenes, placed), anchors)

    figures = demo_build.fit(
        model, step_loss, steps=steps, batch=BATCH, threads=det.THREADS,
        learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, logged="l1_strides",
        log_every=log_every,
    )  # fmt: skip
    return model, figures


# --------------------------------------------------------------------------- ONNX export


def output_names() -> list[str]:
    """The four outputs, model-zoo yolov8_pose order."""
    return [*(f"pose_{s}" for s in STRIDES), "keypoints"]


def output_shapes() -> list[list[int]]:
    heads = [[1, 4 * det.REG_MAX + CLASSES, INPUT // s, INPUT // s] for s in STRIDES]
    return [*heads, [1, K, 3, CELLS]]


def _decode_constants() -> tuple[np.ndarray, np.ndarray]:
    """(2 x stride per cell (1, 1, 1, N), (col, row) x stride per cell (1, 1, 2, N))."""
    centres, strides, _ = det.anchor_points()
    cell = centres / strides[:, None] - 0.5
    twice = (2 * strides).reshape(1, 1, 1, CELLS).astype(np.float32)
    offset = (cell * strides[:, None]).T.reshape(1, 1, 2, CELLS).astype(np.float32)
    return twice, offset


def export_onnx(state: dict):
    """Return digits-pose.onnx (an onnx.ModelProto) written node by node from ``state``."""
    from onnx import numpy_helper

    g = det.GraphWriter(state)
    _, neck = g.features(prefix="det.")
    raws = []
    for i, (p, s) in enumerate(zip(neck, STRIDES, strict=True)):
        p = g.detection_head(p, i, s, prefix="det.", scores=False)
        g.node("Concat", [f"box_{s}", f"cls_logits_{s}"], f"pose_{s}", axis=1)
        k = g.conv(g.conv(g.conv(p, f"kpt_stem.{i}"), f"kpt_mid.{i}"), f"kpt_out.{i}", relu=False)
        raws.append(g.node("Reshape", [k, "kpt_shape"], f"kpt_raw_{s}"))
    twice, offset = _decode_constants()
    for name, value in (
        ("kpt_shape", np.array([1, K, 3, -1], np.int64)),
        ("kpt_split", np.array([2, 1], np.int64)),
        ("kpt_twice_stride", twice),
        ("kpt_offset", offset),
    ):
        g.inits.append(numpy_helper.from_array(value, name))
    g.node("Concat", raws, "kpt_raw", axis=3)
    g.nodes.append(_split("kpt_raw", ["kpt_xy_raw", "kpt_score_raw"]))
    g.node("Mul", ["kpt_xy_raw", "kpt_twice_stride"], "kpt_xy_scaled")
    g.node("Add", ["kpt_xy_scaled", "kpt_offset"], "kpt_xy")
    g.node("Sigmoid", ["kpt_score_raw"], "kpt_score")
    g.node("Concat", ["kpt_xy", "kpt_score"], "keypoints", axis=2)
    return g.model(
        "digits_pose",
        list(zip(output_names(), output_shapes(), strict=True)),
        doc=(
            "Demo digit pose model: float NCHW [1,3,256,256] RGB/255, letterboxed; outputs in "
            "rknn_model_zoo's yolov8_pose layout (per stride 8/16/32 box DFL logits and class "
            f"logits, then keypoints (1,{K},3,{CELLS}) x, y in input pixels, score); see "
            "batchinfer/demo/assets/POSE.md."
        ),
        producer="batchinfer tools/build_demo_pose.py",
    )


def _split(x: str, outputs: list[str]):
    from onnx import helper

    return helper.make_node("Split", [x, "kpt_split"], outputs, axis=2)


def torch_outputs(model, x) -> list[np.ndarray]:
    """The four outputs of the torch model, as the ONNX graph computes them."""
    import torch

    centres, strides, _ = det.anchor_points()
    with torch.no_grad():
        heads, kpts = model(x)
        raw = torch.cat([k.flatten(2) for k in kpts], 2).transpose(1, 2).unflatten(-1, (K, 3))
        xy, score = decode_keypoints(raw, centres, strides)
        points = torch.cat([xy, score.sigmoid()[..., None]], -1).permute(0, 2, 3, 1)
    return [torch.cat([b, c], 1).numpy() for b, c in heads] + [points.numpy()]


def check_export(proto, model, n: int = 4) -> float:
    """Max |ONNX - torch| over the four outputs on ``n`` val scenes."""
    session = demo_build.ort_session(proto)
    worst = 0.0
    for scene in detection.scenes("val", n):
        x = det.to_input(det.letterbox(scene.image)[0][None])
        got = session.run(output_names(), {"images": x.numpy()})
        for a, b in zip(got, torch_outputs(model, x), strict=True):
            worst = max(worst, float(np.abs(a - b).max()))
    return worst


def build_onnx(work: Path) -> dict:
    """Train (or reuse work/weights.pt), export digits-pose.onnx and its settings files."""
    figures, _ = demo_build.export(work, train, build_torch_model, export_onnx, check_export, MODEL)
    for platform in RKNN_PLATFORMS:
        path = ASSETS / f"digits-pose-{platform}.config.json"
        path.write_text(det.settings_json(det.detector_settings(platform)))
    return figures


if __name__ == "__main__":
    import demo_pose_score

    demo_build.main(
        __doc__,
        "pose",
        {
            "train": build_onnx,
            "rknn": demo_pose_score.convert_all,
            "score": demo_pose_score.score,
        },
        Path(__file__).resolve().parents[1] / "build" / "demo-pose",
        lambda section, _: {"POSE.md": demo_pose_score.pose_md(section)},
    )
