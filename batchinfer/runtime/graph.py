"""An ONNX model's graph, beyond what an ONNX Runtime session tells.

Two things need the graph rather than a session: the native (NPU-side) type of each input
and output, for ``get_tensor_attr`` and ``inputs_pass_through`` (read off the file's
protobuf: runtime/onnx_graph.py), and the work a model does, for the ``npu_ms`` estimate
(:mod:`batchinfer.runtime.timing`), which reads it with the ``onnx`` package, optional at
run time.

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

import numpy as np

from batchinfer.runtime.onnx_graph import Affine, read_qdq_boundaries

#: One sentence for when the onnx package is needed and missing.
ONNX_MISSING = (
    "the onnx package is not installed, so the ONNX graph cannot be read; "
    "install it with pip install onnx"
)
_FLOATS = ("float32", "float16", "float64")


def onnx_available() -> bool:
    """True when the onnx package can be imported."""
    return importlib.util.find_spec("onnx") is not None


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
    model_bytes: bytes, inputs: Iterable[tuple[str, str]], outputs: Iterable[tuple[str, str]]
) -> tuple[list[NativeType], list[NativeType]]:
    """Native types of the (name, onnx dtype) ``inputs`` and ``outputs`` of the serialised
    model, read off its protobuf (runtime/onnx_graph.py), so the onnx package is not needed:
    importing it took 0.9 s of CPU in the planner and again in every core worker."""
    inputs, outputs = list(inputs), list(outputs)
    ins, outs = read_qdq_boundaries(model_bytes, [n for n, _ in inputs], [n for n, _ in outputs])

    def native(affine: Affine | None, dtype: str) -> NativeType:
        if affine is None:
            return default_native(dtype)
        return NativeType(affine.dtype, affine.scale, affine.zero_point, True)

    return (
        [native(a, dtype) for a, (_, dtype) in zip(ins, inputs, strict=True)],
        [native(a, dtype) for a, (_, dtype) in zip(outs, outputs, strict=True)],
    )


def mentions_quantisation(model_bytes: bytes) -> bool:
    """True when the serialised model names a QuantizeLinear node (a cheap check without onnx)."""
    return b"QuantizeLinear" in model_bytes
