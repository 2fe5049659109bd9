"""Runtimes with RKNNLite's shape: rknnlite (real), onnx (ONNX Runtime), sim (NPU emulator),
toolkit (rknn-toolkit2's simulator: quantised numerics, no timing).

Pick one with :func:`resolve_backend` and :func:`runtime_class`; drive it through
:class:`batchinfer.runtime.adapter.RuntimeAdapter`. Runtime modules are imported lazily:
the real one only works (and may only be imported) inside a worker on a board.
"""

from __future__ import annotations

from pathlib import Path

from batchinfer.errors import UsageError
from batchinfer.runtime.model_info import ModelInfo, TensorInfo, describe_model

BACKENDS = ("auto", "rknnlite", "onnx", "sim", "toolkit")

__all__ = [
    "BACKENDS",
    "ModelInfo",
    "TensorInfo",
    "describe_model",
    "resolve_backend",
    "runtime_class",
]


def resolve_backend(backend: str, model: Path) -> str:
    """The concrete backend for ``model``: 'auto' picks rknnlite for .rknn, onnx for .onnx."""
    if backend not in BACKENDS:
        raise UsageError(f"Backend {backend!r} is unknown; use one of {', '.join(BACKENDS)}.")
    if backend != "auto":
        return backend
    suffix = Path(model).suffix.lower()
    if suffix == ".rknn":
        return "rknnlite"
    if suffix == ".onnx":
        return "onnx"
    raise UsageError(
        f"Cannot pick a backend for model {model} (not .rknn or .onnx); "
        "pass --backend rknnlite, onnx, sim or toolkit."
    )


def runtime_class(backend: str) -> type:
    """The RKNNLite-shaped class of a concrete backend (imported now, not before)."""
    if backend == "rknnlite":
        from batchinfer.runtime.rknnlite import load_rknnlite_class

        return load_rknnlite_class()
    if backend == "onnx":
        from batchinfer.runtime.onnx import RKNNLite

        return RKNNLite
    if backend == "sim":
        from batchinfer.runtime.sim import RKNNLite

        return RKNNLite
    if backend == "toolkit":
        from batchinfer.errors import RuntimeUnavailableError
        from batchinfer.runtime.toolkit import RKNNLite, unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeUnavailableError(reason)
        return RKNNLite
    raise UsageError(
        f"Backend {backend!r} is not a concrete runtime; resolve 'auto' with resolve_backend() "
        "first or use rknnlite, onnx, sim or toolkit."
    )
