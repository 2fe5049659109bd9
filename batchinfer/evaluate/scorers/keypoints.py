"""The pose task's scorer: COCO ``keypoints`` mAP (OKS) beside the boxes' ``bbox`` mAP
(scorers/instance_parts.py has the shared steps; the ground truth is a COCO file whose
annotations have ``keypoints`` and ``num_keypoints``, as the demo kit's
instances-pose.json). OKS uses COCO's 17 person sigmas unless the job's
``metrics.keypoint_sigmas`` gives one per keypoint (a model with another count needs it).
Metrics: the detection ones and ``kpt_map50_95``, ``kpt_map50``, ``kpt_map75``,
``kpt_map_drop``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from batchinfer.data.dataset import Dataset
from batchinfer.detect.pose import COCO_PERSON_SIGMAS
from batchinfer.evaluate.runs import SidePlan
from batchinfer.evaluate.scorers.instance_parts import PartDicts, PartItems, PartsScorer
from batchinfer.sink.rows import Row
from batchinfer.tasks.pose import KEYPOINT_TYPE

_NAMES = ("x", "y", "score")


class KeypointItems(PartItems):
    """Per-item boxes with their keypoints (original pixels)."""

    PART_FIELDS: ClassVar[list[pa.Field]] = [pa.field("keypoints", pa.list_(KEYPOINT_TYPE))]

    @staticmethod
    def part_dicts(row: Row) -> PartDicts:
        payload = row.payload
        if payload is None or payload.extra is None:
            return []
        return [
            {"keypoints": [dict(zip(_NAMES, p, strict=True)) for p in box.tolist()]}
            for box in payload.extra
        ]


class KeypointsScorer(PartsScorer):
    """COCO keypoints (OKS) beside bbox (module docstring)."""

    task = "pose"
    iou_type = "keypoints"
    prefix = "kpt"
    what = "keypoints (OKS)"
    items_type = KeypointItems

    def sigmas(self) -> Sequence[float] | None:
        given = self.job.metrics.keypoint_sigmas
        return None if given is None else tuple(given)

    def prepare(self, dataset: Dataset, plans: list[SidePlan]) -> None:
        """The instances scorer's, and each side's keypoint count against the sigmas."""
        super().prepare(dataset, plans)
        sigmas = self.sigmas() or COCO_PERSON_SIGMAS
        for plan in plans:
            task = plan.engine.task
            count = getattr(getattr(task, "head", None), "num_keypoints", len(sigmas))
            if count != len(sigmas):
                said = "gives" if self.sigmas() else "is unset: COCO's person sigmas are"
                raise self.job.error(
                    f"{plan.side}.model has {count} keypoints, but metrics.keypoint_sigmas "
                    f"{said} {len(sigmas)}; give one OKS sigma per keypoint.",
                    "metrics.keypoint_sigmas",
                )

    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str:
        return " (pose)"
