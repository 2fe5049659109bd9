"""runtime/onnx_graph.py: a model's inputs and outputs read off its protobuf, as ONNX Runtime
reports them, and files that are not ONNX refused."""

from __future__ import annotations

from pathlib import Path

import models as M
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from batchinfer.errors import ModelError
from batchinfer.runtime import describe_model
from batchinfer.runtime.onnx_graph import read_graph_interface

DEMO_MODELS = sorted((Path(__file__).parents[1] / "batchinfer" / "demo" / "assets").glob("*.onnx"))


def _save(path: Path, inputs, outputs, nodes, inits=(), ir_version: int = 8) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version
    )
    if all(v.type.tensor_type.HasField("shape") for v in [*inputs, *outputs]):
        onnx.checker.check_model(model)  # it wants shapes; ONNX Runtime loads models without
    onnx.save(model, str(path))
    return path


def _identity(path: Path, elem_type: int, shape) -> Path:
    return _save(
        path,
        [helper.make_tensor_value_info("x", elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)],
        [helper.make_node("Identity", ["x"], ["y"])],
    )


def _with_initializer_as_input(path: Path, ir_version: int) -> Path:
    # Before IR 4 every initializer had to be listed as a graph input too; later it may be,
    # to make it overridable. Either way it is not something a caller has to feed.
    w = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    return _save(
        path,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        [w],
        ir_version=ir_version,
    )


MODELS = {
    "nhwc uint8": lambda d: M.nhwc_uint8_model(d),
    "nchw float": lambda d: M.nchw_float_model(d),
    "two outputs, one int64": lambda d: M.two_output_model(d),
    "symbolic dims": lambda d: _identity(d / "sym.onnx", TensorProto.FLOAT, ["n", 3, "h", "w"]),
    "unnamed dynamic dims": lambda d: _identity(d / "dyn.onnx", TensorProto.FLOAT, [None, 8]),
    "unknown rank": lambda d: _identity(d / "rank.onnx", TensorProto.FLOAT, None),
    "a scalar": lambda d: _identity(d / "scalar.onnx", TensorProto.FLOAT, []),
    "float16": lambda d: _identity(d / "f16.onnx", TensorProto.FLOAT16, [1, 4]),
    "int32": lambda d: _identity(d / "i32.onnx", TensorProto.INT32, [1, 4]),
    "bool": lambda d: _identity(d / "bool.onnx", TensorProto.BOOL, [1, 4]),
    "double": lambda d: _identity(d / "f64.onnx", TensorProto.DOUBLE, [1, 4]),
    "initializer as input, IR 3": lambda d: _with_initializer_as_input(d / "ir3.onnx", 3),
    "initializer as input, IR 8": lambda d: _with_initializer_as_input(d / "ir8.onnx", 8),
}


def _ort_view(path: Path) -> tuple[list, list]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return tuple(
        [(a.name, list(a.shape), a.type) for a in args]
        for args in (session.get_inputs(), session.get_outputs())
    )


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_inputs_and_outputs_are_what_onnx_runtime_reports(tmp_path, make):
    path = make(tmp_path)
    graph = read_graph_interface(path)
    mine = tuple(
        [(v.name, list(v.shape), v.type) for v in values]
        for values in (graph.inputs, graph.outputs)
    )
    assert mine == _ort_view(path)


@pytest.mark.parametrize("path", DEMO_MODELS, ids=[p.name for p in DEMO_MODELS])
def test_the_demo_models_read_as_onnx_runtime_reports_them(path):
    graph = read_graph_interface(path)
    assert [(v.name, list(v.shape), v.type) for v in graph.inputs] == _ort_view(path)[0]


def test_an_input_of_a_type_rknn_lacks_is_refused_by_name(tmp_path):
    path = _save(
        tmp_path / "seq.onnx",
        [helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_node("SequenceAt", ["xs", "zero"], ["y"])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )
    with pytest.raises(ModelError, match="input 'xs' has type seq, which RKNN lacks"):
        describe_model(path)


def test_a_rknn_whose_onnx_has_a_custom_op_is_described(tmp_path):
    # rknn-toolkit2's custom-op flow (examples/functions/custom_op): the .onnx beside the
    # .rknn has an operator of Rockchip's "rknn_cst" domain, which ONNX Runtime cannot load,
    # while the board runs the .rknn. Its shapes were unreadable through ONNX Runtime.
    graph = helper.make_graph(
        [helper.make_node("cstDualResidual", ["a", "b"], ["y"], domain="rknn_cst")],
        "custom",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3, 10, 10]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 10, 10]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 10, 10])],
    )
    opsets = [helper.make_opsetid("", 12), helper.make_opsetid("rknn_cst", 1)]
    onnx_path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), onnx_path)
    with pytest.raises(Exception, match="cstDualResidual"):
        ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    info = describe_model(M.fake_rknn(onnx_path))
    assert [t.shape for t in info.inputs] == [(1, 10, 10, 3), (1, 10, 10, 3)]
    assert [t.shape for t in info.outputs] == [(1, 3, 10, 10)]


def _cuts(data: bytes) -> list[int]:
    return [1, 2, len(data) // 3, len(data) // 2, len(data) - 1]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "the file is empty"),
        (b"this is not an onnx model\x00\x01", "wire type 4"),
        (bytes(range(256)) * 8, "field number 0"),
        (b"\x08\x08", "no graph"),  # ir_version 8 and nothing else
        (b"\x3a\x00", "no IR version"),  # an empty graph and nothing else
        (b"\x08\x08\x3a\x00", "the graph has no outputs"),
        (b"\x08\xff\xff", "a truncated number"),
        (b"\x08\x08\x3a\x05\x0a", "runs past its end"),
    ],
)
def test_a_file_that_is_not_onnx_is_refused_with_why(tmp_path, content, why):
    path = tmp_path / "m.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=f"{path}.*not a valid ONNX model.*{why}"):
        read_graph_interface(path)


def test_a_truncated_model_is_refused(tmp_path):
    data = M.nchw_float_model(tmp_path).read_bytes()
    for cut in _cuts(data):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError, match="not a valid ONNX model"):
            read_graph_interface(path)
