"""What an evaluation's task decides: the :class:`Scorer` protocol, and which scorer a job gets.

evaluation.py runs one pipeline for every task; whatever depends on what the model's outputs
mean is its scorer's. The protocol, written down once here:

```text
PROTOCOL (pipeline ⇄ scorer), one scorer per job: scorer_for(job) -> Scorer

  when                          pipeline calls                    scorer answers / does
  load_job (nothing has run)    check_job()                       JobError for what its task
                                                                  needs (detection: the ground
                                                                  truth, faster-coco-eval)
                                metrics()                         its built-in Metric registry
                                significance_test                 where a gate's alpha applies
  planned (nothing has run)     prepare(dataset, plans)           reads and matches the ground
                                                                  truth or class map; refuses
                                                                  a model it cannot score
  the job's folders locked      announce(dataset)                 its log lines
  each side's run               collect(sink) -> items            the side's per-item results
  the reference cache           read_items(table) -> items        the same, from the cache
  after both runs               read_baseline(folder)             Baseline(items, record) or
                                                                  None (baseline.read_accepted)
                                inputs(device, ref, baseline)     what its metrics see
                                worst_notes(inputs)               which core/item a "worst"
                                                                  gate value comes from
  the record (result.json)      side_facts(plan) -> dict          its facts of a side's model
                                labelled(inputs) -> int           dataset.labelled
                                record_section(inputs, dataset)   its keys of the record: per
                                                                  class, per core, worst items
                                                                  (the gallery), comparisons
                                items_table(inputs) -> Table      items.parquet (the baseline)
                                class_history(record)             history's per_class_top1
  the outputs (record only)     summary_*(record)                 its lines of summary.md
                                report_*(record), report          its sections of the report
                                                                  (``report`` names the module)
                                shown_items(record)               the item pictures the report
                                                                  needs (made in a child)
```

The shared steps (locks, both sides' runs, custom metrics, gates, history, the baseline's
files, the record's frame, the report's and the summary's frames) are written once: in
evaluation.py, steps.py, record.py, report.py and summary.py. A scorer never runs a model
nor writes a file; the rendering half (``summary_*``, ``report_*``) reads only the record,
so a record renders again without its job (:func:`scorer_type` by the record's ``task``).

Scorers: ``classify`` (top-k, confusion, McNemar: scorers/classify.py) and ``instances``
(COCO-style detection: scorers/instances.py); the box tasks whose boxes carry a part
subclass the instances scorer through scorers/instance_parts.py, one module each:
``segment`` (COCO segm: scorers/segm.py), ``pose`` (COCO keypoints, OKS:
scorers/keypoints.py), ``obb`` (DOTA-style rotated mAP50: scorers/rotated.py). A task's
``scorer`` (batchinfer/tasks) names its class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from batchinfer.data.dataset import Dataset
    from batchinfer.evaluate.baseline import Baseline
    from batchinfer.evaluate.jobspec import Job
    from batchinfer.evaluate.metrics import Metric
    from batchinfer.evaluate.runs import SidePlan, SideRun
    from batchinfer.evaluate.thumbnails import Fit, Source
    from batchinfer.sink.rows import MemorySink

#: One report section: (its element id, its title, its HTML).
Section = tuple[str, str, str]


class Scorer(Protocol):
    """One task's side of an evaluation (see the module docstring)."""

    job: Job
    #: The record's ``task`` ("classify" records have none: they predate tasks).
    task: str
    #: Where a gate's ``alpha`` applies, as the refusal of a misplaced one says it.
    significance_test: str
    #: The longest side of the pictures its ``shown_items`` get, in pixels.
    picture_side: int
    #: How those pictures are fitted to that side (evaluate/thumbnails.py).
    picture_fit: Fit
    #: The module of its report sections (report.py calls its ``sections(record, pictures)``
    #: -> list[Section]), named, not imported: report modules import matplotlib, which an
    #: evaluation loads only when it writes a report.
    report: str

    # ------------------------------------------------------------------ the job
    def check_job(self) -> None: ...
    def metrics(self) -> dict[str, Metric]: ...

    # ------------------------------------------------------------------ the runs
    def prepare(self, dataset: Dataset, plans: list[SidePlan]) -> None: ...
    def announce(self, dataset: Dataset) -> None: ...
    def collect(self, sink: MemorySink) -> Any: ...
    def read_items(self, table: pa.Table) -> Any: ...
    def read_baseline(self) -> Baseline | None: ...
    def inputs(
        self, device: SideRun, reference: SideRun | None, baseline: Baseline | None
    ) -> Any: ...
    def worst_notes(self, inputs: Any) -> dict[str, str]: ...

    # ------------------------------------------------------------------ the record
    def side_facts(self, plan: SidePlan) -> dict[str, Any]: ...
    def labelled(self, inputs: Any) -> int: ...
    def record_section(self, inputs: Any, dataset: Dataset) -> dict[str, Any]: ...
    def items_table(self, inputs: Any) -> pa.Table: ...

    # ------------------------------------------------------------------ the outputs
    @staticmethod
    def class_history(record: Mapping[str, Any]) -> list[float | None] | None: ...
    @staticmethod
    def summary_title(record: Mapping[str, Any]) -> str: ...
    @staticmethod
    def summary_items(record: Mapping[str, Any]) -> str: ...
    @staticmethod
    def summary_intro(record: Mapping[str, Any]) -> list[str]: ...
    @staticmethod
    def summary_metrics() -> tuple[str, ...]: ...
    @staticmethod
    def summary_body(record: Mapping[str, Any]) -> list[str]: ...
    @staticmethod
    def summary_warnings(record: Mapping[str, Any]) -> list[str]: ...
    @staticmethod
    def report_items(record: Mapping[str, Any]) -> str: ...
    @staticmethod
    def report_trend() -> tuple[str, ...]: ...
    @staticmethod
    def report_css() -> str: ...
    @staticmethod
    def shown_items(record: Mapping[str, Any]) -> list[Source]: ...


def job_tasks() -> tuple[str, ...]:
    """The tasks an evaluation job may name: the built-in tasks (batchinfer/tasks) that
    have a scorer, in the registry's order."""
    from batchinfer.tasks import REGISTRY, available

    return tuple(n for n in REGISTRY if (t := available(n)) is not None and t.scorer)


def scorer_type(task: str) -> type[Scorer]:
    """The scorer of a job's (or a record's) task: the one place a task picks its scorer
    (the task's own ``scorer`` reference, batchinfer/tasks/base.py)."""
    import importlib

    from batchinfer.tasks import task_class

    ref = task_class(task).scorer
    if ref is None:
        raise KeyError(task)
    module, _, name = ref.partition(":")
    scorer: type[Scorer] = getattr(importlib.import_module(module), name)
    return scorer


def scorer_for(job: Job) -> Scorer:
    """The scorer of ``job`` (its ``task``)."""
    return scorer_type(job.task)(job)  # type: ignore[call-arg]


def record_scorer(record: Mapping[str, Any]) -> type[Scorer]:
    """The scorer that renders ``record`` (a result.json; one without ``task`` classifies)."""
    return scorer_type(record.get("task", "classify"))


__all__ = ["Scorer", "Section", "job_tasks", "record_scorer", "scorer_for", "scorer_type"]
