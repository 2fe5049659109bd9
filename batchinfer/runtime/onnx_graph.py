"""The inputs and outputs an ONNX file declares, read from its protobuf without loading it.

Planning a run needs the model's input shape and type, and nothing else from the model.
Asking ONNX Runtime for them meant importing it in the coordinator and building a session,
which optimises the graph and loads every weight: for the demo model 27 ms of import and
5 ms of session, for a model of a few hundred MB seconds and as much memory, all before
any core worker starts (the workers load the model themselves). ``onnx.load`` is no
better: it parses and copies every weight too, and is not a dependency of the engine.

So this module reads the few fields it needs straight off the protobuf wire format, on a
memory map: the file's pages it never touches (the weights) are never read.

    ModelProto        1 ir_version (varint)          7 graph (GraphProto)
                      14 metadata_props (StringStringEntryProto: 1 key, 2 value)
    GraphProto        5 initializer (TensorProto)    11 input, 12 output (ValueInfoProto)
                      15 sparse_initializer (SparseTensorProto: 1 values, a TensorProto)
    TensorProto       8 name
    ValueInfoProto    1 name                         2 type (TypeProto)
    TypeProto         1 tensor_type (Tensor)         4 sequence, 5 map, 8 sparse, 9 optional
    TypeProto.Tensor  1 elem_type (varint)           2 shape (TensorShapeProto)
    TensorShapeProto  1 dim (Dimension: 1 dim_value varint, 2 dim_param string)

(onnx/onnx.proto3; field numbers are part of ONNX's compatibility promise.)

What comes out matches ONNX Runtime's ``session.get_inputs()`` / ``get_outputs()`` for the
same file (the tests compare them): inputs that are also initializers are left out, a dim
is an int, its symbolic name, or None, and a type is ORT's string, e.g. "tensor(float)".
One difference: ORT fills in an output shape the graph leaves undeclared by inferring it;
here an undeclared shape stays unknown (``()``). The engine takes output shapes from the
runtime's own first inference (the canary), not from here.

A file that is not a well-formed ModelProto with a graph raises :class:`ModelError`. A
well-formed model that no runtime can run (an unknown operator, say) passes here and is
refused when a runtime loads it.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchinfer.errors import ModelError

# TensorProto.DataType -> the element names ONNX Runtime uses in its type strings.
_ELEM_TYPES = {
    1: "float",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "double",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
}
_OTHER_TYPES = {4: "seq", 5: "map", 8: "sparse_tensor", 9: "optional"}

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class _Malformed(Exception):
    """The bytes are not the protobuf message they should be."""


@dataclass(frozen=True)
class GraphValue:
    """One graph input or output, shaped like ONNX Runtime's NodeArg (name, shape, type)."""

    name: str
    shape: tuple[int | str | None, ...]
    type: str


@dataclass(frozen=True)
class GraphInterface:
    inputs: tuple[GraphValue, ...]
    outputs: tuple[GraphValue, ...]
    # The model's metadata_props as (key, value) pairs, in file order (Ultralytics' exports
    # say their task and class names there: batchinfer/tasks' plan_task reads them).
    metadata: tuple[tuple[str, str], ...] = ()


def read_graph_interface(path: Path | str) -> GraphInterface:
    """The inputs (initializers excluded) and outputs the ONNX model at ``path`` declares.

    ModelError when the file cannot be read or is not an ONNX model.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) == 0:
                raise ModelError(_not_onnx(path, "the file is empty"))
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    return _model(view)
                except _Malformed as exc:
                    # Said outside this block: the traceback holds views into the map,
                    # which must be gone before it closes.
                    why = str(exc)
                finally:
                    view.release()
    except OSError as exc:
        raise ModelError(f"{path} cannot be read ({exc.strerror or exc}); check it.") from None
    raise ModelError(_not_onnx(path, why))


def _not_onnx(path: Path, why: str) -> str:
    return f"{path} is not a valid ONNX model ({why}); re-export or replace it."


# ---------------------------------------------------------------- messages we read
def _model(buf: memoryview) -> GraphInterface:
    ir_version = None
    graphs = []
    metadata: list[tuple[str, str]] = []
    for field, wire, value in _fields(buf):
        if field == 1 and wire == _VARINT:
            ir_version = value
        elif field == 7 and isinstance(value, memoryview):
            graphs.append(value)  # a repeated message field merges: keep every part
        elif field == 14 and isinstance(value, memoryview):
            metadata.append(_entry(value))
    if not ir_version:
        raise _Malformed("no IR version")
    if not graphs:
        raise _Malformed("no graph")
    inputs: list[GraphValue] = []
    outputs: list[GraphValue] = []
    initializers: set[str] = set()
    for graph in graphs:
        for field, _wire, value in _fields(graph):
            if not isinstance(value, memoryview):
                continue
            if field == 11:
                inputs.append(_value_info(value))
            elif field == 12:
                outputs.append(_value_info(value))
            elif field == 5:
                initializers.add(_tensor_name(value))
            elif field == 15:
                initializers.update(
                    _tensor_name(v)
                    for f, _w, v in _fields(value)
                    if f == 1 and isinstance(v, memoryview)
                )
    if not outputs:
        raise _Malformed("the graph has no outputs")
    return GraphInterface(
        tuple(v for v in inputs if v.name not in initializers), tuple(outputs), tuple(metadata)
    )


def _entry(buf: memoryview) -> tuple[str, str]:
    # Not _text: a metadata string that is not UTF-8 is no reason to refuse the model.
    key = value = ""
    for field, _wire, v in _fields(buf):
        if field == 1 and isinstance(v, memoryview):
            key = str(v, "utf-8", "replace")
        elif field == 2 and isinstance(v, memoryview):
            value = str(v, "utf-8", "replace")
    return key, value


def _tensor_name(buf: memoryview) -> str:
    name = ""
    for field, _wire, value in _fields(buf):
        if field == 8 and isinstance(value, memoryview):
            name = _text(value)
    return name


def _value_info(buf: memoryview) -> GraphValue:
    shape: tuple[int | str | None, ...] = ()
    name, kind = "", "unknown"
    for field, _wire, value in _fields(buf):
        if not isinstance(value, memoryview):
            continue
        if field == 1:
            name = _text(value)
        elif field == 2:
            shape, kind = _type(value)
    return GraphValue(name, shape, kind)


def _type(buf: memoryview) -> tuple[tuple[int | str | None, ...], str]:
    for field, _wire, value in _fields(buf):
        if not isinstance(value, memoryview):
            continue
        if field == 1:
            return _tensor_type(value)
        if field in _OTHER_TYPES:
            return (), _OTHER_TYPES[field]
    return (), "unknown"


def _tensor_type(buf: memoryview) -> tuple[tuple[int | str | None, ...], str]:
    elem = 0
    shape: tuple[int | str | None, ...] = ()
    for field, wire, value in _fields(buf):
        if field == 1 and wire == _VARINT and isinstance(value, int):
            elem = value
        elif field == 2 and isinstance(value, memoryview):
            shape = tuple(
                _dim(v) for f, _w, v in _fields(value) if f == 1 and isinstance(v, memoryview)
            )
    return shape, f"tensor({_ELEM_TYPES.get(elem, f'elem_type {elem}')})"


def _dim(buf: memoryview) -> int | str | None:
    dim: int | str | None = None
    for field, wire, value in _fields(buf):
        if field == 1 and wire == _VARINT and isinstance(value, int):
            dim = value - (1 << 64) if value >= 1 << 63 else value  # int64, two's complement
        elif field == 2 and isinstance(value, memoryview):
            dim = _text(value)
    return dim


# ---------------------------------------------------------------- quantised boundaries
@dataclass(frozen=True)
class Affine:
    """A tensor's per-tensor quantisation: its quantised type (the zero point's, a numpy
    name), scale and zero point."""

    dtype: str
    scale: float
    zero_point: int


# The fields a QDQ graph's boundaries are read from, beyond those above:
#
#     GraphProto      1 node (NodeProto)
#     NodeProto       1 input, 2 output (strings)      4 op_type     5 attribute
#     AttributeProto  1 name                           5 t (TensorProto)
#     TensorProto     1 dims (int64)   2 data_type     4 float_data  5 int32_data
#                     7 int64_data     9 raw_data      10 double_data  11 uint64_data
#                     14 data_location (1: the data is in another file)
#
# Only the scale and zero point tensors the boundary nodes name are decoded; the weights
# are skipped as one length-delimited field each.
_NUMPY_TYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}  # fmt: skip
# data_type -> (the typed field holding its values, their fixed size in bytes; 0: varints).
# int32_data holds int8..int32 values and float16/bfloat16 bits, each as an int32.
_TYPED_FIELDS = {
    **dict.fromkeys((2, 3, 4, 5, 6, 9, 10, 16), (5, 0)),
    1: (4, 4), 11: (10, 8), 7: (7, 0), 12: (11, 0), 13: (11, 0),
}  # fmt: skip


def read_qdq_boundaries(
    model: bytes, inputs: Sequence[str], outputs: Sequence[str]
) -> tuple[list[Affine | None], list[Affine | None]]:
    """How a quantised (QDQ) ONNX graph quantises its boundaries, without the onnx package:
    for each of ``inputs``, the first ``QuantizeLinear`` that consumes it, and for each of
    ``outputs``, a ``DequantizeLinear`` that makes it, as that node's :class:`Affine`; None
    where there is no such node or its quantisation is not one constant per tensor.

    Read in the main graph, as ``onnx.load`` and numpy_helper would (a test compares them).
    ModelError when ``model`` is not a well-formed ONNX model.
    """
    try:
        nodes, tensors = _nodes_and_constants(memoryview(model))
        first_consumer: dict[str, _Node] = {}
        producer: dict[str, _Node] = {}
        for node in nodes:
            for name in node.inputs:
                if node.op_type == "QuantizeLinear":
                    first_consumer.setdefault(name, node)
            for name in node.outputs:
                producer[name] = node
        ins = [_affine(first_consumer.get(name), tensors) for name in inputs]
        outs = []
        for name in outputs:
            made_by = producer.get(name)
            dequantised = made_by is not None and made_by.op_type == "DequantizeLinear"
            outs.append(_affine(made_by, tensors) if dequantised else None)
        return ins, outs
    except _Malformed as exc:
        raise ModelError(f"the ONNX model is not well formed ({exc}); re-export it.") from None


@dataclass(frozen=True)
class _Node:
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _nodes_and_constants(buf: memoryview) -> tuple[list[_Node], dict[str, memoryview]]:
    """The main graph's nodes, and its constant tensors (initializers and Constant nodes'
    values) by name, undecoded."""
    nodes: list[_Node] = []
    tensors: dict[str, memoryview] = {}
    for field, wire, graph in _fields(buf):
        if field != 7 or wire != _BYTES:
            continue
        assert isinstance(graph, memoryview)
        for gfield, gwire, value in _fields(graph):
            if gwire != _BYTES:
                continue
            assert isinstance(value, memoryview)
            if gfield == 5:
                tensors[_tensor_name(value)] = value
            elif gfield == 1:
                node, value_tensor = _node(value)
                nodes.append(node)
                if node.op_type == "Constant" and value_tensor is not None and node.outputs:
                    tensors[node.outputs[0]] = value_tensor
    return nodes, tensors


def _node(buf: memoryview) -> tuple[_Node, memoryview | None]:
    """A node, and the tensor of its ``value`` attribute if it has one."""
    op_type, inputs, outputs, value = "", [], [], None
    for field, wire, v in _fields(buf):
        if wire != _BYTES:
            continue
        assert isinstance(v, memoryview)
        if field == 1:
            inputs.append(_text(v))
        elif field == 2:
            outputs.append(_text(v))
        elif field == 4:
            op_type = _text(v)
        elif field == 5:
            name, tensor = "", None
            for afield, awire, av in _fields(v):
                if afield == 1 and awire == _BYTES:
                    name = _text(av)  # type: ignore[arg-type]
                elif afield == 5 and awire == _BYTES:
                    tensor = av
            if name == "value" and isinstance(tensor, memoryview):
                value = tensor
    return _Node(op_type, tuple(inputs), tuple(outputs)), value


def _affine(node: _Node | None, tensors: dict[str, memoryview]) -> Affine | None:
    """A (De)QuantizeLinear node's per-tensor quantisation (ONNX: the zero point is uint8 0
    when absent); None when it is per-axis, not a constant, or of a type numpy lacks."""
    if node is None or len(node.inputs) < 2 or node.inputs[1] not in tensors:
        return None
    scale = _scalar(tensors[node.inputs[1]])
    zp_name = node.inputs[2] if len(node.inputs) > 2 else ""
    if not zp_name:
        zp: tuple[str, float | int] | None = ("uint8", 0)
    else:
        zp = _scalar(tensors[zp_name]) if zp_name in tensors else None
    if scale is None or zp is None:
        return None
    return Affine(zp[0], float(scale[1]), int(zp[1]))


def _scalar(buf: memoryview) -> tuple[str, float | int] | None:
    """(numpy type name, value) of a one-element tensor; None for any other."""
    dims: list[int] = []
    data_type, raw, typed, external = 0, None, [], False
    for field, wire, value in _fields(buf):
        if field == 1:
            dims += _ints(wire, value)
        elif field == 2 and wire == _VARINT:
            data_type = int(value)
        elif field == 9 and wire == _BYTES:
            raw = bytes(value)
        elif field == 14 and wire == _VARINT:
            external = value == 1
        elif field in (4, 5, 7, 10, 11):
            typed.append((field, wire, value))
    dtype = _NUMPY_TYPES.get(data_type)
    if dtype is None or external or math.prod(dims) != 1:
        return None
    size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    bits: bytes | None
    if raw is not None:
        if len(raw) != size:
            return None
        bits = raw
    else:
        bits = _typed_bytes(data_type, size, typed)
        if bits is None:
            return None
    if dtype == "bfloat16":  # numpy has no bfloat16: its bits are a float32's top half
        return "float32", float(np.frombuffer(b"\0\0" + bits, "<f4")[0])
    return dtype, np.frombuffer(bits, np.dtype(dtype).newbyteorder("<"))[0].item()


def _typed_bytes(
    data_type: int, size: int, typed: list[tuple[int, int, int | memoryview]]
) -> bytes | None:
    """The little-endian bytes of a tensor's one value held in its typed field."""
    field, fixed = _TYPED_FIELDS.get(data_type, (0, 0))
    chunks = [(w, raw) for f, w, raw in typed if f == field]
    if fixed:  # float_data, double_data: packed, or one fixed-size field per value
        data = b"".join(
            bytes(raw) if w == _BYTES else int(raw).to_bytes(fixed, "little") for w, raw in chunks
        )
        return data if len(data) == size else None
    values = [v for w, raw in chunks for v in _ints(w, raw)]
    if len(values) != 1:
        return None
    return (values[0] & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _ints(wire: int, value: int | memoryview) -> list[int]:
    """The values of a repeated varint field: packed (one length-delimited field) or not."""
    if wire == _VARINT:
        assert isinstance(value, int)
        return [value]
    if wire != _BYTES:
        raise _Malformed("a number field of the wrong wire type")
    assert isinstance(value, memoryview)
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


# ---------------------------------------------------------------- the wire format
def _fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field of one message: an int for varints
    and fixed-size fields, a memoryview (not a copy) for length-delimited ones."""
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        value: int | memoryview
        if field == 0:
            raise _Malformed("field number 0")
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _BYTES:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise _Malformed("a field runs past its end")
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if pos + size > end:
                raise _Malformed("a field runs past its end")
            value, pos = int.from_bytes(buf[pos : pos + size], "little"), pos + size
        else:  # 3 and 4 are proto2 groups, which ONNX never uses; 6 and 7 do not exist
            raise _Malformed(f"wire type {wire}")
        yield field, wire, value


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    end = len(buf)
    while True:
        if pos >= end or shift > 63:
            raise _Malformed("a truncated number")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _text(buf: memoryview) -> str:
    try:
        return str(buf, "utf-8")
    except UnicodeDecodeError:
        raise _Malformed("a name that is not UTF-8") from None
