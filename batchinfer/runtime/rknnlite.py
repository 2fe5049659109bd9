"""The real runtime, ``rknnlite.api.RKNNLite``, imported lazily and only where it can work.

Importing rknnlite rewrites the names of Python's logging levels (other libraries then
fail with ``ValueError: Unknown level: 'INFO'``; runtime/_level_names.py says how), so
:func:`load_rknnlite_class` restores them right after the import. Call it inside the
worker process that uses the runtime, never in the coordinator.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
from pathlib import Path

from batchinfer.errors import RuntimeUnavailableError
from batchinfer.messages import setting
from batchinfer.runtime import _level_names

LIBRKNNRT = Path("/usr/lib/librknnrt.so")
_ARM64 = ("aarch64", "arm64")


def unavailable_reason(
    machine: str | None = None,
    has_wheel: bool | None = None,
    librknnrt: Path | None = None,
) -> str | None:
    """Why rknnlite cannot work here, as one sentence with the remedy; None if it can."""
    librknnrt = librknnrt if librknnrt is not None else LIBRKNNRT
    machine = machine if machine is not None else platform.machine()
    if machine.lower() not in _ARM64:
        return (
            f"The rknnlite backend (rknn-toolkit-lite2) exists only for aarch64 boards and this "
            f"machine is {machine}; use "
            + setting("runtime.backend")
            + " onnx or "
            + setting("runtime.backend")
            + " sim on "
            "this machine."
        )
    if has_wheel is None:
        has_wheel = importlib.util.find_spec("rknnlite") is not None
    if not has_wheel:
        return (
            "The rknnlite backend needs rknn-toolkit-lite2, which is not installed; "
            "run pip install 'batchinfer[rk]'."
        )
    if not librknnrt.exists():
        return (
            f"The rknnlite backend needs the NPU runtime {librknnrt}, which is missing; "
            "install Rockchip's librknnrt >= 2.5.0 there (from airockchip/rknn-toolkit2)."
        )
    return None


def load_rknnlite_class() -> type:
    """``rknnlite.api.RKNNLite``; RuntimeUnavailableError saying why when it cannot work here."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeUnavailableError(reason)
    level_names = _level_names.snapshot()
    try:
        module = importlib.import_module("rknnlite.api")
    except Exception as exc:
        raise RuntimeUnavailableError(
            f"rknn-toolkit-lite2 is installed but cannot be imported ({exc}); reinstall it "
            "with pip install --force-reinstall 'batchinfer[rk]'."
        ) from exc
    finally:
        _level_names.restore(level_names)
    return module.RKNNLite
