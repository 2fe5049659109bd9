"""A job's tables and the loaded :class:`Job`: what a job file says, once read and checked.

:mod:`batchinfer.evaluate.job` reads and checks the file (``load_job``); this module holds
what it makes, so that the evaluation's steps and the scorers can name a Job without
importing the loader (which asks the scorers for their metrics).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinfer.bounds import Bounds
from batchinfer.errors import BatchinferError, ConfigError
from batchinfer.options import (
    ITEMS,
    TOPK_MAX,
    DetectOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    option,
)


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
    keypoint_sigmas: tuple[float, ...] | None = option(
        None,
        "Pose jobs: the OKS sigma of each keypoint, in the model's keypoint order (default: "
        "COCO's 17 person keypoints' sigmas).",
        bounds=Bounds(0, 100, above=True, why="a sigma is a fraction of the object's scale"),
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

    def missing(self, key: str, path: Path, what: str) -> JobError:
        """The error of a path the job names that does not exist (``what`` it must be)."""
        return self.error(
            f"{key} {path} does not exist; it must be {what} (relative paths are relative to "
            f"the job file's folder, {self.folder}).",
            key,
        )

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


#: Gates whose ``max_drop`` may take ``alpha``: the metric -> the p-value that decides
#: whether a drop is significant (McNemar's for top-1, the paired image bootstrap's for mAP).
SIGNIFICANCE = {"top1": "mcnemar_p", "map50_95": "map_bootstrap_p", "map50": "map50_bootstrap_p"}
