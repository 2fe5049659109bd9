"""One evaluation of a job: plan both sides, run them, score, gate, record, report.

    load_job ─► open the dataset, class map ─► plan device and reference, check that the
    report and summary paths hold only eval's files (exit 2 on any problem, nothing has
    run) ─► lock the job's output folders ─► reference (cache or run)
    ─► device run ─► baseline ─► metrics ─► gates ─► evals/<id>/ record ─► history row
    ─► baseline (--update-baseline) ─► report and summary ─► unlock

Exit codes (:attr:`Evaluation.exit_code` and the errors' own): 0 every gate passed, 1 a
gate failed, 2 the job file is wrong, 3 the evaluation could not run, 130 interrupted
(nothing recorded). The lock is an ``flock`` on ``.batchinfer.lock`` in every folder the
job writes to (the engine's OUT lock): a second evaluation of the same job, or of another
job sharing a folder, is refused at once (exit 3), and the kernel drops the lock however
its holder ends.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchinfer.data.dataset import Dataset, say_notes
from batchinfer.data.shards import ShardSet
from batchinfer.data.whole_file import LABELS_BOUND, read_whole
from batchinfer.engine.events import Observer
from batchinfer.engine.runner import arrow_system_allocator
from batchinfer.engine.signals import StopSignals
from batchinfer.errors import (
    render_fields,
)
from batchinfer.evaluate.baseline import Baseline, accept_evaluation, read_baseline
from batchinfer.evaluate.detection_eval import evaluate_detection
from batchinfer.evaluate.files import (
    REPORT_MARK,
    SUMMARY_MARK,
    not_ours,
    write_bytes,
    write_json,
    write_table,
)
from batchinfer.evaluate.gates import Verdict, check_gates
from batchinfer.evaluate.history import append_history, record_history_row
from batchinfer.evaluate.job import Job
from batchinfer.evaluate.metrics import (
    EvalInputs,
    builtin_metrics,
    class_counts,
    confusion_matrix,
)
from batchinfer.evaluate.runs import (
    SideRun,
    plan_side,
    reference_results,
    run_side,
)
from batchinfer.evaluate.steps import (
    ITEMS,
    RECORD,
    EvalLockedError,
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
from batchinfer.evaluate.summary import markdown_summary
from batchinfer.evaluate.thumbnails import FLIPPED_PICTURED
from batchinfer.hostinfo import host_facts

if TYPE_CHECKING:
    pass

log = logging.getLogger("batchinfer")


# --------------------------------------------------------------------------- class map
def class_map(job: Job, dataset: Dataset) -> tuple[tuple[str, ...], dict[str, int] | None, dict]:
    """(class names by index, folder -> class when a labels file says so, how it was made)."""
    labels_file = job.dataset.labels
    if labels_file is None:
        # As many names as there are classes, never one per integer up to the largest
        # label (a folder or list label 2000000000 once asked for 2e9 names): labels from
        # names are 0..n-1, and a label from a number is named by that number anyway.
        inverse = {index: name for name, index in dataset.labels.items()}
        names = tuple(inverse.get(i, str(i)) for i in range(len(inverse)))
        return names, None, {"source": "folders"}
    raw = read_whole(
        labels_file,
        "dataset.labels",
        LABELS_BOUND,
        error=lambda message: job.error(message, "dataset.labels"),
        hint="give a text file with one class name per line",
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise job.error(f"dataset.labels {labels_file} cannot be read ({exc}).") from None
    names = [line.strip() for line in text.rstrip("\n").split("\n")]
    if not names or "" in names:
        line = names.index("") + 1 if "" in names else 1
        raise job.error(
            f"dataset.labels {labels_file} has an empty line ({line}); write one class name "
            "per line, line n naming class n."
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise job.error(f"dataset.labels {labels_file} names {duplicates[0]!r} twice.")
    relabel = {}
    for folder in dataset.classes:
        if folder in names:
            relabel[folder] = names.index(folder)
        elif folder.isdigit() and int(folder) < len(names):
            relabel[folder] = int(folder)
        else:
            raise job.error(
                f"dataset.labels: the class folder {folder!r} is neither a name in "
                f"{labels_file} nor a class number below {len(names)}; add it to the file "
                "or rename the folder."
            )
    source = {
        "source": "labels file",
        "path": str(labels_file),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    return tuple(names), relabel, source


# --------------------------------------------------------------------------- the outputs
def check_own_outputs(job: Job) -> None:
    """Before anything runs: the report and summary paths hold nothing but files eval
    wrote (exit 2 otherwise; see batchinfer.evaluate.files)."""
    for key, path, mark in (
        ("output.report", job.outputs.report, REPORT_MARK),
        ("output.summary", job.outputs.summary, SUMMARY_MARK),
    ):
        why = not_ours(path, mark)
        if why is not None:
            raise job.error(
                f"{key} {path} {why}; eval replaces only the files it wrote there: move that "
                f"file away or set {key} to another path.",
                key,
            )


# --------------------------------------------------------------------------- evaluate
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
    if job.task == "detect":  # the same steps with boxes: evaluate/detection_eval.py
        return evaluate_detection(
            job, update_baseline=update_baseline, observers=observers, command=command,
            clock=clock,
        )  # fmt: skip
    observers = observers or (lambda side: ())
    command = command or f"batchinfer eval {job.path}"
    registry = builtin_metrics(job.metrics.topk)
    custom = custom_metrics(job)
    with arrow_system_allocator(), StopSignals() as signals:
        dataset = open_job_dataset(job)
        classes, relabel, class_source = class_map(job, dataset)
        device_plan = plan_side(job, "device", job.device, dataset)
        if device_plan.engine.detects:
            raise job.error(
                f'device.model {device_plan.model.name} is a detector; add task = "detect" '
                "and dataset.ground_truth (its boxes) to score it.",
                "task",
            )
        reference_plan = None
        if job.reference is not None:
            reference_plan = plan_side(job, "reference", job.reference, dataset)
        check_cluster(job)
        check_own_outputs(job)
        with output_locks(job, command):
            # Once the job is known to run: a refused one ends with its one error line.
            say_notes(dataset, labels=job.dataset.labels is None)
            reference = None
            if reference_plan is not None:
                reference = reference_results(
                    job, reference_plan, dataset, relabel, signals, observers
                )
            with device_cluster(job, device_plan, signals) as cluster:
                where = "" if cluster is None else f" of {len(cluster.nodes)} Ray nodes"
                log.info(
                    f"device: {device_plan.model.name} on {device_plan.engine.backend.name}, "
                    f"cores {','.join(map(str, device_plan.engine.cores))}{where}"
                )
                device = run_side(
                    job, device_plan, dataset, relabel, signals, observers("device"), cluster
                )
                cluster_facts = None if cluster is None else cluster.facts(device_plan.engine.cores)
            if reference is not None:  # the same items; the class map is today's
                reference.items.label = device.items.label.copy()
            baseline = read_baseline(job.outputs.baseline)
            inputs = EvalInputs(
                device.items,
                reference.items if reference is not None else None,
                baseline.items if baseline is not None else None,
                classes,
                job.metrics.topk,
                device.core_stats,
            )
            if inputs.outside.items:
                log.warning(inputs.outside.sentence())
            metrics = score_metrics(job, inputs, registry, custom)
            verdict = check_gates(
                job.gates,
                metrics,
                baseline.metrics if baseline else None,
                _worst_of(inputs),
                accepting=update_baseline,
            )
            date = clock()
            eval_id, record_dir = new_record_dir(job, date)
            record = _record(
                job,
                eval_id,
                date,
                inputs,
                metrics,
                verdict,
                dataset,
                classes,
                class_source,
                (device_plan, device),
                (reference_plan, reference),
                baseline,
                cluster_facts,
            )
            record["items_file"] = str(record_dir / ITEMS)
            items_table = _items_table(inputs)
            write_table(record_dir / ITEMS, items_table)
            write_json(record_dir / RECORD, record)
            history = append_history(
                job.outputs.history,
                record_history_row(
                    record, len(inputs.device), [c["top1"] for c in record["per_class"]]
                ),
            )
            accepted = None
            if update_baseline:
                accepted = accept_evaluation(
                    job.outputs.baseline, items_table, record, job.folder, record_dir / RECORD
                )
            report = _write_report(job, record, history, record_dir)
            summary = markdown_summary(record, report)
            write_bytes(job.outputs.summary, f"{SUMMARY_MARK}\n{summary}".encode())
    return Evaluation(job, eval_id, verdict, metrics, record, record_dir, report, summary, accepted)


def _worst_of(inputs: EvalInputs) -> dict[str, str]:
    """Which core or item each "worst" metric comes from, for the verdict."""
    notes = {}
    for metric, key in (
        ("core_top1_min", "top1"),
        ("core_agreement_min", "agreement"),
        ("core_cosine_min", "cosine_mean"),
    ):
        rows = [r for r in inputs.per_core if r[key] is not None]
        if len(rows) > 1:
            notes[metric] = f"worst core {min(rows, key=lambda r: r[key])['place']}"
    cosine = inputs.cosine
    if not np.isnan(cosine).all():
        notes["cosine_min"] = f"worst item {inputs.device.id[int(np.nanargmin(cosine))]}"
    return notes


def _items_table(inputs: EvalInputs) -> pa.Table:
    """Per-item results of the evaluation (no raw outputs): what a baseline keeps."""
    d, r = inputs.device, inputs.reference
    table = d.to_table(with_outputs=False)
    table = table.append_column("correct", pa.array(d.correct))
    if r is not None:
        table = table.append_column("ref_pred", pa.array(r.pred))
        table = table.append_column("agree", pa.array(inputs.agree))
        table = table.append_column("cosine", pa.array(inputs.cosine, from_pandas=True))
    return table


def _none_if_nan(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def _worst(inputs: EvalInputs, dataset: Dataset, n: int) -> list[dict[str, Any]]:
    """The ``n`` worst items: against a reference, disagreements then lowest cosine;
    without one, the most confident mistakes."""
    d = inputs.device
    if n == 0:
        return []
    if inputs.reference is not None:
        cos = inputs.cosine
        candidates = np.flatnonzero(~np.isnan(cos))
        order = sorted(candidates.tolist(), key=lambda i: (bool(inputs.agree[i]), cos[i]))
    else:
        wrong = np.flatnonzero(d.ok & d.labelled & ~d.correct)
        flat = d.flat_outputs()
        confidence = flat[wrong].max(axis=1) if flat.shape[1] else np.zeros(len(wrong))
        order = [int(wrong[i]) for i in np.argsort(-confidence, kind="stable")]
    out = []
    places = item_places(dataset, [d.id[i] for i in order[:n]])
    for i in order[:n]:
        ref_pred = int(inputs.reference.pred[i]) if inputs.reference is not None else None
        out.append(
            {
                "index": int(d.index[i]),
                "id": d.id[i],
                **places.get(d.id[i], {"path": str(dataset.root / d.id[i])}),
                "label": int(d.label[i]),
                "pred": int(d.pred[i]),
                "ref_pred": ref_pred,
                "cosine": _none_if_nan(float(inputs.cosine[i])),
                "core": int(d.core[i]),
                "node": d.node[i],
            }
        )
    return out


def item_places(dataset: Dataset, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Where the report finds a few items' pictures: id -> ``{"path": file}``, or for a
    tar shard's member ``{"path": shard, "member": {"offset", "size", "name"}}``
    (evaluate/thumbnails.py reads either). A list's ids need not be paths
    (``Dataset.paths_of``); a shard set's members are found by listing its shards (headers
    only, once per report)."""
    if not ids:
        return {}
    if isinstance(dataset, ShardSet):
        wanted, found = set(ids), {}
        for item in dataset:
            m = item.member
            if item.id in wanted and m is not None and m.fault is None:
                member = {"offset": m.offset, "size": m.size, "name": m.name}
                found[item.id] = {"path": item.path, "member": member}
                if len(found) == len(wanted):
                    break
        return found
    return {ident: {"path": path} for ident, path in dataset.paths_of(ids).items()}


def _flipped_places(dataset: Dataset, lost: list[str], gained: list[str]) -> dict[str, Any]:
    """The places (:func:`item_places`) of the flipped items the report pictures."""
    return item_places(dataset, lost[:FLIPPED_PICTURED] + gained[:FLIPPED_PICTURED])


def _record(
    job: Job,
    eval_id: str,
    date: dt.datetime,
    inputs: EvalInputs,
    metrics: dict[str, float],
    verdict: Verdict,
    dataset: Dataset,
    classes: tuple[str, ...],
    class_source: dict,
    device: tuple[Any, SideRun],
    reference: tuple[Any, SideRun | None],
    baseline: Baseline | None,
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    d = inputs.device
    n_classes = inputs.n_classes
    names = [classes[i] if i < len(classes) else str(i) for i in range(n_classes)]
    total, correct, errors = class_counts(d, n_classes)
    flips = inputs.flips
    device_facts = side_facts(*device)
    assert device_facts is not None
    device_facts["cluster"] = cluster
    render = job.key_of("device")
    device_facts["warnings"] = [render_fields(w, render) for w in device_facts["warnings"]]
    error_rows = [
        {"id": d.id[i], "error": d.error[i], "core": int(d.core[i]), "node": d.node[i]}
        for i in np.flatnonzero(~d.ok)[:100]
    ]
    return {
        "eval_id": eval_id,
        "date": date.astimezone(dt.timezone.utc).isoformat(),
        "job": job.name,
        "job_file": str(job.path),
        "job_sha256": job.sha256,
        "verdict": verdict.word,
        "gates": verdict.records(),
        "metrics": metrics,
        "model": device_facts["model"],
        "model_sha256": device_facts["model_sha256"],
        "device": device_facts,
        "reference": side_facts(*reference),
        "dataset": {
            "path": str(dataset.root),
            "items": len(dataset),
            "evaluated": len(d),
            "labelled": int(d.labelled.sum()),
            "listing_sha256": dataset.listing_sha256,
            "limit": job.dataset.limit,
        },
        "classes": names,
        "class_map": class_source,
        "labels_outside": dataclasses.asdict(inputs.outside),
        "per_class": [
            {
                "class": i,
                "name": names[i],
                "items": int(total[i]),
                "correct": int(correct[i]),
                "errors": int(errors[i]),
                "top1": float(correct[i] / total[i]) if total[i] else None,
            }
            for i in range(n_classes)
        ],
        "confusion": confusion_matrix(d, n_classes).tolist(),
        "per_core": inputs.per_core,
        "worst": _worst(inputs, dataset, job.metrics.worst),
        "errors": error_rows,
        "flipped": None
        if flips is None
        else {
            "lost": flips.lost,
            "gained": flips.gained,
            "compared": flips.compared,
            "pictured": _flipped_places(dataset, flips.lost, flips.gained),
            "mcnemar": {
                "lost": flips.test.lost,
                "gained": flips.test.gained,
                "statistic": flips.test.statistic,
                "p_value": flips.test.p_value,
                "method": flips.test.method,
            },
        },
        "baseline": None
        if baseline is None
        else {
            k: baseline.record.get(k)
            for k in ("eval_id", "accepted_by", "accepted_at", "model_sha256", "git_commit")
        },
        "gate_limits": [{k: v for k, v in vars(g).items() if v is not None} for g in job.gates],
        "host": host_facts(),
    }


def _write_report(
    job: Job, record: dict[str, Any], history: pa.Table, record_dir: Path
) -> Path | None:
    """The HTML report (in the record folder and at the job's report path), if matplotlib is."""
    try:
        from batchinfer.evaluate.report import html_report
    except ImportError as exc:
        no_report(exc)
        return None
    from batchinfer.evaluate.history import job_history
    from batchinfer.evaluate.report import shown_items
    from batchinfer.evaluate.thumbnails import make_thumbnails

    rel = job.device.reliability
    max_pixels = job.device.preprocess.max_pixels
    max_item_bytes = job.device.preprocess.max_item_bytes
    pictures = make_thumbnails(
        shown_items(record),
        decode_timeout_s=rel.decode_timeout_s,
        startup_timeout_s=rel.startup_timeout_s,
        max_pixels=max_pixels if isinstance(max_pixels, int) else None,
        max_item_bytes=None if max_item_bytes == "none" else max_item_bytes,
    )
    page = html_report(record, job_history(history, job.name), pictures)
    return write_report(job, record_dir, page)


__all__ = ["EvalLockedError", "Evaluation", "class_map", "evaluate", "now_utc"]
