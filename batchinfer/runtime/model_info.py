"""What a model takes and gives, in the RKNN view, read from its ONNX file.

An ``.rknn`` file cannot be parsed off the board, so shapes come from the ``.onnx`` of
the same stem beside it (the model it was converted from), and what ``rknn.config()``
compiled into it from ``<stem>.config.json`` (see :mod:`batchinfer.runtime.conversion`).

Layout. rknn-toolkit2 reads every 4-D input of an ONNX model as NCHW ("framework layout:
NCHW" in librknnrt's model line) and the converted model takes it NHWC, whatever the
channel count: ONNX [1,3,224,224] becomes [1,224,224,3], ONNX [1,96,8,8] becomes
[1,8,8,96], and an ONNX that was already channels-last, [1,300,300,3], becomes
[1,300,3,300] (airockchip/rknn-toolkit2#344, rockchip-linux/rknpu2#26). That rule holds
for a ``.rknn``. An ``.onnx`` loaded directly is not a converted model; it is read the same
way, except that a 4-D input whose last axis is 1, 3 or 4 and whose second axis is not (or
is larger) is taken as already channels-last (as the bundled demo models are) and kept as
it is: [1,8,8,1] and [1,4,4,3] stay, [1,3,8,8] and [1,96,8,8] are NCHW, ties are NCHW.

Normalisation. A ``.rknn`` whose settings give ``mean_values``/``std_values`` for a float
input applies them itself: it takes raw uint8 pixels, NHWC. :class:`TensorInfo` says so
(``normalised_inside``, ``mean``, ``std``), so the engine feeds raw uint8 and never
normalises twice. An input that is not 4-D with mean 0 and std 1 (what a multi-input model's
settings give a tensor input such as a prompt vector) is not normalised: it takes its graph's
type.

Compiled shapes. A ``.rknn`` runs only the shapes it was compiled for: the ONNX's static
shape, or the shape sets of ``dynamic_input`` in its settings. A dynamic batch axis is 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchinfer.errors import ModelError
from batchinfer.messages import setting
from batchinfer.runtime.conversion import ConversionSettings, settings_path
from batchinfer.runtime.onnx_graph import GraphValue, read_graph_interface

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

_FLOAT_DTYPES = ("float32", "float16", "float64")
# Channel counts that mark the last axis of a directly loaded .onnx input as channels-last.
_CHANNELS_LAST = (1, 3, 4)


@dataclass(frozen=True)
class TensorInfo:
    """One input or output: name, RKNN-view shape, numpy dtype name to feed, ONNX layout.

    ``layout`` is the layout of the underlying ONNX tensor ("nchw" or "nhwc") for 4-D
    inputs and None otherwise. Unknown non-batch dims are -1. ``normalised_inside`` is
    True when the model applies ``mean``/``std`` (per channel, 0..255 pixel units) itself:
    then ``dtype`` is uint8 and the input takes raw pixels. ``shapes`` lists every shape
    a dynamic-shape ``.rknn`` was compiled for (``shape`` is the first); None otherwise.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str | None
    normalised_inside: bool = False
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class ModelInfo:
    """A model's inputs and outputs; ``onnx_path`` is the file they were read from.

    ``settings`` are the conversion settings found beside a ``.rknn`` (None otherwise).
    """

    path: Path
    onnx_path: Path
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    settings: ConversionSettings | None = None


@dataclass(frozen=True)
class InputSpec:
    """One model input as a runtime sees it: the ONNX tensor and the RKNN interface.

    ``onnx_dims``/``onnx_dtype``/``layout`` describe the graph's tensor (dynamic dims -1,
    batch 1); ``shape`` is the interface shape (NHWC for 4-D); ``shapes`` the compiled
    interface shapes of a dynamic-shape ``.rknn`` (None: ``shape`` only, with -1 meaning
    any size, which happens only for an ``.onnx`` loaded directly); ``mean``/``std`` the
    normalisation the model applies itself.
    """

    index: int
    name: str
    onnx_dims: tuple[int, ...]
    onnx_dtype: str
    layout: str | None
    shape: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def normalised_inside(self) -> bool:
        return self.mean is not None or self.std is not None

    @property
    def feed_dtype(self) -> str:
        """What a caller feeds: uint8 pixels when the model normalises, else the graph's type."""
        return "uint8" if self.normalised_inside else self.onnx_dtype

    def to_onnx(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The graph-side shape for an interface shape (NHWC -> NCHW for an NCHW input)."""
        if self.layout == "nchw":
            n, h, w, c = shape
            return (n, c, h, w)
        return tuple(shape)

    def info(self) -> TensorInfo:
        return TensorInfo(
            self.name,
            self.shape,
            self.feed_dtype,
            self.layout,
            self.normalised_inside,
            self.mean,
            self.std,
            self.shapes,
        )


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


def onnx_layout(dims: tuple[int, ...], converted: bool = True) -> str | None:
    """The graph layout of an ONNX input: 'nchw' for 4-D (see the module docstring), else None.

    ``converted`` (a ``.rknn``): always NCHW, as rknn-toolkit2 reads it. Otherwise (an
    ``.onnx`` run directly) a 4-D input that is evidently channels-last is 'nhwc'.
    """
    if len(dims) != 4:
        return None
    channels_last = dims[3] in _CHANNELS_LAST and (
        dims[1] not in _CHANNELS_LAST or dims[3] < dims[1]
    )
    if not converted and channels_last:
        return "nhwc"
    return "nchw"


def rknn_view(dims: tuple[int, ...], layout: str | None) -> tuple[int, ...]:
    """The shape the NPU takes for an ONNX input of ``dims``: NHWC for a 4-D NCHW input."""
    if layout == "nchw":
        n, c, h, w = dims
        return (n, h, w, c)
    return tuple(dims)


def input_specs(
    args: Sequence[GraphValue],
    converted: bool,
    settings: ConversionSettings | None = None,
    where: str = "",
) -> tuple[InputSpec, ...]:
    """The graph inputs ``args`` as a (converted) model takes them.

    ``args``: the graph's inputs, from :func:`read_graph_interface` or ONNX Runtime's
    ``session.get_inputs()`` (same fields). ModelError when the conversion settings do not
    fit the graph (see the module docstring); ``where`` names the model in messages.
    """
    where = where or "the model"
    n = len(args)
    if settings is not None:
        _check_counts(settings, n, where)
    specs = []
    for i, arg in enumerate(args):
        dims = concrete_dims(arg.shape)
        dtype = ORT_DTYPES.get(arg.type)
        if dtype is None:
            raise ModelError(f"{where}: input '{arg.name}' has type {arg.type}, which RKNN lacks.")
        layout = onnx_layout(dims, converted)
        mean = settings.mean(i) if settings else None
        std = settings.std(i) if settings else None
        if len(dims) != 4 and _identity(mean, std):
            # mean 0 / std 1 normalises nothing, and a tensor that is not an image is not
            # raw pixels: the input takes its graph's type (rknn.config wants a list for
            # every input of a multi-input model once one has one).
            mean = std = None
        if (mean is not None or std is not None) and dtype not in _FLOAT_DTYPES:
            raise ModelError(
                f"{settings_path_of(settings)} gives mean/std for input {i} ('{arg.name}'), "
                f"but the ONNX input is {dtype}; normalisation applies to float inputs only."
            )
        channels = dims[1] if layout == "nchw" else dims[-1]
        for name, values in (("mean_values", mean), ("std_values", std)):
            if values is not None and len(values) not in (1, channels):
                raise ModelError(
                    f"{settings_path_of(settings)}: {name}[{i}] has {len(values)} value(s) but "
                    f"input '{arg.name}' has {channels} channel(s); give one per channel."
                )
        compiled = settings.shapes(i) if settings else None
        shapes = None
        if compiled is not None:
            for shape in compiled:
                _check_compiled(shape, arg.shape, i, arg.name, settings)
            shapes = tuple(rknn_view(s, layout) for s in compiled)
            view = shapes[0]
        else:
            if converted and any(d < 0 for d in dims):
                raise ModelError(
                    f"{where}: the ONNX input '{arg.name}' has dynamic dims "
                    f"{_fmt(dims)}, but a .rknn has the shapes it was compiled for; list them "
                    f'as "dynamic_input" in {_settings_name(settings, where)}.'
                )
            view = rknn_view(dims, layout)
        specs.append(InputSpec(i, arg.name, dims, dtype, layout, view, shapes, mean, std))
    return tuple(specs)


def _identity(mean: Sequence[float] | None, std: Sequence[float] | None) -> bool:
    """True when (x - mean) / std is x: mean all 0 (or none) and std all 1 (or none)."""
    return all(v == 0 for v in mean or ()) and all(v == 1 for v in std or ())


def settings_path_of(settings: ConversionSettings | None) -> str:
    return str(settings.path) if settings is not None and settings.path else "the settings"


def _settings_name(settings: ConversionSettings | None, where: str) -> str:
    if settings is not None and settings.path is not None:
        return str(settings.path)
    return settings_path(where).name if where.endswith(".rknn") else "<stem>.config.json"


def _check_counts(settings: ConversionSettings, n: int, where: str) -> None:
    for name, values in (
        ("mean_values", settings.mean_values),
        ("std_values", settings.std_values),
    ):
        if values is not None and len(values) > n:
            raise ModelError(
                f"{settings_path_of(settings)}: {name} has {len(values)} lists but {where} "
                f"has {n} input(s); give one list per input."
            )
    if settings.dynamic_input is not None and len(settings.dynamic_input[0]) != n:
        raise ModelError(
            f"{settings_path_of(settings)}: each dynamic_input set has "
            f"{len(settings.dynamic_input[0])} shape(s) but {where} has {n} input(s)."
        )


def _check_compiled(
    shape: tuple[int, ...], onnx_shape: Sequence[object], i: int, name: str, settings
) -> None:
    # Only the ONNX input's dynamic axes (symbolic or unset) may take other sizes.
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in onnx_shape)
    fits = len(shape) == len(dims) and all(
        d < 0 or d == s for s, d in zip(shape, dims, strict=True)
    )
    if not fits:
        raise ModelError(
            f"{settings_path_of(settings)}: dynamic_input shape {_fmt(shape)} for input {i} "
            f"('{name}') does not fit the ONNX input {_fmt(dims)} (only its dynamic axes "
            "may differ)."
        )


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"


def describe_model(path: Path | str) -> ModelInfo:
    """The inputs (RKNN view) and outputs of the model at ``path`` (.onnx, or .rknn + .onnx).

    Raises ModelError when the file is missing or corrupt, when a .rknn has no .onnx
    beside it to read shapes from, or when its conversion settings are invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(
            f"Model file {path} does not exist; check the " + setting("model") + " path."
        )
    if path.suffix.lower() not in (".onnx", ".rknn"):
        raise ModelError(
            f"Model file {path} is neither .rknn nor .onnx; pass an .rknn or .onnx model."
        )
    onnx_path = onnx_beside(path)
    if onnx_path is None:
        raise ModelError(
            f"Input shapes of {path} cannot be read off the board; put "
            f"{path.with_suffix('.onnx').name} beside it or pass "
            + setting("preprocess.size")
            + " and "
            + setting("preprocess.dtype")
            + "."
        )
    converted = path.suffix.lower() == ".rknn"
    settings = ConversionSettings.load_beside(path) if converted else None
    # Read off the file, not from an ONNX Runtime session: see runtime/onnx_graph.py.
    graph = read_graph_interface(onnx_path)
    specs = input_specs(graph.inputs, converted, settings, where=str(path))
    # RKNNLite hands every output back as float32, whatever the graph computes.
    outputs = [
        TensorInfo(arg.name, concrete_dims(arg.shape), "float32", None) for arg in graph.outputs
    ]
    return ModelInfo(path, onnx_path, tuple(s.info() for s in specs), tuple(outputs), settings)


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
        # ONNX Runtime names the file again ("Load model from <path> failed:"): ours does.
        why = first_line.replace(f"Load model from {onnx_path} failed:", "").strip()
        if len(why) > 200:
            why = why[:200].rsplit(" ", 1)[0] + " …"
        raise ModelError(
            f"{onnx_path} is not a valid ONNX model ({why}); re-export or replace it."
        ) from exc
