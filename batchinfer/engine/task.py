"""A run's task, now batchinfer/tasks (one module per task on one protocol): the names
callers imported from here before, kept importable."""

from __future__ import annotations

from batchinfer.detect.class_names import (
    NAMES_COCO80,
    NAMES_DATASET,
    NAMES_FROM_FILE,
    NAMES_METADATA,
    NAMES_NONE,
)
from batchinfer.tasks import Task, plan_task
from batchinfer.tasks.boxes import (
    CONF_RANGE,
    IOU_RANGE,
    MAX_DET_RANGE,
    check_detect_options,
    pad_rgb,
)
from batchinfer.tasks.detect import OTHER_TASKS, NotADetectorError

#: The protocol's class under the name callers knew.
TaskPlan = Task

__all__ = [
    "CONF_RANGE",
    "IOU_RANGE",
    "MAX_DET_RANGE",
    "NAMES_COCO80",
    "NAMES_DATASET",
    "NAMES_FROM_FILE",
    "NAMES_METADATA",
    "NAMES_NONE",
    "OTHER_TASKS",
    "NotADetectorError",
    "TaskPlan",
    "check_detect_options",
    "pad_rgb",
    "plan_task",
]
