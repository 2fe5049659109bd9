"""One evaluation of a job, for every task: plan both sides, run them, score, gate, record, report.

    load_job ─► open the dataset ─► plan device and reference ─► the scorer prepares (the
    class map, or the ground truth matched to the items) ─► check that the report and
    summary paths hold only eval's files (exit 2 on any problem, nothing has run) ─► lock
    the job's output folders ─► reference (cache or run) ─► device run ─► baseline
    ─► metrics ─► gates ─► evals/<id>/ record ─► history row ─► baseline
    (--update-baseline) ─► report and summary ─► unlock

What depends on the task (what the outputs mean) is the job's scorer's: evaluate/scoring.py
has the protocol, scorers/ the classification and the instances (detection) scorers.

Exit codes (:attr:`Evaluation.exit_code` and the errors' own): 0 every gate passed, 1 a
gate failed, 2 the job file is wrong, 3 the evaluation could not run, 130 interrupted
(nothing recorded). The lock is an ``flock`` on ``.batchinfer.lock`` in every folder the
job writes to (the engine's OUT lock): a second evaluation of the same job, or of another
job sharing a folder, is refused at once (exit 3), and the kernel drops the lock however
its holder ends.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchinfer.engine.events import Observer
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.engine.runner import arrow_system_allocator
from batchinfer.evaluate.baseline import accept_evaluation
from batchinfer.evaluate.files import SUMMARY_MARK, write_bytes, write_json, write_table
from batchinfer.evaluate.gates import check_gates
from batchinfer.evaluate.history import append_history, record_history_row
from batchinfer.evaluate.jobspec import Job
from batchinfer.evaluate.record import make_record
from batchinfer.evaluate.runs import plan_side, reference_results, run_side
from batchinfer.evaluate.scorers.classify import class_map
from batchinfer.evaluate.scoring import Scorer, record_scorer, scorer_for
from batchinfer.evaluate.steps import (
    ITEMS,
    RECORD,
    EvalLockedError,
    Evaluation,
    check_cluster,
    check_own_outputs,
    custom_metrics,
    device_cluster,
    item_places,
    new_record_dir,
    no_report,
    now_utc,
    open_job_dataset,
    output_locks,
    score_metrics,
    write_report,
)
from batchinfer.evaluate.summary import markdown_summary

log = logging.getLogger("batchinfer")


def evaluate(
    job: Job,
    *,
    update_baseline: bool = False,
    observers: Callable[[str], Sequence[Observer]] | None = None,
    command: str | None = None,
    clock: Callable[[], dt.datetime] = now_utc,
) -> Evaluation:
    """Run ``job`` once (see the module docstring); raises a BatchinferError when it cannot.

    ``observers(side)`` gives the engine observers for the ``device`` or ``reference`` run
    (observers with a ``close()`` are closed after their run).
    """
    observers = observers or (lambda side: ())
    command = command or f"batchinfer eval {job.path}"
    scorer = scorer_for(job)
    registry = scorer.metrics()
    custom = custom_metrics(job)
    with arrow_system_allocator(), StopSignals() as signals:
        dataset = open_job_dataset(job)
        device_plan = plan_side(job, "device", job.device, dataset)
        reference_plan = None
        if job.reference is not None:
            reference_plan = plan_side(job, "reference", job.reference, dataset)
        scorer.prepare(dataset, [p for p in (device_plan, reference_plan) if p is not None])
        check_cluster(job)
        check_own_outputs(job)
        with output_locks(job, command):
            # Once the job is known to run: a refused one ends with its one error line.
            scorer.announce(dataset)
            reference = None
            if reference_plan is not None:
                reference = reference_results(
                    job, reference_plan, dataset, signals, observers, scorer.collect,
                    scorer.read_items,
                )  # fmt: skip
            with device_cluster(job, device_plan, signals) as cluster:
                where = "" if cluster is None else f" of {len(cluster.nodes)} Ray nodes"
                log.info(
                    f"device: {device_plan.model.name} on {device_plan.engine.backend.name}, "
                    f"cores {','.join(map(str, device_plan.engine.cores))}{where}"
                )
                device = run_side(
                    job, device_plan, dataset, signals, observers("device"), scorer.collect,
                    cluster,
                )  # fmt: skip
                cluster_facts = None if cluster is None else cluster.facts(device_plan.engine.cores)
            baseline = scorer.read_baseline()
            inputs = scorer.inputs(device, reference, baseline)
            metrics = score_metrics(job, inputs, registry, custom)
            verdict = check_gates(
                job.gates,
                metrics,
                baseline.metrics if baseline else None,
                scorer.worst_notes(inputs),
                accepting=update_baseline,
            )
            date = clock()
            eval_id, record_dir = new_record_dir(job, date)
            record = make_record(
                scorer, eval_id, date, inputs, metrics, verdict, dataset,
                (device_plan, device), (reference_plan, reference), baseline, cluster_facts,
            )  # fmt: skip
            record["items_file"] = str(record_dir / ITEMS)
            items_table = scorer.items_table(inputs)
            write_table(record_dir / ITEMS, items_table)
            write_json(record_dir / RECORD, record)
            history = append_history(
                job.outputs.history,
                record_history_row(
                    record, record["dataset"]["evaluated"], scorer.class_history(record)
                ),
            )
            accepted = None
            if update_baseline:
                accepted = accept_evaluation(
                    job.outputs.baseline, items_table, record, job.folder, record_dir / RECORD
                )
            report = _write_report(job, record, history, record_dir, scorer)
            summary = markdown_summary(record, report, scorer)
            write_bytes(job.outputs.summary, f"{SUMMARY_MARK}\n{summary}".encode())
    return Evaluation(job, eval_id, verdict, metrics, record, record_dir, report, summary, accepted)


def _write_report(
    job: Job,
    record: dict[str, Any],
    history: pa.Table,
    record_dir: Path,
    scorer: Scorer | type[Scorer] | None = None,
) -> Path | None:
    """The HTML report (in the record folder and at the job's report path), if matplotlib is.
    ``scorer``: the record's (by its ``task`` when not given)."""
    try:
        from batchinfer.evaluate.report import html_report
    except ImportError as exc:
        no_report(exc)
        return None
    from batchinfer.evaluate.history import job_history
    from batchinfer.evaluate.thumbnails import make_thumbnails

    scorer = scorer or record_scorer(record)
    rel = job.device.reliability
    max_pixels = job.device.preprocess.max_pixels
    max_item_bytes = job.device.preprocess.max_item_bytes
    # A picture is turned by its EXIF orientation only when the readers turned the image:
    # the boxes drawn on it are in the readers' coordinates.
    fit = scorer.picture_fit
    fit = replace(fit, upright=fit.upright and job.device.preprocess.exif_orientation)
    pictures = make_thumbnails(
        scorer.shown_items(record),
        decode_timeout_s=rel.decode_timeout_s,
        startup_timeout_s=rel.startup_timeout_s,
        max_pixels=max_pixels if isinstance(max_pixels, int) else None,
        max_item_bytes=None if max_item_bytes == "none" else max_item_bytes,
        size=scorer.picture_side,
        fit=fit,
    )
    page = html_report(record, job_history(history, job.name), pictures, scorer)
    return write_report(job, record_dir, page)


__all__ = [
    "EvalLockedError",
    "Evaluation",
    "class_map",
    "evaluate",
    "item_places",
    "now_utc",
]
