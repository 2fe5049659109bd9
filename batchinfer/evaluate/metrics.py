"""The metric registry, custom metrics and the scoring of both, for every task.

Every metric is one named number a gate can name (``[gates.METRIC]``). A task's built-in
metrics are its scorer's (evaluate/scoring.py): classification's in
scorers/classify_metrics.py, detection's in scorers/instances_metrics.py; each is a
:class:`Metric` computed from the scorer's inputs (which hold the device's items, and the
reference's, the baseline's and the core stats when there are). The helpers below are the
parts both compute alike: the check that both sides cover the same items, one row per
core, the run's throughput.

Custom metrics are ``module:function`` or ``file.py:function``: the function gets the
device's per-item results (:class:`~batchinfer.evaluate.items.ItemResults`, a detection
job's :class:`~batchinfer.evaluate.scorers.instances_items.DetectionItems`) and, when the
job has a reference, is called again with the reference's; it returns ``{name: number}``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import RunFailedError
from batchinfer.sink.stats import place_name, place_order


# --------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Metric:
    """One named number computed from a scorer's inputs (None when it cannot be)."""

    name: str
    fn: Callable[[Any], float | None]
    needs: str  # "" | "labels" | "reference" | "baseline"
    help: str
    better: str = "higher"  # or "lower"
    comparable: bool = False  # the reference has a value of its own (gates' min_ratio_to_reference)


# --------------------------------------------------------------------------- shared parts
def same_items(device: Any, reference: Any | None) -> None:
    """RunFailedError unless both sides' results cover the same items."""
    if reference is not None and not np.array_equal(device.index, reference.index):
        raise RunFailedError(
            "the reference and the device results do not cover the same items; delete "
            "the reference cache and run the evaluation again."
        )


class Inputs:
    """What every task's metrics see: the device's per-item results, and the reference's,
    the baseline's and the device run's core stats when there are (a task's inputs add
    what its metrics need: the class map, the ground truth)."""

    def __init__(
        self, device: Any, reference: Any | None, baseline: Any | None, core_stats: list | None
    ) -> None:
        same_items(device, reference)
        self.device = device
        self.reference = reference
        self.baseline = baseline
        self.core_stats = core_stats or []


def core_rows(
    items: Any,
    core_stats: list[dict],
    fields: Callable[[np.ndarray, tuple[str | None, int]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One dict per core that gave results: where, items, errors, the task's ``fields(on,
    place)`` (``on``: the items that core ran), then its throughput and latency.

    A core is (node, core) on a cluster (node None on one board), so that core 2 of one
    board is judged apart from core 2 of the others; ``place`` names it (``node1/2``).
    """
    stats = {(r.get("node"), r["core"]): r for r in core_stats if r.get("core") is not None}
    places = items.places
    keys = sorted({p for p in places if p[1] >= 0} | set(stats), key=place_order)
    ok = items.ok
    rows = []
    for node, core in keys:
        on = np.array([p == (node, core) for p in places], dtype=bool)
        s = stats.get((node, core), {})
        rows.append(
            {
                "core": core,
                "node": node,
                "place": place_name(node, core),
                "items": int((on & ok).sum()),
                "errors": int((on & ~ok).sum()),
                **fields(on, (node, core)),
                "items_per_s": s.get("items_per_s"),
                "p50_ms": s.get("p50_ms"),
                "p99_ms": s.get("p99_ms"),
                "utilization": s.get("utilization"),
            }
        )
    return rows


def core_values(x: Any, key: str) -> list[float]:
    """The cores' values of ``key`` (those that have one)."""
    return [r[key] for r in x.per_core if r[key] is not None]


def worst_cores(x: Any, picks: tuple[tuple[str, str, Callable], ...]) -> dict[str, str]:
    """Which core each per-core metric comes from, for the verdict: ``picks`` are (metric,
    per-core key, min or max)."""
    notes = {}
    for metric, key, pick in picks:
        rows = [r for r in x.per_core if r[key] is not None]
        if len(rows) > 1:
            notes[metric] = f"worst core {pick(rows, key=lambda r: r[key])['place']}"
    return notes


def items_per_s(x: Any) -> float | None:
    """The device run's throughput (its core stats' total row)."""
    total = [r for r in x.core_stats if r.get("core") is None]
    return total[0].get("items_per_s") if total else None


def run_metrics(errors_help: str) -> list[Metric]:
    """Every task's metrics of the run: ``errors``, the items that ended as error rows
    (``errors_help`` says what they cost), and ``items_per_s``."""
    return [
        Metric("errors", lambda x: float((~x.device.ok).sum()), "", errors_help, better="lower"),
        Metric("items_per_s", items_per_s, "", "Device run throughput, items per second."),
    ]


# --------------------------------------------------------------------------- custom metrics
@dataclass(frozen=True)
class CustomMetric:
    """A job's ``module:function`` metric, loaded."""

    spec: str
    fn: Callable[[Any], Mapping[str, float]]


class CustomMetricError(Exception):
    """A custom metric cannot be loaded or returned something unusable (the job's fault)."""


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def load_custom(spec: str, folder: Path) -> CustomMetric:
    """Import ``spec`` (``module:function``, or ``file.py:function`` relative to ``folder``)."""
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(os.path.abspath(folder / target))
            module_name = f"batchinfer_custom_metric_{abs(hash(str(path)))}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as exc:
        raise CustomMetricError(f"cannot import {target} ({type(exc).__name__}: {exc})") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CustomMetricError(f"{target} has no function {name}")
    return CustomMetric(spec, fn)


def run_custom(metric: CustomMetric, items: Any, reserved: set[str]) -> dict[str, float]:
    """Call a custom metric; RunFailedError if it raises, CustomMetricError if its result is bad."""
    try:
        values = metric.fn(items)
    except Exception as exc:
        raise RunFailedError(
            f"custom metric {metric.spec} raised {type(exc).__name__}: {exc}; fix the function "
            "and run the evaluation again."
        ) from exc
    if not isinstance(values, Mapping):
        raise CustomMetricError(f"returned {type(values).__name__}, not {{name: number}}")
    out = {}
    for key, value in values.items():
        if not isinstance(key, str) or not _NAME_RE.fullmatch(key):
            raise CustomMetricError(f"returned the name {key!r}; use letters, digits and _")
        if key in reserved:
            raise CustomMetricError(f"returned {key!r}, which is a built-in metric; rename it")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise CustomMetricError(f"returned {key!r}: {value!r}, not a number")
        out[key] = float(value)
    return out


def score(
    inputs: Any, registry: Mapping[str, Metric], custom: list[CustomMetric]
) -> dict[str, float]:
    """Every metric that can be computed: name -> value; ``reference.<name>`` for the reference.

    CustomMetricError names the custom metric at fault (the caller adds the job's key).
    """
    values: dict[str, float] = {}
    reference = inputs.for_reference() if inputs.reference is not None else None
    for metric in registry.values():
        if metric.needs == "reference" and inputs.reference is None:
            continue
        if metric.needs == "baseline" and inputs.baseline is None:
            continue
        value = metric.fn(inputs)
        if value is not None and math.isfinite(value):
            values[metric.name] = float(value)
        if metric.comparable and reference is not None:
            value = metric.fn(reference)
            if value is not None and math.isfinite(value):
                values[f"reference.{metric.name}"] = float(value)
    for custom_metric in custom:
        try:
            values.update(run_custom(custom_metric, inputs.device, set(registry)))
            if inputs.reference is not None:
                own = run_custom(custom_metric, inputs.reference, set(registry))
                values.update({f"reference.{k}": v for k, v in own.items()})
        except CustomMetricError as exc:
            raise CustomMetricError(f"{custom_metric.spec} {exc}") from None
    return values
