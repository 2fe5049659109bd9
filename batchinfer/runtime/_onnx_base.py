"""RKNNLite's shape on top of ONNX Runtime: the base of the ``onnx`` and ``sim`` runtimes.

Everything here mirrors rknn-toolkit-lite2 2.5.0 as batchinfer/runtime/CONTRACT.md
describes it (read from the wheel's ``rknnlite/api/rknn_lite.py`` and the strings of its
compiled modules): methods return 0/-1 or None instead of raising (except
``load_rknn(None)``, TypeError, and ``list_support_target_platform`` of a missing file,
ValueError, as in the wheel), lines go through ``self.rknn_log.logger``, and a bad model
fails in ``init_runtime``, not in ``load_rknn``. The public attributes of the real object
exist: ``rknn_log``, ``rknn_runtime`` (None until ``init_runtime`` makes one: an
:class:`~batchinfer.runtime._emulated_runtime.EmulatedRuntime`, or after a model or device
that fails, an :class:`~batchinfer.runtime._unbuilt_runtime.UnbuiltRuntime`, as the wheel
keeps its half-made runtime), ``rknn_data``, ``rknn_user_key``, ``target``, ``root_dir``,
``load_model_in_npu``, ``verbose``.

``async_mode=True`` follows Rockchip's description (toolkit2 API reference, init_runtime;
rknn_api.h, RKNN_FLAG_ASYNC_MASK): each call returns the previous frame's outputs. The
first call has no previous frame and returns its own [guess]. The same documents mark the
mode "not supported yet", so a board may well answer synchronously: a script that works
on both must not depend on either.

Subclasses adjust the hooks: ``_announce`` (lines at construction), ``_before_init`` /
``_after_init`` / ``_apply_core_mask`` (chip rules, board lines), ``_execute`` (how a call
spends time), ``_after_release`` and ``_versions`` (what get_sdk_version names). A backend
that does not run the ONNX (toolkit.py) replaces ``_init_runtime`` and ``_infer`` whole: the
wheel's public signatures, their defaults, and the frame count stay here, once.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError
from batchinfer.runtime import constants as C
from batchinfer.runtime import graph
from batchinfer.runtime._emulated_runtime import EmulatedRuntime
from batchinfer.runtime._unbuilt_runtime import UnbuiltRuntime
from batchinfer.runtime.conversion import ConversionSettings
from batchinfer.runtime.model_info import (
    ORT_DTYPES,
    InputSpec,
    input_specs,
    onnx_beside,
    open_session,
)
from batchinfer.runtime.rknn_file import read_rknn_metadata
from batchinfer.runtime.rknn_log import RKNNLog

#: Platforms list_support_target_platform() prints when given no model, by NPU model ("chip
#: family"), in the order of the wheel's rknnlite/config/cpu_npu_mapper.yml (2.5.0).
SUPPORTED_PLATFORMS = {
    "RKNPU2-T4": ["RK3562"],
    "RKNPU2-LITE": ["RK3566", "RK3568"],
    "RKNPU2-V2": ["RK3588"],
    "RKNPU2-F2": ["RK3576"],
    "RKNPU2-F3": ["RV1126B"],
}
# The rule list_support_target_platform prints around its lines (rknn_platform_utils strings).
_STARS = "*" * 50
#: The version this runtime's interface follows.
RKNN_API_VERSION = "2.5.0"
# The banner get_sdk_version() returns (Toolkit Lite2 manual, get_sdk_version).
_RULE = "=" * 46

Deliver = Callable[[list[np.ndarray]], list[np.ndarray]]


class DeviceRefused(Exception):
    """init_runtime fails in the wheel's build_graph step; the E lines are already logged."""


def sdk_banner(api: str, drv: str) -> str:
    """get_sdk_version()'s text: a rule, ``RKNN VERSION:``, ``  API: ..``, ``  DRV: ..``, a rule."""
    return f"{_RULE}\nRKNN VERSION:\n  API: {api}\n  DRV: {drv}\n{_RULE}"


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
        self.target = "simulator"
        self.verbose = verbose
        if verbose_file is not None:
            folder = os.path.dirname(verbose_file)
            if folder != "" and not os.path.exists(folder):
                verbose_file = None  # dropped silently, as the real constructor does
        self.verbose_file = verbose_file
        self.rknn_log = RKNNLog(verbose, verbose_file)
        self._announce()
        if verbose:
            if verbose_file is None:
                self.rknn_log.w("Verbose file path is invalid, debug info will not dump to file.")
            else:
                self.rknn_log.d(f"Save log info to: {verbose_file}")
        self.rknn_data: bytes | None = None
        self.rknn_user_key: bytes | None = None
        self.load_model_in_npu = False
        self.rknn_runtime: EmulatedRuntime | UnbuiltRuntime | None = None
        self.root_dir = str(Path(__file__).resolve().parent)
        self.core_mask: int | None = None
        self._model_path: Path | None = None
        self._async = False
        self._pending: list[np.ndarray] | None = None
        self._staging: list[np.ndarray] | None = None
        self._frame_id = 0
        self._call_started = 0.0

    # ---------------------------------------------------------------- lifecycle
    def load_rknn(self, path: str, key_path: str | None = None) -> int:
        """0 when the model file was read, -1 when it (or ``key_path``) is missing."""
        if path is None:  # os.path.exists(None) raises in the real one too
            raise TypeError("load_rknn() path must be str, bytes or os.PathLike, not NoneType")
        data = self._read(path, "RKNN model", "None" if path == "" else os.fspath(path))
        if data is None:
            return -1
        self.rknn_data = data
        # Like RKNNLite, nothing is parsed here: a bad model fails in init_runtime.
        self._model_path = Path(path)
        self._loaded(self._model_path)
        self.rknn_user_key = None
        if key_path is not None:
            # The real one has read the model already and keeps it: only the key is missing.
            self.rknn_user_key = self._read(key_path, "key envelope", key_path)
            if self.rknn_user_key is None:
                return -1
        return 0

    def _read(self, path: str, what: str, shown: object) -> bytes | None:
        """The bytes of ``what`` at ``path``, or None after the wheel's E line for a file
        missing (named as ``shown``) or unreadable."""
        if not os.path.exists(path):
            self.rknn_log.e(f"Invalid {what} path: {shown}", False)
            return None
        try:
            return Path(path).read_bytes()
        except OSError:
            self.rknn_log.e(f"Catch exception when loading {what} [{path}]!", False)
            return None

    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        async_mode: bool = False,
        core_mask: int = C.NPU_CORE_AUTO,
    ) -> int:
        """0 when the runtime is ready, -1 with E lines when it is not."""
        return self._init_runtime(target, async_mode, core_mask)

    def _init_runtime(self, target: str | None, async_mode: bool, core_mask: int) -> int:
        """:meth:`init_runtime`'s work (``device_id`` selects nothing here)."""
        self.rknn_log.d(f"target set by user is: {target}")
        if self.rknn_data is None or self._model_path is None:
            self.rknn_log.e(
                "Model is not loaded yet, this interface should be called after load_rknn!", False
            )
            return -1
        self.release()  # RKNNLite releases the old runtime first.
        if target is not None:
            self.rknn_log.e(
                f"target={target!r} selects remote (adb) mode, which {type(self).__module__} "
                "does not support; call init_runtime() without target.",
                False,
            )
            return -1
        if not self._before_init(core_mask):
            self.release()  # as when the wheel cannot make its runtime: rknn_runtime is None
            return -1
        try:
            self._check_device(core_mask)
            runtime = self._build_runtime()
        except DeviceRefused as exc:
            return self._unbuilt(str(exc))
        except ModelError as exc:
            self.rknn_log.e("Catch exception when init runtime!", False)
            self.rknn_log.e(
                f"Exception: RKNN init failed. error code: RKNN_ERR_MODEL_INVALID ({exc})", False
            )
            return self._unbuilt(f"RKNN_ERR_MODEL_INVALID: {exc}")
        runtime.bind(self._run_feeds, self._apply_core_mask, self._dynamic_checked)
        self.rknn_runtime = runtime
        self._async = bool(async_mode)
        self._frame_id = 0
        self._after_init(runtime)
        # The wheel's own steps and lines (rknnlite/api/rknn_lite.py, init_runtime): the
        # runtime stays alive when only the core mask fails, with -1 and no traceback.
        try:
            ret = runtime.set_core_mask(core_mask)
        except Exception:
            self.rknn_log.e("Catch exception when set npu core mode.", False)
            return -1
        runtime.check_dynamic_shape()
        return ret

    def _unbuilt(self, why: str) -> int:
        """init_runtime failed in the wheel's build_graph step: -1, and rknn_runtime keeps
        a runtime that was never built, as the wheel's does (CONTRACT.md, init_runtime)."""
        self.release()
        self.rknn_runtime = UnbuiltRuntime(why)
        return -1

    def release(self) -> None:
        """Drop the runtime; keeps the model bytes, so init_runtime can run again. Idempotent."""
        if self.rknn_runtime is not None:
            self.rknn_runtime.release()
            self.rknn_runtime = None
        self._pending = None
        self._staging = None
        self._after_release()

    def _build_runtime(self) -> EmulatedRuntime:
        """Session, interface and native types of the loaded model; ModelError if unusable."""
        model_path = self._model_path
        assert model_path is not None
        onnx_path, onnx_bytes = self._onnx_source(model_path)
        session = open_session(onnx_path, onnx_bytes)
        converted = model_path.suffix.lower() != ".onnx"
        settings = ConversionSettings.load_beside(model_path) if converted else None
        self._check_settings(settings)
        specs = input_specs(session.get_inputs(), converted, settings, where=str(model_path))
        outputs = [(o.name, ORT_DTYPES.get(o.type, "float32")) for o in session.get_outputs()]
        native_in = [graph.default_native(s.onnx_dtype) for s in specs]
        native_out = [graph.default_native(dtype) for _, dtype in outputs]
        if graph.mentions_quantisation(onnx_bytes):
            native_in, native_out = graph.native_types(
                onnx_bytes, [(s.name, s.onnx_dtype) for s in specs], outputs
            )
        self._prepare(onnx_path, onnx_bytes, specs)
        api, drv = self._versions()
        return EmulatedRuntime(
            self.rknn_log, session, specs, native_in, native_out, (sdk_banner(api, drv), api, drv)
        )

    def _onnx_source(self, model_path: Path) -> tuple[Path, bytes]:
        """The ONNX model to run: the loaded file, or the .onnx beside a loaded .rknn."""
        if model_path.suffix.lower() == ".onnx":
            assert self.rknn_data is not None
            return model_path, self.rknn_data
        onnx_path = onnx_beside(model_path)
        if onnx_path is None:
            raise ModelError(
                f"{type(self).__module__} runs ONNX models: put "
                f"{model_path.with_suffix('.onnx').name} (the model {model_path.name} was "
                f"converted from) in {model_path.parent}"
            )
        try:
            return onnx_path, onnx_path.read_bytes()
        except OSError as exc:
            raise ModelError(f"Cannot read {onnx_path}: {exc}") from exc

    # ---------------------------------------------------------------- queries
    def get_sdk_version(self) -> str | None:
        """The ``RKNN VERSION:`` banner (API and DRV lines); None when not initialised."""
        text = self._sdk_banner()
        if text is None and not isinstance(self.rknn_runtime, UnbuiltRuntime):
            self.rknn_log.e(
                "Runtime environment is not inited, please call init_runtime to init it first!",
                False,
            )
        return text

    def list_support_target_platform(self, rknn_model: str | None = None) -> dict:
        """Prints and returns the platforms; ValueError (after an E line) for a missing file.

        The wheel logs with its logger's default ``throw``, which raises ValueError, although
        the manual says None: a script must handle both.
        """
        if rknn_model is not None and not os.path.exists(rknn_model):
            self.rknn_log.e(f"The model {rknn_model} does not exist.")
        # The lines are the wheel's (rknnlite/api/rknn_platform_utils strings); how a list is
        # rendered inside them is [guess] (docs/guide/emulator.md).
        if rknn_model is None:
            result: dict = {k: list(v) for k, v in SUPPORTED_PLATFORMS.items()}
            self.rknn_log.p(_STARS)
            self.rknn_log.p("All RKNN Toolkit supported target platforms:")
            for family, chips in result.items():
                self.rknn_log.p(f"chip family {family}: {chips}")
            self.rknn_log.p(_STARS)
            return result
        filled = _filled_platforms(Path(rknn_model))
        supported = filled if filled else [c for v in SUPPORTED_PLATFORMS.values() for c in v]
        result = {"filled_target_platform": filled, "support_target_platform": supported}
        self.rknn_log.p(_STARS)
        self.rknn_log.p(f"Target platforms filled in RKNN model:         {filled}")
        self.rknn_log.p(f"Target platforms supported by this RKNN model: {supported}")
        self.rknn_log.p(_STARS)
        return result

    def list_devices(self) -> tuple[list, list]:
        """(adb_devices, ntb_devices): always empty, remote mode does not exist here."""
        self.rknn_log.p("*" * 25)
        self.rknn_log.p("None devices connected.")
        self.rknn_log.p("*" * 25)
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
        outputs = self._infer(inputs, data_type, data_format, inputs_pass_through, reuse_outputs)
        if outputs is None:
            return None
        self._frame_id += 1
        if get_frame_id:
            outputs.append(self._frame_id)
        return outputs

    def _infer(
        self, inputs: list, data_type: Any, data_format: Any, pass_through: Any, reuse: bool
    ) -> list | None:
        """One call's outputs for :meth:`inference` (which counts the frame), or None after
        its E lines."""
        self._call_started = time.monotonic()  # input conversion is host-side work too
        runtime = self.rknn_runtime
        if runtime is None:
            self.rknn_log.e(
                "Runtime environment is not inited, please call init_runtime to init it first!",
                False,
            )
            return None
        try:
            feeds = runtime.feeds(inputs, data_type, data_format, pass_through)
        except Exception:  # InputRejected, an UnbuiltRuntime's, or a TypeError
            # The wheel's two lines: this one, then the traceback (rknn_lite.py, inference).
            self.rknn_log.e("Catch exception when setting inputs.", False)
            self.rknn_log.e(traceback.format_exc(), False)
            return None
        assert isinstance(runtime, EmulatedRuntime)  # an UnbuiltRuntime's feeds raised
        try:
            return self._execute(runtime, feeds, lambda raw: self._deliver(raw, reuse))
        except Exception as exc:  # never raise, like RKNNLite
            self.rknn_log.e("Catch exception when running RKNN model.", False)
            self.rknn_log.e(f"Exception: {exc}", False)
            return None

    def _run_feeds(
        self, runtime: EmulatedRuntime, feeds: dict[str, np.ndarray]
    ) -> tuple[list | None, int]:
        """``rknn_runtime.run``: one call with this runtime's timing and faults (owned
        outputs, the previous frame's in async mode); (outputs or None, frame id)."""
        self._call_started = time.monotonic()
        outputs = self._execute(runtime, feeds, lambda raw: self._deliver(raw, False))
        if outputs is not None:
            self._frame_id += 1
        return outputs, self._frame_id

    def _deliver(self, raw: list[np.ndarray], reuse_outputs: bool) -> list:
        """float32 outputs (the previous frame's in async mode): staging views or owned arrays."""
        if self._async:
            current = [np.array(r, dtype=np.float32) for r in raw]
            previous, self._pending = self._pending, current
            raw = previous if previous is not None else current
            if not reuse_outputs:
                return [r.copy() for r in raw]
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

    # ---------------------------------------------------------------- hooks
    def _announce(self) -> None:
        """Lines the constructor writes (the sim writes the wheel's version line)."""

    def _loaded(self, path: Path) -> None:
        """The model file at ``path`` was read (the sim picks the chip it was made for)."""

    def _check_settings(self, settings: ConversionSettings | None) -> None:
        """ModelError when the conversion settings cannot run here (the sim checks the chip)."""

    def _prepare(self, onnx_path: Path, onnx_bytes: bytes, specs: tuple[InputSpec, ...]) -> None:
        """Work out per-model settings before the runtime is made; ModelError if impossible."""

    def _before_init(self, core_mask: int) -> bool:
        """False (after logging) to fail init_runtime before a runtime exists (as the
        wheel does when librknnrt cannot be loaded): rknn_runtime stays None."""
        return True

    def _check_device(self, core_mask: int) -> None:
        """Raise DeviceRefused (after logging) when the device refuses the model (the sim's
        init faults); rknn_runtime then keeps an UnbuiltRuntime."""

    def _after_init(self, runtime: EmulatedRuntime) -> None:
        """Lines the runtime writes once it is up (the sim writes librknnrt's)."""

    def _apply_core_mask(self, core_mask: int) -> None:
        """``rknn_runtime.set_core_mask``'s work: record the mask, or log the reason and
        raise (ValueError, as the wheel's ``rknn_log.e`` does) when it is refused."""
        if core_mask not in C.VALID_CORE_MASKS:
            self.core_mask = C.NPU_CORE_AUTO
            self.rknn_log.e(f"The core mode {core_mask} is not supported currently.")
        self.core_mask = core_mask

    def _dynamic_checked(self, dynamic: bool) -> None:
        """``rknn_runtime.check_dynamic_shape`` ran (the sim writes the board's lines)."""

    def _execute(
        self, runtime: EmulatedRuntime, feeds: dict[str, np.ndarray], deliver: Deliver
    ) -> list | None:
        """Run one call and deliver its outputs; None (after logging) for a failed call."""
        return deliver(runtime.compute(feeds))

    def _after_release(self) -> None:
        """Drop whatever a subclass holds besides the runtime."""

    def _versions(self) -> tuple[str, str]:
        """(API, DRV) texts for the get_sdk_version banner."""
        raise NotImplementedError

    def _sdk_banner(self) -> str | None:
        """get_sdk_version()'s text, None when not initialised (a backend without
        ``rknn_runtime`` overrides this)."""
        if self.rknn_runtime is None:
            return None
        try:
            return self.rknn_runtime.get_sdk_version()[0]
        except Exception as exc:  # an UnbuiltRuntime: the wheel's words, and None
            self.rknn_log.e("Catch exception when get sdk version", False)
            self.rknn_log.e(f"Exception: {exc}", False)
            return None


def _filled_platforms(path: Path) -> list[str]:
    """Target platforms named in the JSON document that ends an .rknn file; [] when none."""
    try:
        meta = read_rknn_metadata(path)
    except ModelError:
        return []
    return [p.upper() for p in meta.platforms] if meta else []
