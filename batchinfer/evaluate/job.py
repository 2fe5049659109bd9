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

import dataclasses
import difflib
import glob
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.shard_names import is_shard_spec
from batchinfer.data.whole_file import JOB_BOUND, NESTING_ERRORS, read_whole
from batchinfer.errors import ConfigError
from batchinfer.evaluate.jobspec import (
    SIGNIFICANCE,
    DatasetSettings,
    DeviceSettings,
    Gate,
    GateSettings,
    Job,
    JobError,
    MetricsSettings,
    ModelSettings,
    Outputs,
    OutputSettings,
    RaySettings,
    job_key,
    reraise_in_job,
)
from batchinfer.evaluate.scoring import job_tasks, scorer_for
from batchinfer.messages import setting
from batchinfer.options import from_mapping

if TYPE_CHECKING:
    from batchinfer.evaluate.metrics import Metric

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


_TOP = ("name", "task", "device", "reference", "dataset", "metrics", "gates", "output")
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

    Gates are checked against the job's scorer's metrics (evaluate/scoring.py), so that a
    gate on an unknown metric is refused here, before anything runs.
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
        tasks = job_tasks()
        if task not in tasks:
            words = " or ".join(f'"{t}"' for t in tasks)
            raise ConfigError(setting("task") + f" must be {words}, not {task!r}.", "task")
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
    scorer = scorer_for(job)
    scorer.check_job()  # what the job's task needs (detection: its ground truth)
    gates = _check_gates(job, gates, scorer.metrics(), scorer.significance_test)
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


def _check_files(job: Job) -> None:
    sides = [("device", job.device)] + ([("reference", job.reference)] if job.reference else [])
    for side, settings in sides:
        if settings.model is None:
            raise job.error(f"{side}.model is missing; name the .rknn or .onnx file.", "model")
        if not settings.model.is_file():
            raise job.missing(f"{side}.model", settings.model, "a .rknn or .onnx file")
    ds = job.dataset
    if ds.path is None:
        raise job.error("dataset.path is missing; name the dataset folder.", "dataset.path")
    if not ds.path.exists() and not glob.has_magic(str(ds.path)) and not is_shard_spec(ds.path):
        raise job.missing(  # shards are checked when they are listed
            "dataset.path",
            ds.path,
            "a folder of images or .npy tensors, a list file, a COCO .json, a data.yaml, a "
            "glob or tar shards",
        )
    if ds.labels is not None and not ds.labels.is_file():
        raise job.missing("dataset.labels", ds.labels, "a text file with one class per line")
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
                raise job.missing("metrics.custom", file, "a Python file")


def _check_gates(
    job: Job, gates: list[Gate], builtin: Mapping[str, Metric], significance_test: str
) -> list[Gate]:
    """Gates checked against the metric registry; an ``errors`` gate (max 0) is always there.
    ``significance_test``: where ``alpha`` applies, as the refusal of a misplaced one says."""
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
            raise job.error(
                f"{key}.alpha applies to {significance_test}; move it there, or drop it.",
                f"{key}.alpha",
            )
        if gate.max_drop is not None and metric is not None and metric.better != "higher":
            raise job.error(
                f"{key}.max_drop: lower is better for {gate.metric}; use max instead.",
                f"{key}.max_drop",
            )
    if not any(g.metric == "errors" for g in gates):
        gates.append(Gate("errors", max=0))
    return gates


__all__ = [
    "SIGNIFICANCE",
    "DatasetSettings",
    "DeviceSettings",
    "Gate",
    "GateSettings",
    "Job",
    "JobError",
    "MetricsSettings",
    "ModelSettings",
    "OutputSettings",
    "Outputs",
    "RaySettings",
    "job_key",
    "load_job",
    "reraise_in_job",
]
