"""Tasks: what a run does with a model's outputs (the protocol: batchinfer/tasks/base.py).

``detect.task`` (``--task``) picks one: a built-in name below, a plug-in
(``path/to/file.py:Class``, ``package.module:Class``, or the name an installed package
registers in the entry-point group ``batchinfer.tasks``: batchinfer/tasks/plugin.py), or
``auto`` (the default): the task the model's metadata names (Ultralytics exports) when it
is registered and recognises the model, else the first of :data:`REGISTRY`, in order, that
recognises it. ``raw`` (the outputs stored in the rows) takes any model, so auto always
ends with a task.

Adding a task is adding its module and one line here: names are imported only when used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from batchinfer.errors import ConfigError
from batchinfer.tasks.base import Decoded, ItemDecoder, ModelFacts, Placement, Task
from batchinfer.tasks.registry import (
    NOT_AVAILABLE,
    REGISTRY,
    TaskNotAvailable,
    available,
    task_class,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from batchinfer.options import DetectOptions


def task_from_record(record: Mapping[str, Any]) -> Task:
    """The task a finished run's manifest record names, made again to read its rows (to
    store, draw, export them: not to decode). A task that cannot be had now (a plug-in
    gone, a task not available yet) is a bare one that knows its name only."""
    from batchinfer.tasks.classify import Classify

    name = str(record.get("task") or "classify")
    cls: type[Task] | None = None
    if name in REGISTRY:
        cls = available(name)
    elif record.get("reference"):
        from batchinfer.tasks.plugin import load

        with contextlib.suppress(ConfigError):
            cls = load(str(record["reference"]))
    if cls is None:
        from batchinfer.tasks.raw import Raw

        return type(f"Unavailable_{name}", (Raw,), {"name": name, "keeps_outputs": False})()
    return cls.from_record(record) if cls is not Classify else Classify()


def plan_task(
    opts: DetectOptions,
    model: Path,
    input_hw: tuple[int, int] | None,
    labels: Path | None = None,
    output_shapes: Sequence[Sequence[int]] | None = None,
    dataset: Path | str | None = None,
    batch: int = 1,
) -> Task:
    """The task of a run of ``model`` whose image input is ``input_hw`` (None: not an image).

    ``output_shapes`` default to the model file's (runtime/model_info.py); ``dataset`` (its
    path) may name the classes; ``batch``: a batch-N model's, whose outputs are judged per
    item (each item gets row j of a call's outputs: engine/batching.py). Raises ConfigError
    (exit 2) when the asked task refuses the model, for a labels file that does not fit,
    and for settings out of range.
    """
    from batchinfer.tasks.planning import plan

    return plan(opts, model, input_hw, labels, output_shapes, dataset, batch)


__all__ = [
    "NOT_AVAILABLE",
    "REGISTRY",
    "Decoded",
    "ItemDecoder",
    "ModelFacts",
    "Placement",
    "Task",
    "TaskNotAvailable",
    "available",
    "plan_task",
    "task_class",
    "task_from_record",
]
