"""An ONNX model's graph, read with the ``onnx`` package, which is optional at run time.

Two things need the graph rather than an ONNX Runtime session: the native (NPU-side) type
of each input and output, for ``get_tensor_attr`` and ``inputs_pass_through``, and the
work a model does, for the ``npu_ms`` estimate (:mod:`batchinfer.runtime.timing`).

Native types, as rknn-toolkit2 models report them (airockchip/rknn-toolkit2#304, #432):
a quantised model's input and output are int8 with a scale and zero point; a float model's
are float16 (the NPU computes in float16); integer tensors keep their type. A quantised
(QDQ) ``.onnx`` says which of its tensors are quantised: an input consumed by a
``QuantizeLinear`` is quantised with that node's scale and zero point, an output made by a
``DequantizeLinear`` with that node's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: One sentence for when the onnx package is needed and missing.
ONNX_MISSING = (
    "the onnx package is not installed, so the ONNX graph cannot be read; "
    "install it with pip install onnx"
)
_FLOATS = ("float32", "float16", "float64")


def onnx_available() -> bool:
    """True when the onnx package can be imported."""
    return importlib.util.find_spec("onnx") is not None


def load_graph(model_bytes: bytes) -> Any:
    """The ``onnx.ModelProto`` of ``model_bytes``; ImportError when onnx is missing."""
    import onnx

    return onnx.load_from_string(model_bytes)


@dataclass(frozen=True)
class NativeType:
    """How a tensor is held on the NPU: numpy dtype name, and affine quantisation if any."""

    dtype: str
    scale: float = 1.0
    zero_point: int = 0
    quantised: bool = False

    def dequantise(self, q: np.ndarray) -> np.ndarray:
        """Float32 values of quantised data ``q``: (q - zero_point) * scale."""
        return (q.astype(np.float32) - np.float32(self.zero_point)) * np.float32(self.scale)


def default_native(onnx_dtype: str) -> NativeType:
    """The native type of a tensor the graph does not quantise: float16 for floats."""
    return NativeType("float16" if onnx_dtype in _FLOATS else onnx_dtype)


def native_types(
    model: Any, inputs: Iterable[tuple[str, str]], outputs: Iterable[tuple[str, str]]
) -> tuple[list[NativeType], list[NativeType]]:
    """Native types of the (name, onnx dtype) ``inputs`` and ``outputs`` of ``model``."""
    constants = _constants(model.graph)
    consumers: dict[str, list[Any]] = {}
    producers: dict[str, Any] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node
    ins = []
    for name, dtype in inputs:
        quant = [n for n in consumers.get(name, []) if n.op_type == "QuantizeLinear"]
        native = _affine(quant[0], constants) if quant else None
        ins.append(native or default_native(dtype))
    outs = []
    for name, dtype in outputs:
        node = producers.get(name)
        native = None
        if node is not None and node.op_type == "DequantizeLinear":
            native = _affine(node, constants)
        outs.append(native or default_native(dtype))
    return ins, outs


def _constants(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _affine(node: Any, constants: dict[str, np.ndarray]) -> NativeType | None:
    """The per-tensor quantisation of a (De)QuantizeLinear node; None if it is per-axis."""
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    zp = constants.get(zp_name) if zp_name else np.zeros((), np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1:
        return None
    return NativeType(zp.dtype.name, float(scale.reshape(())), int(zp.reshape(())), True)


def mentions_quantisation(model_bytes: bytes) -> bool:
    """True when the serialised model names a QuantizeLinear node (a cheap check without onnx)."""
    return b"QuantizeLinear" in model_bytes
