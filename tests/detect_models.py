"""A tiny detector for engine tests: the rknn_model_zoo YOLOv8 head layout, boxes you can predict.

``colour_detector(dir, size=64)``: input "images" uint8 [1, size, size, 3] (NHWC, like the demo
models) -> 9 outputs, for strides 8/16/32: box (1, 64, H, W) DFL logits, class scores
(1, 2, H, W), score sum (1, 1, H, W). What it computes:

- class 0 ("red") of a stride-8 cell = mean of relu(R - G) / 255 over the cell's 8x8
  pixels, class 1 ("green") = mean of relu(G - R) / 255: a solid red 8x8 block on a
  cell scores 1.0 there; grey (the letterbox padding), black and white score 0;
- strides 16 and 32 score 0 everywhere (no boxes come from them);
- every side's DFL logits peak at bin 1: each box reaches one stride (8 px) from its
  cell's centre on all four sides, i.e. a 16x16 box centred on the cell.

So a red patch covering stride-8 cell (gx, gy) of the letterboxed input gives one box
(8 gx - 4, 8 gy - 4, 8 gx + 12, 8 gy + 12) in input pixels, class 0 (:func:`cell_box`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from models import _save
from onnx import TensorProto, helper, numpy_helper

STRIDES = (8, 16, 32)
CLASSES = ("red", "green")


def cell_box(gx: int, gy: int) -> tuple[float, float, float, float]:
    """The box (input pixels) a stride-8 cell's detection has."""
    cx, cy = 8 * gx + 4, 8 * gy + 4
    return (cx - 8.0, cy - 8.0, cx + 8.0, cy + 8.0)


def colour_detector(directory: Path, name: str = "detector.onnx", size: int = 64) -> Path:
    nodes, inits, outputs = [], [], []
    inits.append(numpy_helper.from_array(np.array([1.0 / 255], np.float32), "inv255"))
    nodes += [
        helper.make_node("Cast", ["images"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["f"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Mul", ["nchw", "inv255"], ["x"]),
    ]
    # relu(R - G) and relu(G - R): a 1x1 conv with weights [[1,-1,0],[-1,1,0]], then Relu.
    w = np.array([[1, -1, 0], [-1, 1, 0]], np.float32).reshape(2, 3, 1, 1)
    inits.append(numpy_helper.from_array(w, "wdiff"))
    nodes += [
        helper.make_node("Conv", ["x", "wdiff"], ["diff"]),
        helper.make_node("Relu", ["diff"], ["colour"]),
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    inits.append(axes)
    zero = numpy_helper.from_array(np.array([0.0], np.float32), "zero")
    inits.append(zero)
    for i, stride in enumerate(STRIDES):
        h = w_ = size // stride
        pooled = f"pool{i}"
        nodes.append(
            helper.make_node(
                "AveragePool",
                ["colour"],
                [pooled],
                kernel_shape=[stride, stride],
                strides=[stride, stride],
            )
        )
        if stride == 8:
            nodes.append(helper.make_node("Identity", [pooled], [f"cls{i}"]))
        else:
            nodes.append(helper.make_node("Mul", [pooled, "zero"], [f"cls{i}"]))
        logits = np.zeros((1, 64, h, w_), np.float32)
        logits[:, 1::16] = 20.0  # bin 1 of each of the 4 sides
        inits.append(numpy_helper.from_array(logits, f"boxc{i}"))
        nodes += [
            helper.make_node("Identity", [f"boxc{i}"], [f"box{i}"]),
            helper.make_node("ReduceSum", [f"cls{i}", "axes1"], [f"sum{i}"], keepdims=1),
        ]
        outputs += [
            helper.make_tensor_value_info(f"box{i}", TensorProto.FLOAT, [1, 64, h, w_]),
            helper.make_tensor_value_info(f"cls{i}", TensorProto.FLOAT, [1, 2, h, w_]),
            helper.make_tensor_value_info(f"sum{i}", TensorProto.FLOAT, [1, 1, h, w_]),
        ]
    graph = helper.make_graph(
        nodes,
        "colour_detector",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, [1, size, size, 3])],
        outputs,
        inits,
    )
    return _save(graph, Path(directory) / name)


def labels_file(directory: Path, names: tuple[str, ...] = CLASSES) -> Path:
    path = Path(directory) / "labels.txt"
    path.write_text("".join(f"{n}\n" for n in names))
    return path
