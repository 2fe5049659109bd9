"""Per-item results of one model over the dataset, as arrays: what metrics are computed on.

:class:`ItemResults` is what custom metrics receive (``module:function`` gets one and
returns ``{name: value}``). Arrays are in dataset order (by ``index``); an item that
failed (an error row) has ``pred`` -1, ``topk`` -1 and NaN outputs, and its ``error`` set.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.sink.rows import Row


class PerItem:
    """What every task's per-item results have (ItemResults, a detection job's
    DetectionItems): ``index``, ``id``, ``core``, ``node`` and ``error`` arrays."""

    index: np.ndarray
    core: np.ndarray
    node: np.ndarray | None
    error: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    @property
    def ok(self) -> np.ndarray:
        """Items that have a result (not error rows)."""
        return np.array([e is None for e in self.error], dtype=bool)

    @property
    def places(self) -> list[tuple[str | None, int]]:
        """Each item's (node, core): node None on one board, core -1 when none gave it."""
        assert self.node is not None
        return list(zip(self.node.tolist(), self.core.tolist(), strict=True))


@dataclass
class ItemResults(PerItem):
    """One model's results for every item (see the module docstring).

    - ``index`` (int64): position in the dataset's order; ``id`` (str): path in the dataset
    - ``label`` (int64): class index from the class map, -1 when the item has none
    - ``label_name`` (str or None): the class folder's name
    - ``pred`` (int64): top-1 class, -1 for an error row
    - ``topk`` (int32, n x k): the best k classes, best first, -1 padded
    - ``core`` (int64): the NPU core that gave the result, -1 when none did
    - ``node`` (str or None): the cluster node of that core (None on one board)
    - ``error`` (str or None): why the item failed
    - ``outputs``: one float32 array per model output, shaped (n, *output shape)
    """

    index: np.ndarray
    id: np.ndarray
    label: np.ndarray
    label_name: np.ndarray
    pred: np.ndarray
    topk: np.ndarray
    core: np.ndarray
    error: np.ndarray
    outputs: list[np.ndarray]
    node: np.ndarray | None = None  # None: every item on one board

    def __post_init__(self) -> None:
        if self.node is None:
            self.node = np.full(len(self.index), None, dtype=object)

    @property
    def labelled(self) -> np.ndarray:
        return self.label >= 0

    @property
    def correct(self) -> np.ndarray:
        """Top-1 correct; an error row is never correct."""
        return self.ok & self.labelled & (self.pred == self.label)

    def flat_outputs(self) -> np.ndarray:
        """Every output of each item flattened into one row (n x total size), float64."""
        if not self.outputs:
            return np.full((len(self), 0), np.nan)
        return np.concatenate(
            [o.reshape(len(self), -1).astype(np.float64) for o in self.outputs], axis=1
        )

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Row],
        output_shapes: Sequence[tuple[int, ...]],
        topk: int,
        relabel: dict[str, int] | None = None,
    ) -> ItemResults:
        """Arrays from the engine's rows (any order); ``relabel`` maps class folder -> class."""
        rows = sorted(rows, key=lambda r: r.index)
        n = len(rows)
        top = np.full((n, topk), -1, dtype=np.int32)
        outputs = [np.full((n, *shape), np.nan, dtype=np.float32) for shape in output_shapes]
        for i, row in enumerate(rows):
            if row.topk_index is not None:
                k = min(topk, len(row.topk_index))
                top[i, :k] = row.topk_index[:k]
            if row.error is None and row.outputs is not None:
                for out, value in zip(outputs, row.outputs, strict=True):
                    out[i] = np.asarray(value).reshape(out.shape[1:])

        def label_of(row: Row) -> int:
            if relabel is not None and row.label_name is not None:
                return relabel.get(row.label_name, -1)
            return -1 if row.label is None else int(row.label)

        return cls(
            index=np.array([r.index for r in rows], dtype=np.int64),
            id=np.array([r.id for r in rows], dtype=object),
            label=np.array([label_of(r) for r in rows], dtype=np.int64),
            label_name=np.array([r.label_name for r in rows], dtype=object),
            pred=np.array(
                [-1 if r.error is not None or r.pred is None else r.pred for r in rows],
                dtype=np.int64,
            ),
            topk=top,
            core=np.array([-1 if r.core is None else r.core for r in rows], dtype=np.int64),
            error=np.array([r.error for r in rows], dtype=object),
            outputs=outputs,
            node=np.array([r.node for r in rows], dtype=object),
        )

    # ------------------------------------------------------------------ Parquet
    def to_table(self, with_outputs: bool = True) -> pa.Table:
        """The results as a table (outputs as fixed-size lists, shapes in the metadata)."""
        k = self.topk.shape[1]  # metrics.topk, at least 1
        assert self.node is not None  # __post_init__ filled it
        columns = {
            "index": pa.array(self.index),
            "id": pa.array(self.id.tolist(), pa.string()),
            "label": pa.array(self.label),
            "label_name": pa.array(self.label_name.tolist(), pa.string()),
            "pred": pa.array(self.pred),
            "topk_index": pa.FixedSizeListArray.from_arrays(
                pa.array(self.topk.reshape(-1), pa.int32()), k
            ),
            "core": pa.array(self.core),
            "node": pa.array(self.node.tolist(), pa.string()),
            "error": pa.array(self.error.tolist(), pa.string()),
        }
        shapes = []
        if with_outputs:
            for i, out in enumerate(self.outputs):
                size = int(np.prod(out.shape[1:]))
                flat = pa.array(out.reshape(-1).astype(np.float32), pa.float32())
                columns[f"output{i}"] = pa.FixedSizeListArray.from_arrays(flat, size)
                shapes.append(list(out.shape[1:]))
        table = pa.table(columns)
        meta = {b"batchinfer.output_shapes": json.dumps(shapes).encode()}
        return table.replace_schema_metadata(meta)

    @classmethod
    def from_table(cls, table: pa.Table) -> ItemResults:
        meta = table.schema.metadata or {}
        shapes = json.loads(meta.get(b"batchinfer.output_shapes", b"[]"))
        n = table.num_rows
        topk_col = table.column("topk_index").combine_chunks()
        width = topk_col.type.list_size
        topk = topk_col.flatten().to_numpy(zero_copy_only=False).reshape(n, width)
        outputs = []
        for i, shape in enumerate(shapes):
            col = table.column(f"output{i}").combine_chunks().flatten()
            outputs.append(col.to_numpy(zero_copy_only=False).reshape(n, *shape))
        return cls(
            index=table.column("index").to_numpy().astype(np.int64),
            id=np.array(table.column("id").to_pylist(), dtype=object),
            label=table.column("label").to_numpy().astype(np.int64),
            label_name=np.array(table.column("label_name").to_pylist(), dtype=object),
            pred=table.column("pred").to_numpy().astype(np.int64),
            topk=topk.astype(np.int32),
            core=table.column("core").to_numpy().astype(np.int64),
            error=np.array(table.column("error").to_pylist(), dtype=object),
            outputs=outputs,
            node=(  # tables written before clusters have no node column
                np.array(table.column("node").to_pylist(), dtype=object)
                if "node" in table.column_names
                else None
            ),
        )

    @classmethod
    def read(cls, path: Path) -> ItemResults:
        return cls.from_table(pq.read_table(path))
