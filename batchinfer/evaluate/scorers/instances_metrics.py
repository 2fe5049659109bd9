"""The detection metric registry, on a detector's per-item boxes and the ground truth.

Every metric is one named number a gate can name (``[gates.METRIC]``):

- COCO scores (ground truth): ``map50_95``, ``map50``, ``map75``; the float reference
  gets its own (``reference.map50_95``, ...), so ``min_ratio_to_reference`` works;
- ``errors`` (error rows count as images with no detection: their objects are missed),
  ``items_per_s``; ``unmatched_items`` (dataset images the ground truth does not name,
  not scored) and ``unknown_images`` (ground-truth images the dataset lacks), counted;
- against the float reference: ``map_drop`` (reference mAP50:95 - device's; gate it with
  ``max``), ``map50_drop``, ``map_drop_p`` (the paired bootstrap's p-value for that
  difference), ``box_disagreement_mean`` (per image, 1 - soft F1 of the two box sets);
- per core (each row's ``core``, and ``node`` on a cluster): ``core_map_min`` (mAP50:95 of
  the worst core, on the images it ran), ``core_map_spread`` (best minus worst),
  ``core_disagreement_max`` (the reference needed: the highest per-core mean box
  disagreement; a core that adds or moves boxes shows here even when its extra boxes
  score too low to change its mAP);
- against the baseline (the last accepted run), on the images both have:
  ``map_bootstrap_p`` (paired bootstrap of the mAP50:95 difference), ``map50_bootstrap_p``;
  ``max_drop`` with ``alpha`` on ``map50_95`` (or ``map50``) fails a drop only when this
  p-value is below ``alpha``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.metrics import Inputs, Metric, core_rows, core_values, run_metrics
from batchinfer.evaluate.scorers.coco import (
    DetectionScore,
    disagreement,
    score_detections,
    score_groups,
)
from batchinfer.evaluate.scorers.coco_bootstrap import BootstrapResult, paired_bootstrap
from batchinfer.evaluate.scorers.instances_items import DetectionItems, coco_predictions


class DetectInputs(Inputs):
    """What detection metrics see: the device's boxes, the ground truth, and the reference,
    the baseline's boxes and the device's core stats when there are."""

    def __init__(
        self,
        device: DetectionItems,
        gt: GroundTruth,
        category_ids: Sequence[int],
        reference: DetectionItems | None = None,
        baseline: DetectionItems | None = None,
        *,
        resamples: int = 1000,
        seed: int = 0,
        core_stats: list[dict] | None = None,
    ) -> None:
        super().__init__(device, reference, baseline, core_stats)
        self.gt = gt
        self.category_ids = list(category_ids)
        self.resamples = resamples
        self.seed = seed

    def for_reference(self) -> DetectInputs:
        """The same inputs with the reference as the detector under test."""
        assert self.reference is not None
        return DetectInputs(self.reference, self.gt, self.category_ids)

    # ------------------------------------------------------------------ scores
    @cached_property
    def results(self) -> list[dict[str, Any]]:
        return coco_predictions(self.device, self.gt, self.category_ids)

    @cached_property
    def score(self) -> DetectionScore:
        return score_detections(self.gt, self.results)

    @cached_property
    def reference_results(self) -> list[dict[str, Any]] | None:
        if self.reference is None:
            return None
        return coco_predictions(self.reference, self.gt, self.category_ids)

    @cached_property
    def reference_score(self) -> DetectionScore | None:
        results = self.reference_results
        return None if results is None else score_detections(self.gt, results)

    @cached_property
    def vs_reference(self) -> dict[str, BootstrapResult] | None:
        """Paired bootstrap of device - reference over the scored images."""
        if self.reference_results is None:
            return None
        return paired_bootstrap(
            self.gt, self.results, self.reference_results,
            resamples=self.resamples, seed=self.seed,
        )  # fmt: skip

    @cached_property
    def compared_with_baseline(self) -> list[str]:
        """Items scored now that the baseline has a row for (in dataset order)."""
        if self.baseline is None:
            return []
        before = set(self.baseline.id.tolist())
        return [i for i in self.device.id.tolist() if i in before and i in self.gt.image_ids]

    @cached_property
    def vs_baseline(self) -> dict[str, BootstrapResult] | None:
        """Paired bootstrap of device - baseline, on the images both runs have, scored
        against today's ground truth (a corrected annotation counts for both)."""
        if self.baseline is None:
            return None
        both = {i: True for i in self.compared_with_baseline}
        ids = [self.gt.image_ids[i] for i in both]
        before = coco_predictions(self.baseline, self.gt, self.category_ids, only=both)
        now = coco_predictions(self.device, self.gt, self.category_ids, only=both)
        return paired_bootstrap(
            self.gt, now, before, image_ids=ids, resamples=self.resamples, seed=self.seed
        )

    # ------------------------------------------------------------------ per item
    @cached_property
    def disagreement(self) -> np.ndarray:
        """Per item: 1 - soft F1 of the device's and the reference's boxes; NaN where either
        failed (or there is no reference)."""
        out = np.full(len(self.device), np.nan)
        if self.reference is None:
            return out
        for i, (d, r) in enumerate(zip(self.device.boxes, self.reference.boxes, strict=True)):
            if d is not None and r is not None:
                out[i] = disagreement(d[:, :4], d[:, 5], r[:, :4], r[:, 5])
        return out

    # ------------------------------------------------------------------ per core
    @cached_property
    def per_core(self) -> list[dict[str, Any]]:
        """One dict per core that gave results: items, errors, images scored, mAP, and
        against the reference its mAP on the same images and the mean disagreement."""
        d = self.device
        groups: dict[int, Hashable] = {}
        for item, place in zip(d.id.tolist(), d.places, strict=True):
            if place[1] >= 0 and item in self.gt.image_ids:
                groups[self.gt.image_ids[item]] = place
        scores = score_groups(self.gt, self.results, groups)
        ref_scores = (
            score_groups(self.gt, self.reference_results, groups)
            if self.reference_results is not None
            else {}
        )

        def fields(on: np.ndarray, place: tuple[str | None, int]) -> dict[str, Any]:
            s, r = scores.get(place), ref_scores.get(place)
            dis = self.disagreement[on & ~np.isnan(self.disagreement)]
            return {
                "images": 0 if s is None else s.images,
                "map50_95": None if s is None else s.map50_95,
                "map50": None if s is None else s.map50,
                "reference_map50_95": None if r is None else r.map50_95,
                "disagreement_mean": float(dis.mean()) if dis.size else None,
            }

        return core_rows(d, self.core_stats, fields)


# --------------------------------------------------------------------------- the registry
def _core_maps(x: DetectInputs) -> list[float]:
    return core_values(x, "map50_95")


def _drop(x: DetectInputs, key: str) -> float | None:
    ref = x.reference_score
    now = getattr(x.score, key)
    before = None if ref is None else getattr(ref, key)
    return None if now is None or before is None else before - now


def _p(result: dict[str, BootstrapResult] | None, key: str) -> float | None:
    if result is None:
        return None
    p = result[key].p_value
    return None if not np.isfinite(p) else p


def _finite_mean(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else None


def detection_metrics() -> dict[str, Metric]:
    """The built-in detection metrics by name (see the module docstring)."""
    metrics = [
        Metric("map50_95", lambda x: x.score.map50_95, "",
               "COCO mAP averaged over IoU 0.50:0.95 (all areas, 100 detections per image).",
               comparable=True),
        Metric("map50", lambda x: x.score.map50, "", "COCO mAP at IoU 0.50.", comparable=True),
        Metric("map75", lambda x: x.score.map75, "", "COCO mAP at IoU 0.75.", comparable=True),
        *run_metrics("Items that ended as error rows (their objects count as missed)."),
        Metric("unmatched_items", lambda x: float(len(x.gt.unmatched_items)), "",
               "Dataset images the ground truth does not name (not scored).", better="lower"),
        Metric("unknown_images", lambda x: float(len(x.gt.unknown_images)), "",
               "Ground-truth images that are not in the dataset.", better="lower"),
        Metric("map_drop", lambda x: _drop(x, "map50_95"), "reference",
               "The float reference's mAP50:95 minus the device's.", better="lower"),
        Metric("map50_drop", lambda x: _drop(x, "map50"), "reference",
               "The float reference's mAP50 minus the device's.", better="lower"),
        Metric("map_drop_p", lambda x: _p(x.vs_reference, "map50_95"), "reference",
               "Paired image bootstrap p-value of the device-reference mAP50:95 difference."),
        Metric("box_disagreement_mean", lambda x: _finite_mean(x.disagreement), "reference",
               "Mean over images of 1 - soft F1 between device and reference boxes.",
               better="lower"),
        Metric("core_map_min", lambda x: min(_core_maps(x), default=None), "",
               "mAP50:95 of the worst core, on the images it ran."),
        Metric("core_map_spread",
               lambda x: max(_core_maps(x)) - min(_core_maps(x)) if _core_maps(x) else None,
               "", "Best core's mAP50:95 minus the worst core's.", better="lower"),
        Metric("core_disagreement_max",
               lambda x: max(core_values(x, "disagreement_mean"), default=None), "reference",
               "The highest mean box disagreement with the reference of any core.",
               better="lower"),
        Metric("map_bootstrap_p", lambda x: _p(x.vs_baseline, "map50_95"), "baseline",
               "Paired image bootstrap p-value of the mAP50:95 change since the baseline."),
        Metric("map50_bootstrap_p", lambda x: _p(x.vs_baseline, "map50"), "baseline",
               "Paired image bootstrap p-value of the mAP50 change since the baseline."),
    ]  # fmt: skip
    return {m.name: m for m in metrics}


__all__ = ["DetectInputs", "detection_metrics"]
