"""A QDQ model's quantised inputs and outputs, read off the protobuf (runtime/onnx_graph.py)
without the onnx package, against what onnx and its numpy_helper read from the same files.

Reading them with onnx cost 0.9 s of CPU for its import, in the planner and in every core
worker of a run on a quantised .onnx (tools/bench_startup.py on the demo's digits-int8.onnx:
first row 1.65 s before, 0.40 s after)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer.errors import ModelError
from batchinfer.runtime import graph

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "batchinfer" / "demo" / "assets"


def _reference(model_bytes: bytes, inputs, outputs):
    """The native types as onnx.load and numpy_helper read them (the former implementation)."""
    model = onnx.load_from_string(model_bytes)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attr.t)

    def affine(node):
        scale = constants.get(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        zp = constants.get(zp_name) if zp_name else np.zeros((), np.uint8)
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            return None
        return graph.NativeType(zp.dtype.name, float(scale.reshape(())), int(zp.reshape(())), True)

    consumers: dict[str, list] = {}
    producers: dict[str, object] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node
    ins = []
    for name, dtype in inputs:
        quant = [n for n in consumers.get(name, []) if n.op_type == "QuantizeLinear"]
        ins.append((affine(quant[0]) if quant else None) or graph.default_native(dtype))
    outs = []
    for name, dtype in outputs:
        node = producers.get(name)
        native = affine(node) if node is not None and node.op_type == "DequantizeLinear" else None
        outs.append(native or graph.default_native(dtype))
    return ins, outs


def _boundaries(model) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    def typed(values):
        return [(v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name)
                for v in values]  # fmt: skip

    inits = {t.name for t in model.graph.initializer}
    return typed(v for v in model.graph.input if v.name not in inits), typed(model.graph.output)


def _qdq(scale: TensorProto, zero_point: TensorProto | None, *, constant_scale=False):
    """x (float) -> QuantizeLinear -> DequantizeLinear -> Relu -> QuantizeLinear ->
    DequantizeLinear -> y, both pairs with ``scale`` and ``zero_point``."""
    inits = [] if constant_scale else [scale]
    nodes = []
    if constant_scale:
        nodes.append(helper.make_node("Constant", [], [scale.name], value=scale))
    zp = [zero_point.name] if zero_point is not None else []
    if zero_point is not None:
        inits.append(zero_point)
    nodes += [
        helper.make_node("QuantizeLinear", ["x", scale.name, *zp], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", scale.name, *zp], ["xd"]),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", scale.name, *zp], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", scale.name, *zp], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def _raw(name: str, array: np.ndarray, data_type: int) -> TensorProto:
    return helper.make_tensor(name, data_type, array.shape, array.tobytes(), raw=True)


CASES = {
    "float scale raw, int8 zero point raw": (
        _raw("s", np.array(0.0123, np.float32), TensorProto.FLOAT),
        _raw("z", np.array(-7, np.int8), TensorProto.INT8),
    ),
    "float scale typed, int8 zero point typed (negative: a 10-byte varint)": (
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("z", TensorProto.INT8, [], [-128]),
    ),
    "uint8 zero point typed, dims [1]": (
        helper.make_tensor("s", TensorProto.FLOAT, [1], [0.25]),
        helper.make_tensor("z", TensorProto.UINT8, [1], [200]),
    ),
    "no zero point (uint8 0)": (helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), None),
    "float16 scale typed, int16 zero point": (
        helper.make_tensor("s", TensorProto.FLOAT16, [], np.array([0.0625], np.float16)),
        helper.make_tensor("z", TensorProto.INT16, [], [-300]),
    ),
    "float16 scale raw, int32 zero point raw": (
        _raw("s", np.array(0.375, np.float16), TensorProto.FLOAT16),
        _raw("z", np.array(123456, np.int32), TensorProto.INT32),
    ),
    "double scale typed, uint16 zero point typed": (
        helper.make_tensor("s", TensorProto.DOUBLE, [], [0.0009765625]),
        helper.make_tensor("z", TensorProto.UINT16, [], [40000]),
    ),
    "per-axis scale: not quantised per tensor": (
        helper.make_tensor("s", TensorProto.FLOAT, [3], [0.1, 0.2, 0.3]),
        helper.make_tensor("z", TensorProto.INT8, [3], [0, 1, 2]),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("constant_scale", [False, True], ids=["initializer", "Constant node"])
def test_boundaries_match_what_onnx_reads(case, constant_scale):
    scale, zero_point = CASES[case]
    model = _qdq(scale, zero_point, constant_scale=constant_scale)
    data = model.SerializeToString()
    inputs, outputs = _boundaries(model)
    mine = graph.native_types(data, inputs, outputs)
    assert mine == _reference(data, inputs, outputs)
    if "per-axis" in case:
        assert not mine[0][0].quantised and not mine[1][0].quantised
    else:
        assert mine[0][0].quantised and mine[1][0].quantised


def test_the_demo_models_read_as_onnx_reads_them():
    checked = 0
    for path in sorted(ASSETS.glob("*.onnx")):
        data = path.read_bytes()
        model = onnx.load_from_string(data)
        inputs, outputs = _boundaries(model)
        assert graph.native_types(data, inputs, outputs) == _reference(data, inputs, outputs)
        checked += graph.mentions_quantisation(data)
    assert checked >= 1  # digits-int8.onnx at least: a QDQ model was among them


def test_a_truncated_model_is_a_model_error():
    data = (ASSETS / "digits-int8.onnx").read_bytes()
    with pytest.raises(ModelError, match="not well formed"):
        graph.native_types(data[: len(data) // 2], [("x", "float32")], [])


def test_the_emulator_reports_a_quantised_boundary_without_importing_onnx(tmp_path):
    """get_tensor_attr's native types of a QDQ model, in a process where the onnx package
    is never imported (it used to be, for any model that mentions QuantizeLinear)."""
    scale, zero_point = CASES["float scale raw, int8 zero point raw"]
    path = tmp_path / "qdq.onnx"
    path.write_bytes(_qdq(scale, zero_point).SerializeToString())
    script = f"""
import sys
from batchinfer.runtime.sim import RKNNLite
r = RKNNLite(verbose=False, npu_ms=0.1, host_ms=0)
assert r.load_rknn({str(path)!r}) == 0
assert r.init_runtime() == 0
rt = r.rknn_runtime
for n in (rt.native_in[0], rt.native_out[0]):
    print(n.dtype, round(n.scale, 6), n.zero_point, n.quantised)
print("onnx" in sys.modules)
r.release()
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.splitlines()
    assert out[-3:] == ["int8 0.0123 -7 True", "int8 0.0123 -7 True", "False"]
