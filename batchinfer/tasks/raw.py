"""``raw``: the outputs stored in the rows (``out_<name>`` columns, as ``--save-outputs``).

Taken by ``auto`` for any model no other task recognises (so auto always ends with a
task); the reason says why the others did not fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchinfer.messages import Message, setting
from batchinfer.tasks.base import ModelFacts, Task

if TYPE_CHECKING:
    from batchinfer.options import DetectOptions

#: Ultralytics' tasks (metadata ``task``) as people say them, for the reason's wording.
_SAID = {
    "pose": "pose (keypoint) model",
    "segment": "segmentation model",
    "obb": "oriented-box model",
    "classify": "classifier",
    "detect": "detector",
}


@dataclass(frozen=True)
class Raw(Task):
    """The outputs kept as they are (module docstring)."""

    name = "raw"
    keeps_outputs = True
    decodes_in_worker = False

    @classmethod
    def recognise(cls, facts: ModelFacts, options: DetectOptions, asked: bool) -> Raw | None:
        if asked:
            reason = "asked for"
        elif facts.model_task in _SAID and facts.model_task != "detect":
            reason = (
                f"the model's metadata says task: {facts.model_task} (an Ultralytics "
                f"{_SAID[facts.model_task]}), which batchinfer does not decode; its outputs "
                f"{facts.shapes_text} are stored in the rows"
            )
        else:
            reason = (
                f"outputs {facts.shapes_text} are neither one score vector nor a known "
                "detection head; they are stored in the rows"
            )
        return cls(reason=reason, output_shapes=facts.output_shapes, model_task=facts.model_task)

    def said(self) -> Message:
        if self.reason == "asked for":
            return super().said()
        why = Message(self.reason) + "; " + setting("detect.task") + " classify or detect overrides"
        return "task: " + Message(self.name, " (", why, ")")
