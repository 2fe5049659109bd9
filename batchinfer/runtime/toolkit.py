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
import ctypes
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError
from batchinfer.runtime import constants as C
from batchinfer.runtime._emulated_runtime import InputRejected, per_input
from batchinfer.runtime._onnx_base import OnnxRKNNBase, sdk_banner
from batchinfer.runtime.model_info import ORT_DTYPES, concrete_dims, open_session
from batchinfer.runtime.rknn_file import read_rknn_metadata

PACKAGE = "rknn-toolkit2"
CACHE_ENV = "BATCHINFER_TOOLKIT_CACHE"
#: Part of every fingerprint: bump it when what a cache entry holds changes.
CACHE_LAYOUT = "1"
SETTINGS_SUFFIX = ".config.json"
DATASET_SUFFIX = ".dataset.txt"
# The files hybrid_quantization_step1 writes for a model loaded from "model.onnx".
_STEP1_FILES = ("model.model", "model.data", "model.quantization.cfg")
_DONE = "build.json"  # written last: an entry without it is incomplete
_PR_SET_PDEATHSIG = 1

# One toolkit call at a time in this process (its simulator keeps global state).
_LOCK = threading.RLock()

__all__ = [
    "RKNNLite",
    "ToolkitError",
    "ToolkitModel",
    "cache_root",
    "check_settings",
    "ensure_build",
    "fingerprint",
    "toolkit_model",
    "toolkit_version",
    "unavailable_reason",
]


class ToolkitError(Exception):
    """Why a model cannot be built or run by the toolkit: one sentence with the remedy."""


# ---------------------------------------------------------------- the toolkit itself
def unavailable_reason() -> str | None:
    """Why this backend cannot work here, as one sentence with the remedy; None if it can."""
    if importlib.util.find_spec("rknn") is None:
        return (
            "The toolkit backend needs rknn-toolkit2, which is not installed in this "
            "environment; make its own environment with bash tools/toolkit-env.sh and run "
            "batchinfer from there (.venv-toolkit/bin/batchinfer)."
        )
    return None


def toolkit_version() -> str:
    """The installed rknn-toolkit2's version ("unknown" when it has no metadata)."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _rknn_class() -> Any:  # rknn.api.RKNN: the toolkit has no type information
    """``rknn.api.RKNN``, imported quietly (its import warns about pkg_resources)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ToolkitError(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rknn.api import RKNN
    return RKNN


def config_keys() -> frozenset[str]:
    """The keyword arguments ``rknn.config()`` takes in the installed toolkit."""
    params = inspect.signature(_rknn_class().config).parameters
    return frozenset(n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD) - {"self"}


@contextlib.contextmanager
def _quiet() -> Iterator[Any]:
    """Hold the toolkit lock, silence its warnings and send fds 1 and 2 to a temp file.

    The toolkit prints progress bars and native log lines straight to the process's
    stdout and stderr; the file (yielded) keeps them for an error message.
    """
    with _LOCK, warnings.catch_warnings(), tempfile.TemporaryFile() as sink:
        warnings.simplefilter("ignore")
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield sink
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


# ---------------------------------------------------------------- what a model needs
@dataclass(frozen=True)
class ToolkitModel:
    """A model as the toolkit rebuilds it: ONNX, conversion settings, calibration list."""

    model: Path  # the .rknn (or .onnx) asked for
    onnx: Path
    settings: dict[str, Any]  # keyword arguments of rknn.config()
    settings_path: Path
    dataset: tuple[tuple[Path, ...], ...]  # one tuple of input files per calibration sample
    dataset_path: Path

    @property
    def platform(self) -> str:
        return str(self.settings.get("target_platform", "unknown")).lower()


def load_settings(path: Path) -> dict[str, Any]:
    """The JSON object in a ``.config.json`` file; ToolkitError when it is not one."""
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolkitError(f"Cannot read the conversion settings {path} ({exc}).") from exc
    except ValueError as exc:
        raise ToolkitError(
            f"The conversion settings {path} are not valid JSON ({exc}); write the keyword "
            "arguments of rknn.config() as one JSON object."
        ) from exc
    if not isinstance(settings, dict):
        raise ToolkitError(
            f"The conversion settings {path} hold a {type(settings).__name__}, not a JSON "
            "object of rknn.config() keyword arguments."
        )
    return settings


def read_calibration_list(path: Path) -> tuple[tuple[Path, ...], ...]:
    """The samples of a calibration list (paths resolved against its folder)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolkitError(f"Cannot read the calibration list {path} ({exc}).") from exc
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        files = tuple(path.parent / p for p in line.split())
        for file in files:
            if not file.is_file():
                raise ToolkitError(
                    f"Calibration file {file} (line {number} of {path}) does not exist; "
                    "fix the list or restore the file."
                )
        samples.append(files)
    if not samples:
        raise ToolkitError(
            f"The calibration list {path} is empty; list at least one input file per line."
        )
    return tuple(samples)


def check_settings(model: ToolkitModel) -> None:
    """ToolkitError naming any key of the settings that rknn.config() does not take."""
    unknown = sorted(set(model.settings) - config_keys())
    if unknown:
        raise ToolkitError(
            f"{model.settings_path.name} has {', '.join(map(repr, unknown))}, which "
            "rknn.config() does not take; fix the spelling or remove it."
        )


def toolkit_model(model: str | os.PathLike[str]) -> ToolkitModel:
    """What the toolkit needs to rebuild ``model`` (.rknn or .onnx), read from beside it."""
    model = Path(model)
    onnx = model if model.suffix.lower() == ".onnx" else model.with_suffix(".onnx")
    if not onnx.is_file():
        raise ToolkitError(
            f"The toolkit backend rebuilds {model.name} from the model it was converted "
            f"from: put {onnx.name} beside it in {model.parent}."
        )
    settings_path = model.with_suffix(SETTINGS_SUFFIX)
    dataset_path = model.with_suffix(DATASET_SUFFIX)
    for path, what in (
        (settings_path, "the keyword arguments given to rknn.config(), as a JSON object"),
        (dataset_path, "the calibration list given to rknn.build(dataset=...)"),
    ):
        if not path.is_file():
            raise ToolkitError(
                f"The toolkit backend needs {path.name} beside {model.name}: {what}."
            )
    settings = load_settings(settings_path)
    if "target_platform" not in settings:
        meta = read_rknn_metadata(model) if model.suffix.lower() == ".rknn" else None
        if meta is None or not meta.platforms:
            raise ToolkitError(
                f"{settings_path.name} names no target_platform and {model.name} does not "
                'say one; add "target_platform": "rk3588" (or your chip) to it.'
            )
        settings = {**settings, "target_platform": meta.platforms[0]}
    return ToolkitModel(
        model=model,
        onnx=onnx,
        settings=settings,
        settings_path=settings_path,
        dataset=read_calibration_list(dataset_path),
        dataset_path=dataset_path,
    )


def fingerprint(model: ToolkitModel, version: str | None = None) -> str:
    """The cache key of ``model``'s build: ONNX, settings, calibration bytes, toolkit version."""
    h = hashlib.sha256()

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(f"batchinfer-toolkit-build {CACHE_LAYOUT}".encode())
    part((version or toolkit_version()).encode())
    part(model.onnx.read_bytes())
    part(json.dumps(model.settings, sort_keys=True).encode())
    for sample in model.dataset:
        part(b"sample")
        for file in sample:
            part(hashlib.sha256(file.read_bytes()).digest())
    return h.hexdigest()


def cache_root() -> Path:
    """Where builds are cached: $BATCHINFER_TOOLKIT_CACHE, else the user's cache folder."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "batchinfer" / "toolkit"


# ---------------------------------------------------------------- the cached build
def ensure_build(model: ToolkitModel) -> Path:
    """The cache folder holding ``model``'s build, building it first when there is none."""
    key = fingerprint(model)
    root = cache_root()
    entry = root / key[:32]
    if (entry / _DONE).is_file():
        return entry
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key[:32]}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
            if not (entry / _DONE).is_file():
                _build(model, entry, key)
    except OSError as exc:
        raise ToolkitError(
            f"Cannot build in the cache folder {root} ({exc.strerror or exc}); make it "
            f"writable or point {CACHE_ENV} at another folder."
        ) from exc
    return entry


def _build(model: ToolkitModel, entry: Path, key: str) -> None:
    # Under the lock: a folder of an earlier build of this key is one that was killed.
    for stale in entry.parent.glob(f".build-{key[:12]}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=entry.parent))
    try:
        shutil.copyfile(model.onnx, work / "model.onnx")
        (work / "dataset.txt").write_text(
            "".join(" ".join(str(f.resolve()) for f in sample) + "\n" for sample in model.dataset)
        )
        (work / "settings.json").write_text(json.dumps(model.settings))
        started = time.monotonic()
        with open(work / "build.log", "wb") as log:
            done = subprocess.run(
                [sys.executable, "-m", "batchinfer.runtime.toolkit", "build", str(os.getpid())],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        seconds = time.monotonic() - started
        missing = [f for f in _STEP1_FILES if not (work / f).is_file()]
        if done.returncode != 0 or missing:
            failed = entry.parent / f"failed-{key[:32]}.log"
            shutil.copyfile(work / "build.log", failed)
            raise ToolkitError(
                f"rknn-toolkit2 could not build {model.onnx.name} with {model.settings_path.name} "
                f"(exit {done.returncode}: {_last_line(failed.read_text(errors='replace'))}); "
                f"its whole log is {failed}."
            )
        (work / "model.onnx").unlink()
        record = {
            "fingerprint": key,
            "toolkit": toolkit_version(),
            "onnx": str(model.onnx),
            "onnx_sha256": hashlib.sha256(model.onnx.read_bytes()).hexdigest(),
            "settings": model.settings,
            "calibration_samples": len(model.dataset),
            "build_s": round(seconds, 3),
        }
        (work / _DONE).write_text(json.dumps(record, indent=2) + "\n")
        if entry.exists():  # an incomplete entry left by a build that was killed
            shutil.rmtree(entry)
        os.replace(work, entry)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _build_main(parent: int) -> int:
    """The child process of _build: quantise ./model.onnx on ./dataset.txt (step 1)."""
    # Die with the process that started the build (a worker killed mid-build, say).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above
        return 1
    rknn_class = _rknn_class()
    settings = json.loads(Path("settings.json").read_text())
    rknn = rknn_class(verbose=False)
    try:
        for step, call in (
            ("config", lambda: rknn.config(**settings)),
            ("load_onnx", lambda: rknn.load_onnx(model="model.onnx")),
            ("build", lambda: rknn.hybrid_quantization_step1(dataset="dataset.txt")),
        ):
            ret = call()
            if ret != 0:
                print(f"batchinfer: rknn.{step}() returned {ret}", flush=True)
                return 1
    finally:
        rknn.release()
    return 0


# ---------------------------------------------------------------- the runtime
class RKNNLite(OnnxRKNNBase):
    """``rknnlite.api.RKNNLite`` computing with rknn-toolkit2's simulator (no timing)."""

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        super().__init__(verbose=verbose, verbose_file=verbose_file)
        self._rknn: Any = None
        self._model: ToolkitModel | None = None
        self._ranks: tuple[int, ...] = ()

    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        async_mode: bool = False,
        core_mask: int = C.NPU_CORE_AUTO,
    ) -> int:
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
        if self._rknn is None:
            self._log(
                "E",
                "inference: Runtime environment is not inited, please call init_runtime "
                "to init it first!",
            )
            return None
        try:
            arrays, formats = self._check_inputs(
                inputs, data_type, data_format, inputs_pass_through
            )
            with _LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                raw = self._rknn.inference(inputs=arrays, data_format=formats)
            if raw is None:
                raise InputRejected("rknn-toolkit2's simulator returned None.")
            outputs = self._deliver(list(raw), reuse_outputs)
        except InputRejected as exc:
            self._log("E", f"inference: {exc}")
            return None
        except Exception as exc:  # never raise, like RKNNLite
            self._log("E", f"inference: rknn-toolkit2's simulator failed: {_last_line(str(exc))}")
            return None
        self._frame_id += 1
        if get_frame_id:
            outputs.append(self._frame_id)
        return outputs

    def _check_inputs(
        self, inputs: Any, data_type: Any, data_format: Any, pass_through: Any
    ) -> tuple[list[np.ndarray], list[str | None]]:
        """The arrays and data formats to hand the simulator, checked as RKNNLite does.

        The simulator is more lenient than a board (it adds a missing batch axis, ignores
        surplus inputs): these checks keep the board's answers.
        """
        if not isinstance(inputs, list):
            self._log("W", f"inference: inputs should be a list, but got {type(inputs).__name__}")
            inputs = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        n = len(self._ranks)
        if len(inputs) != n:
            raise InputRejected(f"The model needs {n} inputs, but {len(inputs)} inputs were given.")
        types = per_input(data_type, n, "data_type")
        formats = per_input(data_format, n, "data_format")
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

    def _after_release(self) -> None:
        rknn, self._rknn = self._rknn, None
        self._ranks = ()
        if rknn is not None:
            with _quiet():
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
    rknn_class = _rknn_class()
    files = [str(entry / f) for f in _STEP1_FILES]
    with _quiet() as sink:
        try:
            rknn = rknn_class(verbose=False)
        except Exception as exc:
            raise ToolkitError(f"rknn-toolkit2 did not start: {_last_line(str(exc))}") from exc
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
            failure = f"{step} raised {_last_line(str(exc))}"
        if failure is None and warm_up is not None:
            # The first call prints progress bars: make it here, where output is caught.
            # Best effort: a real call that fails says why in its own E line.
            with contextlib.suppress(Exception):
                rknn.inference(inputs=warm_up, data_format=["nhwc"] * len(warm_up))
        if failure is not None:
            rknn.release()
            sink.seek(0)
            printed = _last_line(sink.read().decode(errors="replace"))
            raise ToolkitError(
                f"rknn-toolkit2's simulator did not start for {model.model.name}: {failure} "
                f"({printed}); check {model.settings_path.name}."
            )
    return rknn


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build" or not sys.argv[2].isdigit():
        sys.exit(
            "usage: python -m batchinfer.runtime.toolkit build PARENT_PID (run by ensure_build)"
        )
    sys.exit(_build_main(int(sys.argv[2])))
