"""The ``toolkit`` backend: RKNNLite's interface over rknn-toolkit2's NPU simulator.

It gives a converted model's quantised numerics on an x86 machine, without a board: what
``sim`` cannot, since it runs the float (or QDQ) ONNX with ONNX Runtime. It has **no timing
model**: latencies are this CPU's running the simulator, not an NPU's. It needs
rknn-toolkit2 (x86_64 only, in its own environment: see tools/toolkit-env.sh).

rknn-toolkit2's simulator cannot run an ``.rknn`` file ("use load_xxx & build instead"):
it needs the model the file was converted from, the conversion settings and a build. So
for ``model.rknn`` (or ``model.onnx``) this backend reads, beside it:

``model.onnx``
    the model the .rknn was converted from.
``model.config.json``
    a JSON object with exactly the keyword arguments given to ``rknn.config()``
    (``mean_values``, ``std_values``, ``quant_img_RGB2BGR``, ``target_platform``,
    ``quantized_dtype``, ...). A missing ``target_platform`` is taken from the .rknn.
``model.dataset.txt``
    the calibration list given to ``rknn.build(dataset=...)``, in the toolkit's format:
    one sample per line, the paths of its input files (images or .npy) separated by
    spaces; relative paths are relative to the list's folder.

The build (quantisation calibrated on that list) runs once per fingerprint of the ONNX
bytes, the settings, the calibration files' bytes and the toolkit version, in a child
process (the toolkit writes into its working folder, prints progress bars and can abort
the process; the child dies with its parent), and is cached in ``$BATCHINFER_TOOLKIT_CACHE``
(default ``~/.cache/batchinfer/toolkit``):
``hybrid_quantization_step1``'s outputs (the graph, its weights and the calibrated
quantisation parameters). Each ``init_runtime`` then calls ``hybrid_quantization_step2``
on them and starts the simulator, which gives the same outputs as a plain ``build()``
(tests/test_toolkit_sim.py checks it). Concurrent builds of one fingerprint, from threads or
processes, wait on a lock file and build once.

Calls into the toolkit are serialised within a process: it is not known to be
thread-safe. ``core_mask`` is checked against the seven RKNNLite values and recorded, as
the ``onnx`` backend does: the simulator has no cores.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError
from batchinfer.runtime import constants as C
from batchinfer.runtime._emulated_runtime import InputRejected, per_input, per_input_list
from batchinfer.runtime._onnx_base import OnnxRKNNBase, sdk_banner
from batchinfer.runtime.model_info import ORT_DTYPES, concrete_dims, open_session
from batchinfer.runtime.rknn_file import read_rknn_metadata

# The build's public names stay importable from here, the backend's module (__all__).
from batchinfer.runtime.toolkit_build import (
    CACHE_ENV,
    STEP1_FILES,
    TOOLKIT_LOCK,
    ToolkitError,
    ToolkitModel,
    cache_root,
    check_settings,
    ensure_build,
    fingerprint,
    last_line,
    load_rknn_class,
    load_settings,
    quiet,
    toolkit_model,
    toolkit_version,
    unavailable_reason,
)

__all__ = [
    "CACHE_ENV",
    "RKNNLite",
    "ToolkitError",
    "ToolkitModel",
    "cache_root",
    "check_settings",
    "ensure_build",
    "fingerprint",
    "load_settings",
    "toolkit_model",
    "toolkit_version",
    "unavailable_reason",
]


# ---------------------------------------------------------------- the runtime
class RKNNLite(OnnxRKNNBase):
    """``rknnlite.api.RKNNLite`` computing with rknn-toolkit2's simulator (no timing)."""

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        super().__init__(verbose=verbose, verbose_file=verbose_file)
        self._rknn: Any = None
        self._model: ToolkitModel | None = None
        self._ranks: tuple[int, ...] = ()

    def _init_runtime(self, target: str | None, async_mode: bool, core_mask: int) -> int:
        """0 when the simulator is ready (building the model first if needed), else -1."""
        if self._model_path is None:
            self._log(
                "E",
                "init_runtime: Model is not loaded yet, this interface should be called "
                "after load_rknn!",
            )
            return -1
        self.release()
        if target is not None:
            self._log(
                "E",
                f"init_runtime: target={target!r} selects a board over adb, which this "
                "backend does not drive; call init_runtime() without target.",
            )
            return -1
        try:
            model = toolkit_model(self._model_path)
            check_settings(model)
            self._warn_platform_mismatch(model)
            ranks, warm_up = _input_ranks(model.onnx)
            self._rknn = _open_simulator(model, ensure_build(model), warm_up)
        except (ToolkitError, ModelError) as exc:
            self._log("E", f"init_runtime: {exc}")
            self.release()
            return -1
        self._model = model
        self._ranks = ranks
        self._frame_id = 0
        try:
            self._apply_core_mask(core_mask)  # logs the reason, then raises ValueError
        except ValueError:
            return -1
        return 0

    def _warn_platform_mismatch(self, model: ToolkitModel) -> None:
        if model.model.suffix.lower() != ".rknn":
            return
        meta = read_rknn_metadata(model.model)
        if meta is not None and meta.platforms and model.platform not in meta.platforms:
            self._log(
                "W",
                f"init_runtime: {model.model.name} was converted for {list(meta.platforms)} "
                f"but {model.settings_path.name} says {model.platform}; simulating "
                f"{model.platform}.",
            )

    def _infer(
        self, inputs: list, data_type: Any, data_format: Any, pass_through: Any, reuse: bool
    ) -> list | None:
        """The simulator's outputs as float32 arrays in model order, or None after an E line."""
        if self._rknn is None:
            self._log(
                "E",
                "inference: Runtime environment is not inited, please call init_runtime "
                "to init it first!",
            )
            return None
        try:
            arrays, formats = self._check_inputs(inputs, data_type, data_format, pass_through)
            with TOOLKIT_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                raw = self._rknn.inference(inputs=arrays, data_format=formats)
            if raw is None:
                raise InputRejected("rknn-toolkit2's simulator returned None.")
            return self._deliver(list(raw), reuse)
        except InputRejected as exc:
            self._log("E", f"inference: {exc}")
            return None
        except Exception as exc:  # never raise, like RKNNLite
            self._log("E", f"inference: rknn-toolkit2's simulator failed: {last_line(str(exc))}")
            return None

    def _check_inputs(
        self, inputs: Any, data_type: Any, data_format: Any, pass_through: Any
    ) -> tuple[list[np.ndarray], list[str | None]]:
        """The arrays and data formats to hand the simulator, checked as RKNNLite does.

        The simulator is more lenient than a board (it adds a missing batch axis, ignores
        surplus inputs): these checks keep the board's answers.
        """
        n = len(self._ranks)
        inputs, types, formats = per_input_list(inputs, data_type, data_format, n, self._not_a_list)
        flags = per_input(pass_through, n, "inputs_pass_through")
        out_formats: list[str | None] = []
        for i, (arr, rank) in enumerate(zip(inputs, self._ranks, strict=True)):
            if not isinstance(arr, np.ndarray):
                raise InputRejected(
                    f"The input[{i}] must be a numpy.ndarray, but got {type(arr).__name__}."
                )
            if arr.dtype.name not in C.SUPPORTED_DTYPES:
                raise InputRejected(
                    f"The input[{i}] dtype {arr.dtype.name} is not supported; convert it to "
                    f"one of {', '.join(C.SUPPORTED_DTYPES)}."
                )
            if types[i] is not None and types[i] != arr.dtype.name:
                raise InputRejected(
                    f"The input[{i}] data_type '{types[i]}' does not match the array dtype "
                    f"'{arr.dtype.name}'; nothing is converted."
                )
            if formats[i] not in (None, "nhwc", "nchw"):
                raise InputRejected(
                    f"The input[{i}] data_format '{formats[i]}' is invalid; use 'nhwc' or 'nchw'."
                )
            if arr.ndim != rank:
                raise InputRejected(
                    f"The input[{i}] need {rank}dims input, but {arr.ndim}dims input buffer "
                    "feed (did you forget the batch axis? use np.expand_dims(x, 0))."
                )
            if flags[i]:
                raise InputRejected(
                    "inputs_pass_through is not supported by rknn-toolkit2's simulator; "
                    "pass the input unconverted instead."
                )
            out_formats.append(formats[i] or "nhwc")
        return list(inputs), out_formats

    def _not_a_list(self, inputs: Any) -> None:
        self._log("W", f"inference: inputs should be a list, but got {type(inputs).__name__}")

    def _after_release(self) -> None:
        rknn, self._rknn = self._rknn, None
        self._ranks = ()
        if rknn is not None:
            with quiet():
                rknn.release()

    def _sdk_banner(self) -> str | None:
        if self._rknn is None:
            return None
        platform = self._model.platform if self._model else "unknown"
        return sdk_banner(
            f"{toolkit_version()} (rknn-toolkit2 simulator, {platform} numerics; "
            "batchinfer toolkit backend)",
            "none: no NPU and no timing model (latencies are this CPU's, not an NPU's)",
        )

    def _log(self, level: str, message: str) -> None:
        """One line through ``rknn_log``, as the base class writes them."""
        levels = {"E": logging.ERROR, "W": logging.WARNING, "I": logging.INFO}
        self.rknn_log.logger.log(levels.get(level, logging.DEBUG), message)


def _input_ranks(onnx: Path) -> tuple[tuple[int, ...], list[np.ndarray] | None]:
    """The rank of each model input, and zero inputs for a warm-up call (None if dynamic).

    A 4-D input of a model converted from ONNX is NHWC at the runtime's interface.
    """
    shapes, dtypes = [], []
    for arg in open_session(onnx).get_inputs():
        dims = concrete_dims(arg.shape)
        shapes.append((dims[0], dims[2], dims[3], dims[1]) if len(dims) == 4 else dims)
        dtypes.append(ORT_DTYPES.get(arg.type, "float32"))
    ranks = tuple(len(s) for s in shapes)
    if any(d < 0 for s in shapes for d in s):
        return ranks, None
    return ranks, [np.zeros(s, dtype=t) for s, t in zip(shapes, dtypes, strict=True)]


def _open_simulator(model: ToolkitModel, entry: Path, warm_up: list | None) -> Any:
    """An RKNN object running ``model``'s cached build in the simulator."""
    rknn_class = load_rknn_class()
    files = [str(entry / f) for f in STEP1_FILES]
    with quiet() as sink:
        try:
            rknn = rknn_class(verbose=False)
        except Exception as exc:
            raise ToolkitError(f"rknn-toolkit2 did not start: {last_line(str(exc))}") from exc
        # Its own E/W lines would repeat what the E lines of this class say.
        rknn.rknn_log.logger.setLevel(logging.CRITICAL)
        try:
            step = "config"
            ok = rknn.config(**model.settings) == 0
            if ok:
                step = "hybrid_quantization_step2"
                ok = rknn.hybrid_quantization_step2(*files) == 0
            if ok:
                step = "init_runtime"
                ok = rknn.init_runtime() == 0
            failure = None if ok else f"{step} failed"
        except Exception as exc:
            failure = f"{step} raised {last_line(str(exc))}"
        if failure is None and warm_up is not None:
            # The first call prints progress bars: make it here, where output is caught.
            # Best effort: a real call that fails says why in its own E line.
            with contextlib.suppress(Exception):
                rknn.inference(inputs=warm_up, data_format=["nhwc"] * len(warm_up))
        if failure is not None:
            rknn.release()
            sink.seek(0)
            printed = last_line(sink.read().decode(errors="replace"))
            raise ToolkitError(
                f"rknn-toolkit2's simulator did not start for {model.model.name}: {failure} "
                f"({printed}); check {model.settings_path.name}."
            )
    return rknn
