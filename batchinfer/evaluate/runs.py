"""The device model and the float reference, each through the engine, into per-item results
(the job's scorer makes them of the rows: ItemResults, DetectionItems).

Each side is planned like a main run (``plan_inference``: the same checks and defaults), then
run as ``Engine(DatasetSource, MemorySink(keep_outputs=True))``: rows stay in memory,
outputs included, because cosine similarity needs them. Memory is about items x output
size x 4 bytes per side (1,797 x 10 floats for the demo; 50,000 x 1,000 is 200 MB).

The reference rarely changes, so its results are cached in the job's cache folder under
a fingerprint of everything that decides them: the model file (and the files a runtime
reads beside a .rknn), the backend, the preprocessing, top-k, the dataset folder, its
listing (every item's name in order), every item's size and modification time, and the
item limit. A reference run with error rows is not cached (its next run may succeed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.data.dataset import Dataset
from batchinfer.data.fingerprint import files_sha256
from batchinfer.engine import Engine, RunConfig
from batchinfer.engine.board.instance_probe import settle_instances
from batchinfer.engine.events import Observer
from batchinfer.engine.planning.interface import EnginePlan, EngineResult
from batchinfer.engine.planning.plan import plan_inference, runtime_files
from batchinfer.engine.planning.plan_records import engine_preprocess_record, preprocess_values
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.engine.sources import DatasetSource
from batchinfer.errors import BatchinferError, RunInterrupted
from batchinfer.evaluate.files import write_table
from batchinfer.evaluate.items import ItemResults
from batchinfer.evaluate.jobspec import Job, ModelSettings
from batchinfer.options import OutputOptions
from batchinfer.sink.fingerprint import run_fingerprint
from batchinfer.sink.manifest import model_sha256
from batchinfer.sink.rows import MemorySink
from batchinfer.sink.stats import CoreStatsRecorder
from batchinfer.tasks.detect import NotADetectorError

if TYPE_CHECKING:  # Ray is an optional extra: imported only when a job runs on a cluster
    from batchinfer.cluster import ClusterEngine, ClusterSession

log = logging.getLogger("batchinfer")

#: Bump when the cache file's layout changes: older caches are then not used.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class SidePlan:
    """One side (``device`` or ``reference``), planned: nothing has run yet."""

    side: str
    model: Path
    model_sha256: str
    engine: EnginePlan
    fingerprint: dict[str, Any]


@dataclass
class SideRun:
    """One side's results."""

    items: Any  # the scorer's per-item results (ItemResults, DetectionItems)
    result: EngineResult | None  # None: the reference came from the cache
    core_stats: list[dict[str, Any]]
    cached: bool = False
    instances: EnginePlan | None = None  # the plan run, instances per core chosen (-k auto)

    @property
    def versions(self) -> tuple[str | None, str | None]:
        """(runtime API version, driver version) as the runtime reported them."""
        if self.result is None:
            return None, None
        texts = [t for t in self.result.sdk_versions.values() if t]
        return sdk_versions(texts[0]) if texts else (None, None)


def sdk_versions(text: str) -> tuple[str | None, str | None]:
    """The ``API:`` and ``DRV:`` parts of a get_sdk_version() banner."""
    api = drv = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("API:") and api is None:
            api = line[4:].strip()
        elif line.startswith("DRV:"):
            drv = line[4:].strip() if drv is None else f"{drv}; {line[4:].strip()}"
    return api, drv


def dataset_stat_sha256(dataset: Dataset, limit: int | None) -> str:
    """sha256 over every item's name, size and mtime: a cheap "has any file changed"."""
    return files_sha256(dataset, "stat", limit)


def plan_side(job: Job, side: str, settings: ModelSettings, dataset: Dataset) -> SidePlan:
    """Check one side's model and settings (JobError-style messages with the job's keys)."""
    assert settings.model is not None  # load_job checked it
    detect, labels = settings.detect, None
    if job.task != "classify":  # the job's box task; dataset.labels names its classes
        detect = dataclasses.replace(detect, task=job.task)
        labels = job.dataset.labels
    config = RunConfig(
        dataset=dataset.root,
        model=settings.model,
        runtime=settings.runtime,
        preprocess=settings.preprocess,
        output=OutputOptions(topk=job.metrics.topk),
        reliability=settings.reliability,
        detect=detect,
        limit=job.dataset.limit,
        labels=labels,
    )
    try:
        engine = plan_inference(config, dataset, model=settings.model).engine
        raw = not (engine.classifies or engine.detects)
        if job.task != "detect" and detect.task == "auto" and raw:
            # A classification job scores the first output's top-1 whatever else the model
            # returns; a raw run's rows would have none (a detector is refused later).
            classify = dataclasses.replace(detect, task="classify")
            config = dataclasses.replace(config, detect=classify)
            engine = plan_inference(config, dataset, model=settings.model).engine
        backend = engine.backend
        # Per-core metrics compare cores: none may take the first items alone while the
        # others start (datasets are often in class order).
        engine = dataclasses.replace(engine, cores_start_together=True)
        sha = model_sha256(settings.model)
    except NotADetectorError as exc:
        if job.task != "detect":
            raise job.in_job(exc, side) from None
        # The engine's advice (another detect.task) is no way out here: the job's task is
        # what asked for detection, and a detection job refuses any other detect.task.
        other = (
            ', or drop task = "detect" to evaluate it as a classifier' if exc.could_classify else ""
        )
        raise job.error(
            f"{side}.model: {exc.why} A detection job "
            f'(task = "detect") scores detectors: point {side}.model at one{other}.',
            "model",
        ) from None
    except BatchinferError as exc:
        raise job.in_job(exc, side) from None
    preprocess = preprocess_values(engine.preprocess)
    if engine.feeds:  # what feeds each model input (a single-input record stays as it was)
        preprocess["inputs"] = engine_preprocess_record(engine)["inputs"]
    fingerprint = run_fingerprint(
        model_sha256=sha,
        runtime_files=runtime_files(settings.model),
        backend=backend.name,
        preprocess=preprocess,
        topk=job.metrics.topk,
        save_outputs=True,
        dataset_root=dataset.location,
        dataset_items=len(dataset),
        dataset_listing_sha256=dataset.listing_sha256,
        task=engine.task.fingerprint() if engine.task is not None else None,
    )
    fingerprint["limit"] = job.dataset.limit
    if side == "reference":  # cached: a file replaced under the same name must count
        fingerprint["dataset_stat_sha256"] = dataset_stat_sha256(dataset, job.dataset.limit)
    if backend.name == "sim":  # emulated faults change outputs (skew)
        fingerprint["sim_faults"] = list(settings.runtime.sim.faults)
    return SidePlan(side, settings.model, sha, engine, fingerprint)


def run_side(
    job: Job,
    plan: SidePlan,
    dataset: Dataset,
    signals: StopSignals,
    observers: Sequence[Observer],
    collect: Callable[[MemorySink], Any],
    cluster: ClusterSession | None = None,
) -> SideRun:
    """Run one side over the dataset through the engine; raises if the run did not complete.

    ``collect``: makes the side's items of the rows (the scorer's ``collect``).
    ``cluster``: run it on that Ray cluster's nodes (rows and core stats then name the node).
    """
    engine_plan = plan.engine if cluster is not None else settle_instances(plan.engine)
    sink = MemorySink(keep_outputs=True)
    source = DatasetSource(dataset, limit=job.dataset.limit)
    engine: Engine | ClusterEngine
    if cluster is not None:
        engine = cluster.engine(engine_plan, source, sink, observers)
    else:
        stats = CoreStatsRecorder(engine_plan.cores, engine_plan.instances_per_core)
        engine = Engine(engine_plan, source, sink, observers, stats=stats)
    signals.engine = engine
    try:
        result = engine.run()
    finally:
        signals.engine = None
        for observer in observers:
            close = getattr(observer, "close", None)
            if callable(close):
                close()
    if result.status == "failed":
        assert result.error is not None
        raise job.in_job(result.error, plan.side) from None
    if result.status == "interrupted":
        raise RunInterrupted(
            f"interrupted during the {plan.side} run; nothing was recorded (no history row, "
            "no report)."
        )
    items = collect(sink)
    return SideRun(items, result, result.stats.table().to_pylist(), instances=engine_plan)


# --------------------------------------------------------------------------- the cache
def cache_key(fingerprint: dict[str, Any]) -> str:
    text = json.dumps({"format": CACHE_FORMAT, **fingerprint}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path(folder: Path, fingerprint: dict[str, Any]) -> Path:
    return folder / f"reference-{cache_key(fingerprint)[:20]}.parquet"


def load_cached(
    folder: Path,
    fingerprint: dict[str, Any],
    read_items: Callable[[pa.Table], Any] = ItemResults.from_table,
) -> Any:
    """The cached reference results for ``fingerprint``, or None (absent, other, unreadable);
    ``read_items`` (the scorer's) makes the items of the table."""
    path = cache_path(folder, fingerprint)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    meta = table.schema.metadata or {}
    if meta.get(b"batchinfer.cache_key", b"").decode() != cache_key(fingerprint):
        return None
    return read_items(table)


def store_cached(folder: Path, fingerprint: dict[str, Any], items: Any) -> Path:
    table = items.to_table(with_outputs=True)
    meta = dict(table.schema.metadata or {})
    meta[b"batchinfer.cache_key"] = cache_key(fingerprint).encode()
    meta[b"batchinfer.fingerprint"] = json.dumps(fingerprint).encode()
    path = cache_path(folder, fingerprint)
    write_table(path, table.replace_schema_metadata(meta))
    return path


def reference_results(
    job: Job,
    plan: SidePlan,
    dataset: Dataset,
    signals: StopSignals,
    observers: Callable[[str], Sequence[Observer]],
    collect: Callable[[MemorySink], Any],
    read_items: Callable[[pa.Table], Any],
) -> SideRun:
    """The reference's results: from the cache when its fingerprint matches, else a run
    (``collect`` and ``read_items``: as :func:`run_side` and :func:`load_cached`)."""
    cached = load_cached(job.outputs.cache, plan.fingerprint, read_items)
    if cached is not None:
        log.info(f"reference: {plan.model.name} from the cache (same model, dataset, settings)")
        return SideRun(cached, None, [], cached=True)
    log.info(f"reference: {plan.model.name} on {plan.engine.backend.name}")
    run = run_side(job, plan, dataset, signals, observers("reference"), collect)
    if run.items.ok.all():
        store_cached(job.outputs.cache, plan.fingerprint, run.items)
    else:
        log.warning(
            f"reference: {int((~run.items.ok).sum())} items failed, so its results are not "
            "cached; they are compared only where both models have a result."
        )
    return run
