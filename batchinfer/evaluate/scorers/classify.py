"""The classification scorer (``task = "classify"``, the default): top-k accuracy, the
confusion matrix, agreement and cosine with the reference, McNemar's test against the
baseline (evaluate/scoring.py has the protocol).

The class map comes from the dataset's class folders or ``dataset.labels``; the metrics
are scorers/classify_metrics.py's; the report's sections scorers/classify_report.py's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from batchinfer.data.dataset import Dataset, say_notes
from batchinfer.data.whole_file import LABELS_BOUND, read_whole
from batchinfer.evaluate.baseline import Baseline, read_baseline, unreadable
from batchinfer.evaluate.items import ItemResults
from batchinfer.evaluate.jobspec import Job
from batchinfer.evaluate.markdown import code, text
from batchinfer.evaluate.metrics import Metric, worst_cores
from batchinfer.evaluate.runs import SidePlan, SideRun
from batchinfer.evaluate.scorers.classify_metrics import (
    BaselineItems,
    EvalInputs,
    builtin_metrics,
    class_counts,
    confusion_matrix,
)
from batchinfer.evaluate.steps import item_places
from batchinfer.evaluate.summary import (
    ACCEPT_ONE,
    core_table,
    ids_text,
    labels_outside,
    no_baseline,
    pct,
)
from batchinfer.evaluate.thumbnails import (
    FLIPPED_PICTURED,
    THUMBNAIL_FIT,
    THUMBNAIL_SIDE,
    Source,
)
from batchinfer.sink.rows import MemorySink

log = logging.getLogger("batchinfer")

#: Metrics the summary shows when computed (every gated metric is shown too).
KEY_METRICS = (
    "top1",
    "top5",
    "class_top1_min",
    "errors",
    "top1_agreement",
    "cosine_mean",
    "cosine_min",
    "core_cosine_min",
    "mcnemar_p",
    "items_per_s",
)


# --------------------------------------------------------------------------- class map
def class_map(job: Job, dataset: Dataset) -> tuple[tuple[str, ...], dict[str, int] | None, dict]:
    """(class names by index, folder -> class when a labels file says so, how it was made)."""
    labels_file = job.dataset.labels
    if labels_file is None:
        # As many names as there are classes, never one per integer up to the largest
        # label (a folder or list label 2000000000 once asked for 2e9 names): labels from
        # names are 0..n-1, and a label from a number is named by that number anyway.
        inverse = {index: name for name, index in dataset.labels.items()}
        by_index = tuple(inverse.get(i, str(i)) for i in range(len(inverse)))
        return by_index, None, {"source": "folders"}
    raw = read_whole(
        labels_file,
        "dataset.labels",
        LABELS_BOUND,
        error=lambda message: job.error(message, "dataset.labels"),
        hint="give a text file with one class name per line",
    )
    try:
        text_ = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise job.error(f"dataset.labels {labels_file} cannot be read ({exc}).") from None
    names = [line.strip() for line in text_.rstrip("\n").split("\n")]
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
        "sha256": hashlib.sha256(text_.encode()).hexdigest(),
    }
    return tuple(names), relabel, source


def baseline_items(table: pa.Table, record: dict[str, Any]) -> BaselineItems:
    """A classification baseline's per-item correctness (baseline.read_baseline's reader)."""
    if "correct" not in table.column_names:
        raise ValueError("it was accepted for another task's job, not a classification one")
    return BaselineItems(
        id=np.array(table.column("id").to_pylist(), dtype=object),
        correct=np.array(table.column("correct").to_pylist(), dtype=bool),
        metrics=dict(record.get("metrics") or {}),
    )


# --------------------------------------------------------------------------- the record
def _none_if_nan(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def worst_items(inputs: EvalInputs, dataset: Dataset, n: int) -> list[dict[str, Any]]:
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


def _flipped(inputs: EvalInputs, dataset: Dataset) -> dict[str, Any] | None:
    flips = inputs.flips
    if flips is None:
        return None
    pictured = flips.lost[:FLIPPED_PICTURED] + flips.gained[:FLIPPED_PICTURED]
    return {
        "lost": flips.lost,
        "gained": flips.gained,
        "compared": flips.compared,
        "pictured": item_places(dataset, pictured),
        "mcnemar": {
            "lost": flips.test.lost,
            "gained": flips.test.gained,
            "statistic": flips.test.statistic,
            "p_value": flips.test.p_value,
            "method": flips.test.method,
        },
    }


# --------------------------------------------------------------------------- the scorer
class ClassifyScorer:
    """The classification side of an evaluation (evaluate/scoring.py's protocol)."""

    task = "classify"
    picture_side = THUMBNAIL_SIDE
    picture_fit = THUMBNAIL_FIT
    report = "batchinfer.evaluate.scorers.classify_report"
    significance_test = "gates.top1 with max_drop (McNemar's test is on per-item top-1 correctness)"

    def __init__(self, job: Job) -> None:
        self.job = job
        self.classes: tuple[str, ...] = ()
        self.relabel: dict[str, int] | None = None
        self.class_source: dict[str, Any] = {}

    # ------------------------------------------------------------------ the job
    def check_job(self) -> None:
        key = "dataset.ground_truth"
        if self.job.dataset.ground_truth is not None:
            raise self.job.error(
                f'{key} is for detection jobs; add task = "detect" at the top of the file '
                "(or drop the key).",
                key,
            )

    def metrics(self) -> dict[str, Metric]:
        return builtin_metrics(self.job.metrics.topk)

    # ------------------------------------------------------------------ the runs
    def prepare(self, dataset: Dataset, plans: list[SidePlan]) -> None:
        self.classes, self.relabel, self.class_source = class_map(self.job, dataset)
        device = plans[0]
        if device.engine.detects:
            raise self.job.error(
                f'device.model {device.model.name} is a detector; add task = "detect" '
                "and dataset.ground_truth (its boxes) to score it.",
                "task",
            )

    def announce(self, dataset: Dataset) -> None:
        say_notes(dataset, labels=self.job.dataset.labels is None)

    def collect(self, sink: MemorySink) -> ItemResults:
        shapes = [shape for shape, _ in sink.output_shapes]
        return ItemResults.from_rows(sink.rows, shapes, self.job.metrics.topk, self.relabel)

    def read_items(self, table: pa.Table) -> ItemResults:
        return ItemResults.from_table(table)

    def read_baseline(self) -> Baseline | None:
        folder = self.job.outputs.baseline

        def read(table: pa.Table, record: dict[str, Any]) -> BaselineItems:
            try:
                return baseline_items(table, record)
            except ValueError as exc:
                raise unreadable(folder, str(exc)) from None

        return read_baseline(folder, read)

    def inputs(
        self, device: SideRun, reference: SideRun | None, baseline: Baseline | None
    ) -> EvalInputs:
        if reference is not None:  # the same items; the class map is today's
            reference.items.label = device.items.label.copy()
        inputs = EvalInputs(
            device.items,
            reference.items if reference is not None else None,
            baseline.items if baseline is not None else None,
            self.classes,
            self.job.metrics.topk,
            device.core_stats,
        )
        if inputs.outside.items:
            log.warning(inputs.outside.sentence())
        return inputs

    def worst_notes(self, inputs: EvalInputs) -> dict[str, str]:
        """Which core or item each "worst" metric comes from, for the verdict."""
        notes = worst_cores(
            inputs,
            (
                ("core_top1_min", "top1", min),
                ("core_agreement_min", "agreement", min),
                ("core_cosine_min", "cosine_mean", min),
            ),
        )
        cosine = inputs.cosine
        if not np.isnan(cosine).all():
            notes["cosine_min"] = f"worst item {inputs.device.id[int(np.nanargmin(cosine))]}"
        return notes

    # ------------------------------------------------------------------ the record
    def side_facts(self, plan: SidePlan) -> dict[str, Any]:
        return {}

    def labelled(self, inputs: EvalInputs) -> int:
        return int(inputs.device.labelled.sum())

    def record_section(self, inputs: EvalInputs, dataset: Dataset) -> dict[str, Any]:
        d = inputs.device
        n = inputs.n_classes
        names = [self.classes[i] if i < len(self.classes) else str(i) for i in range(n)]
        total, correct, errors = class_counts(d, n)
        per_class = [
            {
                "class": i,
                "name": names[i],
                "items": int(total[i]),
                "correct": int(correct[i]),
                "errors": int(errors[i]),
                "top1": float(correct[i] / total[i]) if total[i] else None,
            }
            for i in range(n)
        ]
        return {
            "classes": names,
            "class_map": self.class_source,
            "labels_outside": dataclasses.asdict(inputs.outside),
            "per_class": per_class,
            "confusion": confusion_matrix(d, n).tolist(),
            "per_core": inputs.per_core,
            "worst": worst_items(inputs, dataset, self.job.metrics.worst),
            "flipped": _flipped(inputs, dataset),
        }

    def items_table(self, inputs: EvalInputs) -> pa.Table:
        """Per-item results of the evaluation (no raw outputs): what a baseline keeps."""
        d, r = inputs.device, inputs.reference
        table = d.to_table(with_outputs=False)
        table = table.append_column("correct", pa.array(d.correct))
        if r is not None:
            table = table.append_column("ref_pred", pa.array(r.pred))
            table = table.append_column("agree", pa.array(inputs.agree))
            table = table.append_column("cosine", pa.array(inputs.cosine, from_pandas=True))
        return table

    # ------------------------------------------------------------------ the outputs
    @staticmethod
    def class_history(record: Mapping[str, Any]) -> list[float | None] | None:
        return [c["top1"] for c in record["per_class"]]

    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str:
        return ""

    @staticmethod
    def summary_items(record: Mapping[str, Any]) -> str:
        return f"{record['dataset']['evaluated']} items"

    @staticmethod
    def summary_intro(record: Mapping[str, Any]) -> list[str]:
        return []

    @staticmethod
    def summary_metrics() -> tuple[str, ...]:
        return KEY_METRICS

    @staticmethod
    def summary_body(record: Mapping[str, Any]) -> list[str]:
        """Per core, then the items flipped since the baseline."""
        lines = core_table(
            record["per_core"],
            (
                ("top-1", lambda c: pct(c["top1"])),
                ("agreement", lambda c: pct(c["agreement"])),
                (
                    "cosine",
                    lambda c: "-" if c["cosine_mean"] is None else f"{c['cosine_mean']:.6f}",
                ),
            ),
        )
        flipped = record["flipped"]
        lines.append("")
        if flipped is None:
            lines.append(no_baseline(record, code, ACCEPT_ONE))
            return lines
        test = flipped["mcnemar"]
        base = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({text(base.get('eval_id'))}, accepted by "
            f"{text(base.get('accepted_by'))}): "
            f"{len(flipped['lost'])} items lost, {len(flipped['gained'])} gained of "
            f"{flipped['compared']}; McNemar p = {test['p_value']:.3g} ({test['method']})."
        )
        if flipped["lost"]:
            lines.append(f"Lost: {ids_text(flipped['lost'])}.")
        if flipped["gained"]:
            lines.append(f"Gained: {ids_text(flipped['gained'])}.")
        return lines

    @staticmethod
    def summary_warnings(record: Mapping[str, Any]) -> list[str]:
        outside = labels_outside(dict(record))
        return [outside] if outside else []

    @staticmethod
    def report_items(record: Mapping[str, Any]) -> str:
        return f"{record['dataset']['evaluated']} items"

    @staticmethod
    def report_trend() -> tuple[str, ...]:
        return ("top1", "top1_agreement", "cosine_mean")

    @staticmethod
    def report_css() -> str:
        return ""

    @staticmethod
    def shown_items(record: Mapping[str, Any]) -> list[Source]:
        from batchinfer.evaluate.scorers.classify_report import shown_items

        return shown_items(dict(record))


__all__ = ["KEY_METRICS", "ClassifyScorer", "baseline_items", "class_map", "worst_items"]
