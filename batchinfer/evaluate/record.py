"""The evaluation's record (``evals/<id>/result.json``): its frame, the same for every task.

The frame holds what any evaluation has (the job, the verdict and its gates, the metrics,
both sides' models and what they ran on, the dataset, the first item errors, the baseline
it was compared with, the host); the scorer adds its task's keys (``record_section``: per
class, per core, the worst items, the comparisons) and its facts of each side's model.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import numpy as np

from batchinfer.errors import render_fields
from batchinfer.evaluate.steps import side_facts
from batchinfer.hostinfo import host_facts

if TYPE_CHECKING:
    from batchinfer.data.dataset import Dataset
    from batchinfer.evaluate.baseline import Baseline
    from batchinfer.evaluate.gates import Verdict
    from batchinfer.evaluate.runs import SidePlan, SideRun
    from batchinfer.evaluate.scoring import Scorer

#: The item errors a record lists (the items table has every one).
ERRORS_LISTED = 100
#: The baseline's facts a record keeps.
BASELINE_FACTS = ("eval_id", "accepted_by", "accepted_at", "model_sha256", "git_commit")


def _side(scorer: Scorer, plan: SidePlan | None, run: SideRun | None) -> dict[str, Any] | None:
    facts = side_facts(plan, run)
    if facts is not None and plan is not None:
        facts.update(scorer.side_facts(plan))
    return facts


def make_record(
    scorer: Scorer,
    eval_id: str,
    date: dt.datetime,
    inputs: Any,
    metrics: dict[str, float],
    verdict: Verdict,
    dataset: Dataset,
    device: tuple[SidePlan, SideRun],
    reference: tuple[SidePlan | None, SideRun | None],
    baseline: Baseline | None,
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation's result.json (see the module docstring)."""
    job = scorer.job
    d = inputs.device
    device_facts = _side(scorer, *device)
    assert device_facts is not None
    device_facts["cluster"] = cluster
    render = job.key_of("device")
    device_facts["warnings"] = [render_fields(w, render) for w in device_facts["warnings"]]
    error_rows = [
        {"id": d.id[i], "error": d.error[i], "core": int(d.core[i]), "node": d.node[i]}
        for i in np.flatnonzero(~d.ok)[:ERRORS_LISTED]
    ]
    task = {} if scorer.task == "classify" else {"task": scorer.task}
    return {
        "eval_id": eval_id,
        "date": date.astimezone(dt.timezone.utc).isoformat(),
        **task,
        "job": job.name,
        "job_file": str(job.path),
        "job_sha256": job.sha256,
        "verdict": verdict.word,
        "gates": verdict.records(),
        "metrics": metrics,
        "model": device_facts["model"],
        "model_sha256": device_facts["model_sha256"],
        "device": device_facts,
        "reference": _side(scorer, *reference),
        "dataset": {
            "path": str(dataset.root),
            "items": len(dataset),
            "evaluated": len(d),
            "labelled": scorer.labelled(inputs),
            "listing_sha256": dataset.listing_sha256,
            "limit": job.dataset.limit,
        },
        **scorer.record_section(inputs, dataset),
        "errors": error_rows,
        "baseline": None
        if baseline is None
        else {k: baseline.record.get(k) for k in BASELINE_FACTS},
        "gate_limits": [{k: v for k, v in vars(g).items() if v is not None} for g in job.gates],
        "host": host_facts(),
    }


__all__ = ["BASELINE_FACTS", "ERRORS_LISTED", "make_record"]
