"""An estimate of ``npu_ms`` for a model, from the work in its ONNX graph (an estimate only).

The emulator's fixed ``npu_ms`` says nothing about a user's model. Asked for it
(``npu_ms="estimate"``, ``BATCHINFER_SIM_NPU_MS=estimate``, ``--sim-npu-ms estimate``),
the emulator derives one per model from three counts of its graph, at the input shapes
the model runs:

- ``gmac``: multiply-accumulates of Conv, ConvTranspose, MatMul and Gemm, in 1e9;
- ``mconv``: elements those ops write, in 1e6 (memory traffic of their results);
- ``mother``: elements every other op writes, in 1e6 (Sigmoid, Mul, Add, Concat, Resize,
  pooling, ...); activations an NPU applies inside the convolution that makes their input
  (Relu, Clip, LeakyRelu) and ops that only relabel a tensor (Reshape, Flatten, ...) count
  nothing.

and ``npu_ms = COEFFICIENTS · (1, gmac, mconv, mother)``, fitted by non-negative least
squares to the single-core RK3588 INT8 figures of Rockchip's model zoo
(:data:`CALIBRATION`, from airockchip/rknn_model_zoo's README, v2.3.2).
``tools/npu_ms_calibration.py`` builds the calibration architectures as ONNX graphs,
counts them with :func:`count_work`, refits and prints the table with each model's error;
docs/guide/emulator.md quotes it. It is an estimate for an INT8 model on one RK3588 core: not
calibrated for float16 models or other chips, and no substitute for timing the model on a
board. The fitted intercept is 0: models of 2 to 62 ms cannot tell a fixed per-call cost,
so below about 2 ms (the smallest calibration model) the estimate is extrapolation.

Needs the ``onnx`` package (shape inference); without it, :func:`estimate` raises
ImportError and the emulator says so in one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The npu_ms value that asks for the estimate.
ESTIMATE = "estimate"

#: (model, input shape, FPS) on one RK3588 core, INT8: airockchip/rknn_model_zoo README
#: (v2.3.2, "Model performance benchmark"). Model inference only, no pre/post-processing.
CALIBRATION: tuple[tuple[str, tuple[int, ...], float], ...] = (
    ("mobilenetv2-12", (1, 3, 224, 224), 450.7),
    ("resnet50-v2-7", (1, 3, 224, 224), 110.1),
    ("yolov5n", (1, 3, 640, 640), 82.5),
    ("yolov5s_relu", (1, 3, 640, 640), 66.1),
    ("yolov5s", (1, 3, 640, 640), 48.4),
    ("yolov5m", (1, 3, 640, 640), 20.9),
    ("yolov8n", (1, 3, 640, 640), 73.5),
    ("yolov8s", (1, 3, 640, 640), 38.0),
    ("yolov8m", (1, 3, 640, 640), 16.2),
)

#: ms per call = c0 + c1 * gmac + c2 * mconv + c3 * mother (tools/npu_ms_calibration.py).
COEFFICIENTS: tuple[float, float, float, float] = (0.0, 0.576665, 0.312057, 0.162517)

_MAC_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Applied inside the op that makes their input, or only relabelling a tensor: no traffic.
_FREE_OPS = frozenset(
    {
        "Relu",
        "Clip",
        "LeakyRelu",
        "Identity",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Constant",
        "Shape",
        "Dropout",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)


@dataclass(frozen=True)
class Work:
    """What a graph computes: MACs, elements written by MAC ops and by other ops."""

    macs: int
    conv_elements: int
    other_elements: int
    uncounted: tuple[str, ...] = ()  # ops whose shapes could not be inferred

    @property
    def features(self) -> tuple[float, float, float, float]:
        """(1, gmac, mconv, mother): what COEFFICIENTS multiply."""
        return (1.0, self.macs / 1e9, self.conv_elements / 1e6, self.other_elements / 1e6)


@dataclass(frozen=True)
class Estimate:
    """An npu_ms estimate and the work it was computed from."""

    npu_ms: float
    work: Work

    def describe(self) -> str:
        w = self.work
        text = (
            f"npu_ms estimate {self.npu_ms:.3g} ms per call, from {w.macs / 1e9:.3g} GMAC and "
            f"{(w.conv_elements + w.other_elements) / 1e6:.3g} M elements written "
            "(calibrated on RK3588 single-core INT8 model-zoo figures; an estimate, not a "
            "measurement)"
        )
        if w.uncounted:
            text += f"; {len(w.uncounted)} op(s) of unknown shape not counted"
        return text


def predict(work: Work, coefficients: Sequence[float] = COEFFICIENTS) -> float:
    """npu_ms for ``work`` under ``coefficients`` (never below 0.01 ms)."""
    ms = sum(c * f for c, f in zip(coefficients, work.features, strict=True))
    return max(ms, 0.01)


def estimate(model_bytes: bytes, input_shapes: Mapping[str, Sequence[int]]) -> Estimate:
    """The npu_ms estimate of a serialised ONNX model run at ``input_shapes`` (graph layout).

    ImportError when onnx is missing; ValueError when the graph cannot be read.
    """
    import onnx

    try:
        model = onnx.load_from_string(model_bytes)
    except Exception as exc:
        raise ValueError(f"the ONNX graph cannot be read ({exc})") from exc
    work = count_work(model, input_shapes)
    return Estimate(predict(work), work)


def count_work(model: Any, input_shapes: Mapping[str, Sequence[int]]) -> Work:
    """Count the work of ``model`` (an onnx.ModelProto, changed in place) at ``input_shapes``."""
    from onnx import shape_inference

    graph = model.graph
    for value in graph.input:
        shape = input_shapes.get(value.name)
        if shape is None:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, shape, strict=False):
            dim.ClearField("dim_param")
            dim.dim_value = int(size)
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as exc:
        raise ValueError(f"ONNX shape inference failed ({exc})") from exc
    shapes = _known_shapes(inferred.graph)
    macs = conv_elements = other_elements = 0
    uncounted = []
    for node in inferred.graph.node:
        if node.op_type in _FREE_OPS:
            continue
        found = [shapes.get(name) for name in node.output if name]
        outs = [s for s in found if s is not None]
        if not outs or len(outs) < len(found):
            uncounted.append(node.op_type)
            continue
        written = sum(_prod(s) for s in outs)
        if node.op_type in _MAC_OPS:
            node_macs = _macs(node, shapes, outs[0])
            if node_macs is None:
                uncounted.append(node.op_type)
                continue
            macs += node_macs
            conv_elements += written
        else:
            other_elements += written
    return Work(macs, conv_elements, other_elements, tuple(uncounted))


def _known_shapes(graph: Any) -> dict[str, tuple[int, ...]]:
    out = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        if all(d >= 0 for d in dims):
            out[value.name] = dims
    return out


def _macs(node: Any, shapes: dict[str, tuple[int, ...]], out: tuple[int, ...]) -> int | None:
    first = shapes.get(node.input[0])
    second = shapes.get(node.input[1]) if len(node.input) > 1 else None
    if second is None:
        return None
    if node.op_type == "Conv":  # weight (Cout, Cin/group, k...): per output, Cin/group*k MACs
        return _prod(out) * _prod(second[1:])
    if node.op_type == "ConvTranspose":  # weight (Cin, Cout/group, k...): per input element
        return None if first is None else _prod(first) * _prod(second[1:])
    if node.op_type == "MatMul":
        return None if first is None else _prod(out) * first[-1]
    # Gemm: A (M, K), or (K, M) with transA.
    if first is None:
        return None
    trans_a = any(a.name == "transA" and a.i for a in node.attribute)
    return _prod(out) * (first[0] if trans_a else first[-1])


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
