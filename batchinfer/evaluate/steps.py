"""The steps of evaluation.py's one pipeline that do not depend on the task: check the
outputs, lock the job's output folders, run the device side on its cluster, score the
metrics, name the record's folder, say where items' pictures are. What depends on the task
is the scorer's (evaluate/scoring.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.data.dataset import Dataset, Member
from batchinfer.data.shards import ShardSet
from batchinfer.data.sources import open_source
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.data.video.ids import split_frame_id
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.errors import (
    BatchinferError,
    OutputLockedError,
    OutputWriteError,
    RunFailedError,
)
from batchinfer.evaluate.files import REPORT_MARK, SUMMARY_MARK, not_ours, write_bytes
from batchinfer.evaluate.gates import Verdict
from batchinfer.evaluate.jobspec import Job
from batchinfer.evaluate.metrics import (
    CustomMetric,
    CustomMetricError,
    load_custom,
    score,
)
from batchinfer.evaluate.runs import SidePlan, SideRun
from batchinfer.options_video import video_settings
from batchinfer.sink.outdir import OutLock, lock_holder

if TYPE_CHECKING:
    from batchinfer.cluster import ClusterSession

log = logging.getLogger("batchinfer")

RECORD = "result.json"
ITEMS = "items.parquet"


class EvalLockedError(RunFailedError):
    """Another evaluation holds one of the job's output folders (exit 3: nothing ran)."""


@dataclass
class Evaluation:
    """What one evaluation found and wrote."""

    job: Job
    eval_id: str
    verdict: Verdict
    metrics: dict[str, float]
    record: dict[str, Any]
    record_dir: Path
    report: Path | None
    summary: str
    baseline: dict[str, Any] | None  # the record of the baseline accepted now, if any

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict.passed else 1


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


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


# --------------------------------------------------------------------------- the lock
@contextlib.contextmanager
def output_locks(job: Job, command: str) -> Iterator[None]:
    """Hold the lock of every folder the job writes to, or refuse at once (exit 3)."""
    held: list[OutLock] = []
    try:
        for folder in job.outputs.folders():
            lock = OutLock(folder, command=command)
            try:
                lock.acquire()
            except OutputLockedError:
                holder = lock_holder(folder) or {}
                who = ", ".join(
                    f"{k} {holder[k]}" for k in ("pid", "host", "started_at") if holder.get(k)
                )
                what = f" ({who}: {holder['command']})" if holder.get("command") else ""
                raise EvalLockedError(
                    f"{folder} is in use by another evaluation{what}; it was not started "
                    "again. Wait for that one to finish (or give this job other output "
                    "folders)."
                ) from None
            except OutputWriteError as exc:
                raise OutputWriteError(
                    f"cannot lock {folder} ({exc.__cause__ or exc}); fix the permissions of "
                    f"{job.path}'s output folders."
                ) from None
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


# --------------------------------------------------------------------------- the inputs
def custom_metrics(job: Job) -> list[CustomMetric]:
    """The job's ``metrics.custom`` functions, loaded; one that cannot be is the job's error."""
    custom = []
    for spec in job.metrics.custom:
        try:
            custom.append(load_custom(spec, job.folder))
        except CustomMetricError as exc:
            raise job.error(f"metrics.custom {spec!r}: {exc}.", "metrics.custom") from None
    return custom


def open_job_dataset(job: Job) -> Dataset:
    """The job's dataset, opened; one that cannot be is the job's error (``dataset.path``)."""
    try:
        return open_source(
            job.dataset.path,  # type: ignore[arg-type]
            image_root=job.dataset.image_root,
            video=video_settings(job.device.preprocess),  # a video's sampling: the device's
        )
    except BatchinferError as exc:
        raise job.error(f"dataset.path: {exc}", "dataset.path") from None


# --------------------------------------------------------------------------- the report
def no_report(exc: ImportError) -> None:
    """Say that no HTML report is written because its plotting library is missing."""
    log.warning(
        f"no HTML report: {exc.name or 'matplotlib'} is not installed (pip install "
        "'batchinfer[plot]'); the summary and history are written."
    )


def write_report(job: Job, record_dir: Path, page: str) -> Path:
    """The HTML report, written in the record folder and at the job's report path."""
    data = page.encode()
    write_bytes(record_dir / "report.html", data)
    write_bytes(job.outputs.report, data)
    return job.outputs.report


# --------------------------------------------------------------------------- the cluster
def check_cluster(job: Job) -> None:
    """Before anything runs: a malformed ``[device.ray]`` address, or no Ray installed."""
    if job.device.ray.address is not None:
        from batchinfer.cluster.connect import import_ray, parse_address

        parse_address(job.device.ray.address)
        import_ray()


@contextlib.contextmanager
def device_cluster(
    job: Job, plan: SidePlan, signals: StopSignals
) -> Iterator[ClusterSession | None]:
    """The Ray cluster the device side runs on (``[device.ray]`` or ``--ray``), or None."""
    ray = job.device.ray
    if ray.address is None:
        yield None
        return
    from batchinfer.cluster import connect_cluster

    with connect_cluster(ray.address, plan.engine, signals, ray.data) as cluster:
        yield cluster


def score_metrics(
    job: Job, inputs: Any, registry: dict, custom: list[CustomMetric]
) -> dict[str, float]:
    try:
        metrics = score(inputs, registry, custom)
    except CustomMetricError as exc:
        raise job.error(f"metrics.custom {exc}.", "metrics.custom") from None
    for gate in job.gates:
        if gate.metric not in registry and gate.metric not in metrics:
            produced = sorted(k for k in metrics if k not in registry and "." not in k)
            raise job.error(
                f"gates.{gate.metric}: no metric of that name was computed (custom metrics "
                f"gave: {', '.join(produced) or 'nothing'}); fix the gate's name.",
                f"gates.{gate.metric}",
            )
    return metrics


def new_record_dir(job: Job, date: dt.datetime) -> tuple[str, Path]:
    """(evaluation id, its record folder, not yet made): the UTC date, -2, -3... if taken."""
    stamp = date.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    eval_id, n = stamp, 1
    while (job.outputs.evals / eval_id).exists():
        n += 1
        eval_id = f"{stamp}-{n}"
    return eval_id, job.outputs.evals / eval_id


def side_facts(plan: Any, run: SideRun | None) -> dict[str, Any] | None:
    """What a side ran on, as the record keeps it (None when it did not run)."""
    if plan is None or run is None:
        return None
    api, drv = run.versions
    result = run.result
    engine = plan.engine
    return {
        "model": str(plan.model),
        "model_sha256": plan.model_sha256,
        "backend": engine.backend.name,
        "backend_settings": result.backend if result else None,
        "runtime_version": api,
        "driver_version": drv,
        "cores": list(engine.cores),
        "instances_per_core": (run.instances or engine).instances_per_core,
        **(
            {"instances_auto": run.instances.instances_choice}
            if run.instances is not None and run.instances.instances_choice
            else {}
        ),
        "preprocess": plan.fingerprint["preprocess"],
        "cached": run.cached,
        "warnings": [] if result is None else list(result.warnings),
        "retired_cores": [] if result is None else list(result.retired_cores),
        "core_stats": run.core_stats,
    }


# --------------------------------------------------------------------------- pictures
def item_places(dataset: Dataset, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Where the report finds a few items' pictures: id -> ``{"path": file}``, for a tar
    shard's member ``{"path": shard, "member": {"offset", "size", "name"}}``, for a video's
    frame ``{"path": video, "frame": index, "size": the video's bytes as the run read it,
    "autorotate": whether its frames were turned}`` (evaluate/thumbnails.py reads each). A list's
    ids need not be paths
    (``Dataset.paths_of``); a shard set's members are found by listing its shards (headers
    only, once per report)."""
    if not ids:
        return {}
    if isinstance(dataset, ShardSet):
        wanted, found = set(ids), {}
        for item in dataset:
            m = item.member
            if item.id in wanted and isinstance(m, Member) and m.fault is None:
                member = {"offset": m.offset, "size": m.size, "name": m.name}
                found[item.id] = {"path": item.path, "member": member}
                if len(found) == len(wanted):
                    break
        return found
    places: dict[str, dict[str, Any]] = {
        ident: {"path": path} for ident, path in dataset.paths_of(ids).items()
    }
    if isinstance(dataset, VideoDataset):  # its size then: the picture is of that file
        sizes = {v.item.path: v.info.size for v in dataset.videos if v.info is not None}
        for ident, place in places.items():
            video_frame = split_frame_id(ident)  # paths_of gives only frame ids here
            if video_frame is not None:
                place.update(
                    frame=video_frame[1],
                    size=sizes.get(place["path"]),
                    autorotate=dataset.settings.autorotate,
                )
    return places
