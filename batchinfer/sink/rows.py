"""Rows and row sinks: where the engine's results go.

A :class:`Row` is one dataset item's result, success or error (the prediction schema in
predictions.py has the same columns). A sink takes rows in batches:

- the Parquet parts of a run folder (:class:`~batchinfer.sink.predictions.PredictionWriter`);
- :class:`MemorySink`: rows kept in memory (nightly evaluation scores them);
- :class:`NullSink`: rows dropped (benchmarks, which only need the events).

``Row.outputs`` are views into shared memory that are reused as soon as ``write`` returns:
a sink that keeps outputs copies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(slots=True)
class Row:
    """One item's result; ``error`` None on success."""

    index: int
    id: str
    id_bytes: bytes | None
    label: int | None
    label_name: str | None
    core: int | None
    instance: int | None
    attempt: int
    latency_ms: float | None
    read_ms: float | None
    wait_ms: float | None
    error: str | None
    pred: int | None = None
    topk_index: np.ndarray | None = None
    topk_score: np.ndarray | None = None
    outputs: list[np.ndarray] | None = None  # views: valid only during RowSink.write
    t_done: float = 0.0  # time.monotonic() when the row became due (not written to Parquet)
    node: str | None = None  # the cluster node that ran it (None on one board)
    # A list's other columns for the item (Item.columns): the predictions' ``meta`` struct.
    meta: Mapping[str, object] | None = None
    # A video frame's 0-based index in its video and presentation time (s); None otherwise.
    frame: int | None = None
    time_s: float | None = None
    # What the task's decoder made of the item in the core worker (batchinfer/tasks:
    # Task.decoder); None for tasks that decode in the coordinator, and on error rows.
    payload: Any = None

    # A box task's payload (tasks/boxes.py BoxRows), as detection readers (evaluate/) read
    # it: float32 (n, 6) x1, y1, x2, y2, score, class id in the original image's pixels,
    # best first; and that image's size. None for other tasks.
    @property
    def boxes(self) -> np.ndarray | None:
        return getattr(self.payload, "rows", None)

    @property
    def width(self) -> int | None:
        return getattr(self.payload, "width", None)

    @property
    def height(self) -> int | None:
        return getattr(self.payload, "height", None)


class RowSink(Protocol):
    """Where rows go. ``open`` comes before the first row, with the model's output shapes."""

    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None: ...

    def write(self, rows: list[Row]) -> None: ...

    def close(self) -> None: ...


class NullSink:
    """Drops every row."""

    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        pass

    def write(self, rows: list[Row]) -> None:
        pass

    def close(self) -> None:
        pass


class MemorySink:
    """Keeps every row in memory, with a copy of its outputs when ``keep_outputs``."""

    def __init__(self, keep_outputs: bool = False) -> None:
        self.keep_outputs = keep_outputs
        self.rows: list[Row] = []
        self.output_shapes: list[tuple[tuple[int, ...], str]] = []

    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        self.output_shapes = list(outputs)

    def write(self, rows: list[Row]) -> None:
        for row in rows:
            if row.outputs is not None:
                row.outputs = [np.array(o) for o in row.outputs] if self.keep_outputs else None
            self.rows.append(row)

    def close(self) -> None:
        pass

    def sorted_rows(self) -> list[Row]:
        """The rows in dataset order."""
        return sorted(self.rows, key=lambda r: r.index)
