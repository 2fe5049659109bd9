"""The segment task's scorer: COCO ``segm`` mAP of the masks beside the boxes' ``bbox`` mAP
(scorers/instance_parts.py has the shared steps; the ground truth is a COCO instances
file whose annotations have ``segmentation``, as the demo kit's instances-seg.json).
Metrics: the detection ones and ``segm_map50_95``, ``segm_map50``, ``segm_map75``,
``segm_map_drop``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from batchinfer.evaluate.scorers.instance_parts import PartDicts, PartItems, PartsScorer
from batchinfer.sink.rows import Row
from batchinfer.tasks.segment import MASK_TYPE


class MaskItems(PartItems):
    """Per-item boxes with their masks (COCO compressed RLE in the original pixels)."""

    PART_FIELDS: ClassVar[list[pa.Field]] = [pa.field("mask", MASK_TYPE)]

    @staticmethod
    def part_dicts(row: Row) -> PartDicts:
        payload = row.payload
        if payload is None or payload.extra is None:
            return []
        h, w = int(payload.height), int(payload.width)
        return [{"mask": {"counts": c, "height": h, "width": w}} for c in payload.extra]


class SegmScorer(PartsScorer):
    """COCO segm beside bbox (module docstring)."""

    task = "segment"
    iou_type = "segm"
    prefix = "segm"
    what = "masks"
    items_type = MaskItems

    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str:
        return " (instance segmentation)"
