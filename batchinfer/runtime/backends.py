"""Backend objects: everything that differs between runtimes, one class per runtime.

The engine never names a runtime. It asks a :class:`Backend` for the chip and its cores,
lets it check its own options, calls its per-run set-up and clean-up, and, inside a worker
process, asks it for "an instance for core c". The same factory serves the core worker,
bench's peers, eval's float reference and a Ray actor.

Backends are frozen dataclasses, so they pickle: the coordinator sends the one returned
by :meth:`Backend.for_run` to every child it spawns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from batchinfer.errors import BatchinferError, ConfigError, RuntimeUnavailableError, UsageError
from batchinfer.flocks import try_flock
from batchinfer.messages import join, setting
from batchinfer.options import BACKEND_NAMES, RuntimeOptions, SimOptions
from batchinfer.runtime.adapter import RuntimeAdapter
from batchinfer.runtime.constants import (
    CHIP_CORES,
    MULTI_CORE_CHIPS,
    NPU_CORE_AUTO,
    core_mask,
)

NAMES = BACKEND_NAMES


@dataclass(frozen=True)
class Backend:
    """One runtime, as the engine sees it."""

    name: ClassVar[str]
    #: What to check when this runtime fails, for messages ("check ...").
    hint: ClassVar[str] = "check the E lines above"
    model: Path

    def chip(self) -> str:
        """The SoC whose cores this backend offers."""
        return "rk3588"

    def cores(self) -> tuple[int, ...]:
        """Every NPU core of the chip."""
        return tuple(range(CHIP_CORES[self.chip()]))

    def check(self) -> None:
        """Raise a UsageError when this backend cannot run here or its options are wrong."""

    def for_run(self) -> Backend:
        """Per-run set-up; returns the backend the run's children get (default: this one)."""
        return self

    def end_run(self) -> None:
        """Undo :meth:`for_run` (called on the object it returned, whatever happened)."""

    def sweep(self) -> None:
        """Remove what runs that died left behind (called before a run starts)."""

    def runtime_class(self) -> type:
        """The RKNNLite-shaped class (imported on first use, in the process that uses it)."""
        raise NotImplementedError

    def new_runtime(self) -> Any:
        """A fresh RKNNLite-shaped object, not yet loaded."""
        return self.runtime_class()()

    def instance(self, core: int | None) -> RuntimeAdapter:
        """A runtime with the model loaded and initialised on ``core`` (None: any core).

        On a one-core chip the mask is NPU_CORE_AUTO: those chips refuse any other.
        """
        adapter = RuntimeAdapter(self.new_runtime(), core=core, model=self.model, hint=self.hint)
        adapter.load()
        multi = self.chip() in MULTI_CORE_CHIPS
        try:
            adapter.init(core_mask(core) if core is not None and multi else NPU_CORE_AUTO)
        except BaseException:
            adapter.release()
            raise
        return adapter

    def describe(self) -> dict[str, Any]:
        """Facts about this backend for the manifest."""
        return {"name": self.name, "chip": self.chip()}


# --------------------------------------------------------------------------- rknnlite
def detect_chip(root: Path = Path("/")) -> str | None:
    """The Rockchip SoC this machine is, from the device tree (None when not a Rockchip)."""
    with contextlib.suppress(OSError):
        compatible = (root / "proc/device-tree/compatible").read_bytes().decode(errors="replace")
        for chip in CHIP_CORES:
            if f"rockchip,{chip}" in compatible:
                return chip
    return None


def rknn_chip(model: Path) -> str | None:
    """The chip a .rknn file was converted for (its own metadata), when it names a known one."""
    from batchinfer.runtime.rknn_file import read_rknn_metadata

    if Path(model).suffix.lower() != ".rknn":
        return None
    with contextlib.suppress(BatchinferError, OSError):
        meta = read_rknn_metadata(model)
        for platform in meta.platforms if meta is not None else ():
            if platform.lower() in CHIP_CORES:
                return platform.lower()
    return None


@dataclass(frozen=True)
class RknnliteBackend(Backend):
    """The real NPU runtime (rknn-toolkit-lite2 + librknnrt), aarch64 boards only."""

    name: ClassVar[str] = "rknnlite"
    hint: ClassVar[str] = (
        "check /usr/lib/librknnrt.so >= 2.5.0 and read/write access to the NPU device"
    )

    def chip(self) -> str:
        return detect_chip() or "rk3588"

    def check(self) -> None:
        from batchinfer.runtime.rknnlite import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise RuntimeUnavailableError(reason)

    def runtime_class(self) -> type:
        from batchinfer.runtime.rknnlite import load_rknnlite_class

        return load_rknnlite_class()


# --------------------------------------------------------------------------- onnx
def check_onnx_beside(backend: Backend) -> None:
    """The sim and onnx backends run a .rknn from the .onnx it was converted from; without
    one every core would fail to start, each blaming itself: say so once, up front."""
    model = backend.model
    if model.suffix.lower() != ".rknn" or model.with_suffix(".onnx").is_file():
        return
    raise ConfigError(
        setting("runtime.backend")
        + f" {backend.name} runs a .rknn from the .onnx it was converted "
        f"from, and there is no {model.with_suffix('.onnx').name} beside {model}; put that "
        "file there (same stem), or run the .rknn on a board ("
        + setting("runtime.backend")
        + " rknnlite) or "
        "in rknn-toolkit2's simulator (" + setting("runtime.backend") + " toolkit).",
        "runtime.backend",
    )


@dataclass(frozen=True)
class OnnxBackend(Backend):
    """ONNX Runtime on the CPU: x86 runs, and the float reference on a board.

    There is no NPU: "cores" are worker processes laid out as on an RK3588.
    """

    name: ClassVar[str] = "onnx"
    hint: ClassVar[str] = "check the E lines above and that the .onnx model is valid"

    def check(self) -> None:
        check_onnx_beside(self)

    def runtime_class(self) -> type:
        from batchinfer.runtime.onnx import RKNNLite

        return RKNNLite


# --------------------------------------------------------------------------- toolkit
@dataclass(frozen=True)
class ToolkitBackend(Backend):
    """rknn-toolkit2's simulator: the NPU's quantised numerics on x86, without timing.

    Needs rknn-toolkit2 (its own environment: docs/guide/toolkit.md); the chip is the
    one the .rknn was converted for.
    """

    name: ClassVar[str] = "toolkit"
    hint: ClassVar[str] = "check the E lines above and rknn-toolkit2's environment"

    def chip(self) -> str:
        return rknn_chip(self.model) or "rk3588"

    def check(self) -> None:
        from batchinfer.runtime.toolkit import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise RuntimeUnavailableError(reason)

    def runtime_class(self) -> type:
        self.check()
        from batchinfer.runtime.toolkit import RKNNLite

        return RKNNLite


# --------------------------------------------------------------------------- sim
_SIM_STATE_PREFIX = "batchinfer-sim-run-"
_SIM_OWNER = "owner.lock"
T = TypeVar("T")  # what SimBackend._emulator makes


@dataclass(frozen=True)
class SimBackend(Backend):
    """The NPU emulator. Each run emulates its own board: a private state folder, whose
    fault counters ("call=N") start from zero, held by a lock while the run lives."""

    name: ClassVar[str] = "sim"
    hint: ClassVar[str] = (
        "check the sim faults (runtime.sim.faults, BATCHINFER_SIM_FAULTS) and the E lines above"
    )
    options: SimOptions = field(default_factory=SimOptions)
    state_dir: str | None = None
    _owner_fd: int | None = field(default=None, compare=False, repr=False)

    def settings(self) -> Any:
        """The emulator's resolved settings (options, then BATCHINFER_SIM_* variables)."""
        from batchinfer.runtime.sim_settings import SimSettings

        return self._emulator(SimSettings.from_env)

    def _emulator(self, make: Callable[..., T]) -> T:
        """``make`` (the emulator's settings, or one of its runtimes) called with this run's
        sim options: the two must agree."""
        o = self.options
        return make(
            chip=o.chip,
            npu_ms=o.npu_ms,
            host_ms=o.host_ms,
            faults=o.faults or None,
            state_dir=self.state_dir,
        )

    def chip(self) -> str:
        # As the emulator does: the chip asked for, else the one a .rknn was made for.
        chip = self.options.chip or os.environ.get("BATCHINFER_SIM_CHIP") or rknn_chip(self.model)
        return (chip or "rk3588").lower()

    def check(self) -> None:
        check_onnx_beside(self)
        chip = self.chip()
        if chip not in CHIP_CORES:
            raise ConfigError(
                setting("runtime.sim.chip")
                + f" {chip!r} is unknown; use one of {', '.join(CHIP_CORES)}.",
                "runtime.sim.chip",
            )
        from batchinfer.runtime.sim_settings import parse_fault

        for spec in self.options.faults:
            try:
                fault = parse_fault(spec)
            except UsageError as e:
                raise ConfigError(
                    setting("runtime.sim.faults") + f": {e}", "runtime.sim.faults"
                ) from None
            if fault.core is not None and fault.core >= CHIP_CORES[chip]:
                raise ConfigError(
                    setting("runtime.sim.faults")
                    + f" {spec}: core {fault.core} does not exist on {chip} "
                    f"(cores 0-{CHIP_CORES[chip] - 1}); name one of those cores.",
                    "runtime.sim.faults",
                )
        for name in ("npu_ms", "host_ms"):
            value = getattr(self.options, name)
            if value is None or (value == "estimate" and name == "npu_ms"):
                continue
            if isinstance(value, str) or not 0 <= value < float("inf"):
                raise ConfigError(
                    f"{{runtime.sim.{name}}} must be milliseconds >= 0, not {value!r}.",
                    f"runtime.sim.{name}",
                )
        try:
            self.settings()
        except UsageError as e:  # e.g. a bad BATCHINFER_SIM_* variable
            raise ConfigError(str(e)) from None

    def for_run(self) -> SimBackend:
        state = tempfile.mkdtemp(prefix=f"{_SIM_STATE_PREFIX}{os.getpid()}-")
        fd = os.open(os.path.join(state, _SIM_OWNER), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until end_run, or until this process dies
        return dataclasses.replace(self, state_dir=state, _owner_fd=fd)

    def end_run(self) -> None:
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._owner_fd is not None:
            os.close(self._owner_fd)

    def sweep(self) -> None:
        sweep_sim_states()

    def __getstate__(self) -> dict:
        # The owner lock stays with the coordinator: children must not hold it.
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        state["_owner_fd"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    def new_runtime(self) -> Any:
        from batchinfer.runtime.sim import RKNNLite

        return self._emulator(RKNNLite)

    def runtime_class(self) -> type:
        from batchinfer.runtime.sim import RKNNLite

        return RKNNLite

    def describe(self) -> dict[str, Any]:
        s = self.settings()
        return {
            "name": self.name,
            "chip": s.chip,
            "npu_ms": s.npu_ms,
            "host_ms": s.host_ms,
            "faults": [str(f) for f in s.faults],
        }


def sweep_sim_states(root: Path | None = None) -> list[Path]:
    """Remove emulator state folders whose run is gone (nobody holds their owner lock).

    Liveness is the lock, not a pid: a pid says nothing across PID namespaces (containers
    sharing /tmp), and a lock dies with its process however it dies.
    """
    root = Path(tempfile.gettempdir()) if root is None else root
    swept = []
    for path in root.glob(f"{_SIM_STATE_PREFIX}*"):
        try:
            fd = os.open(path / _SIM_OWNER, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # no owner file yet (being created), or not ours
        try:
            if not try_flock(fd, fcntl.LOCK_EX):
                continue  # its run is alive
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept


# --------------------------------------------------------------------------- the factory
_CLASSES: dict[str, type[Backend]] = {
    "rknnlite": RknnliteBackend,
    "onnx": OnnxBackend,
    "sim": SimBackend,
    "toolkit": ToolkitBackend,
}


def backend_class(name: str) -> type[Backend]:
    """The Backend class of a concrete backend name."""
    return _CLASSES[name]


def resolve_name(name: str, model: Path) -> str:
    """The concrete backend for ``model``: 'auto' picks rknnlite for .rknn, onnx for .onnx."""
    if name not in NAMES:
        raise ConfigError(
            setting("runtime.backend") + f" {name!r} is unknown; use one of {', '.join(NAMES)}.",
            "runtime.backend",
        )
    if name != "auto":
        return name
    suffix = Path(model).suffix.lower()
    if suffix == ".rknn":
        return "rknnlite"
    if suffix == ".onnx":
        return "onnx"
    raise ConfigError(
        f"Cannot pick a backend for model {model} (not .rknn or .onnx); pass "
        + setting("runtime.backend")
        + " "
        "rknnlite, onnx or sim.",
        "runtime.backend",
    )


def make_backend(model: Path, options: RuntimeOptions) -> Backend:
    """The backend ``options`` ask for, checked (UsageError naming the setting at fault)."""
    name = resolve_name(options.backend, model)
    if name != "sim" and not options.sim.is_default():
        set_fields = [
            setting(f"runtime.sim.{f.name}")
            for f in dataclasses.fields(SimOptions)
            if getattr(options.sim, f.name) != f.default
        ]
        raise ConfigError(
            join(", ", set_fields) + f" only apply to the sim backend, and the backend is {name}; "
            "drop them, or pass " + setting("runtime.backend") + " sim.",
            "runtime.sim",
        )
    backend = SimBackend(Path(model), options.sim) if name == "sim" else _CLASSES[name](Path(model))
    backend.check()
    return backend
