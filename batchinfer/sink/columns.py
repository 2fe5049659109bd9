"""The columns of a prediction part that are not a task's own, as typed arrays.

Every part has the base columns (:data:`BASE_FIELDS`: index, id, ..., error, frame,
time_s); the classification task's (``pred``, ``topk_index``, ``topk_score``) are built
here too (:class:`TopKColumns`, :func:`top_k_batch`), as the prediction schema had them
before tasks existed. A leaf of the house: batchinfer/tasks builds its columns from these,
and sink/predictions.py writes them; neither is imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from batchinfer.sink.storable import checked_array

if TYPE_CHECKING:
    from batchinfer.sink.rows import Row

BASE_FIELDS = [
    pa.field("index", pa.int64(), nullable=False),
    pa.field("id", pa.string()),
    # The exact name when it is not valid UTF-8 (else null); ``id`` then shows it escaped.
    pa.field("id_bytes", pa.binary()),
    pa.field("label", pa.int64()),
    pa.field("label_name", pa.string()),
    # The cluster node that ran the item (batchinfer.cluster); null on one board.
    pa.field("node", pa.string()),
    pa.field("core", pa.int16()),
    pa.field("instance", pa.int16()),
    pa.field("attempt", pa.int16()),
    pa.field("latency_ms", pa.float32()),
    pa.field("read_ms", pa.float32()),
    pa.field("wait_ms", pa.float32()),
    pa.field("error", pa.string()),
    # Video frames (batchinfer.data.video): the frame's index in its video, its time (s).
    pa.field("frame", pa.int64()),
    pa.field("time_s", pa.float64()),
]
#: The classify task's columns (batchinfer/tasks/classify.py), after the base ones.
CLASSIFY_FIELDS = [
    pa.field("pred", pa.int64()),
    pa.field("topk_index", pa.list_(pa.int32())),
    pa.field("topk_score", pa.list_(pa.float32())),
]


def base_field_names() -> frozenset[str]:
    """Columns every part has, whatever its task (a plug-in's fields may not take them)."""
    return frozenset(f.name for f in BASE_FIELDS) | {"meta"}


def top_k_batch(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best classes of each row of ``scores`` (n, C), and their scores, best first.

    Ties go to the lower class index; NaN scores rank last. One vectorised pass for a batch
    of rows: the engine's collector calls it once per batch of results.
    """
    n, c = scores.shape
    k = min(k, c)
    if k <= 0:
        return np.empty((n, 0), np.int32), np.empty((n, 0), np.float32)
    key = scores
    if np.isnan(key.min()):  # min propagates NaN: no n x C mask unless there is one
        key = np.where(np.isnan(key), -np.inf, key)
    if k <= _ARGMAX_K and k < c and np.issubdtype(key.dtype, np.floating):
        index = _top_k_by_argmax(key, k)
        return index.astype(np.int32), scores[np.arange(n)[:, None], index].astype(np.float32)
    rows = np.arange(n)[:, None]
    if k < c:
        # After argpartition at C-k-1 and C-k, the last k positions hold the k largest
        # (unordered) and position C-k-1 the next one.
        order = np.argpartition(key, (c - k - 1, c - k), axis=1)
        candidates = order[:, c - k :]
        kth, next_below = key[rows[:, 0], order[:, c - k]], key[rows[:, 0], order[:, c - k - 1]]
    else:
        candidates = np.broadcast_to(np.arange(c), (n, c))
    values = key[rows, candidates]
    index = candidates[rows, np.lexsort((candidates, -values), axis=1)]
    if k < c:
        # argpartition chooses arbitrarily among values tied at the k-th place (the next
        # value equals the k-th): such rows are sorted whole, so the lower class indexes win.
        for r in np.flatnonzero(next_below == kth):
            index[r] = np.lexsort((np.arange(c), -key[r].astype(np.float64)))[:k]
    return index.astype(np.int32), scores[rows, index].astype(np.float32)


# Up to this k, top-k is k passes of argmax (each a fast vectorised scan) rather than one
# argpartition. `python tools/bench_topk.py`, top-5, µs per row: 1,000 classes 2.9 against
# 5.1 (8 rows) and 0.95 against 10.7 (64 rows); 21,843 classes 14 against 189 (8 rows).
_ARGMAX_K = 16


def _top_k_by_argmax(key: np.ndarray, k: int) -> np.ndarray:
    """Top-k of each row of float ``key`` (n, C), k < C, NaN already -inf: argmax picks the
    best, which is then struck out, k times. argmax returns the first of equal maxima, so ties
    go to the lower class index at every place, the kth included."""
    n, c = key.shape
    work = key.copy()
    rows = np.arange(n)
    index = np.empty((n, k), np.intp)
    for j in range(k):
        best = work.argmax(axis=1)
        index[:, j] = best
        if j < k - 1:
            work[rows, best] = -np.inf
    # A row whose best left is -inf cannot tell struck-out classes from its own -inf scores:
    # it is sorted whole (below); this never happens with finite scores. The best left only
    # falls from pass to pass, so the last pass tells for all.
    if np.isneginf(work[rows, best]).any():
        for r in np.flatnonzero(np.isneginf(key).sum(axis=1) > c - k):
            index[r] = np.lexsort((np.arange(c), -key[r].astype(np.float64)))[:k]
    return index


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best classes of ``scores`` (flattened) and their scores, best first.

    Ties go to the lower class index; NaN scores rank last.
    """
    x = np.asarray(scores).reshape(1, -1)
    index, values = top_k_batch(x, k)
    return index[0], values[0]


class Column:
    """A growable numpy column with a validity mask: a row costs its bytes, not a Python object.

    Holding a few thousand rows as Python ints, floats and small arrays costs kilobytes a
    row; as typed arrays it costs tens of bytes, so the coordinator's memory does not depend
    on how many rows a part waits for.
    """

    def __init__(self, dtype: str, width: int = 0, nulls: int = 0) -> None:
        """An empty column, or one that starts with ``nulls`` null rows."""
        self.dtype, self.width, self.n = dtype, width, 0
        self.values: np.ndarray = np.zeros(0, dtype)
        self.valid: np.ndarray = np.zeros(0, bool)
        self._grow(max(256, 2 * nulls))
        self.n = nulls

    def _grow(self, capacity: int) -> None:
        shape = (capacity, self.width) if self.width else (capacity,)
        values, valid = np.zeros(shape, self.dtype), np.zeros(capacity, bool)
        if self.n:
            values[: self.n], valid[: self.n] = self.values[: self.n], self.valid[: self.n]
        self.values, self.valid = values, valid

    def extend(self, values: list) -> None:
        """Append values (None: null) in one go."""
        m = len(values)
        if self.n + m > len(self.valid):
            self._grow(max(2 * len(self.valid), self.n + m))
        valid = [v is not None for v in values]
        at = slice(self.n, self.n + m)
        if all(valid):
            self.values[at] = np.stack(values) if self.width else values
            self.valid[at] = True
        else:
            where = np.flatnonzero(valid) + self.n
            present = [v for v in values if v is not None]
            if present:
                self.values[where] = np.stack(present) if self.width else present
            self.valid[at] = valid
        self.n += m

    def arrow(self, value_type: pa.DataType) -> pa.Array:
        values, mask = self.values[: self.n], ~self.valid[: self.n]
        if not self.width:
            return pa.array(values, type=value_type, mask=mask)
        offsets = np.zeros(self.n + 1, np.int32)
        np.cumsum(np.where(mask, 0, self.width), out=offsets[1:])
        flat = values[~mask].reshape(-1)
        return pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(flat, type=value_type), mask=null_mask(mask)
        )


def list_array(chunks: list[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    """One Arrow list column from per-row arrays (None -> null), without per-element Python."""
    lengths = np.fromiter((0 if c is None else c.size for c in chunks), np.int64, len(chunks))
    offsets = np.zeros(len(chunks) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [c for c in chunks if c is not None]
    values = np.concatenate(present) if present else np.empty(0, value_type.to_pandas_dtype())
    mask = null_mask(np.fromiter((c is None for c in chunks), bool, len(chunks)))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type), mask=mask)


def null_mask(mask: np.ndarray) -> pa.Array | None:
    """``mask`` for ListArray.from_arrays, or None when no row is null: given a mask, pyarrow
    imports pyarrow.compute to apply it, at the end of every run (53 ms with what only it
    imports, once pyarrow.parquet is in; ``python -X importtime -c "import pyarrow.parquet,
    pyarrow.compute"`` shows it)."""
    return pa.array(mask) if mask.any() else None


class TopKColumns:
    """A part's ``pred``, ``topk_index`` and ``topk_score`` (the classify task's columns),
    as typed arrays: a row costs its bytes, not Python objects."""

    def __init__(self) -> None:
        self._pred: list[int | None] = []
        self._rows = 0
        # Top-k width is known at the first row that has one (k = min(topk, classes)).
        self._index: Column | None = None
        self._score: Column | None = None

    def add(self, rows: Sequence[Row], ok: Sequence[bool]) -> int:
        """Buffer rows' top-k (``ok`` False: an error row, nulls); ValueError, before any
        append, when rows have top-k of different widths."""
        topk = [r.topk_index if good else None for r, good in zip(rows, ok, strict=True)]
        widths = {t.size for t in topk if t is not None}
        if self._index is not None:
            widths.add(self._index.width)
        if len(widths) > 1:
            raise ValueError(f"rows have top-k of different widths {sorted(widths)}")
        self._pred.extend([r.pred if good else None for r, good in zip(rows, ok, strict=True)])
        if widths and self._index is None:  # earlier rows had none: null
            (width,) = widths
            self._index = Column("int32", width, nulls=self._rows)
            self._score = Column("float32", width, nulls=self._rows)
        if self._index is not None and self._score is not None:
            self._index.extend(topk)
            self._score.extend(
                [r.topk_score if t is not None else None for r, t in zip(rows, topk, strict=True)]
            )
        self._rows += len(rows)
        return 0

    def arrays(self, bad: dict[int, str]) -> list[pa.Array]:
        arrays = [checked_array(self._pred, "pred", pa.int64(), bad)]
        for col, value_type in ((self._index, pa.int32()), (self._score, pa.float32())):
            if col is None:
                arrays.append(pa.nulls(self._rows, pa.list_(value_type)))
            else:
                arrays.append(col.arrow(value_type))
        return arrays
