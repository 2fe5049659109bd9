"""RKNNLite's shape on top of ONNX Runtime: the base of the ``onnx`` and ``sim`` runtimes.

Everything here mirrors rknn-toolkit-lite2 2.5.0 as described in
docs/rknnlite-contract.md: methods return 0/-1 or None instead of raising (except
``load_rknn(None)``, which raises TypeError like the real one), problems are written as
``E RKNN: [time] ...`` / ``W RKNN: [time] ...`` lines to stderr (or ``verbose_file``),
and a bad model fails in ``init_runtime``, not in ``load_rknn``.

Subclasses adjust three hooks: ``_apply_core_mask`` (chip rules), ``_execute`` (how a
call spends time) and ``_sdk_text`` (what get_sdk_version names).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError
from batchinfer.runtime import constants as C
from batchinfer.runtime.model_info import (
    ORT_DTYPES,
    concrete_dims,
    onnx_beside,
    onnx_layout,
    open_session,
    rknn_view,
)
from batchinfer.runtime.rknn_file import read_rknn_metadata

#: Platforms list_support_target_platform() prints when given no model (rknn-toolkit-lite2 2.5.0).
SUPPORTED_PLATFORMS = {"RKNPU2": ["RK3562", "RK3566", "RK3568", "RK3576", "RK3588", "RV1126B"]}

_NHWC_TO_NCHW = (0, 3, 1, 2)
_NCHW_TO_NHWC = (0, 2, 3, 1)


@dataclass(frozen=True)
class _InputSpec:
    """One ONNX input: its dims (dynamic = -1, batch 1), numpy dtype and 4-D layout."""

    name: str
    dims: tuple[int, ...]
    dtype: np.dtype
    layout: str | None  # "nchw"/"nhwc" for 4-D inputs, else None

    @property
    def rknn_shape(self) -> tuple[int, ...]:
        return rknn_view(self.dims, self.layout)


class _InferenceRejected(Exception):
    """An input problem: inference() logs the message and returns None."""


class OnnxRKNNBase:
    """An RKNNLite-compatible runtime that runs the model's ONNX file on the CPU."""

    NPU_CORE_AUTO = C.NPU_CORE_AUTO
    NPU_CORE_0 = C.NPU_CORE_0
    NPU_CORE_1 = C.NPU_CORE_1
    NPU_CORE_2 = C.NPU_CORE_2
    NPU_CORE_0_1 = C.NPU_CORE_0_1
    NPU_CORE_0_1_2 = C.NPU_CORE_0_1_2
    NPU_CORE_ALL = C.NPU_CORE_ALL

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        # Like RKNNLite's constructor: no native state, so the object is safe to fork.
        self.verbose = verbose
        self.verbose_file = verbose_file
        self.core_mask: int | None = None
        self._model_path: Path | None = None
        self._model_bytes: bytes | None = None
        self._session: Any = None
        self._inputs: tuple[_InputSpec, ...] = ()
        self._output_names: tuple[str, ...] = ()
        self._staging: list[np.ndarray] | None = None
        self._frame_id = 0
        self._call_started = 0.0

    # ---------------------------------------------------------------- logging
    def _log(self, level: str, message: str) -> None:
        """Write one RKNNLite-style log line (``E``/``W``/``I``/``D``); I/D only when verbose."""
        if level in ("I", "D") and not self.verbose:
            return
        stamp = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        line = f"{level} RKNN: [{stamp}] {message}\n"
        if self.verbose_file:
            try:
                with open(self.verbose_file, "a", encoding="utf-8") as fh:
                    fh.write(line)
            except OSError:
                sys.stderr.write(line)
            if level in ("E", "W"):
                sys.stderr.write(line)
        else:
            sys.stderr.write(line)

    # ---------------------------------------------------------------- lifecycle
    def load_rknn(self, path: str, key_path: str | None = None) -> int:
        """0 when the model file was read, -1 when it is missing; TypeError for None."""
        if path is None:
            raise TypeError("load_rknn() path must be str, bytes or os.PathLike, not NoneType")
        path_str = os.fspath(path)
        if path_str == "" or not os.path.exists(path_str):
            self._log("E", f"load_rknn: The model file '{path_str}' does not exist!")
            return -1
        try:
            data = Path(path_str).read_bytes()
        except OSError as exc:
            self._log("E", f"load_rknn: Cannot read the model file '{path_str}': {exc}")
            return -1
        # Like RKNNLite, nothing is parsed here: a bad model fails in init_runtime.
        self._model_path = Path(path_str)
        self._model_bytes = data
        self._log("I", f"load_rknn: loaded {path_str} ({len(data)} bytes)")
        return 0

    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        async_mode: bool = False,
        core_mask: int = C.NPU_CORE_AUTO,
    ) -> int:
        """0 when the runtime is ready, -1 with an E log line when it is not."""
        if self._model_path is None or self._model_bytes is None:
            self._log(
                "E",
                "init_runtime: Model is not loaded yet, this interface should be called "
                "after load_rknn!",
            )
            return -1
        self.release()  # RKNNLite releases the old runtime first.
        if target is not None:
            self._log(
                "E",
                f"init_runtime: target={target!r} selects remote (adb) mode, which this "
                "runtime does not support; call init_runtime() without target.",
            )
            return -1
        if not self._before_init(core_mask):
            self.release()
            return -1
        source = self._onnx_source()
        if source is None:
            self.release()
            return -1
        try:
            session = open_session(*source)
        except ModelError as exc:
            self._log("E", f"init_runtime: RKNN_ERR_MODEL_INVALID: {exc}")
            self.release()
            return -1
        inputs = []
        for arg in session.get_inputs():
            dims = concrete_dims(arg.shape)
            dtype_name = ORT_DTYPES.get(arg.type)
            if dtype_name is None:
                self._log("E", f"init_runtime: input '{arg.name}' has unsupported type {arg.type}")
                self.release()
                return -1
            inputs.append(_InputSpec(arg.name, dims, np.dtype(dtype_name), onnx_layout(dims)))
        self._session = session
        self._inputs = tuple(inputs)
        self._output_names = tuple(o.name for o in session.get_outputs())
        self._frame_id = 0
        # The real runtime stays alive when only the core mask fails: so does this one.
        return 0 if self._apply_core_mask(core_mask) else -1

    def release(self) -> None:
        """Drop the runtime; keeps the model bytes, so init_runtime can run again. Idempotent."""
        self._session = None
        self._inputs = ()
        self._output_names = ()
        self._staging = None
        self._after_release()

    # ---------------------------------------------------------------- queries
    def get_sdk_version(self) -> str | None:
        """A multi-line str naming the runtime (API) and driver (DRV); None when not initialised."""
        if self._session is None:
            self._log(
                "E",
                "get_sdk_version: Runtime environment is not inited, please call "
                "init_runtime to init it first!",
            )
            return None
        return self._sdk_text()

    def list_support_target_platform(self, rknn_model: str | None = None) -> dict:
        """Prints and returns the platforms; ValueError (after an E line) for a missing model."""
        if rknn_model is None:
            result: dict = {k: list(v) for k, v in SUPPORTED_PLATFORMS.items()}
            print("*" * 48)
            for kind, chips in result.items():
                print(f"{kind}: {chips}")
            print("*" * 48)
            return result
        path = os.fspath(rknn_model)
        if not os.path.exists(path):
            # RKNNLite 2.5.0 logs this with rknn_log.e() without throw=False, which raises.
            message = f"The model {path} does not exist."
            self._log("E", f"list_support_target_platform: {message}")
            raise ValueError(message)
        filled = _filled_platforms(Path(path))
        supported = filled if filled else list(SUPPORTED_PLATFORMS["RKNPU2"])
        result = {"filled_target_platform": filled, "support_target_platform": supported}
        print("*" * 48)
        print(f"Target platforms filled in RKNN model:         {filled}")
        print(f"Target platforms supported by this RKNN model: {supported}")
        print("*" * 48)
        return result

    def list_devices(self) -> tuple[list, list]:
        """(adb_devices, ntb_devices): always empty, remote mode does not exist here."""
        print("*" * 48)
        print("all device(s) with adb mode:\n[]")
        print("all device(s) with ntb mode:\n[]")
        print("*" * 48)
        return [], []

    # ---------------------------------------------------------------- inference
    def inference(
        self,
        inputs: list,
        data_type: str | list | None = None,
        data_format: str | list | None = None,
        inputs_pass_through: list | None = None,
        get_frame_id: bool = False,
        reuse_outputs: bool = False,
    ) -> list | None:
        """The outputs as float32 arrays in model order (+ frame id), or None; never raises."""
        self._call_started = time.monotonic()  # input conversion is host-side work too
        try:
            if self._session is None:
                self._log(
                    "E",
                    "inference: Runtime environment is not inited, please call "
                    "init_runtime to init it first!",
                )
                return None
            feeds = self._prepare_feeds(inputs, data_type, data_format, inputs_pass_through)
            outputs = self._execute(feeds, reuse_outputs)
            if outputs is None:
                return None
        except _InferenceRejected as exc:
            self._log("E", f"inference: {exc}")
            return None
        except Exception as exc:  # never raise, like RKNNLite
            self._log("E", f"inference: Catch exception when running the model: {exc}")
            return None
        self._frame_id += 1
        if get_frame_id:
            outputs.append(self._frame_id)
        return outputs

    def _run_session(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The raw ONNX Runtime outputs for ``feeds``."""
        return self._session.run(list(self._output_names), feeds)

    def _deliver(self, raw: list[np.ndarray], reuse_outputs: bool) -> list:
        """float32 outputs: views of staging buffers when reusing, else owned arrays."""
        if not reuse_outputs:
            # ORT's arrays are fresh per call; astype copies only when the dtype differs.
            return [np.asarray(r, dtype=np.float32) for r in raw]
        if self._staging is None or any(
            s.shape != np.shape(r) for s, r in zip(self._staging, raw, strict=True)
        ):
            self._staging = [np.empty(np.shape(r), dtype=np.float32) for r in raw]
        for buf, r in zip(self._staging, raw, strict=True):
            np.copyto(buf, r, casting="unsafe")
        return [buf[...] for buf in self._staging]

    def _prepare_feeds(
        self,
        inputs: Any,
        data_type: Any,
        data_format: Any,
        pass_through: Any,
    ) -> dict[str, np.ndarray]:
        """The ONNX feeds for RKNN-view inputs; _InferenceRejected says what is wrong."""
        if not isinstance(inputs, list):
            self._log("W", f"inference: inputs should be a list, but got {type(inputs).__name__}")
            inputs = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        n = len(self._inputs)
        if len(inputs) != n:
            raise _InferenceRejected(
                f"The model needs {n} inputs, but {len(inputs)} inputs were given."
            )
        types = _per_input(data_type, n, "data_type")
        formats = _per_input(data_format, n, "data_format")
        flags = _per_input(pass_through, n, "inputs_pass_through")
        feeds = {}
        for i, (spec, arr) in enumerate(zip(self._inputs, inputs, strict=True)):
            feeds[spec.name] = self._convert_input(i, spec, arr, types[i], formats[i], flags[i])
        return feeds

    def _convert_input(
        self,
        i: int,
        spec: _InputSpec,
        arr: Any,
        data_type: str | None,
        data_format: str | None,
        pass_through: Any,
    ) -> np.ndarray:
        """One input converted to what the ONNX graph takes (dtype, layout)."""
        if not isinstance(arr, np.ndarray):
            raise _InferenceRejected(
                f"The input[{i}] must be a numpy.ndarray, but got {type(arr).__name__}."
            )
        dtype = arr.dtype.name
        if dtype not in C.SUPPORTED_DTYPES:
            raise _InferenceRejected(
                f"The input[{i}] dtype {dtype} is not supported; convert it to one of "
                f"{', '.join(C.SUPPORTED_DTYPES)} (float64 is a common mistake: use float32)."
            )
        if data_type is not None and data_type != dtype:
            raise _InferenceRejected(
                f"The input[{i}] data_type '{data_type}' does not match the array dtype "
                f"'{dtype}'; nothing is converted, pass data_type='{dtype}' or convert the array."
            )
        if data_format is not None and data_format not in ("nhwc", "nchw"):
            raise _InferenceRejected(
                f"The input[{i}] data_format '{data_format}' is invalid; use 'nhwc' or 'nchw'."
            )
        rank = len(spec.dims)
        if arr.ndim != rank:
            raise _InferenceRejected(
                f"The input[{i}] need {rank}dims input, but {arr.ndim}dims input buffer feed "
                "(did you forget the batch axis? use np.expand_dims(x, 0))."
            )
        if pass_through not in (None, 0, 1, False, True):
            raise _InferenceRejected(
                f"inputs_pass_through[{i}] is {pass_through!r}; use 0 or 1 per input."
            )
        if pass_through:
            # Sent as is: must already be exactly what the graph takes.
            if arr.dtype != spec.dtype or not _shape_fits(arr.shape, spec.dims):
                raise _InferenceRejected(
                    f"The input[{i}] is pass-through, so it must already be "
                    f"{spec.dtype.name} {_fmt(spec.dims)} ({spec.layout or 'as the model'}), "
                    f"but got {dtype} {_fmt(arr.shape)}."
                )
            return arr
        data = arr
        if rank == 4:
            fmt = data_format or "nhwc"
            if spec.layout == "nchw" and fmt == "nhwc":
                data = arr.transpose(_NHWC_TO_NCHW)
            elif spec.layout == "nhwc" and fmt == "nchw":
                self._log(
                    "W",
                    f"inference: The input[{i}] is NCHW data for an NHWC model input; "
                    "it will be transposed to NHWC.",
                )
                data = arr.transpose(_NCHW_TO_NHWC)
        if not _shape_fits(data.shape, spec.dims):
            given = data.shape if rank != 4 else rknn_view(data.shape, spec.layout)
            raise _InferenceRejected(
                f"The input[{i}] shape {_fmt(given)} does not match the model input "
                f"{_fmt(spec.rknn_shape)}" + (" (NHWC)." if rank == 4 else ".")
            )
        # A real NPU converts/quantises internally; here ONNX Runtime needs its own dtype.
        return np.ascontiguousarray(data, dtype=spec.dtype)

    # ---------------------------------------------------------------- hooks
    def _before_init(self, core_mask: int) -> bool:
        """False (after logging) to fail init_runtime before the session is built."""
        return True

    def _apply_core_mask(self, core_mask: int) -> bool:
        """Record the core mask; False (after logging) when init_runtime must return -1."""
        if core_mask not in C.VALID_CORE_MASKS:
            self._log("E", f"init_runtime: The core mode {core_mask} is not supported currently.")
            self.core_mask = C.NPU_CORE_AUTO
            return False
        self.core_mask = core_mask
        return True

    def _execute(self, feeds: dict[str, np.ndarray], reuse_outputs: bool) -> list | None:
        """Run one call and deliver its outputs; None (after logging) for a failed call."""
        return self._deliver(self._run_session(feeds), reuse_outputs)

    def _after_release(self) -> None:
        """Drop whatever a subclass holds besides the session."""

    def _sdk_text(self) -> str:
        raise NotImplementedError

    def _onnx_source(self) -> tuple[Path, bytes] | None:
        """The ONNX model to run: the loaded file, or the .onnx beside a loaded .rknn."""
        model_path = self._model_path
        if model_path is None or self._model_bytes is None:
            return None
        if model_path.suffix.lower() == ".onnx":
            return model_path, self._model_bytes
        onnx_path = onnx_beside(model_path)
        if onnx_path is None:
            self._log(
                "E",
                f"init_runtime: {type(self).__module__} runs ONNX models: put "
                f"{model_path.with_suffix('.onnx').name} (the model {model_path.name} was "
                f"converted from) in {model_path.parent}.",
            )
            return None
        try:
            return onnx_path, onnx_path.read_bytes()
        except OSError as exc:
            self._log("E", f"init_runtime: Cannot read {onnx_path}: {exc}")
            return None


def _per_input(value: Any, n: int, what: str) -> list:
    """``value`` spread over n inputs: a scalar applies to all, a list must have n items."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise _InferenceRejected(f"{what} has {len(value)} items but the model has {n} inputs.")
        return list(value)
    return [value] * n


def _shape_fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(
        d < 0 or d == s for s, d in zip(shape, dims, strict=True)
    )


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"


def _filled_platforms(path: Path) -> list[str]:
    """Target platforms named in the JSON document that ends an .rknn file; [] when none."""
    try:
        meta = read_rknn_metadata(path)
    except ModelError:
        return []
    return [p.upper() for p in meta.platforms] if meta else []
