"""``pose``: YOLOv8-pose, each box with its keypoints.

Heads (batchinfer/detect/pose.py): the model zoo's yolov8_pose (per stride (1, 64+C, H, W),
then the keypoints (1, K, 3, N)), taken from the shapes alone, and Ultralytics' export
((1, 4+C+K*D, N)), which has a detector's layout: it is pose only when the model's metadata
says so (``task: pose``, ``kpt_shape``) or ``--task pose`` is given (then COCO's 17 x 3
keypoints unless the metadata's ``kpt_shape`` says otherwise).

Each element of ``boxes`` gains ``keypoints: list<struct<x: float32, y: float32, score:
float32>>`` in the original image's pixels (score 1 when the model gives none, D = 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchinfer.tasks.base import ModelFacts
from batchinfer.tasks.boxes import BoxRows
from batchinfer.tasks.head_task import HeadTask, Parts, flat_extras

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox
    from batchinfer.detect.pose import Poses

#: One keypoint, in the original image's pixels.
KEYPOINT_TYPE = pa.struct(
    [pa.field("x", pa.float32()), pa.field("y", pa.float32()), pa.field("score", pa.float32())]
)


@dataclass(frozen=True)
class Pose(HeadTask):
    """Keypoints per box (module docstring)."""

    name = "pose"
    scorer = "batchinfer.evaluate.scorers.keypoints:KeypointsScorer"

    @classmethod
    def find_head(cls, facts: ModelFacts, input_hw: tuple[int, int], asked: bool) -> Any:
        from batchinfer.detect.pose import recognise_pose

        meta = facts.meta
        said = "pose" if asked or facts.model_task == "pose" else None
        kpt = None if meta is None else meta.kpt_shape
        return recognise_pose(input_hw, facts.output_shapes, task=said, kpt_shape=kpt)

    @classmethod
    def no_head(cls, facts: ModelFacts) -> str:
        return (
            f"The outputs {facts.shapes_text} are no pose head batchinfer knows: it reads the "
            "model zoo's yolov8_pose (per stride 8/16/32 (1, 64+C, H, W), then keypoints "
            "(1, K, 3, N)) and Ultralytics' (1, 4+C+K*3, N) (K from the metadata's kpt_shape, "
            "else 17)."
        )

    def make_decoder(self, quant: tuple[tuple[float, int] | None, ...]) -> Any:
        from batchinfer.detect.pose import PoseDecoder

        assert self.input_hw is not None
        return PoseDecoder(self.head, self.input_hw, self.settings, quant)

    def parts(self, found: Poses, placed: Letterbox | None) -> Parts:
        assert self.input_hw is not None
        height, width = self.input_hw if placed is None else (placed.src_h, placed.src_w)
        points = np.asarray(found.keypoints, np.float32).reshape(len(found), -1, 3)
        return Parts(
            found.boxes, found.scores, found.class_ids, points, width, height, found.nonfinite
        )

    def parts_said(self) -> str:
        return "keypoints"

    def box_fields(self) -> list[pa.Field]:
        return [*super().box_fields(), pa.field("keypoints", pa.list_(KEYPOINT_TYPE))]

    def box_columns(self, flat: np.ndarray, payloads: Sequence[BoxRows | None]) -> list[pa.Array]:
        extras = flat_extras(payloads)
        k = extras[0].shape[1] if extras else 0
        points = np.concatenate(extras) if extras else np.empty((0, 0, 3), np.float32)
        values = points.reshape(-1, 3)
        structs = pa.StructArray.from_arrays(
            [pa.array(np.ascontiguousarray(values[:, i]), pa.float32()) for i in range(3)],
            fields=list(KEYPOINT_TYPE),
        )
        offsets = pa.array(np.arange(len(flat) + 1, dtype=np.int32) * k)
        listed = pa.ListArray.from_arrays(offsets, structs, type=pa.list_(KEYPOINT_TYPE))
        return [*super().box_columns(flat, payloads), listed]
