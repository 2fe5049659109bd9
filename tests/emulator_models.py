"""Small ONNX models for the emulator tests, as a conversion would start from them.

- ``conv_classifier(dir, ...)``: a resnet-style NCHW float classifier: input "input"
  float32 [1,C,H,W] (H and W symbolic with ``dynamic_hw``) -> Conv3x3+Relu -> Conv3x3
  stride 2+Relu -> GlobalAveragePool -> Gemm -> "logits" [1,classes].
- ``dense_model(dir, name, shape)``: float32 input of any ``shape`` -> Flatten -> MatMul
  -> "logits" [1,10]: every input element moves the output (layout tests).
- ``rknn_for(onnx_path, **config)``: an ``.rknn`` beside the ``.onnx``, and when ``config``
  is given its ``<stem>.config.json`` written as a conversion script writes it.
- ``qdq_model(float_path, out_path, samples)``: the float model quantised with ONNX
  Runtime's ``quantize_static`` (QDQ, int8 weights and activations), calibrated on
  ``samples`` (graph-layout float inputs).
- ``ort(path, **feeds)``: ONNX Runtime's outputs, the reference every test compares with.
Weights are seeded, so models are the same in every process.
"""

from __future__ import annotations

import json
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest
import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]


def conv_classifier(
    directory: Path,
    name: str = "classifier.onnx",
    size: int = 16,
    channels: int = 3,
    classes: int = 10,
    dynamic_hw: bool = False,
) -> Path:
    """Path of an NCHW float32 [1,channels,size,size] -> [1,classes] conv classifier."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((8, channels, 3, 3)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32)
    fc = rng.standard_normal((classes, 16)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b2"),
        numpy_helper.from_array(fc, "fc"),
        numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "fcb"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
    ]
    hw: list = ["H", "W"] if dynamic_hw else [size, size]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, channels, *hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        inits,
    )
    return M._save(graph, Path(directory) / name)


def dense_model(directory: Path, name: str, shape: tuple[int, ...]) -> Path:
    """Path of a float32 ``shape`` -> [1,10] model through Flatten and MatMul."""
    n = int(np.prod(shape[1:]))
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((n, 10)).astype(np.float32), "W")]
    nodes = [
        helper.make_node("Flatten", ["x"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return M._save(graph, Path(directory) / name)


def rknn_for(onnx_path: Path, **config: object) -> Path:
    """An .rknn beside ``onnx_path``; with ``config``, its settings as a conversion writes them."""
    rknn = M.fake_rknn(onnx_path, target_platform=str(config.get("target_platform", "rk3588")))
    if config:
        # The three lines a conversion script adds: cfg = dict(...); rknn.config(**cfg); dump.
        with open(rknn.with_name(rknn.stem + ".config.json"), "w") as fh:
            json.dump(config, fh)
    return rknn


def ort(path: Path, **feeds: np.ndarray) -> list[np.ndarray]:
    """ONNX Runtime's outputs of the model at ``path`` for ``feeds``."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def nchw_normalised(x_nhwc: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """What the converted model computes on raw NHWC pixels: (x - mean) / std, as NCHW."""
    x = (x_nhwc.astype(np.float32) - np.float32(mean)) / np.float32(std)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def qdq_model(float_path: Path, out_path: Path, samples: list[np.ndarray]) -> Path:
    """``float_path`` quantised to int8 QDQ with ONNX Runtime, calibrated on ``samples``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{"input": s} for s in samples])

        def get_next(self) -> dict | None:
            return next(self._it, None)

    quantize_static(
        str(float_path),
        str(out_path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,  # the NPU's int8, not ORT's default uint8
        weight_type=QuantType.QInt8,
    )
    return out_path
