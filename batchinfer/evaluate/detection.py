"""Detection scores: COCO mAP by faster-coco-eval, per class and per core, PR curves, and a
paired bootstrap of the mAP difference between two detectors on the same images.

Scores follow the COCO protocol exactly (pycocotools' numbers, to 1e-4; tested):
``map50_95`` is AP averaged over IoU 0.50:0.05:0.95, ``map50`` and ``map75`` at one IoU,
all areas, at most 100 detections per image and class, averaged over the classes that have
ground truth. A class with ground truth and no detection scores 0; a class without ground
truth is left out (not 0). :func:`score_detections` runs faster-coco-eval (the ``detect``
extra), a C++ port of pycocotools' matching and accumulation.

The paired bootstrap (:func:`paired_bootstrap`) asks whether detector A's mAP differs
from detector B's on the same images by more than the choice of images explains. The
image is the unit: one resample draws N image ids with replacement, and both mAPs are
computed on that same multiset, so whatever makes an image hard for both cancels in the
difference (the pairing), and the objects of one image, which are not independent, stay
together. mAP is not a sum over images, so each resample re-runs the accumulation; what
does not change between resamples is each image's matching (a detection's match depends
only on its own image's boxes), so it is done once (:func:`match_images`) and each
resample only re-weights it: an image drawn k times counts k times in the cumulative
true and false positives and in the number of ground-truth boxes
(:func:`weighted_map`; with every weight 1 it gives faster-coco-eval's numbers, tested).
The interval is the percentile interval of the resampled differences; the p-value is the
one the interval inverts to (twice the smaller share of resampled differences on either
side of zero, with the usual +1 so that it is never 0): the smallest level at which the
percentile interval would exclude 0.

Cost, measured (CPU time on this machine; tests/detection_data.py's random cases):

- 500 images, 10 classes, 2,060 detections a side: faster-coco-eval scores one side in
  0.10 s; matching takes 0.15 s a side, 200 resamples 0.07 s; 1,000 resamples of both
  sides, matching included, 1.4 s;
- 5,000 images, 80 classes, 139,000 detections a side (COCO val2017's size): 4.1 s,
  5.4 s, 2.1 s; 1,000 resamples of both sides 24 s.

Re-running faster-coco-eval on copied images instead would cost its full time per
resample and side: over 3 minutes for 1,000 resamples of the small case. The default is
1,000 resamples: a p-value near 0.05 rests on the few resamples in one tail, which 200
count coarsely (0.010 with 200 against 0.046 with 1,000 on the small case).
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchinfer.errors import UsageError
from batchinfer.evaluate.groundtruth import GroundTruth

#: COCO's IoU thresholds (0.50:0.05:0.95) and recall points (0:0.01:1), as pycocotools
#: makes them (linspace: arange drifts past 0.95).
IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
#: Detections kept per image and class (COCO's maxDets for AP).
MAX_DETS = 100
#: Area range "all" (pycocotools' [0, 1e5**2]).
_AREA_ALL = (0.0, 1e5**2)


class DetectEvalUnavailable(UsageError):
    """faster-coco-eval is not installed (exit 2: nothing can be scored)."""


def _coco_api() -> tuple[Any, Any]:
    try:
        from faster_coco_eval import COCO, COCOeval_faster
    except ImportError:
        raise DetectEvalUnavailable(
            "scoring detections needs faster-coco-eval, which is not installed; "
            "pip install 'batchinfer[detect]'."
        ) from None
    return COCO, COCOeval_faster


def require_scoring() -> None:
    """DetectEvalUnavailable now when faster-coco-eval is missing: checked when a detection
    job is loaded, so a user does not wait for both sides' runs to learn it."""
    _coco_api()


# --------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class DetectionScore:
    """COCO scores of one set of detections against the ground truth.

    ``precision`` is COCO's interpolated precision, shape (IoU thresholds, recall points,
    classes), for area "all" and 100 detections; -1 where a class has no ground truth.
    """

    map50_95: float | None  # None: no class has ground truth among the scored images
    map50: float | None
    map75: float | None
    category_ids: tuple[int, ...]
    names: tuple[str, ...]
    precision: np.ndarray
    recall: np.ndarray  # (IoU thresholds, classes): the highest recall reached, -1 as above
    gt_boxes: np.ndarray  # (classes,) ground-truth boxes (crowd boxes not counted)
    detections: np.ndarray  # (classes,) detections scored
    images: int

    def ap(self, iou: float | None = None) -> np.ndarray:
        """AP per class (NaN for a class without ground truth), at one IoU or 0.50:0.95."""
        p = self.precision if iou is None else self.precision[[_iou_index(iou)]]
        valid = (p > -1).all(axis=(0, 1))
        out = np.full(p.shape[2], np.nan)
        if valid.any():
            out[valid] = p[:, :, valid].mean(axis=(0, 1))
        return out

    def per_class(self) -> list[dict[str, Any]]:
        """One row per class: id, name, boxes, detections, AP50:95, AP50, recall at 0.5."""
        ap, ap50 = self.ap(), self.ap(0.5)
        recall50 = self.recall[_iou_index(0.5)]
        rows = []
        for k, (cid, name) in enumerate(zip(self.category_ids, self.names, strict=True)):
            rows.append(
                {
                    "category_id": cid,
                    "name": name,
                    "gt_boxes": int(self.gt_boxes[k]),
                    "detections": int(self.detections[k]),
                    "ap50_95": _value(ap[k]),
                    "ap50": _value(ap50[k]),
                    "recall50": _value(recall50[k]) if recall50[k] > -1 else None,
                }
            )
        return rows

    def pr_curves(self, iou: float = 0.5) -> dict[str, Any]:
        """Precision at COCO's 101 recall points, per class and averaged over the classes
        with ground truth ("overall", COCO's own average), at IoU ``iou``."""
        p = self.precision[_iou_index(iou)]  # (R, K)
        valid = (p > -1).all(axis=0)
        overall = p[:, valid].mean(axis=1) if valid.any() else np.full(p.shape[0], np.nan)
        return {
            "iou": float(iou),
            "recall": RECALL_POINTS.tolist(),
            "overall": [_value(v) for v in overall],
            "per_class": [
                {"name": name, "category_id": cid, "precision": p[:, k].tolist()}
                for k, (cid, name) in enumerate(zip(self.category_ids, self.names, strict=True))
                if valid[k]
            ],
        }

    def metrics(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (("map50_95", self.map50_95), ("map50", self.map50), ("map75", self.map75))
            if v is not None
        }


def _value(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _iou_index(iou: float) -> int:
    hits = np.flatnonzero(np.isclose(IOU_THRESHOLDS, iou))
    if not hits.size:
        raise ValueError(f"IoU {iou} is not one of COCO's thresholds 0.50:0.05:0.95")
    return int(hits[0])


def _mean_valid(p: np.ndarray) -> float | None:
    valid = p[p > -1]
    return float(valid.mean()) if valid.size else None


def check_results(gt: GroundTruth, results: Sequence[Mapping[str, Any]]) -> None:
    """ValueError if a result names an image or category the ground truth does not have."""
    images = {i["id"] for i in gt.images}
    cats = {c.id for c in gt.categories}
    for r in results:
        if r["image_id"] not in images:
            raise ValueError(f"a detection names image {r['image_id']}, not in the ground truth")
        if r["category_id"] not in cats:
            raise ValueError(
                f"a detection names category {r['category_id']}, not in the ground truth"
            )


def score_detections(
    gt: GroundTruth,
    results: Sequence[Mapping[str, Any]],
    image_ids: Collection[int] | None = None,
) -> DetectionScore:
    """COCO bbox scores of ``results`` (COCO result dicts) on ``image_ids`` (default: all
    the ground truth's images), by faster-coco-eval."""
    COCO, COCOeval_faster = _coco_api()
    check_results(gt, results)
    ids = sorted({i["id"] for i in gt.images} if image_ids is None else set(image_ids))
    cats = sorted(c.id for c in gt.categories)
    names = [gt.category_names[c] for c in cats]
    T, R, K = len(IOU_THRESHOLDS), len(RECALL_POINTS), len(cats)
    keep = set(ids)
    gt_boxes = np.zeros(K, dtype=np.int64)
    dets = np.zeros(K, dtype=np.int64)
    index = {c: k for k, c in enumerate(cats)}
    for a in gt.annotations:
        if a["image_id"] in keep and not a["iscrowd"]:
            gt_boxes[index[a["category_id"]]] += 1
    for r in results:
        if r["image_id"] in keep:
            dets[index[r["category_id"]]] += 1
    if not ids or not K:
        empty = np.full((T, R, K), -1.0)
        return DetectionScore(
            None, None, None, tuple(cats), tuple(names), empty, np.full((T, K), -1.0),
            gt_boxes, dets, len(ids),
        )  # fmt: skip
    quiet = lambda *args, **kwargs: None  # noqa: E731 - faster-coco-eval's log hook
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(gt.coco())
        coco_gt.print_function = quiet
        coco_dt = coco_gt.loadRes([_result(r) for r in results])
        ev = COCOeval_faster(coco_gt, coco_dt, "bbox", print_function=quiet)
        ev.params.imgIds = ids
        ev.params.catIds = cats
        ev.evaluate()
        ev.accumulate()
    # (T, R, K, area, maxDets): area "all" is the first, 100 detections the last.
    precision = np.asarray(ev.eval["precision"])[:, :, :, 0, -1].copy()
    recall = np.asarray(ev.eval["recall"])[:, :, 0, -1].copy()
    return DetectionScore(
        map50_95=_mean_valid(precision),
        map50=_mean_valid(precision[_iou_index(0.5)]),
        map75=_mean_valid(precision[_iou_index(0.75)]),
        category_ids=tuple(cats),
        names=tuple(names),
        precision=precision,
        recall=recall,
        gt_boxes=gt_boxes,
        detections=dets,
        images=len(ids),
    )


def _result(r: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh result dict (the COCO API adds keys to what it gets)."""
    return {
        "image_id": r["image_id"],
        "category_id": r["category_id"],
        "bbox": [float(v) for v in r["bbox"]],
        "score": float(r["score"]),
    }


def score_groups(
    gt: GroundTruth,
    results: Sequence[Mapping[str, Any]],
    groups: Mapping[int, Hashable],
) -> dict[Hashable, DetectionScore]:
    """Scores per group of images (``groups``: image id -> group, e.g. the NPU core that
    ran it): a core that computes differently shows as a lower mAP of its own."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for image_id, group in groups.items():
        members[group].append(image_id)
    return {g: score_detections(gt, results, ids) for g, ids in members.items()}


# --------------------------------------------------------------------------- matching
@dataclass(frozen=True)
class _ClassMatches:
    """One class's scored detections in COCO's global order (score descending)."""

    image: np.ndarray  # (n,) position of each detection's image
    tp: np.ndarray  # (T, n) matched to a ground-truth box that counts
    fp: np.ndarray  # (T, n) matched to nothing (and not ignored)
    gt_count: np.ndarray  # (images,) ground-truth boxes that count, per image


@dataclass(frozen=True)
class ImageMatches:
    """Each image's COCO matching of one set of detections, for re-weighted scoring."""

    image_ids: tuple[int, ...]  # positions -> COCO image ids
    classes: tuple[_ClassMatches, ...]  # in sorted category id order


def _iou(dt: np.ndarray, gt: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """COCO bbox IoU (x, y, w, h boxes); against a crowd box, intersection / detection area."""
    dx1, dy1 = dt[:, 0:1], dt[:, 1:2]
    dx2, dy2 = dx1 + dt[:, 2:3], dy1 + dt[:, 3:4]
    gx1, gy1 = gt[:, 0], gt[:, 1]
    gx2, gy2 = gx1 + gt[:, 2], gy1 + gt[:, 3]
    iw = np.clip(np.minimum(dx2, gx2) - np.maximum(dx1, gx1), 0, None)
    ih = np.clip(np.minimum(dy2, gy2) - np.maximum(dy1, gy1), 0, None)
    inter = iw * ih
    d_area = dt[:, 2:3] * dt[:, 3:4]
    union = np.where(crowd[None, :], d_area, d_area + (gt[:, 2] * gt[:, 3])[None, :] - inter)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(union > 0, inter / union, 0.0)
    return out


def _match_image(
    dt_boxes: np.ndarray, gt_boxes: np.ndarray, gt_ignore: np.ndarray, crowd: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """pycocotools' evaluateImg for one image and class, every IoU threshold at once.

    Detections come sorted by score; ground truth with the boxes that count first. A
    detection takes the unmatched box (crowd boxes may be taken again) of highest IoU at
    or above the threshold, the last one among equals, preferring boxes that count.
    Returns (matched, ignored), each (T, detections).
    """
    T, D, G = len(IOU_THRESHOLDS), len(dt_boxes), len(gt_boxes)
    matched = np.zeros((T, D), dtype=bool)
    ignored = np.zeros((T, D), dtype=bool)
    if G:
        ious = _iou(dt_boxes, gt_boxes, crowd)
        taken = np.zeros((T, G), dtype=bool)
        floor = np.minimum(IOU_THRESHOLDS, 1 - 1e-10)[:, None]
        for d in range(D):
            ok = (ious[d][None, :] >= floor) & (~taken | crowd[None, :])
            for wanted in (~gt_ignore, gt_ignore):
                cand = np.where(ok & wanted[None, :], ious[d][None, :], -1.0)
                best = G - 1 - np.argmax(cand[:, ::-1], axis=1)  # the last among equals
                hit = cand[np.arange(T), best] >= 0
                hit &= ~matched[:, d]
                t = np.flatnonzero(hit)
                matched[t, d] = True
                ignored[t, d] = gt_ignore[best[t]]
                taken[t, best[t]] = True
    area = dt_boxes[:, 2] * dt_boxes[:, 3]
    outside = (area < _AREA_ALL[0]) | (area > _AREA_ALL[1])
    ignored |= ~matched & outside[None, :]
    return matched, ignored


def match_images(
    gt: GroundTruth,
    results: Sequence[Mapping[str, Any]],
    image_ids: Collection[int] | None = None,
) -> ImageMatches:
    """Match ``results`` to the ground truth image by image, as COCO does (see the module
    docstring); :func:`weighted_map` then scores any re-weighting of the images."""
    check_results(gt, results)
    ids = sorted({i["id"] for i in gt.images} if image_ids is None else set(image_ids))
    position = {image_id: n for n, image_id in enumerate(ids)}
    cats = sorted(c.id for c in gt.categories)
    gts: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for a in gt.annotations:
        if a["image_id"] in position:
            gts[a["image_id"], a["category_id"]].append(a)
    dts: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        if r["image_id"] in position:
            dts[r["image_id"], r["category_id"]].append(r)
    classes = []
    for cat in cats:
        gt_count = np.zeros(len(ids), dtype=np.float64)
        scores, images, tps, fps = [], [], [], []
        for image_id in ids:
            g = gts.get((image_id, cat), [])
            d = dts.get((image_id, cat), [])
            if not g and not d:
                continue
            g_ignore = np.array(
                [bool(a["iscrowd"]) or not _AREA_ALL[0] <= a["area"] <= _AREA_ALL[1] for a in g],
                dtype=bool,
            )
            order = np.argsort(g_ignore, kind="mergesort")
            g_boxes = np.array([g[i]["bbox"] for i in order], dtype=np.float64).reshape(-1, 4)
            crowd = np.array([bool(g[i]["iscrowd"]) for i in order], dtype=bool)
            g_ignore = g_ignore[order]
            gt_count[position[image_id]] = float((~g_ignore).sum())
            d_scores = np.array([r["score"] for r in d], dtype=np.float64)
            keep = np.argsort(-d_scores, kind="mergesort")[:MAX_DETS]
            d_boxes = np.array([d[i]["bbox"] for i in keep], dtype=np.float64).reshape(-1, 4)
            matched, ignored = _match_image(d_boxes, g_boxes, g_ignore, crowd)
            scores.append(d_scores[keep])
            images.append(np.full(len(keep), position[image_id], dtype=np.int64))
            tps.append(matched & ~ignored)
            fps.append(~matched & ~ignored)
        if scores:
            s = np.concatenate(scores)
            order = np.argsort(-s, kind="mergesort")
            image = np.concatenate(images)[order]
            tp = np.concatenate(tps, axis=1)[:, order]
            fp = np.concatenate(fps, axis=1)[:, order]
        else:
            image = np.zeros(0, dtype=np.int64)
            tp = fp = np.zeros((len(IOU_THRESHOLDS), 0), dtype=bool)
        classes.append(_ClassMatches(image, tp, fp, gt_count))
    return ImageMatches(tuple(ids), tuple(classes))


#: Bound on the (resamples x detections) block weighted_map holds at once.
_BLOCK = 4_000_000


def weighted_map(matches: ImageMatches, weights: np.ndarray) -> np.ndarray:
    """mAP50:95 and mAP50 for each row of ``weights`` (rows x images: how many times each
    image counts), as an array (rows, 2); NaN where no class has ground truth."""
    W = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    B, T, R = W.shape[0], len(IOU_THRESHOLDS), len(RECALL_POINTS)
    ap = np.full((B, T, len(matches.classes)), np.nan)
    for k, c in enumerate(matches.classes):
        npig = W @ c.gt_count  # (B,)
        n = len(c.image)
        if n == 0:
            ap[:, :, k] = np.where(npig > 0, 0.0, np.nan)[:, None]
            continue
        step = max(1, _BLOCK // n)
        for lo in range(0, B, step):
            hi = min(B, lo + step)
            ap[lo:hi, :, k] = _class_ap(W[lo:hi], npig[lo:hi], c, R)
    with np.errstate(invalid="ignore"), contextlib.suppress(RuntimeWarning):
        both = np.stack([_nanmean(ap.reshape(B, -1)), _nanmean(ap[:, 0, :])], axis=1)
    return both


def _nanmean(a: np.ndarray) -> np.ndarray:
    count = (~np.isnan(a)).sum(axis=1)
    total = np.nansum(a, axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _class_ap(W: np.ndarray, npig: np.ndarray, c: _ClassMatches, R: int) -> np.ndarray:
    """AP (rows, T) of one class under the weights, as pycocotools' accumulate computes it.

    Only the true positives' points are formed: precision is highest right after a true
    positive (false positives only lower it, and leave recall where it was), so the
    precision envelope and the first point reaching each recall level are both found
    among them. The false positives before a true positive are the weighted detections so
    far minus the true positives and the ignored ones, so the work per threshold is the
    true positives', not every detection's (most are false positives at low scores).
    """
    B, T = W.shape[0], c.tp.shape[0]
    w = W[:, c.image]  # (B, n)
    seen = np.cumsum(w, axis=1)  # weighted detections up to each one, itself included
    valid = npig > 0
    boxes = np.where(valid, npig, 1.0)[:, None]
    rows = np.arange(B)[:, None] * (R + 1)
    ap = np.zeros((B, T))
    for t in range(T):
        at = np.flatnonzero(c.tp[t])
        m = at.size
        if m == 0:
            continue  # no true positive: precision 0 at every recall point
        tp = np.cumsum(w[:, at], axis=1)
        fp = seen[:, at] - tp
        ignored = np.flatnonzero(~c.tp[t] & ~c.fp[t])
        if ignored.size:
            before = np.searchsorted(ignored, at)  # ignored detections ahead of each
            cum = np.concatenate([np.zeros((B, 1)), np.cumsum(w[:, ignored], axis=1)], axis=1)
            fp -= cum[:, before]
        pr = tp / (fp + tp + np.spacing(1))
        envelope = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1]
        # COCO takes, at each recall point r, the first detection whose recall reaches r:
        # its index is the number of detections with recall < r. A detection's recall is
        # below the points after the last point <= it, so counting detections by that
        # point and summing gives every point's index at once, exactly (no float offsets).
        # Recall as COCO divides it: tp * (1 / boxes) can differ in the last bit, and a
        # recall exactly on a recall point must fall on the same side as COCO's.
        below = np.searchsorted(RECALL_POINTS, tp / boxes, side="right")
        counts = np.bincount((rows + below).ravel(), minlength=B * (R + 1))
        first = np.cumsum(counts.reshape(B, R + 1), axis=1)[:, :R]  # (B, R)
        picked = np.take_along_axis(envelope, np.minimum(first, m - 1), axis=1)
        ap[:, t] = np.where(first < m, picked, 0.0).mean(axis=1)
    ap[~valid] = np.nan
    return ap


# --------------------------------------------------------------------------- bootstrap
@dataclass(frozen=True)
class BootstrapResult:
    """A paired bootstrap of ``a - b`` for one metric (see the module docstring)."""

    metric: str  # map50_95 | map50
    a: float
    b: float
    difference: float  # a - b on every image
    low: float  # percentile interval of the resampled differences
    high: float
    level: float
    p_value: float
    resamples: int
    seed: int
    images: int

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def resample_weights(n: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n) counts: how many times each of n images is drawn in each resample."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    flat = (draws + np.arange(resamples)[:, None] * n).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def paired_bootstrap(
    gt: GroundTruth,
    results_a: Sequence[Mapping[str, Any]],
    results_b: Sequence[Mapping[str, Any]],
    *,
    image_ids: Collection[int] | None = None,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, BootstrapResult]:
    """Paired bootstrap over images of mAP(a) - mAP(b), for map50_95 and map50.

    Both sides are scored on the same resampled images each time; the same ``seed`` gives
    the same answer.
    """
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    a = match_images(gt, results_a, image_ids)
    b = match_images(gt, results_b, image_ids)
    n = len(a.image_ids)
    full = np.ones((1, n))
    point_a, point_b = weighted_map(a, full)[0], weighted_map(b, full)[0]
    weights = resample_weights(n, resamples, seed) if n else np.zeros((resamples, 0))
    diffs = weighted_map(a, weights) - weighted_map(b, weights)  # (resamples, 2)
    out = {}
    for m, name in enumerate(("map50_95", "map50")):
        d = diffs[:, m]
        d = d[np.isfinite(d)]
        observed = float(point_a[m] - point_b[m])
        if not d.size or not np.isfinite(observed):
            low = high = p = float("nan")
        else:
            low, high = (float(v) for v in np.quantile(d, [(1 - level) / 2, (1 + level) / 2]))
            tail = min(int((d <= 0).sum()), int((d >= 0).sum()))
            p = min(1.0, 2 * (tail + 1) / (d.size + 1))
        out[name] = BootstrapResult(
            name, float(point_a[m]), float(point_b[m]), observed, low, high, level, p,
            resamples, seed, n,
        )  # fmt: skip
    return out


# --------------------------------------------------------------------------- disagreement
def box_iou_xyxy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4) with every box of ``b`` (m, 4), x1 y1 x2 y2."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    iw, ih = np.clip(hi - lo, 0, None).transpose(2, 0, 1)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def disagreement(
    boxes_a: np.ndarray,
    classes_a: np.ndarray,
    boxes_b: np.ndarray,
    classes_b: np.ndarray,
    min_iou: float = 0.5,
) -> float:
    """How differently two detectors saw one image: 1 - soft F1 of their box sets, in 0..1.

    Boxes of the same class are paired greedily by IoU (highest first, each box once,
    IoU at least ``min_iou``); soft F1 = 2 x (sum of the pairs' IoUs) / (boxes of a +
    boxes of b). 0: the same boxes; 1: no box in common (or one side saw nothing the
    other saw). Two empty sets agree (0).
    """
    na, nb = len(boxes_a), len(boxes_b)
    if na + nb == 0:
        return 0.0
    iou = box_iou_xyxy(boxes_a, boxes_b)
    same = np.asarray(classes_a)[:, None] == np.asarray(classes_b)[None, :]
    iou = np.where(same & (iou >= min_iou), iou, 0.0)
    total = 0.0
    if iou.size:
        order = np.argsort(-iou, axis=None, kind="stable")
        used_a, used_b = np.zeros(na, bool), np.zeros(nb, bool)
        for flat in order:
            value = iou.flat[flat]
            if value <= 0:
                break
            i, j = divmod(int(flat), nb)
            if used_a[i] or used_b[j]:
                continue
            used_a[i] = used_b[j] = True
            total += float(value)
    return 1.0 - 2.0 * total / (na + nb)


__all__ = [
    "IOU_THRESHOLDS",
    "MAX_DETS",
    "RECALL_POINTS",
    "BootstrapResult",
    "DetectEvalUnavailable",
    "DetectionScore",
    "ImageMatches",
    "box_iou_xyxy",
    "check_results",
    "disagreement",
    "match_images",
    "paired_bootstrap",
    "resample_weights",
    "score_detections",
    "score_groups",
    "weighted_map",
]
