"""Choosing a run's task: the model's facts read once, then the asked task or ``auto``'s
order (batchinfer/tasks/__init__.py says the order; each task says whether it fits)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchinfer.engine.planning.model_metadata import read_model_metadata
from batchinfer.errors import ConfigError, ModelError
from batchinfer.messages import setting
from batchinfer.tasks.base import ModelFacts, Task
from batchinfer.tasks.registry import REGISTRY, available, task_class

if TYPE_CHECKING:
    from batchinfer.options import DetectOptions


def _static(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape as the runtime reports it: a dynamic batch axis is 1."""
    dims = [int(d) for d in shape]
    if dims and dims[0] <= 0:
        dims[0] = 1
    return tuple(dims)


def is_plugin(name: str) -> bool:
    """``file.py:Class`` or ``package.module:Class`` (a colon), not a built-in name."""
    return ":" in name


def plan(
    opts: DetectOptions,
    model: Path,
    input_hw: tuple[int, int] | None,
    labels: Path | None,
    output_shapes: Sequence[Sequence[int]] | None,
    dataset: Path | str | None,
    batch: int = 1,
) -> Task:
    """See :func:`batchinfer.tasks.plan_task`."""
    from batchinfer.tasks.boxes import check_detect_options

    check_detect_options(opts)
    name = opts.task
    if name != "auto" and not is_plugin(name) and name not in REGISTRY:
        from batchinfer.tasks.plugin import entry_point

        if entry_point(name) is None:
            raise ConfigError(
                setting("detect.task")
                + f" {name!r} is no task: give auto, {', '.join(REGISTRY)}, a plug-in "
                "(path/to/file.py:Class or package.module:Class), or the name of an "
                "installed one.",
                "detect.task",
            )
    if output_shapes is None:
        output_shapes, quant = _model_outputs(model, name)
    else:
        quant = ()
    if batch > 1:  # each item gets row j of a batch-N call's outputs
        output_shapes = [(1, *s[1:]) if s and s[0] == batch else tuple(s) for s in output_shapes]
    facts = ModelFacts(
        model=Path(model),
        input_hw=None if input_hw is None else (int(input_hw[0]), int(input_hw[1])),
        output_shapes=tuple(_static(s) for s in output_shapes),
        quant=quant,
        meta=read_model_metadata(Path(model)),
        labels=labels,
        dataset=dataset,
    )
    if name == "auto":
        return _auto(facts, opts)
    if is_plugin(name) or name not in REGISTRY:
        from batchinfer.tasks.plugin import plan_plugin

        return plan_plugin(name, facts, opts)
    task = task_class(name).recognise(facts, opts, asked=True)
    if task is None:  # a task that refuses when asked says why itself; this is a fallback
        raise ConfigError(
            setting("detect.task") + f" {name} does not fit {facts.model.name} (outputs "
            f"{facts.shapes_text}).",
            "detect.task",
        )
    return task


def _auto(facts: ModelFacts, opts: DetectOptions) -> Task:
    """The task the metadata names when it recognises the model, else the registry's first."""
    names = list(REGISTRY)
    said = facts.model_task
    if said in REGISTRY:
        names.remove(said)
        names.insert(0, said)
    for name in names:
        cls = available(name)
        if cls is None:
            continue
        task = cls.recognise(facts, opts, asked=False)
        if task is not None:
            return task
    raise AssertionError("raw recognises every model")  # pragma: no cover


def _model_outputs(
    model: Path, task: str
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[float, int] | None, ...]]:
    """The model's output shapes (and their quantisation, when the graph says it); () when
    they cannot be read (a bare .rknn), unless a task that needs them was asked for."""
    from batchinfer.runtime import describe_model

    try:
        info = describe_model(model)
    except ModelError as e:
        if task in REGISTRY and task not in ("classify", "raw"):
            raise ConfigError(
                setting("detect.task")
                + f" {task} needs the model's output shapes, which cannot be read "
                f"({e}); put the .onnx it was converted from beside it.",
                "detect.task",
            ) from e
        return (), ()
    return tuple(tuple(o.shape) for o in info.outputs), _output_quant(info.onnx_path, info)


def _output_quant(onnx_path: Path, info: object) -> tuple[tuple[float, int] | None, ...]:
    """Per output, (scale, zero point) when a QDQ graph quantises it; () when none is."""
    try:
        from batchinfer.runtime import graph

        data = Path(onnx_path).read_bytes()
        if not graph.mentions_quantisation(data):
            return ()
        outputs = info.outputs  # type: ignore[attr-defined]
        _, outs = graph.native_types(data, [], [(o.name, o.dtype) for o in outputs])
    except Exception:  # quantisation parameters are a fallback for int8 outputs, never fatal
        return ()
    quant = tuple((n.scale, n.zero_point) if n.quantised else None for n in outs)
    return quant if any(quant) else ()
