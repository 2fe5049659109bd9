"""``obb``: YOLOv8-OBB oriented boxes.

Heads (batchinfer/detect/obb.py): the model zoo's yolov8_obb (per stride (1, 64+C, H, W),
then the angle (1, 1, N)), taken from the shapes alone, and Ultralytics' export
((1, 4+C+1, N), the angle last), which looks like a detector with one more class: it is OBB
only when the model's metadata says ``task: obb`` or ``--task obb`` is given.

Rotated NMS is vectorised (detect/rotated_nms.py): ProbIoU as Ultralytics for its export,
exact polygon IoU as the model zoo for the zoo's layout, each head judged as its reference
does. Each element of ``boxes`` gains ``cx, cy, w, h, angle`` (radians, Ultralytics' xywhr,
angle in [0, pi/2)), in original pixels; ``x1..y2`` are the enclosing axis-aligned box
(clipped to the image), so readers of detection rows keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from batchinfer.tasks.base import ModelFacts
from batchinfer.tasks.boxes import BoxRows
from batchinfer.tasks.head_task import HeadTask, Parts, flat_extras

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox
    from batchinfer.detect.obb import ObbSettings, OrientedBoxes
    from batchinfer.options import DetectOptions

#: The rotated box's fields of one element of ``boxes``.
ROTATED_FIELDS = [pa.field(k, pa.float32()) for k in ("cx", "cy", "w", "h", "angle")]


@dataclass(frozen=True)
class Obb(HeadTask):
    """Oriented boxes (module docstring)."""

    name = "obb"
    scorer = "batchinfer.evaluate.scorers.rotated:RotatedScorer"
    exports = {  # noqa: RUF012 (a ClassVar)
        "coco": "batchinfer.export:export_coco",
        "dota": "batchinfer.export:export_dota",
    }

    @classmethod
    def find_head(cls, facts: ModelFacts, input_hw: tuple[int, int], asked: bool) -> Any:
        from batchinfer.detect.obb import recognise_obb

        said = "obb" if asked or facts.model_task == "obb" else None
        return recognise_obb(input_hw, facts.output_shapes, task=said)

    @classmethod
    def no_head(cls, facts: ModelFacts) -> str:
        return (
            f"The outputs {facts.shapes_text} are no oriented-box head batchinfer knows: it "
            "reads the model zoo's yolov8_obb (per stride 8/16/32 (1, 64+C, H, W), then the "
            "angle (1, 1, N)) and Ultralytics' (1, 4+C+1, N)."
        )

    @classmethod
    def make_settings(cls, opts: DetectOptions, head: Any) -> Any:
        from batchinfer.detect.obb import ObbSettings

        return ObbSettings(
            conf=float(opts.conf),
            iou=float(opts.iou),
            max_det=int(opts.max_det),
            nms="polygon" if head.family == "yolov8-obb-zoo" else "probiou",
            agnostic=bool(opts.agnostic_nms),
        )

    def make_decoder(self, quant: tuple[tuple[float, int] | None, ...]) -> Any:
        from batchinfer.detect.obb import ObbDecoder

        assert self.input_hw is not None
        # settings holds ObbSettings here (make_settings), not the DetectSettings BoxTask says
        return ObbDecoder(self.head, self.input_hw, cast("ObbSettings", self.settings), quant)

    def parts(self, found: OrientedBoxes, placed: Letterbox | None) -> Parts:
        assert self.input_hw is not None
        height, width = self.input_hw if placed is None else (placed.src_h, placed.src_w)
        return Parts(
            found.boxes, found.scores, found.class_ids, np.asarray(found.xywhr, np.float32),
            width, height, found.nonfinite,
        )  # fmt: skip

    def parts_said(self) -> str:
        return "rotated boxes (cx, cy, w, h, angle)"

    def box_fields(self) -> list[pa.Field]:
        return [*super().box_fields(), *ROTATED_FIELDS]

    def box_columns(self, flat: np.ndarray, payloads: Sequence[BoxRows | None]) -> list[pa.Array]:
        extras = flat_extras(payloads)
        xywhr = np.concatenate(extras) if extras else np.empty((0, 5), np.float32)
        rotated = [pa.array(np.ascontiguousarray(xywhr[:, i]), pa.float32()) for i in range(5)]
        return [*super().box_columns(flat, payloads), *rotated]
