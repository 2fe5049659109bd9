"""Constant-output fake models: an ONNX graph whose outputs are given tensors, whatever the
image it is fed, so a decoder (or ``batchinfer run --task ...`` end to end) can be checked
against a reference on outputs planted in any head layout (tests/seg_scenes.py,
tests/pose_obb_outputs.py make them).

Each output is ``Add(constant, 0 x ReduceMean(images))``: the input is read (runtimes
that prune an unused input, or refuse a graph without one, still run it), and the value
is the constant exactly (0 x a finite mean is 0; float32 addition of 0 is exact).
Ultralytics-style metadata (``task``, ``names``, ``kpt_shape``, ``imgsz``) goes in the
model's ``metadata_props``, as Ultralytics' ONNX export writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def fake_model(
    outputs: Sequence[np.ndarray],
    input_hw: tuple[int, int],
    names: Sequence[str] | None = None,
    metadata: Mapping[str, object] | None = None,
) -> onnx.ModelProto:
    """A model with input ``images`` float32 [1, 3, H, W] whose outputs are ``outputs``."""
    names = list(names or (f"output{i}" for i in range(len(outputs))))
    h, w = input_hw
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0.0), "zero")]
    outs = []
    for name, value in zip(names, outputs, strict=True):
        value = np.ascontiguousarray(value, np.float32)
        inits.append(numpy_helper.from_array(value, f"{name}_value"))
        nodes.append(helper.make_node("Add", [f"{name}_value", "nothing"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    image = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, h, w])
    graph = helper.make_graph(nodes, "constant_outputs", [image], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.checker.check_model(model)
    return model


def ultralytics_metadata(
    task: str, num_classes: int, input_hw: tuple[int, int], kpt_shape=None
) -> dict[str, str]:
    """The metadata Ultralytics' export writes (values as its str() of Python objects)."""
    meta = {
        "task": task,
        "names": str({i: f"class{i}" for i in range(num_classes)}),
        "imgsz": str(list(input_hw)),
        "stride": "32",
        "batch": "1",
    }
    if kpt_shape is not None:
        meta["kpt_shape"] = str(list(kpt_shape))
    return meta


def write_fake_model(path: Path, *args, **kwargs) -> Path:
    """:func:`fake_model` saved at ``path``."""
    onnx.save(fake_model(*args, **kwargs), path)
    return path


def run_fake(model: onnx.ModelProto, image: np.ndarray | None = None) -> list[np.ndarray]:
    """The model's outputs in ONNX Runtime on ``image`` (random when None)."""
    import onnxruntime as ort

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if image is None:
        image = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": image})
