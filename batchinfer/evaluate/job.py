"""Job files: one nightly accuracy evaluation, as a TOML file, read and checked on load.

A job names the device model and its runtime settings, the dataset, an optional float
reference model with its own runtime and preprocessing, the metrics, the gates and where
the outputs go (docs/reference/jobs.md has every key). The runtime, preprocessing and
reliability tables are the option groups of :mod:`batchinfer.options`, read with
:func:`~batchinfer.options.from_mapping`, so their keys, types and defaults are the CLI's.

Every problem is one :class:`JobError` line that names the job file and the key, with
field names rendered as the job file's keys (``device.runtime.cores``, not ``--cores``).
Relative paths resolve against the job file's folder.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import glob
import hashlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinfer.bounds import Bounds
from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.shards import is_shard_spec
from batchinfer.data.whole_file import JOB_BOUND, NESTING_ERRORS, read_whole
from batchinfer.errors import BatchinferError, ConfigError
from batchinfer.evaluate.metrics import Metric, builtin_metrics
from batchinfer.messages import setting
from batchinfer.options import (
    ITEMS,
    TOPK_MAX,
    DetectOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    from_mapping,
    option,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class JobError(ConfigError):
    """A job file is wrong (exit 2); the message names the file and the key."""


# --------------------------------------------------------------------------- the tables
@dataclass(frozen=True)
class ModelSettings:
    """``[device]`` and ``[reference]``: a model and how it runs."""

    model: Path | None = option(None, "The model file (.rknn or .onnx).", path=True)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    preprocess: PreprocessOptions = field(default_factory=PreprocessOptions)
    reliability: ReliabilityOptions = field(default_factory=ReliabilityOptions)
    detect: DetectOptions = field(default_factory=DetectOptions)  # [device.detect]: the task


@dataclass(frozen=True)
class RaySettings:
    """``[device.ray]``: run the device model on a Ray cluster (the reference stays here)."""

    address: str | None = option(
        None,
        "A Ray cluster: auto or HOST:PORT (a running cluster; evaluate on its head node), "
        "local or local:N (N simulated nodes on this machine); default: this board only.",
    )
    data: str = option(
        "head",
        "head (the dataset is on this node; tensors are shipped) or shared (every node "
        "mounts it at the same path and reads its share).",
        choices=("head", "shared"),
    )


@dataclass(frozen=True)
class DeviceSettings(ModelSettings):
    """``[device]``: the model under test; ``[device.ray]`` may put it on a cluster."""

    ray: RaySettings = field(default_factory=RaySettings)


@dataclass(frozen=True)
class DatasetSettings:
    """``[dataset]``: the items and their classes."""

    path: Path | None = option(
        None,
        "The dataset: a folder (images or .npy; class subfolders give labels), a list file "
        "(.txt/.csv/.jsonl/.parquet), a COCO .json, a data.yaml or a glob.",
        path=True,
    )
    labels: Path | None = option(
        None,
        "Class names, one per line (line n is class n); default: the class folder names.",
        path=True,
    )
    limit: int | None = option(None, "Only the first N items of the dataset.", bounds=ITEMS)
    image_root: Path | None = option(
        None,
        "Where the relative paths of a list file or COCO JSON given as path start "
        "(default: the list's folder).",
        path=True,
    )
    ground_truth: Path | None = option(
        None,
        "Detection jobs: the boxes, a COCO instances .json file or a folder of YOLO .txt "
        "labels (matched to the images by path, else by name).",
        path=True,
    )
    images_without_labels: str = option(
        "unmatched",
        "Detection jobs with YOLO labels: an image without a .txt file is 'unmatched' (not "
        "scored, counted) or 'empty' (an image with no objects, as Ultralytics reads it).",
        choices=("unmatched", "empty"),
    )


@dataclass(frozen=True)
class MetricsSettings:
    """``[metrics]``: what is scored beyond the built-in metrics."""

    topk: int = option(
        5, "k of the top-k accuracy (classes kept per item).", bounds=Bounds(1, TOPK_MAX)
    )
    worst: int = option(
        12, "How many worst items the report and summary name.", bounds=Bounds(0, 1000)
    )
    custom: tuple[str, ...] = option(
        (),
        "Custom metrics, 'module:function' or 'file.py:function' (relative to the job "
        "file); the function gets the rows and returns {name: value}.",
    )
    bootstrap: int = option(
        1000,
        "Detection jobs: resamples of the paired image bootstrap that compares mAP with the "
        "reference and the baseline.",
        bounds=Bounds(1, 100_000, why="each resample re-scores every image"),
    )
    seed: int = option(
        0,
        "Detection jobs: the bootstrap's seed (the same seed, the same answer).",
        bounds=Bounds(0, 2**32 - 1, why="numpy's seeds are 32-bit"),
    )
    display_conf: float = option(
        0.25,
        "Detection jobs: the report draws the boxes scoring at least this (the job's "
        "detect.conf, 0.001 for mAP, keeps every low-score box).",
        bounds=Bounds(0, 1),
    )


@dataclass(frozen=True)
class GateSettings:
    """``[gates.METRIC]``: the limits one metric must meet (finite numbers, all of them)."""

    # Metrics differ in range (accuracies, cosines, counts, custom): any finite number.
    min: float | None = option(
        None, "Absolute floor: the metric must be at least this.", bounds=Bounds()
    )
    max: float | None = option(
        None, "Absolute ceiling (for counts such as errors).", bounds=Bounds()
    )
    max_drop: float | None = option(
        None,
        "At most this much below the baseline's value (the last accepted run).",
        bounds=Bounds(0),
    )
    alpha: float | None = option(
        None,
        "With max_drop on top1: a drop fails only when McNemar's test on per-item "
        "correctness finds it significant at this level (e.g. 0.05).",
        bounds=Bounds(0, 1, above=True, below=True),
    )
    min_ratio_to_reference: float | None = option(
        None,
        "At least this share of the float reference's value (e.g. 0.99).",
        bounds=Bounds(0, above=True),
    )


@dataclass(frozen=True)
class OutputSettings:
    """``[output]``: where the evaluation writes (one folder unless said otherwise)."""

    dir: Path | None = option(
        None, "The job's output folder (default: eval/<name> beside the job file).", path=True
    )
    history: Path | None = option(None, "History table (default: <dir>/history.parquet).")
    baseline: Path | None = option(None, "Baseline folder (default: <dir>/baseline).")
    report: Path | None = option(None, "HTML report (default: <dir>/report.html).")
    summary: Path | None = option(None, "Markdown summary (default: <dir>/summary.md).")
    cache: Path | None = option(None, "Reference cache folder (default: <dir>/cache).")


# --------------------------------------------------------------------------- the job
@dataclass(frozen=True)
class Gate:
    """The limits on one metric (``[gates.METRIC]``)."""

    metric: str
    min: float | None = None
    max: float | None = None
    max_drop: float | None = None
    alpha: float | None = None
    min_ratio_to_reference: float | None = None


@dataclass(frozen=True)
class Outputs:
    """Resolved output locations."""

    dir: Path
    history: Path
    baseline: Path
    report: Path
    summary: Path
    cache: Path

    @property
    def evals(self) -> Path:
        """Per-evaluation records: ``evals/<id>/items.parquet`` and ``result.json``."""
        return self.dir / "evals"

    def folders(self) -> list[Path]:
        """Every folder an evaluation writes into (each gets the lock)."""
        folders = {self.dir, self.history.parent, self.baseline, self.report.parent}
        folders |= {self.summary.parent, self.cache}
        return sorted(folders)


@dataclass(frozen=True)
class Job:
    """A loaded, checked job file."""

    path: Path  # as the user named it (messages show this)
    name: str
    device: DeviceSettings
    reference: ModelSettings | None
    dataset: DatasetSettings
    metrics: MetricsSettings
    gates: tuple[Gate, ...]
    outputs: Outputs
    sha256: str  # of the job file's bytes
    task: str = "classify"  # or "detect" (top-level ``task``)

    @property
    def folder(self) -> Path:
        return Path(os.path.abspath(self.path)).parent

    def error(self, message: str, *fields: str) -> JobError:
        """A JobError about this job file (the message names the key)."""
        return JobError(f"{self.path}: {message}", *fields)

    def key_of(self, side: str) -> Callable[[str], str]:
        """Render the engine's field names as this job's keys for ``side`` (device/reference)."""
        return lambda name: job_key(side, name)

    def in_job(self, error: BatchinferError, side: str) -> BatchinferError:
        """``error`` (same class and exit code) with the file named and job keys for fields."""
        return reraise_in_job(error, self.path, self.key_of(side))


_SIDE_GROUPS = ("runtime", "preprocess", "reliability", "detect")
_FLAT = {
    "output.topk": "metrics.topk",
    "dataset": "dataset.path",
    "limit": "dataset.limit",
    "image_root": "dataset.image_root",
    "ray": "device.ray.address",
    "ray_data": "device.ray.data",
}


def job_key(side: str, name: str) -> str:
    """The job file's key for an engine field (``runtime.cores`` -> ``device.runtime.cores``)."""
    if name.split(".")[0] in _SIDE_GROUPS or name == "model":
        return f"{side}.{name}"
    return _FLAT.get(name, name)


def reraise_in_job(error: BatchinferError, job: Path, name: Callable[[str], str]) -> Any:
    """A copy of ``error`` whose message starts with the job file and names job keys."""
    text = error.render(name)
    if not text.startswith(f"{job}:"):
        text = f"{job}: {text}"
    new = copy.copy(error)
    new.args = (text,)
    return new


_TOP = ("name", "task", "device", "reference", "dataset", "metrics", "gates", "output")
TASKS = ("classify", "detect")

#: Gates whose ``max_drop`` may take ``alpha``: the metric -> the p-value that decides
#: whether a drop is significant (McNemar's for top-1, the paired image bootstrap's for mAP).
SIGNIFICANCE = {"top1": "mcnemar_p", "map50_95": "map_bootstrap_p", "map50": "map50_bootstrap_p"}
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _unknown(job: Path, key: str, known: tuple[str, ...] | list[str], where: str = "") -> JobError:
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {(where + '.') if where else ''}{close[0]}?" if close else ""
    listed = ", ".join(known)
    return JobError(f"{job}: {full} is not a key of {where or 'a job file'} ({listed}){hint}", full)


def _table(job: Path, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise JobError(f"{job}: {key} must be a table ([{key}]), not {value!r}.", key)
    return value


def load_job(path: Path | str) -> Job:
    """Read and check the job file at ``path``; JobError (exit 2) naming file and key.

    Gates are checked against the metric registry (metrics.py), so that a gate on an
    unknown metric is refused here, before anything runs.
    """
    path = Path(path)
    raw = read_whole(
        path,
        "job file",
        JOB_BOUND,
        error=JobError,
        hint="pass the path of a TOML job file such as jobs/digits.toml",
    )
    try:
        # utf-8-sig: a byte-order mark (Notepad's "UTF-8 with BOM") is dropped, as every
        # other file batchinfer reads drops it; tomllib alone says line 1 is invalid.
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except ValueError as exc:  # not UTF-8, not TOML, or an integer of thousands of digits
        raise JobError(f"{path}: not valid TOML ({parse_problem(exc)}); fix the file.") from None
    except NESTING_ERRORS:  # tomllib parses nested arrays and inline tables recursively
        raise JobError(
            f"{path}: arrays or inline tables nested too deeply to read; a job file's values "
            "are nested a few levels at most, fix the file."
        ) from None

    folder = Path(os.path.abspath(path)).parent

    def resolve(p: Path) -> Path:
        return Path(os.path.abspath(folder / p.expanduser()))

    for key in data:
        if key not in _TOP:
            raise _unknown(path, key, _TOP)
    try:
        name = data.get("name", path.stem)
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ConfigError(
                setting("name")
                + f" must be a short name of letters, digits, '.', '_' or '-', not {name!r}.",
                "name",
            )
        task = data.get("task", "classify")
        if task not in TASKS:
            raise ConfigError(
                setting("task") + f' must be "classify" or "detect", not {task!r}.', "task"
            )
        device = from_mapping(DeviceSettings, _table(path, data, "device"), "device", resolve)
        reference = None
        if "reference" in data:
            reference = from_mapping(
                ModelSettings, _table(path, data, "reference"), "reference", resolve
            )
        dataset = from_mapping(DatasetSettings, _table(path, data, "dataset"), "dataset", resolve)
        metrics = from_mapping(MetricsSettings, _table(path, data, "metrics"), "metrics", resolve)
        output = from_mapping(OutputSettings, _table(path, data, "output"), "output", resolve)
        gates_table = _table(path, data, "gates")
        gates = []
        for metric, table in gates_table.items():
            settings = from_mapping(GateSettings, table, f"gates.{metric}", resolve)
            gates.append(Gate(metric, **dataclasses.asdict(settings)))
    except JobError:
        raise
    except ConfigError as exc:
        raise JobError(f"{path}: {exc}", *exc.fields) from None

    job = Job(
        path=path,
        name=name,
        device=device,
        reference=reference,
        dataset=dataset,
        metrics=metrics,
        gates=(),
        outputs=_outputs(output, folder, name),
        sha256=hashlib.sha256(raw).hexdigest(),
        task=task,
    )
    _check_files(job)
    _check_metrics(job)
    _check_detection(job)
    gates = _check_gates(job, gates, job_metrics(job))
    return dataclasses.replace(job, gates=tuple(gates))


def _outputs(output: OutputSettings, folder: Path, name: str) -> Outputs:
    base = output.dir or Path(os.path.abspath(folder / "eval" / name))
    return Outputs(
        dir=base,
        history=output.history or base / "history.parquet",
        baseline=output.baseline or base / "baseline",
        report=output.report or base / "report.html",
        summary=output.summary or base / "summary.md",
        cache=output.cache or base / "cache",
    )


def _missing(job: Job, key: str, path: Path, what: str) -> JobError:
    return job.error(
        f"{key} {path} does not exist; it must be {what} (relative paths are relative to "
        f"the job file's folder, {job.folder}).",
        key,
    )


def _check_files(job: Job) -> None:
    sides = [("device", job.device)] + ([("reference", job.reference)] if job.reference else [])
    for side, settings in sides:
        if settings.model is None:
            raise job.error(f"{side}.model is missing; name the .rknn or .onnx file.", "model")
        if not settings.model.is_file():
            raise _missing(job, f"{side}.model", settings.model, "a .rknn or .onnx file")
    ds = job.dataset
    if ds.path is None:
        raise job.error("dataset.path is missing; name the dataset folder.", "dataset.path")
    if not ds.path.exists() and not glob.has_magic(str(ds.path)) and not is_shard_spec(ds.path):
        raise _missing(  # shards are checked when they are listed
            job,
            "dataset.path",
            ds.path,
            "a folder of images or .npy tensors, a list file, a COCO .json, a data.yaml, a "
            "glob or tar shards",
        )
    if job.task == "detect" and is_shard_spec(ds.path):
        raise job.error(
            "dataset.path names tar shards, which detection jobs do not read yet (their "
            "ground truth names image files); extract them into a folder.",
            "dataset.path",
        )
    if ds.labels is not None and not ds.labels.is_file():
        raise _missing(job, "dataset.labels", ds.labels, "a text file with one class per line")
    from batchinfer.evaluate.history import history_problem  # pyarrow: only once it is needed

    problem = history_problem(job.outputs.history)
    if problem is not None:  # refused now: the evaluation would append to it after its runs
        raise job.error(
            f"output.history {job.outputs.history} is {problem}; move it aside (a new one "
            "is then started) or name another file.",
            "output.history",
        )


def _check_metrics(job: Job) -> None:
    m = job.metrics
    for spec in m.custom:
        target, _, function = spec.rpartition(":")
        if not target or not function.isidentifier():
            raise job.error(
                f"metrics.custom {spec!r} is not 'module:function' or 'file.py:function'.",
                "metrics.custom",
            )
        if target.endswith(".py"):
            file = Path(os.path.abspath(job.folder / target))
            if not file.is_file():
                raise _missing(job, "metrics.custom", file, "a Python file")


def job_metrics(job: Job) -> dict[str, Metric]:
    """The built-in metrics of the job's task."""
    if job.task == "detect":
        from batchinfer.evaluate.detection_metrics import detection_metrics

        return detection_metrics()
    return builtin_metrics(job.metrics.topk)


def _check_detection(job: Job) -> None:
    """A detection job has ground truth and detectors; a classification job has neither."""
    ds, key = job.dataset, "dataset.ground_truth"
    if job.task != "detect":
        if ds.ground_truth is not None:
            raise job.error(
                f'{key} is for detection jobs; add task = "detect" at the top of the file '
                "(or drop the key).",
                key,
            )
        return
    if ds.ground_truth is None:
        raise job.error(
            f"{key} is missing; a detection job needs the boxes: a COCO instances .json "
            "file or a folder of YOLO .txt labels.",
            key,
        )
    if not ds.ground_truth.exists():
        raise _missing(job, key, ds.ground_truth, "a COCO .json file or a YOLO labels folder")
    from batchinfer.evaluate.detection import require_scoring  # numpy: only for detection jobs

    require_scoring()
    sides = [("device", job.device)] + ([("reference", job.reference)] if job.reference else [])
    for side, settings in sides:
        if settings.detect.task not in ("auto", "detect"):
            raise job.error(
                f'{side}.detect.task is "{settings.detect.task}" in a detection job; drop it '
                '(the task is the job\'s: task = "detect").',
                f"{side}.detect.task",
            )
    if job.metrics.bootstrap < 1:
        raise job.error(
            f"metrics.bootstrap must be at least 1, not {job.metrics.bootstrap}.",
            "metrics.bootstrap",
        )


def _check_gates(job: Job, gates: list[Gate], builtin: Mapping[str, Metric]) -> list[Gate]:
    """Gates checked against the metric registry; an ``errors`` gate (max 0) is always there."""
    for gate in gates:
        key = f"gates.{gate.metric}"
        limits = {f.name for f in dataclasses.fields(GateSettings)}
        if all(getattr(gate, name) is None for name in limits):
            raise job.error(f"{key} sets no limit; give one of {', '.join(sorted(limits))}.", key)
        metric = builtin.get(gate.metric)
        if metric is None and not job.metrics.custom:
            known = sorted(builtin)
            close = difflib.get_close_matches(gate.metric, known, n=1, cutoff=0.6)
            hint = f"; did you mean gates.{close[0]}?" if close else ""
            raise job.error(
                f"{key}: there is no metric {gate.metric!r} (metrics: {', '.join(known)}){hint}",
                key,
            )
        needs = metric.needs if metric is not None else ""
        if needs == "reference" and job.reference is None:
            raise job.error(
                f"{key}: {gate.metric} compares with the float reference, and the job has no "
                "[reference]; add one, or drop the gate.",
                key,
            )
        if gate.min_ratio_to_reference is not None:
            if job.reference is None:
                raise job.error(
                    f"{key}.min_ratio_to_reference needs a [reference] model; add one, or "
                    "drop the limit.",
                    f"{key}.min_ratio_to_reference",
                )
            if metric is not None and not metric.comparable:
                raise job.error(
                    f"{key}.min_ratio_to_reference: the reference has no {gate.metric} of "
                    "its own; use it on an accuracy metric (top1, top5, class_top1_min) or "
                    "a custom metric.",
                    f"{key}.min_ratio_to_reference",
                )
        if gate.alpha is not None and (gate.metric not in SIGNIFICANCE or gate.max_drop is None):
            test = (
                "gates.map50_95 or gates.map50 with max_drop (the paired image bootstrap of mAP)"
                if job.task == "detect"
                else "gates.top1 with max_drop (McNemar's test is on per-item top-1 correctness)"
            )
            raise job.error(
                f"{key}.alpha applies to {test}; move it there, or drop it.", f"{key}.alpha"
            )
        if gate.max_drop is not None and metric is not None and metric.better != "higher":
            raise job.error(
                f"{key}.max_drop: lower is better for {gate.metric}; use max instead.",
                f"{key}.max_drop",
            )
    if not any(g.metric == "errors" for g in gates):
        gates.append(Gate("errors", max=0))
    return gates
