"""What the ``toolkit`` backend needs of rknn-toolkit2 before it can run a model (the
backend itself and the files it reads are described in batchinfer/runtime/toolkit.py's
docstring): the toolkit's presence and version, the model's files beside it
(:class:`ToolkitModel`), and the cached build (:func:`ensure_build`), made in a child
process run as ``python -m batchinfer.runtime.toolkit_build build PARENT_PID``.
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

from batchinfer.runtime.rknn_file import read_rknn_metadata

PACKAGE = "rknn-toolkit2"
CACHE_ENV = "BATCHINFER_TOOLKIT_CACHE"
#: Part of every fingerprint: bump it when what a cache entry holds changes.
CACHE_LAYOUT = "1"
SETTINGS_SUFFIX = ".config.json"
DATASET_SUFFIX = ".dataset.txt"
# The files hybrid_quantization_step1 writes for a model loaded from "model.onnx".
STEP1_FILES = ("model.model", "model.data", "model.quantization.cfg")
_DONE = "build.json"  # written last: an entry without it is incomplete
_PR_SET_PDEATHSIG = 1

# One toolkit call at a time in this process (its simulator keeps global state).
TOOLKIT_LOCK = threading.RLock()


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


def load_rknn_class() -> Any:  # rknn.api.RKNN: the toolkit has no type information
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
    params = inspect.signature(load_rknn_class().config).parameters
    return frozenset(n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD) - {"self"}


@contextlib.contextmanager
def quiet() -> Iterator[Any]:
    """Hold the toolkit lock, silence its warnings and send fds 1 and 2 to a temp file.

    The toolkit prints progress bars and native log lines straight to the process's
    stdout and stderr; the file (yielded) keeps them for an error message.
    """
    with TOOLKIT_LOCK, warnings.catch_warnings(), tempfile.TemporaryFile() as sink:
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


def last_line(text: str) -> str:
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
                [
                    sys.executable,
                    "-m",
                    "batchinfer.runtime.toolkit_build",
                    "build",
                    str(os.getpid()),
                ],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        seconds = time.monotonic() - started
        missing = [f for f in STEP1_FILES if not (work / f).is_file()]
        if done.returncode != 0 or missing:
            failed = entry.parent / f"failed-{key[:32]}.log"
            shutil.copyfile(work / "build.log", failed)
            raise ToolkitError(
                f"rknn-toolkit2 could not build {model.onnx.name} with {model.settings_path.name} "
                f"(exit {done.returncode}: {last_line(failed.read_text(errors='replace'))}); "
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
    rknn_class = load_rknn_class()
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


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build" or not sys.argv[2].isdigit():
        sys.exit(
            "usage: python -m batchinfer.runtime.toolkit_build build PARENT_PID "
            "(run by ensure_build)"
        )
    sys.exit(_build_main(int(sys.argv[2])))
