"""What ``batchinfer info`` shows: a model's tensors, its runtime, and that runtime's version."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchinfer.errors import BatchinferError, ModelError, UsageError
from batchinfer.options import RuntimeOptions
from batchinfer.runtime import describe_model
from batchinfer.runtime.backends import Backend, resolve_name
from batchinfer.runtime.model_info import onnx_beside, open_session
from batchinfer.runtime.rknn_file import read_rknn_metadata


def _runtime_facts(backend: Backend) -> tuple[str | None, object]:
    """The runtime's SDK/driver text and its supported platforms (None where it says none)."""
    adapter = backend.instance(None)
    try:
        sdk = adapter.sdk_version()
        with contextlib.redirect_stdout(io.StringIO()):  # it prints what it returns
            try:
                platforms = adapter.rknn.list_support_target_platform(rknn_model=str(backend.model))
            except Exception:  # the real one may raise where the manual says None
                platforms = None
        return sdk, platforms
    finally:
        adapter.release()


def _platform_lines(platforms: object) -> list[str]:
    """RKNNLite's platform dict as lines a person reads ("filled: RK3588")."""
    if not isinstance(platforms, dict):
        return [f"platforms: {platforms}"]
    lines = ["platforms:"]
    for key, value in platforms.items():
        shown = ", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value
        lines.append(f"  {str(key).replace('_', ' ')}: {shown or '-'}")
    return lines


def model_report(
    model: Path,
    backend: str = "auto",
    inputs: tuple[str, ...] = (),
    name: Callable[[str], str] = str,
) -> str:
    """A human-readable description of ``model`` as ``backend`` would run it; ``inputs``
    (NAME=COLUMN, as ``run --input``) say which manifest columns feed which inputs;
    ``name`` names the settings the report's reasons mention (the CLI: as flags)."""
    model = Path(model).expanduser()
    if not model.is_file():
        raise ModelError(
            f"model file {model} does not exist; pass the path of a .rknn or .onnx file."
        )
    concrete = resolve_name(backend, model)
    lines = [f"model:   {model}", f"runtime: {concrete}" + (" (auto)" if backend == "auto" else "")]
    try:
        info = describe_model(model)
    except ModelError as e:
        if onnx_beside(model) is not None:
            raise  # the model itself does not load: that is the answer, as an error
        # A bare .rknn: only a board can read it.
        lines.append(f"tensors: unknown ({e.render(name)})")
        info = None
    if info is not None and concrete in ("onnx", "sim"):
        # Shapes came off the file (runtime/onnx_graph.py); a graph ONNX Runtime refuses
        # (an unknown operator, an opset too new) is the answer here, as an error.
        open_session(info.onnx_path)
    if info is not None:
        rknn = model.suffix.lower() == ".rknn"
        for title, tensors in (("inputs", info.inputs), ("outputs", info.outputs)):
            lines.append(f"{title}:")
            for t in tensors:
                shape, layout = list(t.shape), ""
                if t.layout and rknn:
                    # A .rknn's shape is the runtime's (NHWC); the layout named is its source
                    # model's, which --layout defaults to: said so, or they read as a clash.
                    layout = f"  (source model: {t.layout})"
                elif t.layout:
                    # An ONNX model's own shape in its own layout ([1, 3, 256, 256] NCHW);
                    # what the runtime is fed (NHWC, RKNN's view) is said under "fed by".
                    shape, layout = _own_shape(t.shape, t.layout), f"  {t.layout.upper()}"
                lines.append(f"  {t.name:<16} {t.dtype:<8} {shape}{layout}")
    if info is not None:
        lines.extend(_feed_lines(info, inputs, model))
        lines.extend(_task_lines(model, info, name))
    if model.suffix.lower() == ".rknn":
        lines.extend(_rknn_file_lines(model))
    try:
        from batchinfer.runtime.backends import make_backend

        sdk, platforms = _runtime_facts(make_backend(model, RuntimeOptions(backend=concrete)))
    except BatchinferError as e:
        lines.append(f"version: unavailable ({e.render(name)})")
    else:
        lines.append("version:")
        lines.extend(f"  {line}" for line in (sdk or "unknown").splitlines())
        if platforms:
            lines.extend(_platform_lines(platforms))
    return "\n".join(lines)


def _own_shape(view: tuple[int, ...], layout: str) -> list[int]:
    """A 4-D input's shape in its graph's layout, from the RKNN view (NHWC) it is fed in."""
    if layout == "nchw" and len(view) == 4:
        n, h, w, c = view
        return [n, c, h, w]
    return list(view)


def _fed_as(t: Any, rknn: bool, image: bool) -> str:
    """What the runtime is given for an ONNX model's NCHW image input: its RKNN view, the
    images as decoded (a feature map's tensors go in the graph's own NCHW instead)."""
    if rknn or not image or t.layout != "nchw" or len(t.shape) != 4:
        return ""
    return f"; fed as {list(t.shape)} NHWC, the order RKNN runtimes take 4-D inputs in"


def _feed_lines(info: Any, pairs: tuple[str, ...], model: Path) -> list[str]:
    """What ``run`` feeds each input from (batchinfer.data.feeds); UsageError for a name
    in ``pairs`` the model has no input of."""
    from batchinfer.data.feeds import is_image_shape, parse_input_map

    mapping = parse_input_map(pairs)
    names = [t.name for t in info.inputs]
    unknown = [n for n in mapping if n not in names]
    if unknown:
        raise UsageError(
            f"--input names {', '.join(repr(n) for n in unknown)}, but {model} has no such "
            f"input; its inputs are {', '.join(repr(n) for n in names)}."
        )
    lines = ["fed by (batchinfer run):"]
    for t in info.inputs:
        kind = "images or tensors" if is_image_shape(t.shape) else "tensors"
        if len(t.shape) == 4 and not is_image_shape(t.shape) and t.layout == "nchw":
            n, h, w, c = t.shape  # a feature map comes as its source graph's NCHW
            kind = f"tensors {[n, c, h, w]}, NCHW"
        if t.name in mapping:
            source = f"the manifest column {mapping[t.name]!r}"
        elif len(info.inputs) == 1:
            source = f"each dataset item, or the array {t.name!r} of .npz items"
        else:
            source = f"the array {t.name!r} of .npz items, or --input {t.name}=COLUMN"
        rknn = model.suffix.lower() == ".rknn"
        fed = _fed_as(t, rknn, is_image_shape(t.shape))
        lines.append(f"  {t.name:<16} {source} ({kind}{fed})")
    return lines


def _task_lines(model: Path, info: Any, name: Callable[[str], str]) -> list[str]:
    """What ``run --task auto`` would do with the outputs, and why (batchinfer/tasks)."""
    from batchinfer.data.preprocess import preprocess_for
    from batchinfer.options import DetectOptions
    from batchinfer.tasks import plan_task

    input_hw = None
    if len(info.inputs) == 1:
        try:
            spec = preprocess_for(info.inputs[0].shape, info.inputs[0].dtype)
            input_hw = spec.size if spec.is_image else None
        except BatchinferError:
            input_hw = None
    shapes = [tuple(o.shape) for o in info.outputs]
    try:
        task = plan_task(DetectOptions(), model, input_hw, output_shapes=shapes)
    except BatchinferError as e:
        return [f"task:    unknown ({e.render(name)})"]
    return task.info_lines()


def _rknn_file_lines(model: Path) -> list[str]:
    """What the .rknn file says about itself (the JSON document at its end)."""
    meta = read_rknn_metadata(model)
    if meta is None:
        return ["rknn file: no metadata at its end (not written by rknn-toolkit2 2.x?)"]
    lines = [
        "rknn file (its own metadata; shapes as in the source model, the runtime takes 4-D "
        "inputs as NHWC):",
        f"  platforms: {', '.join(meta.platforms) or 'none named'}",
        f"  written by rknn-toolkit2 {meta.version or '?'}"
        + (f" from {meta.source_format}" if meta.source_format else ""),
    ]
    for title, tensors in (("inputs", meta.inputs), ("outputs", meta.outputs)):
        lines.append(f"  {title}:")
        for t in tensors:
            method = f"  per-{t.qnt_method} quantised" if t.qnt_method else ""
            lines.append(f"    {t.name:<14} {t.dtype or 'float':<8} {list(t.shape)}{method}")
    return lines
