"""What the segm and keypoints scorers share: instances whose boxes carry a part (a mask, the
keypoints), scored by COCO's ``segm`` or ``keypoints`` evaluation beside ``bbox``.

Everything else is the instances scorer's (scorers/instances.py): the ground truth's
reading and matching (a COCO instances file whose annotations have the parts), the bbox
mAP and its bootstrap, per class, per core, the reference and the baseline. A subclass
(one module per task: scorers/segm.py, scorers/keypoints.py) names its task, its COCO
``iouType``, its metric prefix, and how a row's payload becomes its boxes' part dicts.

Metrics it adds (``PREFIX`` is ``segm`` or ``kpt``): ``PREFIX_map50_95``, ``PREFIX_map50``,
``PREFIX_map75`` (the reference gets its own, ``reference.PREFIX_map50_95``, ...), and
``PREFIX_map_drop`` (the float reference's minus the device's mAP50:95).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from batchinfer.evaluate.baseline import Baseline, read_baseline, unreadable
from batchinfer.evaluate.metrics import Metric
from batchinfer.evaluate.runs import SideRun
from batchinfer.evaluate.scorers.coco import DetectionScore, score_detections
from batchinfer.evaluate.scorers.instances import InstancesScorer
from batchinfer.evaluate.scorers.instances_items import BOX_TYPE, DetectionItems
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs, detection_metrics
from batchinfer.sink.rows import MemorySink, Row

PartDicts = list[dict[str, Any]]


@dataclasses.dataclass
class PartItems(DetectionItems):
    """:class:`DetectionItems` whose boxes carry parts: ``parts[i][j]`` is the dict of item
    i's box j's extra fields (``{"mask": {...}}``), None for an error row."""

    parts: list[PartDicts | None] = dataclasses.field(default_factory=list)

    #: The extra fields of one box (a subclass's), as the predictions' ``boxes`` have them.
    PART_FIELDS: ClassVar[list[pa.Field]] = []

    @staticmethod
    def part_dicts(row: Row) -> PartDicts:
        """One successful row's parts, box by box (a subclass's)."""
        raise NotImplementedError

    @classmethod
    def from_rows(cls, rows: Sequence[Row], names: Sequence[str] = ()) -> PartItems:
        items = super().from_rows(rows, names)
        assert isinstance(items, PartItems)
        ordered = sorted(rows, key=lambda r: r.index)
        items.parts = [None if r.error is not None else cls.part_dicts(r) for r in ordered]
        return items

    def box_dicts(self, i: int) -> list[dict[str, Any]] | None:
        boxes = super().box_dicts(i)
        parts = self.parts[i] if i < len(self.parts) else None
        if boxes is None or parts is None:
            return boxes
        return [{**b, **p} for b, p in zip(boxes, parts, strict=True)]

    def to_table(self, with_outputs: bool = True) -> pa.Table:
        table = super().to_table(with_outputs)
        box_type = pa.struct([*BOX_TYPE, *self.PART_FIELDS])
        rows = [self.box_dicts(i) for i in range(len(self))]
        at = table.column_names.index("boxes")
        return table.set_column(at, "boxes", pa.array(rows, pa.list_(box_type)))

    @classmethod
    def from_table(cls, table: pa.Table) -> PartItems:
        items = super().from_table(table)
        assert isinstance(items, PartItems)
        keys = [f.name for f in cls.PART_FIELDS]
        items.parts = [
            None if boxes is None else [{k: b.get(k) for k in keys} for b in boxes]
            for boxes in table.column("boxes").to_pylist()
        ]
        return items


class PartInputs(DetectInputs):
    """:class:`DetectInputs` plus the COCO score of the parts (``iou_type``)."""

    iou_type = "bbox"
    sigmas: Sequence[float] | None = None

    def with_parts(self, iou_type: str, sigmas: Sequence[float] | None) -> PartInputs:
        self.iou_type, self.sigmas = iou_type, sigmas
        return self

    def for_reference(self) -> DetectInputs:
        assert self.reference is not None
        out = PartInputs(self.reference, self.gt, self.category_ids)
        return out.with_parts(self.iou_type, self.sigmas)

    @cached_property
    def part_score(self) -> DetectionScore:
        return score_detections(self.gt, self.results, iou_type=self.iou_type, sigmas=self.sigmas)

    @cached_property
    def reference_part_score(self) -> DetectionScore | None:
        results = self.reference_results
        if results is None:
            return None
        return score_detections(self.gt, results, iou_type=self.iou_type, sigmas=self.sigmas)


def part_metrics(prefix: str, what: str) -> dict[str, Metric]:
    """The detection metrics and the parts' (module docstring); ``what``: "mask" ..."""

    def drop(x: PartInputs) -> float | None:
        ref = x.reference_part_score
        if ref is None or ref.map50_95 is None or x.part_score.map50_95 is None:
            return None
        return ref.map50_95 - x.part_score.map50_95

    metrics = [
        Metric(f"{prefix}_map50_95", lambda x: x.part_score.map50_95, "",
               f"COCO {what} mAP averaged over 0.50:0.95.", comparable=True),
        Metric(f"{prefix}_map50", lambda x: x.part_score.map50, "",
               f"COCO {what} mAP at 0.50.", comparable=True),
        Metric(f"{prefix}_map75", lambda x: x.part_score.map75, "",
               f"COCO {what} mAP at 0.75.", comparable=True),
        Metric(f"{prefix}_map_drop", drop, "reference",
               f"The float reference's {what} mAP50:95 minus the device's.", better="lower"),
    ]  # fmt: skip
    return {**detection_metrics(), **{m.name: m for m in metrics}}


class PartsScorer(InstancesScorer):
    """The instances scorer with a part scored beside the boxes (module docstring)."""

    iou_type: ClassVar[str] = "bbox"
    prefix: ClassVar[str] = ""
    what: ClassVar[str] = ""  # the part as the record and summary say it
    items_type: ClassVar[type[PartItems]] = PartItems
    inputs_type: ClassVar[type[DetectInputs]] = PartInputs

    def sigmas(self) -> Sequence[float] | None:
        return None

    def label(self) -> str:
        """How the summary names the parts' score."""
        return f"COCO {self.iou_type}"

    def check_job(self) -> None:
        super().check_job()
        path = self.job.dataset.ground_truth
        if path is not None and path.is_dir():
            raise self.job.error(
                f"dataset.ground_truth is a folder of YOLO labels; a {self.task} job reads "
                f"its {self.what} from a COCO instances .json file.",
                "dataset.ground_truth",
            )

    def metrics(self) -> dict[str, Metric]:
        return part_metrics(self.prefix, self.what)

    def collect(self, sink: MemorySink) -> PartItems:
        return self.items_type.from_rows(sink.rows, self.names)

    def read_items(self, table: pa.Table) -> PartItems:
        return self.items_type.from_table(table)

    def read_baseline(self) -> Baseline | None:
        folder = self.job.outputs.baseline
        keys = {f.name for f in self.items_type.PART_FIELDS}

        def read(table: pa.Table, record: dict[str, Any]) -> PartItems:
            boxes = table.schema.field("boxes").type if "boxes" in table.column_names else None
            fields = set() if boxes is None else {f.name for f in boxes.value_type}
            if not keys <= fields:
                raise unreadable(folder, f"was accepted for another job, not a {self.task} one")
            return self.items_type.from_table(table)

        return read_baseline(folder, read)

    def inputs(
        self, device: SideRun, reference: SideRun | None, baseline: Baseline | None
    ) -> PartInputs:
        out = super().inputs(device, reference, baseline)
        assert isinstance(out, PartInputs)
        return out.with_parts(self.iou_type, self.sigmas())

    def record_section(self, inputs: DetectInputs, dataset: Any) -> dict[str, Any]:
        assert isinstance(inputs, PartInputs)
        out = super().record_section(inputs, dataset)
        _with_parts(out["worst"], inputs, self.job.metrics.display_conf)
        ref = inputs.reference_part_score
        out["parts"] = {
            "iou_type": self.iou_type,
            "label": self.label(),
            "what": self.what,
            "device": inputs.part_score.metrics(),
            "reference": None if ref is None else ref.metrics(),
            "sigmas": None if self.sigmas() is None else list(self.sigmas() or ()),
        }
        return out

    @staticmethod
    def summary_body(record: Mapping[str, Any]) -> list[str]:
        return [*InstancesScorer.summary_body(record), *parts_lines(record)]


def _with_parts(worst: list[dict[str, Any]], inputs: PartInputs, conf: float) -> None:
    """The report's examples drawn with their masks or keypoints: each example's device
    and reference boxes (those from ``conf`` up, in the same order) with their parts."""
    sides = (("device_boxes", inputs.device), ("reference_boxes", inputs.reference))
    for example in worst:
        for key, items in sides:
            if items is None or example.get(key) is None:
                continue
            i = int(np.flatnonzero(items.index == example["index"])[0])
            boxes = items.box_dicts(i) or []
            example[key] = [b for b in boxes if b["score"] >= conf]


def parts_lines(record: Mapping[str, Any]) -> list[str]:
    """The summary's line of the parts' scores (bbox scores are the instances scorer's)."""
    parts = record.get("parts") or {}
    if not parts:
        return []

    def said(scores: Mapping[str, Any] | None) -> str:
        if not scores:
            return "none"
        return ", ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} -" for k, v in scores.items()
        )

    label = parts.get("label") or f"COCO {parts['iou_type']}"
    line = f"{label} ({parts['what']}): {said(parts['device'])}"
    if parts.get("reference"):
        line += f"; reference: {said(parts['reference'])}"
    return ["", line]
