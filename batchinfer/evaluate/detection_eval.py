"""One evaluation of a detection job (``task = "detect"``): evaluation.py's steps, with boxes.

    load_job ─► open the dataset, read the ground truth and match it to the items ─► plan
    device and reference (each must be a detector; the classes are mapped onto the ground
    truth's categories) ─► lock the job's folders ─► reference (cache or run) ─► device run
    ─► baseline ─► metrics (detection_metrics.py) ─► gates ─► evals/<id>/ record ─►
    history row ─► baseline (--update-baseline) ─► report and summary ─► unlock

Exit codes are evaluation.py's. Everything about the job file (the ground truth unreadable
or inconsistent, a model that is not a detector, classes that do not map onto the ground
truth's categories) is a JobError before anything runs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.data.dataset import Dataset
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.engine.events import Observer
from batchinfer.engine.runner import arrow_system_allocator
from batchinfer.engine.signals import StopSignals
from batchinfer.errors import RunFailedError, render_fields
from batchinfer.evaluate import baseline as baseline_files
from batchinfer.evaluate.baseline import accept_evaluation
from batchinfer.evaluate.detection_examples import detection_examples
from batchinfer.evaluate.detection_items import DetectionItems
from batchinfer.evaluate.detection_metrics import DetectInputs, detection_metrics
from batchinfer.evaluate.files import write_bytes, write_json, write_table
from batchinfer.evaluate.gates import check_gates
from batchinfer.evaluate.groundtruth import (
    GroundTruth,
    GroundTruthError,
    category_ids_for,
    read_coco,
    read_yolo,
)
from batchinfer.evaluate.history import append_history, record_history_row
from batchinfer.evaluate.job import Job
from batchinfer.evaluate.runs import SidePlan, SideRun, plan_side, reference_results, run_side
from batchinfer.evaluate.steps import (
    ITEMS,
    RECORD,
    Evaluation,
    check_cluster,
    custom_metrics,
    device_cluster,
    new_record_dir,
    no_report,
    now_utc,
    open_job_dataset,
    output_locks,
    score_metrics,
    side_facts,
    write_report,
)
from batchinfer.evaluate.video_truth import read_video_truth
from batchinfer.hostinfo import host_facts
from batchinfer.sink.rows import MemorySink

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
        if isinstance(dataset, VideoDataset):  # frames: COCO <video>#<frame> or MOT gt.txt
            task = plan.engine.task
            return read_video_truth(path, dataset, scored, task.names if task else ())
        if path.is_dir():
            task = plan.engine.task
            names = task.names if task is not None else ()
            if not names and task is not None and task.head is not None:
                # Unnamed classes are the head's: a YOLO class id beyond them is refused
                # with its line, not taken as a count (class 2000000000 asked for that
                # many categories).
                names = tuple(str(i) for i in range(task.head.num_classes))
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
    if task is None or not task.detects or task.head is None:  # plan_task raises first
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


# --------------------------------------------------------------------------- baseline
def read_detection_baseline(folder: Path) -> tuple[DetectionItems, dict[str, Any]] | None:
    """The accepted baseline's boxes and record, or None when none was accepted yet."""
    record_path = folder / baseline_files.RECORD
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        table = pq.read_table(folder / baseline_files.ITEMS)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise RunFailedError(
            f"the baseline in {folder} cannot be read ({exc}); restore it, or move the folder "
            "aside and accept a new baseline with --update-baseline."
        ) from None
    if "boxes" not in table.column_names:
        raise RunFailedError(
            f"the baseline in {folder} was accepted for a classification job, not a detection "
            "one; move the folder aside and accept a new baseline with --update-baseline."
        )
    return DetectionItems.from_table(table), record


# --------------------------------------------------------------------------- evaluate
def evaluate_detection(
    job: Job,
    *,
    update_baseline: bool = False,
    observers: Callable[[str], Sequence[Observer]] | None = None,
    command: str | None = None,
    clock: Callable[[], dt.datetime] | None = None,
) -> Evaluation:
    """Run the detection ``job`` once (see the module docstring)."""
    observers = observers or (lambda side: ())
    command = command or f"batchinfer eval {job.path}"
    clock = clock or now_utc
    registry = detection_metrics()
    custom = custom_metrics(job)
    with arrow_system_allocator(), StopSignals() as signals:
        dataset = open_job_dataset(job)
        device_plan = plan_side(job, "device", job.device, dataset)
        plans = [device_plan]
        reference_plan = None
        if job.reference is not None:
            reference_plan = plan_side(job, "reference", job.reference, dataset)
            plans.append(reference_plan)
        gt = read_ground_truth(job, dataset, device_plan)
        names = class_names(job, plans, gt)
        try:
            category_ids = category_ids_for(names, gt)
        except GroundTruthError as exc:
            raise job.error(f"dataset.ground_truth: {exc}", "dataset.ground_truth") from None
        _log_matching(gt)
        check_cluster(job)

        def collect(sink: MemorySink) -> DetectionItems:
            return DetectionItems.from_rows(sink.rows, names)

        with output_locks(job, command):
            reference = None
            if reference_plan is not None:
                reference = reference_results(
                    job, reference_plan, dataset, None, signals, observers, collect, DetectionItems
                )
            with device_cluster(job, device_plan, signals) as cluster:
                device = run_side(
                    job, device_plan, dataset, None, signals, observers("device"), cluster, collect
                )
                cluster_facts = None if cluster is None else cluster.facts(device_plan.engine.cores)
            baseline = read_detection_baseline(job.outputs.baseline)
            inputs = DetectInputs(
                device.items,
                gt,
                category_ids,
                reference.items if reference is not None else None,
                baseline[0] if baseline is not None else None,
                resamples=job.metrics.bootstrap,
                seed=job.metrics.seed,
                core_stats=device.core_stats,
            )
            metrics = score_metrics(job, inputs, registry, custom)
            baseline_metrics = dict(baseline[1].get("metrics") or {}) if baseline else None
            verdict = check_gates(
                job.gates, metrics, baseline_metrics, _worst_core(inputs), accepting=update_baseline
            )
            date = clock()
            eval_id, record_dir = new_record_dir(job, date)
            record = detection_record(
                job, eval_id, date, inputs, metrics, verdict, dataset, names, category_ids,
                (device_plan, device), (reference_plan, reference),
                baseline[1] if baseline else None, cluster_facts,
            )  # fmt: skip
            record["items_file"] = str(record_dir / ITEMS)
            items_table = detection_items_table(inputs)
            write_table(record_dir / ITEMS, items_table)
            write_json(record_dir / RECORD, record)
            history = append_history(
                job.outputs.history,
                record_history_row(record, record["dataset"]["evaluated"], None),
            )
            accepted = None
            if update_baseline:
                accepted = accept_evaluation(
                    job.outputs.baseline, items_table, record, job.folder, record_dir / RECORD
                )
            report = _write_report(job, record, history, record_dir)
            from batchinfer.evaluate.detection_summary import detection_summary

            summary = detection_summary(record, report)
            write_bytes(job.outputs.summary, summary.encode())
    return Evaluation(job, eval_id, verdict, metrics, record, record_dir, report, summary, accepted)


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


def _worst_core(inputs: DetectInputs) -> dict[str, str]:
    """Which core each per-core metric comes from, for the verdict."""
    notes = {}
    for metric, key, pick in (
        ("core_map_min", "map50_95", min),
        ("core_disagreement_max", "disagreement_mean", max),
    ):
        rows = [r for r in inputs.per_core if r[key] is not None]
        if len(rows) > 1:
            notes[metric] = f"worst core {pick(rows, key=lambda r: r[key])['place']}"
    return notes


# --------------------------------------------------------------------------- the record
def _none_if_nan(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def detection_record(
    job: Job,
    eval_id: str,
    date: dt.datetime,
    inputs: DetectInputs,
    metrics: dict[str, float],
    verdict: Any,
    dataset: Dataset,
    names: tuple[str, ...],
    category_ids: list[int],
    device: tuple[SidePlan, SideRun],
    reference: tuple[SidePlan | None, SideRun | None],
    baseline: dict[str, Any] | None,
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation's result.json (the classification record's keys where they apply)."""
    d = inputs.device
    device_facts = side_facts(*device)
    assert device_facts is not None
    device_facts["cluster"] = cluster
    device_facts["task"] = device[0].engine.task.to_json() if device[0].engine.task else None
    render = job.key_of("device")
    device_facts["warnings"] = [render_fields(w, render) for w in device_facts["warnings"]]
    reference_facts = side_facts(*reference)
    if reference_facts is not None and reference[0] is not None and reference[0].engine.task:
        reference_facts["task"] = reference[0].engine.task.to_json()
    error_rows = [
        {"id": d.id[i], "error": d.error[i], "core": int(d.core[i]), "node": d.node[i]}
        for i in np.flatnonzero(~d.ok)[:100]
    ]
    score = inputs.score
    ref_score = inputs.reference_score
    per_class = score.per_class()
    if ref_score is not None:
        for row, ref in zip(per_class, ref_score.per_class(), strict=True):
            row["reference_ap50_95"] = ref["ap50_95"]
            row["reference_ap50"] = ref["ap50"]
    bootstrap_ref = inputs.vs_reference
    bootstrap_base = inputs.vs_baseline
    return {
        "eval_id": eval_id,
        "date": date.astimezone(dt.timezone.utc).isoformat(),
        "task": "detect",
        "job": job.name,
        "job_file": str(job.path),
        "job_sha256": job.sha256,
        "verdict": verdict.word,
        "gates": verdict.records(),
        "metrics": metrics,
        "model": device_facts["model"],
        "model_sha256": device_facts["model_sha256"],
        "device": device_facts,
        "reference": reference_facts,
        "dataset": {
            "path": str(dataset.root),
            "items": len(dataset),
            "evaluated": len(d),
            "labelled": len(inputs.gt.images),  # images with ground truth: the scored ones
            "listing_sha256": dataset.listing_sha256,
            "limit": job.dataset.limit,
        },
        "ground_truth": inputs.gt.summary(),
        "classes": list(names),
        "category_ids": list(category_ids),
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
        "worst": detection_examples(inputs, dataset, job.metrics.worst, job.metrics.display_conf),
        "display_conf": job.metrics.display_conf,
        "errors": error_rows,
        "vs_reference": None
        if bootstrap_ref is None
        else {k: v.to_json() for k, v in bootstrap_ref.items()},
        "vs_baseline": None
        if bootstrap_base is None
        else {
            "compared": len(inputs.compared_with_baseline),
            **{k: v.to_json() for k, v in bootstrap_base.items()},
        },
        "flipped": None,
        "baseline": None
        if baseline is None
        else {
            k: baseline.get(k)
            for k in ("eval_id", "accepted_by", "accepted_at", "model_sha256", "git_commit")
        },
        "gate_limits": [{k: v for k, v in vars(g).items() if v is not None} for g in job.gates],
        "host": host_facts(),
    }


def detection_items_table(inputs: DetectInputs) -> pa.Table:
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


def _write_report(
    job: Job, record: dict[str, Any], history: pa.Table, record_dir: Path
) -> Path | None:
    """The HTML report (in the record folder and at the job's report path), if matplotlib is."""
    try:
        from batchinfer.evaluate.detection_report import detection_html
    except ImportError as exc:
        no_report(exc)
        return None
    from batchinfer.evaluate.history import job_history

    page = detection_html(record, job_history(history, job.name))
    return write_report(job, record_dir, page)


__all__ = [
    "class_names",
    "detection_items_table",
    "detection_record",
    "evaluate_detection",
    "read_detection_baseline",
    "read_ground_truth",
]
