"""Runtimes with RKNNLite's shape: rknnlite (real), onnx (ONNX Runtime), sim (NPU emulator).

The engine uses them through backend objects (:mod:`batchinfer.runtime.backends`); the
functions here are the short way for scripts and tools. Runtime modules are imported
lazily: the real one only works (and may only be imported) inside a worker on a board.
"""

from __future__ import annotations

from pathlib import Path

from batchinfer.messages import setting
from batchinfer.options import BACKEND_NAMES
from batchinfer.runtime.model_info import ModelInfo, TensorInfo, describe_model

BACKENDS = BACKEND_NAMES

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
    from batchinfer.runtime.backends import resolve_name

    return resolve_name(backend, model)


def runtime_class(backend: str) -> type:
    """The RKNNLite-shaped class of a concrete backend (imported now, not before)."""
    from batchinfer.errors import ConfigError
    from batchinfer.runtime.backends import backend_class

    if backend not in BACKENDS or backend == "auto":
        raise ConfigError(
            setting("runtime.backend")
            + f" {backend!r} is not a concrete runtime; resolve 'auto' with "
            "resolve_backend() first, or use one of "
            + ", ".join(b for b in BACKENDS if b != "auto")
            + ".",
            "runtime.backend",
        )
    return backend_class(backend)(Path()).runtime_class()
