"""What a model takes and gives, in the RKNN view, read from its ONNX file.

An ``.rknn`` file cannot be parsed off the board, so shapes come from the ``.onnx`` of
the same stem beside it (the model it was converted from). The RKNN view of a 4-D input
is NHWC, as the NPU takes it, whatever layout the ONNX graph uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchinfer.errors import ModelError

#: ONNX Runtime's type strings -> numpy dtype names.
ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(int32)": "int32",
    "tensor(uint32)": "uint32",
    "tensor(int64)": "int64",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}

# Channel counts that mark axis 1 of a 4-D tensor as the channel axis (NCHW).
_CHANNEL_DIMS = (1, 3, 4)


@dataclass(frozen=True)
class TensorInfo:
    """One input or output: name, RKNN-view shape, numpy dtype name, ONNX layout.

    ``layout`` is the layout of the underlying ONNX tensor ("nchw" or "nhwc") for 4-D
    inputs and None otherwise. Unknown non-batch dims are -1.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str | None


@dataclass(frozen=True)
class ModelInfo:
    """A model's inputs and outputs; ``onnx_path`` is the file they were read from."""

    path: Path
    onnx_path: Path
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def onnx_beside(path: Path) -> Path | None:
    """The ONNX file a model runs from here: itself, or ``<stem>.onnx`` beside a .rknn."""
    if path.suffix.lower() == ".onnx":
        return path
    candidate = path.with_suffix(".onnx")
    return candidate if candidate.is_file() else None


def concrete_dims(dims: list | tuple) -> tuple[int, ...]:
    """ONNX dims with the batch axis fixed to 1 when dynamic and other dynamic dims -1."""
    out = []
    for axis, dim in enumerate(dims):
        if isinstance(dim, int) and dim > 0:
            out.append(dim)
        else:
            out.append(1 if axis == 0 else -1)
    return tuple(out)


def onnx_layout(dims: tuple[int, ...]) -> str | None:
    """'nchw' or 'nhwc' for a 4-D ONNX input (guessed from the channel axis), else None."""
    if len(dims) != 4:
        return None
    if dims[1] in _CHANNEL_DIMS and dims[3] not in _CHANNEL_DIMS:
        return "nchw"
    return "nhwc"


def rknn_view(dims: tuple[int, ...], layout: str | None) -> tuple[int, ...]:
    """The shape the NPU takes for an ONNX input of ``dims``: NHWC for a 4-D NCHW input."""
    if layout == "nchw":
        n, c, h, w = dims
        return (n, h, w, c)
    return tuple(dims)


def describe_model(path: Path | str) -> ModelInfo:
    """The inputs (RKNN view) and outputs of the model at ``path`` (.onnx, or .rknn + .onnx).

    Raises ModelError when the file is missing or corrupt, or when a .rknn has no .onnx
    beside it to read shapes from.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"Model file {path} does not exist; check the --model path.")
    if path.suffix.lower() not in (".onnx", ".rknn"):
        raise ModelError(
            f"Model file {path} is neither .rknn nor .onnx; pass an .rknn or .onnx model."
        )
    onnx_path = onnx_beside(path)
    if onnx_path is None:
        raise ModelError(
            f"Input shapes of {path} cannot be read off the board; put "
            f"{path.with_suffix('.onnx').name} beside it or pass --size and --dtype."
        )
    session = open_session(onnx_path)
    inputs = []
    for arg in session.get_inputs():
        dims = concrete_dims(arg.shape)
        layout = onnx_layout(dims)
        dtype = ORT_DTYPES.get(arg.type, arg.type)
        inputs.append(TensorInfo(arg.name, rknn_view(dims, layout), dtype, layout))
    # RKNNLite hands every output back as float32, whatever the graph computes.
    outputs = [
        TensorInfo(arg.name, concrete_dims(arg.shape), "float32", None)
        for arg in session.get_outputs()
    ]
    return ModelInfo(path, onnx_path, tuple(inputs), tuple(outputs))


def session_options():  # -> onnxruntime.SessionOptions
    """ONNX Runtime options for one runtime instance: one thread, sequential, quiet."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # One instance stands for one NPU core's runtime; parallelism comes from instances.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return opts


def open_session(onnx_path: Path | str, model_bytes: bytes | None = None):
    """An ONNX Runtime CPU session for the model; ModelError if it is not valid ONNX."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(
            model_bytes if model_bytes is not None else str(onnx_path),
            sess_options=session_options(),
            providers=["CPUExecutionProvider"],
        )
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{onnx_path} is not a valid ONNX model ({first_line[:160]}); re-export or replace it."
        ) from exc
