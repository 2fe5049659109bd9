"""Per-item results of one detector over the dataset: what detection metrics are computed on.

:class:`DetectionItems` is the detection counterpart of
:class:`~batchinfer.evaluate.items.ItemResults` (custom metrics of a detection job get
one). Arrays are in dataset order; each item's boxes are a float32 (n, 6) array
``x1, y1, x2, y2, score, class_id`` in the upright original image's pixels, best first,
and None for an error row. As a table (the reference cache, ``items.parquet``, the
baseline) the boxes are the predictions' own column, a list of structs
``{class_id, label, score, x1, y1, x2, y2}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchinfer.evaluate.groundtruth import GroundTruth
from batchinfer.evaluate.items import PerItem
from batchinfer.tasks.boxes import BOX_TYPE

if TYPE_CHECKING:
    from batchinfer.sink.rows import Row

_NO_BOXES = np.zeros((0, 6), dtype=np.float32)


@dataclass
class DetectionItems(PerItem):
    """One detector's results for every item (see the module docstring).

    - ``index`` (int64), ``id`` (str): as in ItemResults
    - ``core`` (int64, -1 when none gave it), ``node`` (str or None), ``error`` (str or None)
    - ``boxes``: one (n, 6) float32 array per item, None for an error row
    - ``width``, ``height`` (int64): the upright image's size, -1 when unknown
    - ``names``: class names by class id (may be empty)
    """

    index: np.ndarray
    id: np.ndarray
    core: np.ndarray
    node: np.ndarray
    error: np.ndarray
    boxes: list[np.ndarray | None]
    width: np.ndarray
    height: np.ndarray
    names: tuple[str, ...] = ()

    @property
    def n_boxes(self) -> np.ndarray:
        return np.array([-1 if b is None else len(b) for b in self.boxes], dtype=np.int64)

    def label_of(self, class_id: int) -> str:
        return self.names[class_id] if 0 <= class_id < len(self.names) else str(class_id)

    @classmethod
    def from_rows(cls, rows: Sequence[Row], names: Sequence[str] = ()) -> DetectionItems:
        """Arrays from the engine's rows (any order)."""
        rows = sorted(rows, key=lambda r: r.index)

        def boxes_of(row: Row) -> np.ndarray | None:
            if row.error is not None:
                return None
            if row.boxes is None:
                return _NO_BOXES
            return np.asarray(row.boxes, dtype=np.float32).reshape(-1, 6)

        return cls(
            index=np.array([r.index for r in rows], dtype=np.int64),
            id=np.array([r.id for r in rows], dtype=object),
            core=np.array([-1 if r.core is None else r.core for r in rows], dtype=np.int64),
            node=np.array([r.node for r in rows], dtype=object),
            error=np.array([r.error for r in rows], dtype=object),
            boxes=[boxes_of(r) for r in rows],
            width=np.array([-1 if r.width is None else r.width for r in rows], dtype=np.int64),
            height=np.array([-1 if r.height is None else r.height for r in rows], dtype=np.int64),
            names=tuple(names),
        )

    # ------------------------------------------------------------------ rows and boxes
    def box_dicts(self, i: int) -> list[dict[str, Any]] | None:
        """Item ``i``'s boxes as the predictions' structs (None for an error row)."""
        b = self.boxes[i]
        if b is None:
            return None
        return [
            {
                "class_id": int(c),
                "label": self.label_of(int(c)),
                "score": float(s),
                "x1": float(x1),
                "y1": float(y1),
                "x2": float(x2),
                "y2": float(y2),
            }
            for x1, y1, x2, y2, s, c in b.tolist()
        ]

    def rows(self) -> list[dict[str, Any]]:
        """Prediction rows ``{"id", "boxes"}`` as :func:`batchinfer.detect.coco_results`
        reads them."""
        return [{"id": self.id[i], "boxes": self.box_dicts(i)} for i in range(len(self))]

    # ------------------------------------------------------------------ Parquet
    def to_table(self, with_outputs: bool = True) -> pa.Table:
        """The items as a table; ``with_outputs`` is ItemResults' (raw outputs are not kept
        for detection: the boxes are the result)."""
        rows = [self.box_dicts(i) for i in range(len(self))]
        table = pa.table(
            {
                "index": pa.array(self.index),
                "id": pa.array(self.id.tolist(), pa.string()),
                "core": pa.array(self.core),
                "node": pa.array(self.node.tolist(), pa.string()),
                "error": pa.array(self.error.tolist(), pa.string()),
                "boxes": pa.array(rows, pa.list_(BOX_TYPE)),
                "n_boxes": pa.array([None if r is None else len(r) for r in rows], pa.int32()),
                "width": pa.array(self.width),
                "height": pa.array(self.height),
            }
        )
        meta = {b"batchinfer.class_names": json.dumps(list(self.names)).encode()}
        return table.replace_schema_metadata(meta)

    @classmethod
    def from_table(cls, table: pa.Table) -> DetectionItems:
        meta = table.schema.metadata or {}
        names = tuple(json.loads(meta.get(b"batchinfer.class_names", b"[]")))
        boxes: list[np.ndarray | None] = []
        for row in table.column("boxes").to_pylist():
            if row is None:
                boxes.append(None)
                continue
            values = [[b["x1"], b["y1"], b["x2"], b["y2"], b["score"], b["class_id"]] for b in row]
            boxes.append(np.array(values, dtype=np.float32).reshape(-1, 6))
        n = table.num_rows

        def column(name: str, fill: Any) -> np.ndarray:
            if name not in table.column_names:
                return np.full(n, fill, dtype=object if fill is None else np.int64)
            values = table.column(name).to_pylist()
            if fill is None:
                return np.array(values, dtype=object)
            return np.array([fill if v is None else v for v in values], dtype=np.int64)

        return cls(
            index=column("index", -1),
            id=np.array(table.column("id").to_pylist(), dtype=object),
            core=column("core", -1),
            node=column("node", None),
            error=column("error", None),
            boxes=boxes,
            width=column("width", -1),
            height=column("height", -1),
            names=names,
        )


def coco_predictions(
    items: DetectionItems,
    gt: GroundTruth,
    category_ids: Sequence[int],
    only: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """COCO result dicts of the items that have ground truth (and are in ``only``, if
    given), by :func:`batchinfer.detect.coco_results`."""
    from batchinfer.detect import coco_results

    rows = [
        r for r in items.rows() if r["id"] in gt.image_ids and (only is None or r["id"] in only)
    ]
    return coco_results(rows, gt.image_ids, category_ids)


__all__ = ["BOX_TYPE", "DetectionItems", "coco_predictions"]
