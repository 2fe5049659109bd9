"""Nightly accuracy evaluation: job files, metrics, gates, baseline, history and report.

    from batchinfer.evaluate import load_job, evaluate
    result = evaluate(load_job("jobs/digits.toml"))
    result.verdict.passed, result.metrics["top1"], result.report

``batchinfer eval JOB`` is the command; docs/guide/eval.md and docs/reference/jobs.md
describe the job file and the outputs.
"""

from __future__ import annotations

from batchinfer.evaluate.evaluation import EvalLockedError, Evaluation, evaluate
from batchinfer.evaluate.gates import GateResult, Verdict, check_gates
from batchinfer.evaluate.items import ItemResults
from batchinfer.evaluate.job import load_job
from batchinfer.evaluate.jobspec import Gate, Job, JobError
from batchinfer.evaluate.metrics import Metric
from batchinfer.evaluate.scorers.classify_metrics import EvalInputs, builtin_metrics, mcnemar

__all__ = [
    "EvalInputs",
    "EvalLockedError",
    "Evaluation",
    "Gate",
    "GateResult",
    "ItemResults",
    "Job",
    "JobError",
    "Metric",
    "Verdict",
    "builtin_metrics",
    "check_gates",
    "evaluate",
    "load_job",
    "mcnemar",
]
