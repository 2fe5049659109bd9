"""The main job: a dataset folder, through the engine, into a run folder.

    plan_run (reads only; looks at OUT) → plan.out.begin (lock OUT, look again, clear or
      resume it, manifest "running") → Engine(DatasetSource, plan.out.rows, observers).run()
      → plan.out.finish (last rows, stats, manifest; lock released)

OUT's life is :class:`batchinfer.sink.output_folder.OutputFolder`'s (plan.out): the engine
calls it before the run and after it; nothing else here touches the folder, but for
:func:`run`'s early refusal of a held OUT (planning does not ask; the lock does).

The same steps run a plan on a Ray cluster (batchinfer.cluster): :func:`run_plan` takes
the engine to use (``make_engine``) and extra manifest fields.

Signals: SIGINT, SIGTERM and SIGHUP are handled for the whole call (engine/plumbing/signals.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from batchinfer.data.dataset import Dataset, say_notes
from batchinfer.engine.board.instance_probe import settle_instances
from batchinfer.engine.events import Observer, RowsDone, Started
from batchinfer.engine.loop import Engine
from batchinfer.engine.npu_watch import NpuLoadWatch, board_backend
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.interface import EngineResult
from batchinfer.engine.planning.plan import RunPlan, plan_run
from batchinfer.engine.plumbing import fork_server
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.engine.sources import DatasetSource, ItemSource
from batchinfer.errors import UsageError, render_fields
from batchinfer.hostinfo import host_facts
from batchinfer.runtime.npu_load import NpuLoad
from batchinfer.sink.out_lock import refuse_if_held
from batchinfer.sink.output_folder import OutputFolder
from batchinfer.sink.rows import RowSink
from batchinfer.sink.run_folder import RunEnd
from batchinfer.sink.stats import CoreStatsRecorder
from batchinfer.tasks import Task

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished (or interrupted) run produced; commands map ``status`` to exit codes."""

    out: Path
    status: str  # complete | interrupted (a failed run raises its error)
    total: int  # items in the dataset
    skipped: int  # already done before this invocation (resume)
    succeeded: int  # rows written by this invocation
    errors: int
    stats: pa.Table  # this invocation's core_stats rows
    warnings: list[str] = field(default_factory=list)
    failed_items: list[tuple[str, str]] = field(default_factory=list)  # (id, error), first few
    skipped_files: dict[str, Any] = field(default_factory=dict)  # files that are not items
    #: The board's own NPU load over the run (its driver's file); None: no NPU to read
    #: (onnx, toolkit, a cluster's nodes). Its per_core is None when it was not readable.
    npu_load: NpuLoad | None = None


@contextlib.contextmanager
def arrow_system_allocator() -> Iterator[None]:
    """Let Arrow use malloc while the run lasts (restored afterwards).

    Arrow's default allocator (mimalloc) keeps the pages of every Parquet part it wrote:
    measured here, writing 8,192 rows grew the process by ~20 MB that it never gave back,
    against ~2 MB with the system allocator. The coordinator's memory should depend on the
    slots, not on how many parts it has written.

    This covers what pyarrow's Python layer allocates. Parquet's column writers allocate
    from Arrow's C++ default pool, which only ``ARROW_DEFAULT_MEMORY_POOL=system`` set
    before pyarrow is imported changes: the ``batchinfer`` program sets it (entry.py); a
    script calling the library can set it itself.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _per_item(cpu_s: dict[str, float], items: int) -> dict[str, float] | None:
    """CPU milliseconds per item by role, and in total (start-up, a fixed cost, left out)."""
    if not items or not cpu_s:  # nothing run, or an engine that does not count CPU
        return None
    per = {role: round(1e3 * s / items, 4) for role, s in cpu_s.items() if role != "startup"}
    per["total"] = round(sum(per.values()), 4)
    return per


def _manifest_fields(plan: RunPlan) -> dict[str, Any]:
    config, engine = plan.config, plan.engine
    return {
        "command": config.command,
        "config": config.to_json(),
        "model": str(plan.model),
        "model_sha256": plan.model_sha256,
        "backend": plan.backend.name,
        "dataset": plan.dataset.manifest_json(),
        "preprocess": plan.preprocess_json(),
        "cores": list(engine.cores),
        "instances_per_core": engine.instances_per_core,
        **({"instances_auto": engine.instances_choice} if engine.instances_choice else {}),
        "slots": engine.slots,
        "readers": engine.readers,
        "cpu_affinity": list(engine.cpus) if engine.cpus else None,
        "host": host_facts(),
        "pid": os.getpid(),
        **({"task": engine.task.to_json()} if engine.task is not None else {}),
    }


def detect_figures(detect: dict[str, float]) -> dict[str, Any] | None:
    """The manifest's ``detect`` record: boxes written, NaN/inf candidates dropped, and the
    core workers' CPU milliseconds per item spent decoding (post-processing)."""
    if not detect:
        return None
    decoded = int(detect.get("items", 0))
    return {
        "items_decoded": decoded,
        "boxes": int(detect.get("boxes", 0)),
        "nonfinite_dropped": int(detect.get("nonfinite", 0)),
        "nonfinite_items": int(detect.get("nonfinite_items", 0)),
        "postprocess_cpu_ms_per_item": (
            round(1e3 * detect.get("cpu_s", 0.0) / decoded, 4) if decoded else None
        ),
    }


class RunEngine(Protocol):
    """What :func:`run_plan` needs of an engine (:class:`Engine`, or the cluster's)."""

    stats: CoreStatsRecorder

    def run(self) -> EngineResult: ...

    def request_stop(self, reason: str) -> None: ...


#: Makes the engine of a run: (plan, source, sink, observers, invocation) -> engine.
EngineFactory = Callable[[RunPlan, ItemSource, RowSink, list, int], RunEngine]


def _board_engine(
    plan: RunPlan, source: ItemSource, sink: RowSink, observers: list, invocation: int
) -> Engine:
    stats = CoreStatsRecorder(plan.engine.cores, plan.engine.instances_per_core, invocation)
    return Engine(plan.engine, source, sink, observers, stats=stats)


def run(
    config: RunConfig | str | os.PathLike[str],
    observers: Sequence[Observer] = (),
    listing: Callable[[int], None] | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    **options: Any,
) -> RunResult:
    """Run a model over a dataset on the NPU cores into a run folder.

    Either ``run(RunConfig(...))`` or ``run(dataset, model=..., **options)`` with the CLI's
    option names (``cores=(0, 1, 2)``, ``backend="sim"``, ``out="runs/a"``: see
    :meth:`RunConfig.of`). Raises a :class:`~batchinfer.errors.BatchinferError` for anything
    that stops the run before or while it runs; item failures are error rows, not
    exceptions. ``listing`` is called with the number of entries listed so far while a big
    dataset is listed.
    """
    if not isinstance(config, RunConfig):
        if model is None:
            raise UsageError(
                f"run({os.fsdecode(config)!r}) needs the model: run(dataset, model=...), "
                "or a RunConfig."
            )
        config = RunConfig.of(config, model, **options)
    elif model is not None or options:
        given = ", ".join(["model", *options] if model is not None else options)
        raise UsageError(
            f"run takes a RunConfig or (dataset, model=..., options), not both ({given})."
        )
    if config.output.out is not None:
        # The early refusal of a held OUT, before the fork server is launched for nothing
        # (the ``run`` command makes its own, before it imports this module).
        refuse_if_held(config.output.out)
    return plan_and_run(config, observers, listing)


def plan_and_run(
    config: RunConfig,
    observers: Sequence[Observer] = (),
    listing: Callable[[int], None] | None = None,
) -> RunResult:
    """:func:`run` after its early refusal of a held OUT, for a caller that made it (the
    ``run`` command): plan ``config`` and run it. OUT is not asked about again until its
    lock is taken (:meth:`OutputFolder.begin`)."""
    # The children's fork server is held first: it imports while this process plans.
    with arrow_system_allocator(), StopSignals() as signals, fork_server.running():
        plan = plan_run(config, listing=listing)
        return run_plan(plan, signals, observers)


def run_plan(
    plan: RunPlan,
    signals: StopSignals,
    observers: Sequence[Observer] = (),
    make_engine: EngineFactory = _board_engine,
    fields: dict[str, Any] | None = None,
) -> RunResult:
    """Take OUT and run ``plan`` with the engine ``make_engine`` makes; ``fields`` go
    into the manifest too. Called inside :class:`StopSignals` (and the Arrow allocator)."""
    plan = dataclasses.replace(plan, engine=settle_instances(plan.engine))  # -k auto
    with plan.out.begin({**_manifest_fields(plan), **(fields or {})}, **_task_sink(plan)) as out:
        return _run(plan, out, signals, observers, make_engine)


def _run(
    plan: RunPlan,
    out: OutputFolder,
    signals: StopSignals,
    observers: Sequence[Observer],
    make_engine: EngineFactory,
) -> RunResult:
    limit = plan.config.limit
    n = len(plan.dataset) if limit is None else min(len(plan.dataset), limit)
    skipped = out.done_below(n)
    source = DatasetSource(plan.dataset, skip=out.skip(), limit=limit, todo=n - skipped)
    failed, first_row = _FirstFailures(), _FirstRow()
    notes = _DatasetNotes(plan.dataset, plan.engine.task)
    watch = NpuLoadWatch(lambda: board_backend(engine))
    engine = make_engine(
        plan, source, out.rows, [notes, failed, first_row, watch, *observers], out.invocation
    )
    stats = engine.stats
    signals.engine = engine
    try:
        result = engine.run()
    finally:
        watch.stop()
    npu_load = watch.summary()
    stats.set_npu_load(npu_load.of(plan.engine.cores) if npu_load is not None else None)
    counts = dict(result.counts)
    counts.update(
        dataset=len(plan.dataset),
        to_do=n - skipped,
        skipped_done=skipped,
        collected=result.counts["succeeded"] + result.counts["errors"],
    )
    status, error, counts = out.finish(
        RunEnd(
            status=result.status,
            error=result.error,
            stats=stats,
            counts=counts,
            fields={
                "sdk_versions": {str(k): v for k, v in result.sdk_versions.items()},
                "backend_settings": result.backend,
                "retired_cores": result.retired_cores,
                # Settings named as fields (runtime.cores), as str() of an error does: the
                # manifest is read by people and tools, not through a front end.
                "warnings": [render_fields(w, lambda name: name) for w in result.warnings],
                "timings": {"collect_s": round(result.collect_s, 4), **first_row.timings()},
                "cpu_s": result.cpu_s,
                "cpu_ms_per_item": _per_item(result.cpu_s, counts["collected"]),
                "coordinator_peak_rss_mb": round(result.peak_rss_mb, 1),
                "npu_load": None if npu_load is None else npu_load.to_json(),
                **_detect_record(out, result.detect, plan),
            },
        )
    )
    if error is not None:
        raise error
    return RunResult(
        out=out.path,
        status=status,
        total=len(plan.dataset),
        skipped=skipped,
        succeeded=counts["succeeded"],
        errors=counts["errors"],
        stats=stats.table(),
        warnings=list(result.warnings),
        failed_items=failed.items,
        skipped_files=plan.dataset.skipped.to_json(),
        npu_load=npu_load,
    )


class _DatasetNotes:
    """Says the task picked and why, and how the dataset was read (labels, leftovers
    skipped), once, when items start to flow: an invocation refused before that ends with
    its one error line only."""

    def __init__(self, dataset: Dataset, task: Task | None) -> None:
        self.dataset: Dataset | None = dataset
        self.task = task

    def notify(self, event: object) -> None:
        if self.dataset is not None and isinstance(event, Started):
            if self.task is not None:
                log.info(self.task.said())
            say_notes(self.dataset)
            self.dataset = None


def _task_sink(plan: RunPlan) -> dict[str, Any]:
    """What the run folder's rows need to know of the task (its columns: Task.fields; the
    save_outputs a raw task forces)."""
    engine = plan.engine
    out: dict[str, Any] = {"save_outputs": engine.save_outputs, "meta": plan.dataset.meta_type}
    if engine.task is not None:
        out.update(task=engine.task)
    return out


def _detect_record(out: OutputFolder, detect: dict[str, float], plan: RunPlan) -> dict:
    """The manifest's ``detect`` figures, summed over a resumed run's invocations."""
    if plan.engine.worker_task is None:
        return {}
    earlier = out.earlier("detect_totals") or {}
    keys = ("items", "boxes", "nonfinite", "nonfinite_items", "cpu_s")
    totals = {k: earlier.get(k, 0) + detect.get(k, 0) for k in keys}
    return {"detect": detect_figures(totals), "detect_totals": totals}


class _FirstFailures:
    """Keeps the first few error rows, so the summary can say which items failed and why."""

    KEEP = 5

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def notify(self, event: object) -> None:
        if isinstance(event, RowsDone) and len(self.items) < self.KEEP:
            for row in event.rows:
                if row.error is not None and len(self.items) < self.KEEP:
                    self.items.append((row.id, row.error))


class _FirstRow:
    """When the first row came, in seconds since this process started (the manifest's
    ``timings.first_row_s``: how long a command took to give its first result, start-up
    included)."""

    def __init__(self) -> None:
        self.age: float | None = None

    def notify(self, event: object) -> None:
        if self.age is None and isinstance(event, RowsDone):
            self.age = process_age_s()

    def timings(self) -> dict[str, float]:
        return {} if self.age is None else {"first_row_s": round(self.age, 3)}


def process_age_s() -> float | None:
    """Seconds since this process started, to the kernel's clock tick (10 ms), or None off
    Linux. (psutil's create_time adds the boot time in whole seconds: up to 1 s off.)"""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None
