"""The instances scorer (``task = "detect"``): COCO-style scores of per-item instances
against the ground truth (evaluate/scoring.py has the protocol).

The ground truth (a COCO instances file or YOLO labels) is read and matched to the items
before anything runs; each side must be a detector, and its classes are mapped onto the
ground truth's categories. Everything about the job file (the ground truth unreadable or
inconsistent, a model that is not a detector, classes that do not map onto the ground
truth's categories) is a JobError before anything runs.

Scores are COCO's ``bbox`` (scorers/coco.py, faster-coco-eval); the paired image
bootstrap compares with the reference and the baseline (scorers/coco_bootstrap.py). A task
scored with another COCO ``iouType`` (``segm``, ``keypoints``) subclasses
:class:`InstancesScorer` in a module of its own: its items (the masks or keypoints in the
COCO results, :func:`~.instances_items.coco_predictions`), its ``iou_type`` and its
drawings; the steps here serve it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import pyarrow as pa

from batchinfer.data.dataset import Dataset
from batchinfer.data.shard_names import is_shard_spec
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.evaluate.baseline import Baseline, read_baseline, unreadable
from batchinfer.evaluate.groundtruth import (
    GroundTruth,
    GroundTruthError,
    category_ids_for,
    read_coco,
    read_yolo,
)
from batchinfer.evaluate.jobspec import Job
from batchinfer.evaluate.metrics import Metric, worst_cores
from batchinfer.evaluate.runs import SidePlan, SideRun
from batchinfer.evaluate.scorers import instances_summary
from batchinfer.evaluate.scorers.instances_examples import PANEL_SIDE, detection_examples
from batchinfer.evaluate.scorers.instances_items import DetectionItems
from batchinfer.evaluate.scorers.instances_metrics import DetectInputs, detection_metrics
from batchinfer.evaluate.thumbnails import PANEL_FIT, Source, picture_source
from batchinfer.evaluate.video_truth import read_video_truth
from batchinfer.sink.rows import MemorySink

if TYPE_CHECKING:
    from batchinfer.detect.heads import Head


@runtime_checkable
class _Detector(Protocol):
    """What this scorer reads of a task whose rows hold boxes (``Task.detects``): its
    class names (tasks.boxes.BoxTask) and its detection head (tasks.detect.Detect)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def head(self) -> Head | None: ...


log = logging.getLogger("batchinfer")


# --------------------------------------------------------------------------- ground truth
def read_ground_truth(job: Job, dataset: Dataset, plan: SidePlan) -> GroundTruth:
    """The job's ground truth matched to the items evaluated (JobError when it is wrong)."""
    path = job.dataset.ground_truth
    assert path is not None  # load_job checked it
    items = list(dataset)
    ids = [i.id for i in items]
    # Matched against every item (an entry for an image past dataset.limit is not
    # "unknown"), scored on the items evaluated.
    scored = None if job.dataset.limit is None else set(ids[: job.dataset.limit])
    try:
        task = plan.engine.task
        detector = task if isinstance(task, _Detector) else None
        if isinstance(dataset, VideoDataset):  # frames: COCO <video>#<frame> or MOT gt.txt
            return read_video_truth(
                path, dataset, scored, detector.names if detector is not None else ()
            )
        if path.is_dir():
            names = detector.names if detector is not None else ()
            if not names and detector is not None and detector.head is not None:
                # Unnamed classes are the head's: a YOLO class id beyond them is refused
                # with its line, not taken as a count (class 2000000000 asked for that
                # many categories).
                names = tuple(str(i) for i in range(detector.head.num_classes))
            return read_yolo(
                path,
                ids,
                {i.id: i.path for i in items},
                names or None,
                exif_orientation=plan.engine.preprocess.exif_orientation,
                missing_is_empty=job.dataset.images_without_labels == "empty",
                scored=scored,
            )
        return read_coco(path, ids, scored)
    except GroundTruthError as exc:
        raise job.error(f"dataset.ground_truth: {exc}", "dataset.ground_truth") from None


def _detector_plan(job: Job, plan: SidePlan) -> tuple[int, tuple[str, ...]]:
    """(classes, class names) of a side's detection head (the plan asked for detection)."""
    task = plan.engine.task
    if not isinstance(task, _Detector) or not task.detects or task.head is None:
        # (plan_task refused a model that is not a detector before this)
        raise job.error(f"{plan.side}.model {plan.model.name} is not a detector.", "model")
    return task.head.num_classes, task.names


def class_names(job: Job, plans: Sequence[SidePlan], gt: GroundTruth) -> tuple[str, ...]:
    """The detector's class names (its labels, else the ground truth's when the counts
    agree, else numbers); both sides must have the same number of classes."""
    (n, names), *others = [_detector_plan(job, p) for p in plans]
    for (m, _), plan in zip(others, plans[1:], strict=True):
        if m != n:
            raise job.error(
                f"{plan.side}.model has {m} classes and device.model {n}; the reference must "
                "detect the same classes.",
                "reference.model",
            )
    if names:
        return tuple(names)
    if len(gt.categories) == n:
        return tuple(c.name for c in sorted(gt.categories, key=lambda c: c.id))
    return tuple(str(i) for i in range(n))


def _log_matching(gt: GroundTruth) -> None:
    what = [f"ground truth: {len(gt.images)} images, {len(gt.annotations)} boxes"]
    if gt.unmatched_items:
        what.append(
            f"{len(gt.unmatched_items)} dataset images have no entry (not scored; first: "
            f"{gt.unmatched_items[0]})"
        )
    if gt.unknown_images:
        what.append(
            f"{len(gt.unknown_images)} ground-truth images are not in the dataset (first: "
            f"{gt.unknown_images[0]})"
        )
    log.info("; ".join(what))


# --------------------------------------------------------------------------- the record
def _bootstraps(inputs: DetectInputs) -> dict[str, Any]:
    ref, base = inputs.vs_reference, inputs.vs_baseline
    return {
        "vs_reference": None if ref is None else {k: v.to_json() for k, v in ref.items()},
        "vs_baseline": None
        if base is None
        else {
            "compared": len(inputs.compared_with_baseline),
            **{k: v.to_json() for k, v in base.items()},
        },
    }


def instances_table(inputs: DetectInputs) -> pa.Table:
    """Per-item results (boxes, core, error; against the reference its box count and the
    disagreement): what a baseline keeps."""
    table = inputs.device.to_table()
    scored = [i in inputs.gt.image_ids for i in inputs.device.id.tolist()]
    table = table.append_column("scored", pa.array(scored))
    if inputs.reference is not None:
        counts = inputs.reference.n_boxes
        table = table.append_column(
            "ref_n_boxes", pa.array([None if c < 0 else int(c) for c in counts], pa.int32())
        )
        table = table.append_column("disagreement", pa.array(inputs.disagreement, from_pandas=True))
    return table


# --------------------------------------------------------------------------- the scorer
class InstancesScorer:
    """The detection side of an evaluation (evaluate/scoring.py's protocol)."""

    task = "detect"
    picture_side = PANEL_SIDE
    picture_fit = PANEL_FIT
    report = "batchinfer.evaluate.scorers.instances_report"
    #: What its metrics see (a scorer of a part beside the boxes extends it).
    inputs_type: ClassVar[type[DetectInputs]] = DetectInputs
    significance_test = (
        "gates.map50_95 or gates.map50 with max_drop (the paired image bootstrap of mAP)"
    )

    def __init__(self, job: Job) -> None:
        self.job = job
        self.gt: GroundTruth | None = None
        self.names: tuple[str, ...] = ()
        self.category_ids: list[int] = []

    # ------------------------------------------------------------------ the job
    def check_job(self) -> None:
        """A detection job has ground truth and detectors (and faster-coco-eval to score)."""
        job = self.job
        ds, key = job.dataset, "dataset.ground_truth"
        if ds.path is not None and is_shard_spec(ds.path):
            raise job.error(
                "dataset.path names tar shards, which detection jobs do not read yet (their "
                "ground truth names image files); extract them into a folder.",
                "dataset.path",
            )
        if ds.ground_truth is None:
            raise job.error(
                f"{key} is missing; a detection job needs the boxes: a COCO instances .json "
                "file or a folder of YOLO .txt labels.",
                key,
            )
        if not ds.ground_truth.exists():
            raise job.missing(key, ds.ground_truth, "a COCO .json file or a YOLO labels folder")
        from batchinfer.evaluate.scorers.coco import require_scoring

        require_scoring()
        sides = [("device", job.device)] + ([("reference", job.reference)] if job.reference else [])
        for side, settings in sides:
            if settings.detect.task not in ("auto", self.task):
                raise job.error(
                    f'{side}.detect.task is "{settings.detect.task}" in a {self.task} job; '
                    f'drop it (the task is the job\'s: task = "{self.task}").',
                    f"{side}.detect.task",
                )

    def metrics(self) -> dict[str, Metric]:
        return detection_metrics()

    # ------------------------------------------------------------------ the runs
    def prepare(self, dataset: Dataset, plans: list[SidePlan]) -> None:
        job = self.job
        self.gt = read_ground_truth(job, dataset, plans[0])
        self.names = class_names(job, plans, self.gt)
        try:
            self.category_ids = category_ids_for(self.names, self.gt)
        except GroundTruthError as exc:
            raise job.error(f"dataset.ground_truth: {exc}", "dataset.ground_truth") from None

    def announce(self, dataset: Dataset) -> None:
        assert self.gt is not None
        _log_matching(self.gt)

    def collect(self, sink: MemorySink) -> DetectionItems:
        return DetectionItems.from_rows(sink.rows, self.names)

    def read_items(self, table: pa.Table) -> DetectionItems:
        return DetectionItems.from_table(table)

    def read_baseline(self) -> Baseline | None:
        folder = self.job.outputs.baseline

        def read(table: pa.Table, record: dict[str, Any]) -> DetectionItems:
            if "boxes" not in table.column_names:
                raise unreadable(
                    folder, "was accepted for a classification job, not a detection one"
                )
            return DetectionItems.from_table(table)

        return read_baseline(folder, read)

    def inputs(
        self, device: SideRun, reference: SideRun | None, baseline: Baseline | None
    ) -> DetectInputs:
        assert self.gt is not None
        return self.inputs_type(
            device.items,
            self.gt,
            self.category_ids,
            reference.items if reference is not None else None,
            baseline.items if baseline is not None else None,
            resamples=self.job.metrics.bootstrap,
            seed=self.job.metrics.seed,
            core_stats=device.core_stats,
        )

    def worst_notes(self, inputs: DetectInputs) -> dict[str, str]:
        """Which core each per-core metric comes from, for the verdict."""
        return worst_cores(
            inputs,
            (
                ("core_map_min", "map50_95", min),
                ("core_disagreement_max", "disagreement_mean", max),
            ),
        )

    # ------------------------------------------------------------------ the record
    def side_facts(self, plan: SidePlan) -> dict[str, Any]:
        task = plan.engine.task
        return {"task": task.to_json() if task else None}

    def labelled(self, inputs: DetectInputs) -> int:
        return len(inputs.gt.images)  # images with ground truth: the scored ones

    def record_section(self, inputs: DetectInputs, dataset: Dataset) -> dict[str, Any]:
        score, ref_score = inputs.score, inputs.reference_score
        per_class = score.per_class()
        if ref_score is not None:
            for row, ref in zip(per_class, ref_score.per_class(), strict=True):
                row["reference_ap50_95"] = ref["ap50_95"]
                row["reference_ap50"] = ref["ap50"]
        metrics = self.job.metrics
        return {
            "ground_truth": inputs.gt.summary(),
            "classes": list(self.names),
            "category_ids": list(self.category_ids),
            "class_map": {
                "source": f"{inputs.gt.source['format']} ground truth",
                "path": inputs.gt.source.get("path"),
            },
            "per_class": per_class,
            "pr_curves": {
                "device": score.pr_curves(0.5),
                "reference": ref_score.pr_curves(0.5) if ref_score is not None else None,
            },
            "per_core": inputs.per_core,
            "worst": detection_examples(inputs, dataset, metrics.worst, metrics.display_conf),
            "display_conf": metrics.display_conf,
            **_bootstraps(inputs),
            "flipped": None,
        }

    def items_table(self, inputs: DetectInputs) -> pa.Table:
        return instances_table(inputs)

    # ------------------------------------------------------------------ the outputs
    @staticmethod
    def class_history(record: Mapping[str, Any]) -> list[float | None] | None:
        return None

    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str:
        return " (detection)"

    @staticmethod
    def summary_items(record: Mapping[str, Any]) -> str:
        return instances_summary.items_phrase(record)

    @staticmethod
    def summary_intro(record: Mapping[str, Any]) -> list[str]:
        return instances_summary.intro(record)

    @staticmethod
    def summary_metrics() -> tuple[str, ...]:
        return instances_summary.KEY_METRICS

    @staticmethod
    def summary_body(record: Mapping[str, Any]) -> list[str]:
        return instances_summary.body(record)

    @staticmethod
    def summary_warnings(record: Mapping[str, Any]) -> list[str]:
        return []

    @staticmethod
    def report_items(record: Mapping[str, Any]) -> str:
        dataset = record["dataset"]
        return f"{dataset['evaluated']} items, {dataset['labelled']} scored"

    @staticmethod
    def report_trend() -> tuple[str, ...]:
        return ()

    @staticmethod
    def report_css() -> str:
        from batchinfer.evaluate.scorers.instances_report import GALLERY_CSS

        return GALLERY_CSS

    @staticmethod
    def shown_items(record: Mapping[str, Any]) -> list[Source]:
        # Every image and frame: the gallery draws its boxes on these (instances_report.py).
        return [picture_source(i) for i in record["worst"]]


__all__ = ["InstancesScorer", "class_names", "instances_table", "read_ground_truth"]
