"""Classification metrics, on per-item results (pure numpy): the classify scorer's registry.

Every metric is one named number. Built-in metrics (see :func:`builtin_metrics`):

- accuracy (needs labels): ``top1``, ``top<k>``, ``class_top1_min`` (the worst class);
  an error row counts as wrong, so a failing item can never raise accuracy;
- ``errors`` (error rows), ``items_per_s`` (the device run's throughput);
- against the float reference: ``top1_agreement`` (same top-1 class), ``cosine_mean`` and
  ``cosine_min`` (cosine similarity of the outputs, item by item);
- per core (from each row's ``core``, and ``node`` on a cluster): ``core_top1_min``,
  ``core_top1_spread``, ``core_agreement_min``, ``core_cosine_min``: a core that computes
  differently shows here;
- against the baseline (the last accepted run), matched by item id: ``mcnemar_p``
  (McNemar's paired test on per-item top-1 correctness), ``flipped_lost`` (right then,
  wrong now), ``flipped_gained``.

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from batchinfer.errors import RunFailedError
from batchinfer.evaluate.items import ItemResults
from batchinfer.evaluate.metrics import Inputs, Metric, core_rows, core_values, run_metrics
from batchinfer.evaluate.outside import Outside, outside_labels


# --------------------------------------------------------------------------- functions
def topk_accuracy(items: ItemResults, k: int) -> float | None:
    """Share of labelled items whose label is among the best ``k`` classes (None: no labels)."""
    labelled = items.labelled
    if not labelled.any():
        return None
    if k == 1:
        hit = items.correct
    else:
        hit = items.ok & (items.topk[:, :k] == items.label[:, None]).any(axis=1)
    return float(hit[labelled].mean())


def class_counts(items: ItemResults, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class: (labelled items, top-1 correct, error rows)."""
    labelled = items.labelled & (items.label < n_classes)
    label = items.label[labelled]
    total = np.bincount(label, minlength=n_classes)
    correct = np.bincount(label, weights=items.correct[labelled], minlength=n_classes)
    errors = np.bincount(label, weights=~items.ok[labelled], minlength=n_classes)
    return total, correct.astype(np.int64), errors.astype(np.int64)


def confusion_matrix(items: ItemResults, n_classes: int) -> np.ndarray:
    """Counts [true class, predicted class] over labelled items with a result."""
    keep = items.ok & items.labelled & (items.label < n_classes)
    keep &= (items.pred >= 0) & (items.pred < n_classes)
    matrix = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(matrix, (items.label[keep], items.pred[keep]), 1)
    return matrix


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n x d) arrays; NaN where a row is NaN; 1 for two zero rows."""
    dot = np.einsum("ij,ij->i", a, b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / norms
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cos[both_zero] = 1.0
    cos[(norms == 0) & ~both_zero] = 0.0
    cos[np.isnan(a).any(axis=1) | np.isnan(b).any(axis=1)] = np.nan
    return np.clip(cos, -1.0, 1.0)


@dataclass(frozen=True)
class McNemar:
    """McNemar's test on paired correctness: ``lost`` right-then-wrong, ``gained`` the reverse."""

    lost: int
    gained: int
    statistic: float | None  # chi-square (None for the exact test)
    p_value: float
    method: str  # "exact" (binomial) or "chi2" (with continuity correction)


#: Below this many discordant items the exact binomial test is used (chi-square is then poor).
MCNEMAR_EXACT_BELOW = 25


def mcnemar(lost: int, gained: int) -> McNemar:
    """Two-sided McNemar test of ``lost`` vs ``gained`` discordant pairs.

    Exact binomial test (p = 2 P[X <= min(lost, gained)], X ~ Bin(n, 1/2), at most 1) when
    n = lost + gained < 25, else chi-square with Edwards' continuity correction,
    (|lost - gained| - 1)^2 / n on one degree of freedom.
    """
    n = lost + gained
    if n == 0:
        return McNemar(lost, gained, None, 1.0, "exact")
    if n < MCNEMAR_EXACT_BELOW:
        tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1)) / 2**n
        return McNemar(lost, gained, None, min(1.0, 2 * tail), "exact")
    statistic = (abs(lost - gained) - 1) ** 2 / n
    # The chi-square survival function with one degree of freedom.
    return McNemar(lost, gained, statistic, math.erfc(math.sqrt(statistic / 2)), "chi2")


# --------------------------------------------------------------------------- the inputs
@dataclass(frozen=True)
class BaselineItems:
    """The baseline's per-item correctness, by item id."""

    id: np.ndarray
    correct: np.ndarray
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Flips:
    """Items whose top-1 correctness changed since the baseline (ids in dataset order)."""

    lost: list[str]
    gained: list[str]
    compared: int  # items labelled in both runs
    test: McNemar


class EvalInputs(Inputs):
    """What the metrics see: device results, and the reference, baseline, stats if any."""

    def __init__(
        self,
        device: ItemResults,
        reference: ItemResults | None = None,
        baseline: BaselineItems | None = None,
        classes: tuple[str, ...] = (),
        topk: int = 5,
        core_stats: list[dict] | None = None,
    ) -> None:
        super().__init__(device, reference, baseline, core_stats)
        self.classes = classes
        self.topk = topk

    def for_reference(self) -> EvalInputs:
        """The same inputs with the reference as the model under test (its own accuracy)."""
        assert self.reference is not None
        return EvalInputs(self.reference, classes=self.classes, topk=self.topk)

    @cached_property
    def n_classes(self) -> int:
        """The per-class tables' classes: the model's and the named ones (see outside.py)."""
        widest = max([o.shape[-1] for o in self.device.outputs[:1]] or [0])
        return max(len(self.classes), widest)

    @cached_property
    def outside(self) -> Outside:
        """Labelled items whose label is none of the :attr:`n_classes` classes."""
        return outside_labels(self.device.label, self.n_classes)

    @cached_property
    def cosine(self) -> np.ndarray:
        """Per item cosine of device and reference outputs; NaN where either failed."""
        if self.reference is None:
            return np.full(len(self.device), np.nan)
        a, b = self.device.flat_outputs(), self.reference.flat_outputs()
        if a.shape != b.shape:
            raise RunFailedError(
                f"the device model's outputs ({a.shape[1]} values per item) and the "
                f"reference's ({b.shape[1]}) differ in size, so they cannot be compared; "
                "use a reference model with the same outputs."
            )
        return cosine_similarity(a, b)

    @cached_property
    def agree(self) -> np.ndarray:
        """Device and reference give the same top-1 class (False where either failed)."""
        if self.reference is None:
            return np.zeros(len(self.device), dtype=bool)
        return self.device.ok & self.reference.ok & (self.device.pred == self.reference.pred)

    @cached_property
    def flips(self) -> Flips | None:
        if self.baseline is None:
            return None
        before = dict(zip(self.baseline.id.tolist(), self.baseline.correct.tolist(), strict=True))
        lost, gained, compared = [], [], 0
        for item_id, labelled, now in zip(
            self.device.id.tolist(),
            self.device.labelled.tolist(),
            self.device.correct.tolist(),
            strict=True,
        ):
            was = before.get(item_id)
            if was is None or not labelled:
                continue
            compared += 1
            if was and not now:
                lost.append(item_id)
            elif now and not was:
                gained.append(item_id)
        return Flips(lost, gained, compared, mcnemar(len(lost), len(gained)))

    @cached_property
    def per_core(self) -> list[dict[str, Any]]:
        """One dict per core that gave results: items, errors, accuracy, agreement, cosine.

        A core is (node, core) on a cluster (node None on one board), so that core 2 of one
        board is judged apart from core 2 of the others; ``place`` names it (``node1/2``).
        """
        d = self.device

        def fields(on: np.ndarray, place: tuple[str | None, int]) -> dict[str, Any]:
            labelled = on & d.labelled
            ref_ok = on & self.reference.ok if self.reference is not None else on & False
            cos = self.cosine[on & ~np.isnan(self.cosine)]
            return {
                "top1": float(d.correct[labelled].mean()) if labelled.any() else None,
                "agreement": float(self.agree[ref_ok].mean()) if ref_ok.any() else None,
                "cosine_mean": float(cos.mean()) if cos.size else None,
            }

        return core_rows(d, self.core_stats, fields)


# --------------------------------------------------------------------------- the registry
def _min(values: list[float]) -> float | None:
    return min(values) if values else None


def _finite(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _class_top1_min(x: EvalInputs) -> float | None:
    total, correct, _ = class_counts(x.device, x.n_classes)
    present = total > 0
    return float((correct[present] / total[present]).min()) if present.any() else None


def _agreement(x: EvalInputs) -> float | None:
    assert x.reference is not None
    ref_ok = x.reference.ok
    return float(x.agree[ref_ok].mean()) if ref_ok.any() else None


def _spread(values: list[float]) -> float | None:
    return max(values) - min(values) if values else None


def _worst_core(name: str, value: str, needs: str, text: str) -> Metric:
    """The metric ``name``: the worst core's ``value`` (a column of :func:`core_values`)."""
    return Metric(name, lambda x: _min(core_values(x, value)), needs, text)


def builtin_metrics(topk: int = 5) -> dict[str, Metric]:
    """The built-in metrics by name (``top<k>`` follows ``metrics.topk``)."""
    metrics = [
        Metric(
            "top1",
            lambda x: topk_accuracy(x.device, 1),
            "labels",
            "Share of labelled items whose top-1 class is their label (error rows are wrong).",
            comparable=True,
        ),
        Metric(
            f"top{topk}",
            lambda x: topk_accuracy(x.device, topk),
            "labels",
            f"Share of labelled items whose label is among the best {topk} classes.",
            comparable=True,
        ),
        Metric(
            "class_top1_min",
            _class_top1_min,
            "labels",
            "Top-1 accuracy of the worst class.",
            comparable=True,
        ),
        *run_metrics("Items that ended as error rows (unreadable, or failed every attempt)."),
        Metric(
            "top1_agreement",
            _agreement,
            "reference",
            "Share of items (with a reference result) whose top-1 class is the reference's.",
        ),
        Metric(
            "cosine_mean",
            lambda x: float(_finite(x.cosine).mean()) if _finite(x.cosine).size else None,
            "reference",
            "Mean cosine similarity of device and reference outputs.",
        ),
        Metric(
            "cosine_min",
            lambda x: float(_finite(x.cosine).min()) if _finite(x.cosine).size else None,
            "reference",
            "Worst item's cosine similarity of device and reference outputs.",
        ),
        _worst_core("core_top1_min", "top1", "labels", "Top-1 accuracy of the worst core."),
        Metric(
            "core_top1_spread",
            lambda x: _spread(core_values(x, "top1")),
            "labels",
            "Best core's top-1 minus the worst core's.",
            better="lower",
        ),
        _worst_core(
            "core_agreement_min",
            "agreement",
            "reference",
            "Top-1 agreement with the reference of the worst core.",
        ),
        _worst_core(
            "core_cosine_min",
            "cosine_mean",
            "reference",
            "Mean output cosine with the reference of the worst core.",
        ),
        Metric(
            "mcnemar_p",
            lambda x: x.flips.test.p_value if x.flips else None,
            "baseline",
            "McNemar's p-value for a change in per-item top-1 correctness since the baseline.",
        ),
        Metric(
            "flipped_lost",
            lambda x: float(len(x.flips.lost)) if x.flips else None,
            "baseline",
            "Items right in the baseline and wrong now.",
            better="lower",
        ),
        Metric(
            "flipped_gained",
            lambda x: float(len(x.flips.gained)) if x.flips else None,
            "baseline",
            "Items wrong in the baseline and right now.",
        ),
    ]
    if topk == 1:
        metrics.pop(1)
    return {m.name: m for m in metrics}


__all__ = [
    "MCNEMAR_EXACT_BELOW",
    "BaselineItems",
    "EvalInputs",
    "Flips",
    "McNemar",
    "builtin_metrics",
    "class_counts",
    "confusion_matrix",
    "cosine_similarity",
    "mcnemar",
    "topk_accuracy",
]
