"""Tiny ONNX models for tests, built with onnx.helper, with numpy references of their maths.

Stable API (other test files import it):

- ``nhwc_uint8_model(dir, name=..., size=8, channels=1, classes=10, dynamic_batch=False,
  batch=1)``: input "image" uint8 [1,size,size,channels] (NHWC) -> "logits" float32
  [1,classes]; ``batch`` N builds its batch-N twin ([N,...] -> [N,classes]).
  ``nhwc_uint8_reference(x, ...)`` computes the same logits with numpy.
- ``nchw_float_model(dir, ...)``: input "input" float32 [1,3,8,8] (NCHW) -> "logits"
  float32 [1,10]; ``nchw_float_reference(x_nchw)``.
- ``two_output_model(dir)``: input "x" float32 [1,4] -> "double" float32 [1,4] (= 2x) and
  "argmax" int64 [1,1] (the runtime returns it as float32).
- ``corrupt_model(dir)``: a file named .onnx that is not ONNX.
- ``fake_rknn(onnx_path)``: an .rknn file beside an .onnx of the same stem, laid out like a
  real one (``rknn_bytes(document)``: header, model bytes, trailing JSON document).
Weights are fixed (seeded), so outputs are reproducible across processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8


def _weights(n_in: int, n_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal((n_out,)).astype(np.float32)
    return w, b


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _linear_head(
    nodes: list, inits: list, x: str, n_in: int, n_out: int, seed: int, out: str
) -> None:
    # Flatten (keeps batch) -> MatMul -> Add: every input element moves the output.
    w, b = _weights(n_in, n_out, seed)
    inits += [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    nodes += [
        helper.make_node("Flatten", [x], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], [out]),
    ]


def nhwc_uint8_model(
    directory: Path,
    name: str = "nhwc_uint8.onnx",
    size: int = 8,
    channels: int = 1,
    classes: int = 10,
    dynamic_batch: bool = False,
    batch: int = 1,
) -> Path:
    """Path of a uint8 NHWC [1,size,size,channels] -> float32 [1,classes] classifier;
    ``batch`` N > 1: its twin built for a static batch of N ([N,...] in, [N,classes] out)."""
    axis: int | str = "N" if dynamic_batch else batch
    nodes: list = [helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT)]
    inits: list = [numpy_helper.from_array(np.array(1 / 255, dtype=np.float32), "scale")]
    nodes.append(helper.make_node("Mul", ["f", "scale"], ["scaled"]))
    _linear_head(nodes, inits, "scaled", size * size * channels, classes, seed=1, out="logits")
    graph = helper.make_graph(
        nodes,
        "nhwc_uint8",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, [axis, size, size, channels])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [axis, classes])],
        inits,
    )
    return _save(graph, Path(directory) / name)


def nhwc_uint8_reference(
    x: np.ndarray, size: int = 8, channels: int = 1, classes: int = 10
) -> np.ndarray:
    """The logits nhwc_uint8_model computes for NHWC uint8 ``x``."""
    w, b = _weights(size * size * channels, classes, seed=1)
    flat = (x.astype(np.float32) * np.float32(1 / 255)).reshape(x.shape[0], -1)
    return flat @ w + b


def nchw_float_model(directory: Path, name: str = "nchw_float.onnx") -> Path:
    """Path of a float32 NCHW [1,3,8,8] -> float32 [1,10] model."""
    nodes: list = []
    inits: list = []
    _linear_head(nodes, inits, "input", 3 * 8 * 8, 10, seed=2, out="logits")
    graph = helper.make_graph(
        nodes,
        "nchw_float",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return _save(graph, Path(directory) / name)


def nchw_float_reference(x_nchw: np.ndarray) -> np.ndarray:
    """The logits nchw_float_model computes for NCHW float ``x_nchw``."""
    w, b = _weights(3 * 8 * 8, 10, seed=2)
    return x_nchw.astype(np.float32).reshape(x_nchw.shape[0], -1) @ w + b


def two_output_model(directory: Path, name: str = "two_output.onnx") -> Path:
    """Path of a float32 [1,4] -> ("double" float32 [1,4], "argmax" int64 [1,1]) model."""
    inits = [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["double"]),
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "two_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [
            helper.make_tensor_value_info("double", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("argmax", TensorProto.INT64, [1, 1]),
        ],
        inits,
    )
    return _save(graph, Path(directory) / name)


def corrupt_model(directory: Path, name: str = "corrupt.onnx") -> Path:
    """Path of a file with an .onnx name that is not an ONNX model."""
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not an onnx model\x00\x01")
    return path


def rknn_bytes(document: dict | bytes | None, model: bytes = b"\x00" * 64) -> bytes:
    """The bytes of an .rknn file as rknn-toolkit2 2.5.0 lays it out (see runtime/rknn_file).

    A 64-byte header (magic, format version 6, the model's size), the model, then the
    JSON ``document``'s length and the document. ``None`` leaves the document out.
    """
    header = b"RKNN\x00\x00\x00\x00" + (6).to_bytes(8, "little") + len(model).to_bytes(8, "little")
    data = header.ljust(64, b"\x00") + model
    if document is None:
        return data
    text = document if isinstance(document, bytes) else json.dumps(document).encode()
    return data + len(text).to_bytes(8, "little") + text


def fake_rknn(onnx_path: Path, target_platform: str = "rk3588") -> Path:
    """Path of an .rknn file beside ``onnx_path`` (same stem) naming ``target_platform``."""
    path = Path(onnx_path).with_suffix(".rknn")
    path.write_bytes(rknn_bytes({"target_platform": [target_platform], "version": "2.5.0"}))
    return path
