"""``segment``: YOLO instance segmentation, each box with its mask as COCO compressed RLE.

Heads (batchinfer/detect/seg_heads.py): the model zoo's yolov8_seg (13 outputs) and
yolov5_seg (7 outputs), and Ultralytics' export ((1, 4+C+32, N) and the prototype). No
detection head has 2, 7 or 13 outputs of those shapes, so ``auto`` takes them as
segmentation from the shapes alone; an Ultralytics export whose metadata names another task
is never taken. The core worker decodes (detect/seg_decode.py): masks are computed only
inside each kept box, at the prototype's resolution, then mapped to the original image.

Each element of ``boxes`` gains ``mask: struct<counts: string, height: int32, width:
int32>``: the instance's COCO compressed RLE in the original image's pixels, decodable by
``pycocotools.mask.decode({"size": [height, width], "counts": counts})``. No dense mask is
ever stored.
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
    from batchinfer.detect.seg_decode import SegmentDetections

#: One box's mask: COCO compressed RLE of the original image.
MASK_TYPE = pa.struct(
    [
        pa.field("counts", pa.string()),
        pa.field("height", pa.int32()),
        pa.field("width", pa.int32()),
    ]
)


@dataclass(frozen=True)
class Segment(HeadTask):
    """Instance segmentation (module docstring)."""

    name = "segment"
    scorer = "batchinfer.evaluate.scorers.segm:SegmScorer"

    @classmethod
    def find_head(cls, facts: ModelFacts, input_hw: tuple[int, int], asked: bool) -> Any:
        from batchinfer.detect.seg_heads import recognise_segment

        return recognise_segment(input_hw, facts.output_shapes)

    @classmethod
    def no_head(cls, facts: ModelFacts) -> str:
        from batchinfer.detect.seg_heads import explain_no_seg_head

        assert facts.input_hw is not None
        return explain_no_seg_head(facts.input_hw, facts.output_shapes)

    def make_decoder(self, quant: tuple[tuple[float, int] | None, ...]) -> Any:
        from batchinfer.detect.seg_decode import SegmentDecoder

        assert self.input_hw is not None
        return SegmentDecoder(self.head, self.input_hw, self.settings, quant)

    def parts(self, found: SegmentDetections, placed: Letterbox | None) -> Parts:
        return Parts(
            found.boxes, found.scores, found.class_ids, list(found.masks),
            found.width, found.height, found.nonfinite,
        )  # fmt: skip

    def parts_said(self) -> str:
        return "masks (COCO RLE)"

    def box_fields(self) -> list[pa.Field]:
        return [*super().box_fields(), pa.field("mask", MASK_TYPE)]

    def box_columns(self, flat: np.ndarray, payloads: Sequence[BoxRows | None]) -> list[pa.Array]:
        counts = [c for masks in flat_extras(payloads) for c in masks]
        sizes = [(p.height, p.width) for p in payloads if p is not None and len(p.rows)]
        lengths = [len(p.rows) for p in payloads if p is not None and len(p.rows)]
        hw = np.repeat(np.array(sizes, np.int32).reshape(-1, 2), lengths, axis=0)
        mask = pa.StructArray.from_arrays(
            [pa.array(counts, pa.string()), pa.array(hw[:, 0]), pa.array(hw[:, 1])],
            fields=list(MASK_TYPE),
        )
        return [*super().box_columns(flat, payloads), mask]
