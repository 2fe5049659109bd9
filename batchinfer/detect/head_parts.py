"""Pieces every decoder shares (detection, segmentation, pose, oriented boxes): checking
the settings, quantisation and output shapes, dequantising, the confidence filter, the DFL
expectation, the cell tables and the centre-size to corner conversion; and the candidates
of the two YOLOv8 layouts the pose and oriented-box heads come in.

- The model zoo's layout (``examples/yolov8_pose``, ``examples/yolov8_obb``): per stride
  8/16/32 one output (1, 64 + C, H, W), 64 DFL box logits then C class *logits* (the zoo's
  post-processing applies the sigmoid: ``conf = sigmoid(out[:, 64:, :])``; its C code
  compares the logit with ``unsigmoid(threshold)``), plus one extra output over all N
  cells (the keypoints, or the angle).
- Ultralytics' ONNX export: one output (1, 4 + C + E, N): cx, cy, w, h in input pixels,
  C class scores (sigmoid applied), E extra rows per cell (keypoints, or the angle).

A cell is a candidate when its best class score is >= ``conf`` (the zoo's C rule; the
detection decoder's too). The threshold is applied to the logit (the sigmoid is
increasing), so only the candidates' scores go through a sigmoid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from batchinfer.detect.heads import DFL_BINS, STRIDE_SETS, STRIDES, batch_one, grid_sizes
from batchinfer.errors import InferenceError, UsageError

Quant = tuple[float, int] | None


class Thresholds(Protocol):
    """What :func:`check_settings` reads of a decoder's settings."""

    @property
    def conf(self) -> float: ...
    @property
    def iou(self) -> float: ...
    @property
    def max_det(self) -> int: ...


def check_settings(settings: Thresholds) -> None:
    """UsageError unless conf and iou are fractions and max_det is at least 1."""
    if not 0.0 <= settings.conf <= 1.0 or not 0.0 <= settings.iou <= 1.0:
        raise UsageError(
            f"Detection thresholds must lie in 0..1 (conf {settings.conf}, "
            f"iou {settings.iou}); give fractions such as conf 0.25, iou 0.45."
        )
    if settings.max_det < 1:
        raise UsageError(f"max_det must be at least 1 (it is {settings.max_det}).")


def check_quant(quant: Sequence[Quant]) -> tuple[Quant, ...]:
    """The per-output (scale, zero point) as a tuple; UsageError for a scale not > 0."""
    for q in quant:
        if q is not None and not q[0] > 0:
            raise UsageError(f"An output's quantisation scale must be > 0 (it is {q[0]}).")
    return tuple(quant)


def quant_of(quant: Sequence[Quant], i: int) -> Quant:
    """Output ``i``'s (scale, zero point); None (a float output) when not given."""
    return quant[i] if i < len(quant) else None


def real(values: np.ndarray, q: Quant, i: int) -> np.ndarray:
    """Output ``i``'s values as float32 (int8/uint8 dequantised with its scale, zero point)."""
    if values.dtype.kind in "iu":
        if q is None:
            raise InferenceError(
                f"Output {i} is {values.dtype} but no quantisation (scale, zero point) "
                "was given for it; ask the runtime for float outputs or pass its quant."
            )
        scale, zero_point = q
        return (values.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
    return values.astype(np.float32, copy=False)


def unbatched(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without its leading batch axis of 1 (runtimes differ in reporting it)."""
    return shape[1:] if shape and shape[0] == 1 else shape


def check_shapes(
    outputs: Sequence[np.ndarray], expected: Sequence[tuple[int, ...]], head: str
) -> None:
    """InferenceError unless the outputs have the expected shapes (a batch axis of 1 may be
    reported or not)."""
    got = [tuple(o.shape) for o in outputs]
    if len(got) != len(expected) or any(
        unbatched(g) != unbatched(e) for g, e in zip(got, expected, strict=False)
    ):
        raise InferenceError(
            f"The model returned outputs of shapes {got}, but its {head} needs "
            f"{[tuple(e) for e in expected]}."
        )


def passing(best: np.ndarray, conf: float) -> tuple[np.ndarray, int]:
    """Indices of the finite scores >= conf, and how many scores are NaN/inf."""
    cells = np.flatnonzero(best >= conf)
    finite = np.isfinite(best)
    if finite.all():
        return cells, 0
    return cells[finite[cells]], best.size - int(np.count_nonzero(finite))


def dfl(logits: np.ndarray) -> np.ndarray:
    """Expected bin of each side's 16-bin softmax: (4, 16, k) logits -> (4, k) distances.

    The sums over the bins are taken one bin at a time (elementwise): each box's sum is then
    the same whatever other boxes are decoded with it, which a matrix product does not
    promise (its order of summation may depend on how many columns it has).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        e = logits - logits.max(axis=1, keepdims=True)
        np.exp(e, out=e)
        e = np.ascontiguousarray(e.transpose(1, 0, 2))  # (16, 4, k): each bin contiguous
        weighted, total = e[1].copy(), e[0] + e[1]
        for b in range(2, DFL_BINS):
            weighted += b * e[b]
            total += e[b]
        return weighted / total


def cell_tables(
    grids: Sequence[tuple[int, int]], strides: Sequence[int]
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Over the cells of all strides in order: where each stride's cells start, every
    cell's centre (x, y) in cells of its stride (2, N), and its stride (N,)."""
    offsets, centres, cell_strides = [], [], []
    start = 0
    for (gh, gw), stride in zip(grids, strides, strict=True):
        offsets.append(start)
        start += gh * gw
        row, col = np.divmod(np.arange(gh * gw), gw)
        centres.append(np.stack([col, row]) + 0.5)
        cell_strides.append(np.full(gh * gw, stride))
    return (
        offsets,
        np.concatenate(centres, axis=1).astype(np.float32),
        np.concatenate(cell_strides).astype(np.float32),
    )


def xywh_to_xyxy(cx: np.ndarray, cy: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """(n, 4) float32 corners x1 y1 x2 y2 from centres and sizes (NaN/inf let through)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(
            np.float32, copy=False
        )


def scored(
    obj: np.ndarray, best_cls: np.ndarray, conf: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Score (object x best class score), which pass ``conf``, and how many were NaN/inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        scores = obj * best_cls
    finite = np.isfinite(scores)
    kept = np.flatnonzero(finite & (scores >= conf))
    bad = scores.size - int(np.count_nonzero(finite))
    return scores[kept], kept, bad


def yolov5_boxes(
    xywh: np.ndarray,
    anchor: np.ndarray,
    cells: np.ndarray,
    gw: int,
    stride: int,
    anchors: np.ndarray,
) -> np.ndarray:
    """(n, 4) float32 x1 y1 x2 y2 of YOLOv5 candidates (the model zoo's formula): their
    (n, 4) sigmoided x, y, w, h, their anchor and cell in a stride ``gw`` cells wide, and
    that stride's (A, 2) anchors."""
    s = np.float32(stride)
    cx = (xywh[:, 0] * 2 - 0.5 + (cells % gw)) * s
    cy = (xywh[:, 1] * 2 - 0.5 + (cells // gw)) * s
    w = (xywh[:, 2] * 2) ** 2 * anchors[anchor, 0]
    h = (xywh[:, 3] * 2) ** 2 * anchors[anchor, 1]
    return xywh_to_xyxy(cx, cy, w, h)


class HeadLike(Protocol):
    """What :class:`GridDecoder` reads of a recognised head."""

    @property
    def family(self) -> str: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    def describe(self) -> str: ...


H = TypeVar("H", bound=HeadLike)
S = TypeVar("S", bound=Thresholds)
M = TypeVar("M")  # a decoder's method for one head family


class GridDecoder(Generic[H, S]):
    """What every decoder (detection, segmentation, pose, oriented boxes) keeps: its head,
    the input size, the settings and per-output quantisation (both checked), each stride's
    grid and the cell tables of :func:`cell_tables`."""

    def __init__(
        self,
        head: H,
        input_hw: tuple[int, int],
        settings: S | None = None,
        quant: Sequence[Quant] = (),
    ) -> None:
        """``settings``: None for :meth:`_default_settings`. ``quant`` gives, per output, the
        (scale, zero_point) of an int8/uint8 output a runtime returns unconverted (None or
        absent: the output is float)."""
        settings = settings if settings is not None else self._default_settings()
        self._check_settings(settings)
        self.head = head
        self.input_hw = (int(input_hw[0]), int(input_hw[1]))
        self.settings = settings
        self.quant = check_quant(quant)
        self._grids = grid_sizes(self.input_hw, head.strides)
        self._offsets, self._centres, self._strides = cell_tables(self._grids, head.strides)
        self._cells = sum(h * w for h, w in self._grids)
        self._ready()

    def _ready(self) -> None:
        """A decoder's own set-up, once the head, settings and grids are known (which
        method decodes its head family, anchors): none here."""

    def _by_family(self, methods: Mapping[str, M], what: str) -> M:
        """The one of ``methods`` (by head family) that decodes this decoder's head;
        UsageError naming the ``what`` head family when none does."""
        method = methods.get(self.head.family)
        if method is None:
            raise UsageError(f"No decoder for the {what} head family {self.head.family!r}.")
        return method

    def _default_settings(self) -> S:
        raise NotImplementedError  # a decoder whose settings may be left out says which

    def _check_settings(self, settings: S) -> None:
        check_settings(settings)

    def _quant(self, i: int) -> Quant:
        return quant_of(self.quant, i)

    def _real(self, i: int, values: np.ndarray) -> np.ndarray:
        """Output ``i``'s values as float32 (int8/uint8 dequantised with its scale, zp)."""
        return real(values, quant_of(self.quant, i), i)

    def _check_shapes(
        self, outputs: Sequence[np.ndarray], expected: Sequence[tuple[int, ...]]
    ) -> None:
        check_shapes(outputs, expected, self.head.describe())

    def _cell_boxes(self, at: np.ndarray, dist: np.ndarray) -> np.ndarray:
        """(n, 4) x1 y1 x2 y2 in input pixels of the cells ``at`` (over all strides) from
        their DFL distances (4, n): left, top, right, bottom in cells of their stride."""
        centre = self._centres[:, at]  # (2, n) in cells
        xyxy = np.concatenate((centre - dist[:2], centre + dist[2:]))
        return (xyxy * self._strides[at]).T


def batch_one_shapes(output_shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]] | None:
    """The shapes with a dynamic batch axis made 1; None when there are none, or when one is
    not of batch 1."""
    shapes = [batch_one(tuple(s)) for s in output_shapes]
    if not shapes or any(s is None for s in shapes):
        return None
    return shapes  # type: ignore[return-value]  # no None left


def ultralytics_strides(input_hw: tuple[int, int], cells: int) -> tuple[int, ...] | None:
    """The stride set whose grids for this input have ``cells`` cells in all, or None."""
    for strides in STRIDE_SETS:
        if cells == sum(h * w for h, w in grid_sizes(input_hw, strides)):
            return strides
    return None


def zoo_classes(input_hw: tuple[int, int], shapes: Sequence[tuple[int, ...]]) -> int | None:
    """C when the shapes are the zoo's 3 x (1, 64 + C, H, W) for strides 8/16/32, else None."""
    grids = grid_sizes(input_hw, STRIDES)
    if len(shapes) != 3 or any(
        len(s) != 4 or tuple(s[2:]) != g for s, g in zip(shapes, grids, strict=True)
    ):
        return None
    channels = {s[1] for s in shapes}
    if len(channels) != 1:
        return None
    nc = channels.pop() - 4 * DFL_BINS
    return nc if nc >= 1 else None


def zoo_layout(
    input_hw: tuple[int, int], shapes: Sequence[tuple[int, ...]]
) -> tuple[int, int, tuple[int, ...]] | None:
    """(C, N cells, the extra output's shape) when the shapes are the zoo's 3 x
    (1, 64 + C, H, W) for strides 8/16/32 and one extra output, else None."""
    if len(shapes) != len(STRIDES) + 1:
        return None
    nc = zoo_classes(input_hw, shapes[:3])
    if not nc:
        return None
    return nc, sum(h * w for h, w in grid_sizes(input_hw, STRIDES)), shapes[3]


@dataclass
class Candidates:
    """The cells that passed the threshold: over all strides, in the order of the cells."""

    cells: np.ndarray  # (k,) cell index over all strides (0..N-1)
    scores: np.ndarray  # (k,) float32, sigmoid applied
    class_ids: np.ndarray  # (k,) int32
    sides: np.ndarray  # (4, k) float32: zoo: DFL left, top, right, bottom in cells;
    #                    Ultralytics: cx, cy, w, h in input pixels
    nonfinite: int  # cells dropped for a NaN/inf score or box


def _logit(p: float) -> float:
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def zoo_candidates(
    outputs: Sequence[np.ndarray],
    quant: Sequence[Quant],
    grids: Sequence[tuple[int, int]],
    offsets: Sequence[int],
    num_classes: int,
    conf: float,
) -> Candidates:
    """Candidates of the zoo's per-stride (1, 64 + C, H, W) outputs (class logits)."""
    threshold = _logit(conf)
    parts: list[tuple[np.ndarray, ...]] = []
    nonfinite = 0
    for b, (gh, gw) in enumerate(grids):
        q = quant_of(quant, b)
        raw = outputs[b].reshape(4 * DFL_BINS + num_classes, gh * gw)
        cls = raw[4 * DFL_BINS :]
        best = real(cls.max(axis=0), q, b)  # max then dequantise: scale > 0 keeps the order
        cells, bad = passing(best, threshold)
        nonfinite += bad
        if not cells.size:
            continue
        logits = real(raw[: 4 * DFL_BINS, cells], q, b).reshape(4, DFL_BINS, -1)
        parts.append((cells + offsets[b], best[cells], cls[:, cells].argmax(axis=0), logits))
    if not parts:
        return _empty(nonfinite)
    cells, best, class_ids, logits = (np.concatenate(p, axis=-1) for p in zip(*parts, strict=True))
    scores = _sigmoid(best)
    return _finite(Candidates(cells, scores, class_ids.astype(np.int32), dfl(logits), nonfinite))


def ultralytics_candidates(
    raw: np.ndarray, q: Quant, num_classes: int, conf: float, i: int = 0
) -> Candidates:
    """Candidates of Ultralytics' (4 + C + E, N) output ``i`` (class scores sigmoided)."""
    best = real(raw[4 : 4 + num_classes].max(axis=0), q, i)
    cells, nonfinite = passing(best, conf)
    if not cells.size:
        return _empty(nonfinite)
    class_ids = raw[4 : 4 + num_classes, cells].argmax(axis=0).astype(np.int32)
    sides = real(raw[:4, cells], q, i)
    return _finite(Candidates(cells, best[cells], class_ids, sides, nonfinite))


def _empty(nonfinite: int) -> Candidates:
    return Candidates(
        np.zeros(0, np.intp), np.zeros(0, np.float32), np.zeros(0, np.int32),
        np.zeros((4, 0), np.float32), nonfinite,
    )  # fmt: skip


def _finite(c: Candidates) -> Candidates:
    ok = np.isfinite(c.sides).all(axis=0)
    if ok.all():
        return c
    bad = len(ok) - int(np.count_nonzero(ok))
    return Candidates(c.cells[ok], c.scores[ok], c.class_ids[ok], c.sides[:, ok], c.nonfinite + bad)


def finite_extra(c: Candidates, extra: np.ndarray, ok: np.ndarray) -> tuple[Candidates, np.ndarray]:
    """The candidates, and their extra values (keypoints, angles), where ``ok`` (the extra
    values are finite); the others are counted in ``nonfinite``."""
    if ok.all():
        return c, extra
    kept = pick(c, ok)
    kept.nonfinite += len(ok) - int(np.count_nonzero(ok))
    return kept, extra[ok]


def pick(c: Candidates, keep: np.ndarray) -> Candidates:
    """The candidates at ``keep`` (indices or mask), in that order."""
    return Candidates(
        c.cells[keep], c.scores[keep], c.class_ids[keep], c.sides[:, keep], c.nonfinite
    )
