"""Calibrate the emulator's npu_ms estimate (batchinfer/runtime/timing.py) on public figures.

Builds the architectures of timing.CALIBRATION as ONNX graphs (weights carry shapes but no
data: only the work is counted), counts each with timing.count_work, fits timing's
coefficients by non-negative least squares to the single-core RK3588 INT8 FPS of Rockchip's
model zoo, and prints a Markdown table: each model's counts, its measured and estimated
time and the estimate's error, also when the model is left out of the fit. The counted MACs
are printed beside the published figures the builders are checked against (in brackets:
the papers for MobileNetV2 and ResNet-50, Ultralytics' README GFLOPs / 2 for YOLOv5 and
YOLOv8).

    python tools/npu_ms_calibration.py            # table + the fitted coefficients
    python tools/npu_ms_calibration.py --check    # exit 1 if timing.COEFFICIENTS is stale

Architectures (as exported for the model zoo: BatchNorm folded into convolutions,
detection heads end at their last convolutions):
- mobilenetv2-12: MobileNetV2 1.0 (Sandler et al. 2018, table 2), ReLU6, 1000 classes.
- resnet50-v2-7: pre-activation ResNet-50 v2 (He et al. 2016; the ONNX model zoo's is
  Gluon's resnet50_v2): BatchNorm+ReLU before each convolution, stride in the 3x3.
- yolov5{n,s,m}: Ultralytics YOLOv5 v6 (P5, 6x6 stem, C3, SPPF), SiLU; yolov5s_relu the
  same with ReLU, as the model zoo ships it. Depth/width 0.33/0.25, 0.33/0.50, 0.67/0.75.
- yolov8{n,s,m}: Ultralytics YOLOv8 (C2f, SPPF, decoupled head, 64-channel box branch and
  80 classes with a sigmoid, DFL decoding left to the CPU as in the model zoo).
"""

from __future__ import annotations

import argparse
import itertools
import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from batchinfer.runtime import timing

#: Published compute of each architecture, GMAC, to check the builders against.
PUBLISHED_GMAC = {
    "mobilenetv2-12": 0.300,  # MobileNetV2 paper, table 4: 300M multiply-adds
    "resnet50-v2-7": 4.1,  # ResNet paper: 3.8 GFLOPs (multiply-adds) for v1; v2 ~4.1
    "yolov5n": 4.5 / 2,  # Ultralytics YOLOv5 README (v6.0+): GFLOPs at 640
    "yolov5s_relu": 16.5 / 2,
    "yolov5s": 16.5 / 2,
    "yolov5m": 49.0 / 2,
    "yolov8n": 8.7 / 2,  # Ultralytics YOLOv8 README: GFLOPs at 640
    "yolov8s": 28.6 / 2,
    "yolov8m": 78.9 / 2,
}


class Net:
    """A tiny ONNX graph builder: every method returns (tensor name, channels)."""

    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name, self.shape = name, shape
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def _weight(self, shape: tuple[int, ...]) -> str:
        t = TensorProto()  # dims only: shape inference needs no data, counting no values
        t.name, t.data_type = self._id("w"), TensorProto.FLOAT
        t.dims.extend(shape)
        self.inits.append(t)
        return t.name

    def _const(self, values: list, dtype: type) -> str:
        name = self._id("c")
        self.inits.append(numpy_helper.from_array(np.array(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self._id(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def act(self, x: str, act: str | None) -> str:
        if act == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if act == "relu":
            return self.op("Relu", [x])
        if act == "relu6":
            return self.op("Clip", [x, self._const(0.0, np.float32), self._const(6.0, np.float32)])
        return x

    def conv(
        self,
        x,
        cout: int,
        k: int = 1,
        s: int = 1,
        g: int = 1,
        act: str | None = "silu",
        p: int | None = None,
    ):
        name, cin = x
        w = self._weight((cout, cin // g, k, k))
        b = self._weight((cout,))
        pad = k // 2 if p is None else p
        y = self.op(
            "Conv", [name, w, b], kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4, group=g
        )
        return self.act(y, act), cout

    def add(self, a, b):
        return self.op("Add", [a[0], b[0]]), a[1]

    def concat(self, xs):
        return self.op("Concat", [x[0] for x in xs], axis=1), sum(x[1] for x in xs)

    def maxpool(self, x, k: int, s: int):
        return self.op(
            "MaxPool", [x[0]], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4
        ), x[1]

    def upsample(self, x):
        scales = self._const([1.0, 1.0, 2.0, 2.0], np.float32)
        return self.op("Resize", [x[0], "", scales], mode="nearest"), x[1]

    def split2(self, x):
        half = x[1] // 2
        a, b = self._id("split"), self._id("split")
        self.nodes.append(
            helper.make_node("Split", [x[0], self._const([half, half], np.int64)], [a, b], axis=1)
        )
        return (a, half), (b, half)

    def bn_relu(self, x):
        c = x[1]
        params = [self._weight((c,)) for _ in range(4)]
        return self.op("Relu", [self.op("BatchNormalization", [x[0], *params])]), c

    def head(self, x, classes: int):
        pooled = self.op("GlobalAveragePool", [x[0]])
        flat = self.op("Flatten", [pooled])
        w, b = self._weight((classes, x[1])), self._weight((classes,))
        return self.op("Gemm", [flat, w, b], transB=1), classes

    def model(self, outputs: list[str]):
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info("images", TensorProto.FLOAT, list(self.shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# ---------------------------------------------------------------- architectures
def mobilenetv2(shape):
    net = Net("mobilenetv2", shape)
    x = net.conv(("images", 3), 32, 3, 2, act="relu6")
    for t, c, n, s in [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]:
        for i in range(n):
            stride = s if i == 0 else 1
            y = net.conv(x, x[1] * t, 1, act="relu6") if t != 1 else x
            y = net.conv(y, y[1], 3, stride, g=y[1], act="relu6")
            y = net.conv(y, c, 1, act=None)
            x = net.add(y, x) if stride == 1 and x[1] == c else y
    x = net.conv(x, 1280, 1, act="relu6")
    return net.model([net.head(x, 1000)[0]])


def resnet50_v2(shape):
    net = Net("resnet50_v2", shape)
    x = net.conv(("images", 3), 64, 7, 2, act=None)
    x = net.maxpool(net.bn_relu(x), 3, 2)
    for stage, (blocks, c) in enumerate([(3, 256), (4, 512), (6, 1024), (3, 2048)]):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            pre = net.bn_relu(x)
            shortcut = net.conv(pre, c, 1, stride, act=None) if i == 0 else x
            y = net.conv(pre, c // 4, 1, act=None)
            y = net.conv(net.bn_relu(y), c // 4, 3, stride, act=None)
            y = net.conv(net.bn_relu(y), c, 1, act=None)
            x = net.add(y, shortcut)
    return net.model([net.head(net.bn_relu(x), 1000)[0]])


def _ch(c: int, width: float, max_channels: int = 1024) -> int:
    return math.ceil(min(c, max_channels) * width / 8) * 8


def _depth(n: int, depth: float) -> int:
    return max(round(n * depth), 1)


def yolov5(shape, depth: float, width: float, act: str = "silu"):
    net = Net("yolov5", shape)

    def conv(x, c, k=1, s=1, p=None):
        return net.conv(x, c, k, s, act=act, p=p)

    def c3(x, c2, n, shortcut=True):
        c_ = c2 // 2
        a = conv(x, c_)
        for _ in range(_depth(n, depth)):
            y = conv(conv(a, c_), c_, 3)
            a = net.add(y, a) if shortcut else y
        return conv(net.concat([a, conv(x, c_)]), c2)

    def sppf(x, c2):
        a = conv(x, x[1] // 2)
        p1 = net.maxpool(a, 5, 1)
        p2 = net.maxpool(p1, 5, 1)
        return conv(net.concat([a, p1, p2, net.maxpool(p2, 5, 1)]), c2)

    w = lambda c: _ch(c, width)  # noqa: E731
    x = conv(("images", 3), w(64), 6, 2, p=2)
    x = c3(conv(x, w(128), 3, 2), w(128), 3)
    p3 = c3(conv(x, w(256), 3, 2), w(256), 6)
    p4 = c3(conv(p3, w(512), 3, 2), w(512), 9)
    p5 = sppf(c3(conv(p4, w(1024), 3, 2), w(1024), 3), w(1024))
    h5 = conv(p5, w(512))
    h4 = conv(c3(net.concat([net.upsample(h5), p4]), w(512), 3, False), w(256))
    o3 = c3(net.concat([net.upsample(h4), p3]), w(256), 3, False)
    o4 = c3(net.concat([conv(o3, w(256), 3, 2), h4]), w(512), 3, False)
    o5 = c3(net.concat([conv(o4, w(512), 3, 2), h5]), w(1024), 3, False)
    outs = [net.conv(o, 255, 1, act=None)[0] for o in (o3, o4, o5)]
    return net.model(outs)


def yolov8(shape, depth: float, width: float, max_channels: int):
    net = Net("yolov8", shape)

    def conv(x, c, k=1, s=1):
        return net.conv(x, c, k, s)

    def c2f(x, c2, n, shortcut):
        a, b = net.split2(conv(x, 2 * (c2 // 2)))
        parts = [a, b]
        for _ in range(_depth(n, depth)):
            y = conv(conv(parts[-1], c2 // 2, 3), c2 // 2, 3)
            parts.append(net.add(y, parts[-1]) if shortcut else y)
        return conv(net.concat(parts), c2)

    def sppf(x, c2):
        a = conv(x, x[1] // 2)
        p1 = net.maxpool(a, 5, 1)
        p2 = net.maxpool(p1, 5, 1)
        return conv(net.concat([a, p1, p2, net.maxpool(p2, 5, 1)]), c2)

    w = lambda c: _ch(c, width, max_channels)  # noqa: E731
    x = conv(conv(("images", 3), w(64), 3, 2), w(128), 3, 2)
    x = c2f(x, w(128), 3, True)
    p3 = c2f(conv(x, w(256), 3, 2), w(256), 6, True)
    p4 = c2f(conv(p3, w(512), 3, 2), w(512), 6, True)
    p5 = sppf(c2f(conv(p4, w(1024), 3, 2), w(1024), 3, True), w(1024))
    h4 = c2f(net.concat([net.upsample(p5), p4]), w(512), 3, False)
    o3 = c2f(net.concat([net.upsample(h4), p3]), w(256), 3, False)
    o4 = c2f(net.concat([conv(o3, w(256), 3, 2), h4]), w(512), 3, False)
    o5 = c2f(net.concat([conv(o4, w(512), 3, 2), p5]), w(1024), 3, False)
    c_box, c_cls = max(16, o3[1] // 4, 64), max(o3[1], 80)
    outs = []
    for o in (o3, o4, o5):
        box = net.conv(conv(conv(o, c_box, 3), c_box, 3), 64, 1, act=None)
        cls = net.conv(conv(conv(o, c_cls, 3), c_cls, 3), 80, 1, act=None)
        outs += [box[0], net.op("Sigmoid", [cls[0]])]
    return net.model(outs)


BUILDERS = {
    "mobilenetv2-12": mobilenetv2,
    "resnet50-v2-7": resnet50_v2,
    "yolov5n": lambda s: yolov5(s, 0.33, 0.25),
    "yolov5s_relu": lambda s: yolov5(s, 0.33, 0.50, act="relu"),
    "yolov5s": lambda s: yolov5(s, 0.33, 0.50),
    "yolov5m": lambda s: yolov5(s, 0.67, 0.75),
    "yolov8n": lambda s: yolov8(s, 0.33, 0.25, 1024),
    "yolov8s": lambda s: yolov8(s, 0.33, 0.50, 1024),
    "yolov8m": lambda s: yolov8(s, 0.67, 0.75, 768),
}


def calibration_work() -> dict[str, timing.Work]:
    """timing.count_work of every calibration architecture, by model name."""
    return {
        name: timing.count_work(BUILDERS[name](shape), {"images": shape})
        for name, shape, _ in timing.CALIBRATION
    }


def fit(works: dict[str, timing.Work], leave_out: str | None = None) -> tuple[float, ...]:
    """Non-negative least squares on relative error (every model weighs the same).

    Every count costs time, so no coefficient may be negative; with four unknowns the
    best non-negative solution is found by solving each subset of them and keeping the
    feasible one with the smallest residual.
    """
    rows = [(n, fps) for n, _, fps in timing.CALIBRATION if n != leave_out]
    ms = np.array([1000.0 / fps for _, fps in rows])
    a = np.array([works[name].features for name, _ in rows]) / ms[:, None]
    ones = np.ones_like(ms)
    best: tuple[float, np.ndarray] | None = None
    for k in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), k):
            coef, *_ = np.linalg.lstsq(a[:, subset], ones, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[list(subset)] = coef
            residual = float(np.sum((a @ full - ones) ** 2))
            if best is None or residual < best[0]:
                best = (residual, full)
    assert best is not None  # a single non-negative column always fits
    return tuple(float(round(c, 6)) for c in best[1])


def table(works: dict[str, timing.Work], coef: tuple[float, ...]) -> str:
    rows = [
        "| model | input | GMAC (published) | M elements conv / other | measured ms (FPS) "
        "| estimate ms | error | error left out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    errors, held_out = [], []
    for name, shape, fps in timing.CALIBRATION:
        w = works[name]
        ms, est = 1000.0 / fps, timing.predict(w, coef)
        loo = timing.predict(w, fit(works, leave_out=name))
        errors.append(abs(est / ms - 1))
        held_out.append(abs(loo / ms - 1))
        rows.append(
            f"| {name} | {'x'.join(map(str, shape[2:]))} | {w.macs / 1e9:.2f} "
            f"({PUBLISHED_GMAC[name]:.2f}) | {w.conv_elements / 1e6:.1f} / "
            f"{w.other_elements / 1e6:.1f} | {ms:.2f} ({fps}) | {est:.2f} | "
            f"{100 * (est / ms - 1):+.0f} % | {100 * (loo / ms - 1):+.0f} % |"
        )
    rows.append("")
    rows.append(
        f"Mean absolute error {100 * np.mean(errors):.0f} %, largest {100 * max(errors):.0f} %; "
        f"fitted without the model itself (leave-one-out): mean {100 * np.mean(held_out):.0f} %, "
        f"largest {100 * max(held_out):.0f} %."
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if COEFFICIENTS are stale")
    args = parser.parse_args()
    works = calibration_work()
    coef = fit(works)
    if args.check:
        stale = not np.allclose(coef, timing.COEFFICIENTS, rtol=1e-3, atol=1e-6)
        print(f"fitted {coef}\nstored {timing.COEFFICIENTS}")
        return 1 if stale else 0
    print(table(works, coef))
    print(f"\nCOEFFICIENTS = {coef}  # ms: 1, GMAC, M conv elements, M other elements")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
