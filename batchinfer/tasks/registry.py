"""The built-in tasks by name, imported only when used (batchinfer/tasks/__init__.py says
how ``--task`` picks one)."""

from __future__ import annotations

import importlib

from batchinfer.errors import ConfigError
from batchinfer.messages import setting
from batchinfer.tasks.base import Task

#: Built-in tasks, name -> "module:Class", in the order ``auto`` tries them.
REGISTRY: dict[str, str] = {
    "detect": "batchinfer.tasks.detect:Detect",
    "segment": "batchinfer.tasks.segment:Segment",
    "pose": "batchinfer.tasks.pose:Pose",
    "obb": "batchinfer.tasks.obb:Obb",
    "classify": "batchinfer.tasks.classify:Classify",
    "raw": "batchinfer.tasks.raw:Raw",
}

#: What a task's module being absent means: registered, not written yet.
NOT_AVAILABLE = "not available yet"


class TaskNotAvailable(ConfigError):
    """A registered task whose module is not there (yet)."""


def task_class(name: str) -> type[Task]:
    """The class of built-in task ``name`` (TaskNotAvailable when its module is absent)."""
    module, _, cls = REGISTRY[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise TaskNotAvailable(
            setting("detect.task") + f" {name}: that task is {NOT_AVAILABLE} in this version "
            "of batchinfer; use auto, classify, detect or raw.",
            "detect.task",
        ) from None
    found: type[Task] = getattr(mod, cls)
    return found


def available(name: str) -> type[Task] | None:
    """The class of built-in task ``name``, or None when it is not available yet."""
    try:
        return task_class(name)
    except TaskNotAvailable:
        return None
