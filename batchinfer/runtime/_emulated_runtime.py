"""``rknn_runtime``: what ``init_runtime`` creates, with the real object's queries and inputs.

The real RKNNLite keeps its runtime in ``self.rknn_runtime`` (None until ``init_runtime``
has made one, None again after ``release``); scripts read model shapes through it::

    n_in, n_out = rknn.rknn_runtime.get_in_out_num()
    attr = rknn.rknn_runtime.get_tensor_attr(0)            # is_output=False
    h, w = attr.dims[1], attr.dims[2]                       # NHWC for a 4-D input

and some drive it directly, as ``RKNNLite.inference`` does (to overlap setting the next
inputs with getting the last outputs)::

    rknn.rknn_runtime.set_inputs([img], None, ["nhwc"], inputs_pass_through=None)
    rknn.rknn_runtime.run(False)
    outputs = rknn.rknn_runtime.get_outputs(False)

Those members behave as below, each raising an ``Exception`` where the real one does
(``inference`` turns that into its E line and ``None``). Any other member is an
AttributeError that names what the real runtime offers (:data:`MEMBERS`).

After an ``init_runtime`` that failed once the runtime object existed (the model or the
device refused: the wheel's ``build_graph`` step), the real RKNNLite keeps that object in
``rknn_runtime``: it is not None although ``init_runtime`` returned -1 (test the return
value, not ``rknn_runtime``). ``UnbuiltRuntime`` (runtime/_unbuilt_runtime.py) stands for
it: every query raises, ``inference`` returns None with ``E Catch exception when setting inputs.``,
``get_sdk_version`` returns None, ``release`` sets it back to None.

``get_tensor_attr`` returns a ctypes structure laid out like the wheel's (rknn_api.h's
``rknn_tensor_attr``; the wheel spells ``size_with_stride`` as ``stride_with_stride``):
``name`` is bytes, ``dims`` a 16-slot array of which ``n_dims`` count, ``fmt``/``type``/
``qnt_type`` are rknn_api.h's enum values. Inputs: NHWC for 4-D (else UNDEFINED), native
type (see :mod:`batchinfer.runtime.graph`), ``size`` in native bytes, ``w_stride`` = W.
Outputs: the graph's shape, NCHW for 4-D, native type.

Input rules (``set_inputs``), in the order the real runtime applies them: a list of
ndarrays, one per input (a non-list only warns); a supported dtype, equal to
``data_type`` when given; the rank of the input; ``data_format='nchw'`` 4-D data is
transposed to NHWC (with the real W line); the shape must be the model's (for a
dynamic-shape ``.rknn``, one compiled shape set for all inputs). Then the model's own
normalisation (mean/std from the conversion settings) and conversion to the graph's type
and layout. ``inputs_pass_through`` is a list with one 0/1 flag per input; a flagged
buffer skips all of that and must already be the native type in the native layout
(NHWC for 4-D); a quantised one is dequantised for the graph.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from batchinfer.runtime import constants as C
from batchinfer.runtime.conversion import normalise
from batchinfer.runtime.graph import NativeType
from batchinfer.runtime.model_info import InputSpec, concrete_dims
from batchinfer.runtime.rknn_log import RKNNLog

RKNN_MAX_DIMS = 16
RKNN_MAX_NAME_LEN = 256
# rknn_api.h enums.
TENSOR_NCHW, TENSOR_NHWC, TENSOR_NC1HWC2, TENSOR_UNDEFINED = 0, 1, 2, 3
QNT_NONE, QNT_DFP, QNT_AFFINE_ASYMMETRIC = 0, 1, 2
TENSOR_TYPES = {
    "float32": 0,
    "float16": 1,
    "int8": 2,
    "uint8": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "bool": 9,
}
_NHWC_TO_NCHW = (0, 3, 1, 2)
_NCHW_TO_NHWC = (0, 2, 3, 1)


_U32 = ctypes.c_uint32


class RKNNTensorAttr(ctypes.Structure):
    """``rknn_tensor_attr`` as the rknnlite wheel declares it."""

    # The C struct's members in rknn_api.h's order, three to a line (one a line made 16
    # lines of one shape).
    _fields_ = [
        ("index", _U32), ("n_dims", _U32), ("dims", _U32 * RKNN_MAX_DIMS),
        ("name", ctypes.c_char * RKNN_MAX_NAME_LEN), ("n_elems", _U32), ("size", _U32),
        ("fmt", ctypes.c_int), ("type", ctypes.c_int), ("qnt_type", ctypes.c_int),
        ("fl", ctypes.c_int8), ("zp", ctypes.c_int32), ("scale", ctypes.c_float),
        ("w_stride", _U32), ("stride_with_stride", _U32), ("pass_through", ctypes.c_uint8),
        ("h_stride", _U32),
    ]  # fmt: skip


class RKNNPerfRun(ctypes.Structure):
    """``rknn_perf_run`` (rknn_api.h): ``run_duration``, microseconds of the last run."""

    _fields_ = [("run_duration", ctypes.c_int64)]


class InputRejected(Exception):
    """An input problem: inference() logs it and returns None."""


# The wheel's warning for inputs that are not a list (they are listed and go on).
_NOT_A_LIST = (
    "Inputs should be placed in a list, like [img1, img2], both the img1 and img2 are ndarray."
)


#: The members of the real ``rknn_runtime`` that the emulator has (rknn_api.h, the wheel).
MEMBERS = (
    "get_in_out_num()",
    "get_tensor_attr(index, is_output=False)",
    "get_sdk_version()",
    "set_inputs(inputs, data_type=None, data_format=None, inputs_pass_through=None)",
    "run(get_frame_id=False)",
    "get_outputs(get_frame_id=False)",
    "get_run_perf()",
    "get_output_shape(index)",
    "set_core_mask(core_mask)",
    "check_dynamic_shape()",
    "release()",
)
# Members of the real RKNNRuntime that the emulator does not have: ctypes internals and
# steps RKNNLite.init_runtime takes itself.
_NOT_EMULATED = ("lib", "context", "build_graph", "check_rt_version", "extend_rt_lib")


def missing_member(name: str) -> AttributeError:
    """The AttributeError for a member the emulator's ``rknn_runtime`` lacks."""
    offered = ", ".join(MEMBERS)
    if name in _NOT_EMULATED:
        return AttributeError(
            f"rknn_runtime.{name} belongs to the real RKNNRuntime (rknnlite.api.rknn_runtime) "
            f"but is not emulated (its ctypes internals and init_runtime's own steps are "
            f"not); the emulator's rknn_runtime offers {offered}."
        )
    hint = " (input shapes: get_tensor_attr(i).dims)" if name in ("get_inputs", "inputs") else ""
    return AttributeError(
        f"rknn_runtime has no attribute {name!r}, and the real RKNNRuntime "
        f"(rknnlite.api.rknn_runtime) has none either as far as is known "
        f"(batchinfer/runtime/CONTRACT.md); it offers {offered}{hint}."
    )


#: Runs staged feeds with the owning RKNNLite's timing and faults: (outputs or None for
#: a failed call, frame id).
Runner = Callable[["EmulatedRuntime", dict[str, np.ndarray]], tuple[list | None, int]]


class EmulatedRuntime:
    """The runtime of one initialised model: ONNX Runtime session plus the RKNN interface."""

    def __init__(
        self,
        log: RKNNLog,
        session: Any,
        inputs: tuple[InputSpec, ...],
        native_in: Sequence[NativeType],
        native_out: Sequence[NativeType],
        sdk: tuple[str, str, str],
    ) -> None:
        self._log = log
        self.session = session
        self.inputs = inputs
        self.native_in = tuple(native_in)
        self.native_out = tuple(native_out)
        self.output_names = tuple(o.name for o in session.get_outputs())
        self._output_dims = tuple(concrete_dims(o.shape) for o in session.get_outputs())
        self._sdk = sdk
        self._runner: Runner | None = None  # set by the RKNNLite that made this runtime
        self._core_mask_setter: Callable[[int], None] | None = None
        self._dynamic_checked: Callable[[bool], None] | None = None
        self.is_dynamic_shape = False  # the wheel's attribute, set by check_dynamic_shape
        self._staged: dict[str, np.ndarray] | None = None  # set_inputs' feeds, for run
        self._outputs: list[np.ndarray] | None = None  # the last run's, for get_outputs
        self._run_us = 0  # the last run's duration, for get_run_perf

    def __getattr__(self, name: str) -> Any:
        # Only called for members that do not exist: say what the real runtime offers.
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing_member(name)

    def bind(
        self,
        runner: Runner,
        core_mask_setter: Callable[[int], None] | None = None,
        dynamic_checked: Callable[[bool], None] | None = None,
    ) -> None:
        """Let ``run`` use the owning RKNNLite's timing and faults, ``set_core_mask`` its
        chip rules and ``check_dynamic_shape`` its board lines (RKNNLite calls this)."""
        self._runner = runner
        self._core_mask_setter = core_mask_setter
        self._dynamic_checked = dynamic_checked

    # ---------------------------------------------------------------- queries
    def get_in_out_num(self) -> tuple[int, int]:
        """(number of inputs, number of outputs)."""
        return len(self.inputs), len(self.output_names)

    def get_tensor_attr(self, index: int, is_output: bool = False) -> RKNNTensorAttr:
        """The attributes of input (or output) ``index``; Exception for a bad index."""
        count = len(self.output_names) if is_output else len(self.inputs)
        if not 0 <= index < count:
            what = "OUTPUT" if is_output else "INPUT"
            self._log.native(
                40,
                f"rknn_query, RKNN_QUERY_{what}_ATTR, p_attr->index({index}) >= "
                f"{what.lower()}_num({count})!",
            )
            raise Exception(  # the real runtime raises a bare Exception too
                f"Query tensor attribute of {'output' if is_output else 'input'} {index} failed, "
                "error code: RKNN_ERR_PARAM_INVALID"
            )
        if is_output:
            dims = self._output_dims[index]
            name = self.output_names[index]
            native = self.native_out[index]
            fmt = TENSOR_NCHW if len(dims) == 4 else TENSOR_UNDEFINED
        else:
            spec = self.inputs[index]
            dims, name, native = spec.shape, spec.name, self.native_in[index]
            fmt = TENSOR_NHWC if len(dims) == 4 else TENSOR_UNDEFINED
        attr = RKNNTensorAttr()
        attr.index = index
        attr.n_dims = len(dims)
        for axis, d in enumerate(dims[:RKNN_MAX_DIMS]):
            attr.dims[axis] = max(
                d, 0
            )  # 0 stands for a size only an .onnx run directly leaves open
        attr.name = name.encode()[: RKNN_MAX_NAME_LEN - 1]
        attr.n_elems = int(np.prod([max(d, 0) for d in dims]))
        attr.size = attr.n_elems * np.dtype(native.dtype).itemsize
        attr.fmt = fmt
        attr.type = TENSOR_TYPES.get(native.dtype, TENSOR_TYPES["float32"])
        attr.qnt_type = QNT_AFFINE_ASYMMETRIC  # boards report AFFINE with scale 1 for float16 too
        attr.zp = native.zero_point
        attr.scale = native.scale
        attr.w_stride = dims[2] if fmt == TENSOR_NHWC else 0
        attr.stride_with_stride = attr.size
        return attr

    def get_sdk_version(self) -> tuple[str, str, str]:
        """(banner text, API version text, driver version text)."""
        return self._sdk

    def get_output_shape(self, index: int) -> list[int]:
        """The dims of output ``index``. The wheel's method takes exactly one argument
        besides self (its argument check, rknn_runtime .so); its name and meaning are not
        readable there, so the index and the returned list are [guess]."""
        if not isinstance(index, int) or not 0 <= index < len(self.output_names):
            raise Exception(
                f"Query tensor attribute of output {index} failed, error code: "
                "RKNN_ERR_PARAM_INVALID"
            )
        return [max(d, 0) for d in self._output_dims[index]]

    def set_core_mask(self, core_mask: int) -> int:
        """0 when the chip takes ``core_mask``; raises (after its E line) when it does not,
        and init_runtime then logs ``E Catch exception when set npu core mode.`` and
        returns -1 (rknn_lite.py; the messages are the rknn_runtime .so's strings)."""
        if self._core_mask_setter is not None:
            self._core_mask_setter(core_mask)
        return 0

    def check_dynamic_shape(self) -> None:
        """Query whether the model has dynamic shapes (the wheel's docstring: "query the
        model's rknn_input_range; if that fails it is not a dynamic-shape model"); a
        static model gets the board's two warnings. Returns None [guess: init_runtime
        ignores the value]."""
        self.is_dynamic_shape = any(spec.shapes is not None for spec in self.inputs)
        if self._dynamic_checked is not None:
            self._dynamic_checked(self.is_dynamic_shape)

    def release(self) -> None:
        self.session = None
        self._staged = self._outputs = None

    # ---------------------------------------------------------------- the real calls
    def set_inputs(
        self,
        inputs: Any,
        data_type: Any = None,
        data_format: Any = None,
        inputs_pass_through: Any = None,
    ) -> None:
        """Check and stage ``inputs`` for :meth:`run`; InputRejected (an Exception) says
        what is wrong, as the real one raises."""
        self._staged = self.feeds(inputs, data_type, data_format, inputs_pass_through)

    def run(self, get_frame_id: bool = False) -> int | tuple[int, int]:
        """Run the staged inputs: 0, or ``(0, frame_id)`` with ``get_frame_id`` [guess: the
        wheel's inference reads ``ret[1]`` only then]; Exception for a failed call."""
        if self._staged is None or self._runner is None:
            raise Exception(
                "Run failed: no inputs are set; call set_inputs first. error code: "
                "RKNN_ERR_INPUT_INVALID"
            )
        started = time.monotonic()
        outputs, frame_id = self._runner(self, self._staged)
        self._run_us = int((time.monotonic() - started) * 1e6)
        if outputs is None:
            raise Exception("Run failed. error code: RKNN_ERR_FAIL")
        self._outputs = outputs
        return (0, frame_id) if get_frame_id else 0

    def get_outputs(self, get_frame_id: bool = False) -> list[np.ndarray]:
        """The last run's outputs, float32 arrays in model order, owned by the caller."""
        if self._outputs is None:
            raise Exception(
                "Get outputs failed: nothing has run yet; call run first. error code: "
                "RKNN_ERR_OUTPUT_INVALID"
            )
        return [o.copy() for o in self._outputs]

    def get_run_perf(self) -> RKNNPerfRun:
        """``run_duration``: the last :meth:`run`'s wall time in microseconds (the
        emulated call's, host_ms included; a board counts the NPU run only)."""
        return RKNNPerfRun(self._run_us)

    # ---------------------------------------------------------------- inputs
    def feeds(
        self, inputs: Any, data_type: Any, data_format: Any, pass_through: Any
    ) -> dict[str, np.ndarray]:
        """The ONNX feeds for RKNN-interface ``inputs``; InputRejected says what is wrong."""
        n = len(self.inputs)
        inputs, types, formats = per_input_list(
            inputs, data_type, data_format, n, lambda _: self._log.w(_NOT_A_LIST)
        )
        flags = _pass_through_flags(pass_through, n)
        arrays = [
            self._interface_view(i, arr, types[i], formats[i], flags[i])
            for i, arr in enumerate(inputs)
        ]
        self._check_shapes(arrays)
        return {
            spec.name: self._graph_feed(spec, arr, flags[i])
            for i, (spec, arr) in enumerate(zip(self.inputs, arrays, strict=True))
        }

    def compute(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for ``feeds``, in model order."""
        return self.session.run(list(self.output_names), feeds)

    def _interface_view(
        self, i: int, arr: Any, data_type: Any, data_format: Any, pass_through: int
    ) -> np.ndarray:
        """Input ``i`` as the interface takes it (NHWC for 4-D), after the real checks."""
        spec = self.inputs[i]
        if not isinstance(arr, np.ndarray):
            raise InputRejected(f"Type of inputs[{i}] is not np.ndarray!")
        dtype = arr.dtype.name
        if dtype not in C.SUPPORTED_DTYPES:
            raise InputRejected(f"Unsupport inputs[{i}].dtype: {dtype}")
        if data_type is not None and data_type != dtype:
            raise InputRejected(f"inputs[{i}].dtype: {dtype} is not same as data_type")
        if data_format is not None and data_format not in ("nhwc", "nchw"):
            raise InputRejected(f"Unsupport data format: {data_format}")
        if pass_through:
            native = self.native_in[i]
            if arr.dtype != np.dtype(native.dtype) or arr.ndim != len(spec.shape):
                raise InputRejected(
                    f"The input[{i}] is passed through, so it must already be the model's "
                    f"native {native.dtype} {_fmt(spec.shape)}"
                    + (" (NHWC)" if len(spec.shape) == 4 else "")
                    + f", but got {dtype} {_fmt(arr.shape)}."
                )
            return arr
        rank = len(spec.shape)
        if arr.ndim != rank:
            hint = " Please try to feed input as 4D data." if rank == 4 else ""
            raise InputRejected(
                f"The input[{i}] need {rank}dims input, but {arr.ndim}dims input buffer feed.{hint}"
            )
        if data_format == "nchw":
            if rank == 4:
                self._log.w(
                    f"The input[{i}] need NHWC data format, but NCHW set, the data format and "
                    "data buffer will be changed to NHWC."
                )
                return arr.transpose(_NCHW_TO_NHWC)
            self._log.w(
                f"The input[{i}] need NHWC data format, but the shape is not 4D, no data transpose."
            )
        return arr

    def _check_shapes(self, arrays: list[np.ndarray]) -> None:
        """Every input has the model's shape; a dynamic model's inputs share one shape set."""
        candidates: set[int] | None = None
        for spec, arr in zip(self.inputs, arrays, strict=True):
            if spec.shapes is None:
                if not _shape_fits(arr.shape, spec.shape):
                    raise InputRejected(
                        f"The input[{spec.index}] shape {_fmt(arr.shape)} does not match the "
                        f"model input {_fmt(spec.shape)}"
                        + (" (NHWC)." if len(spec.shape) == 4 else ".")
                    )
                continue
            fits = {k for k, shape in enumerate(spec.shapes) if tuple(arr.shape) == shape}
            if not fits:
                listed = ", ".join(_fmt(s) for s in spec.shapes)
                raise InputRejected(
                    f"The input[{spec.index}] shape {_fmt(arr.shape)} is not a shape this "
                    f"dynamic-shape model was compiled for; use one of {listed} (NHWC)."
                )
            candidates = fits if candidates is None else candidates & fits
            if not candidates:
                raise InputRejected(
                    "The input shapes are each compiled into the model but not as one set; "
                    "feed the shapes of one dynamic_input set together."
                )

    def _graph_feed(self, spec: InputSpec, arr: np.ndarray, pass_through: int) -> np.ndarray:
        """The interface array converted to the graph's type and layout."""
        if pass_through:
            native = self.native_in[spec.index]
            data = native.dequantise(arr) if native.quantised else arr
        elif spec.normalised_inside:
            try:
                data = normalise(arr, spec.mean, spec.std)
            except ValueError as exc:
                raise InputRejected(f"The input[{spec.index}]: {exc}.") from exc
        else:
            data = arr
        if spec.layout == "nchw":
            data = data.transpose(_NHWC_TO_NCHW)
        # A real NPU converts and quantises internally; ONNX Runtime needs the graph's type.
        return np.ascontiguousarray(data, dtype=spec.onnx_dtype)


def per_input_list(
    inputs: Any, data_type: Any, data_format: Any, n: int, not_a_list: Callable[[Any], None]
) -> tuple[list, list, list]:
    """(inputs, data types, data formats) for a model of ``n`` inputs, read as RKNNLite reads
    them: inputs that are not a list are told to ``not_a_list`` (a warning) and listed (a
    lone array as a list of one); InputRejected for a wrong count."""
    if not isinstance(inputs, list):
        not_a_list(inputs)
        inputs = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
    if len(inputs) != n:
        raise InputRejected(f"The model needs {n} inputs, but {len(inputs)} inputs were given.")
    return inputs, per_input(data_type, n, "data_type"), per_input(data_format, n, "data_format")


def per_input(value: Any, n: int, what: str) -> list:
    """``value`` spread over n inputs: a scalar applies to all, a list must have n items."""
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise InputRejected(f"The lengths of {what} and inputs are not equal.")
        return list(value)
    return [value] * n


def _pass_through_flags(value: Any, n: int) -> list[int]:
    """One 0/1 flag per input; the real runtime takes only a list (``True`` fails there too)."""
    if value is None:
        return [0] * n
    if not isinstance(value, list | tuple):
        raise InputRejected(
            f"inputs_pass_through must be a list with one 0/1 flag per input, e.g. {[1] * n}, "
            f"not {value!r}."
        )
    if len(value) != n:
        raise InputRejected("The lengths of inputs_pass_through and inputs are not equal.")
    flags = []
    for i, flag in enumerate(value):
        if flag not in (0, 1):  # False/True compare equal to 0/1
            raise InputRejected(f"inputs_pass_through[{i}] is {flag!r}; use 0 or 1.")
        flags.append(int(flag))
    return flags


def _shape_fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(
        d < 0 or d == s for s, d in zip(shape, dims, strict=True)
    )


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"
