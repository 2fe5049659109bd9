"""What an Ultralytics export says about itself: the ``task`` and ``names`` in its ONNX
metadata_props (batchinfer/tasks decides a run's task with it)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from batchinfer.errors import ModelError


@dataclass(frozen=True)
class ModelMetadata:
    """What an Ultralytics export says about itself in its ONNX metadata_props."""

    task: str | None  # "detect", "pose", ... (None when not said)
    names: tuple[str, ...] | None  # class names by id, when given and well-formed
    file: str  # the ONNX file it was read from, for messages
    # A pose export's (keypoints, values per keypoint: 2 or 3), when given and well-formed
    kpt_shape: tuple[int, int] | None = None


def read_model_metadata(model: Path) -> ModelMetadata | None:
    """The Ultralytics metadata of ``model`` (an .onnx, or the .onnx beside a .rknn); None
    when there is none, or the file cannot be read (the output shapes then decide alone)."""
    from batchinfer.runtime.model_info import onnx_beside
    from batchinfer.runtime.onnx_graph import read_graph_interface

    try:
        path = onnx_beside(Path(model))
        if path is None or not path.is_file():
            return None
        props = dict(read_graph_interface(path).metadata)
    except (ModelError, OSError):
        return None
    task = props.get("task", "").strip().lower() or None
    if task is None and "kpt_shape" in props:
        task = "pose"  # exports from before Ultralytics wrote ``task`` carry keypoints so
    names = _metadata_names(props.get("names"))
    if task is None and names is None:
        return None
    return ModelMetadata(task, names, path.name, _kpt_shape(props.get("kpt_shape")))


def _kpt_shape(text: str | None) -> tuple[int, int] | None:
    """Ultralytics writes ``kpt_shape`` as a list literal, "[17, 3]"; None unless it is
    two positive integers, the second 2 or 3."""
    try:
        value = ast.literal_eval(text) if text else None  # literals only: never runs code
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    k, d = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return (k, d) if k >= 1 and d in (2, 3) else None


def _metadata_names(text: str | None) -> tuple[str, ...] | None:
    """Ultralytics writes ``names`` as a Python dict literal, "{0: 'person', 1: 'bicycle'}";
    a list is taken too. None unless it names each class id 0..N-1 once."""
    if not text:
        return None
    try:
        value = ast.literal_eval(text)  # literals only: never runs code
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, (list, tuple)):
        value = dict(enumerate(value))
    if not isinstance(value, dict) or not value:
        return None
    try:
        by_id = {int(k): str(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_id) != list(range(len(by_id))):
        return None
    return tuple(by_id[i] for i in range(len(by_id)))
