"""Prediction rows, one per dataset item, written as Parquet parts under OUT/predictions/.

Every row has the base columns (index, id, ..., error); the run's task adds its own
(batchinfer/tasks: ``Task.fields``/``Task.arrays``): a classification run's rows hold the
top-1 and top-k classes (``pred``, ``topk_index``, ``topk_score``); a detection run's its
boxes (``boxes``: a list of structs class_id, label, score, x1, y1, x2, y2 in the original
image's pixels, best first), ``n_boxes`` and the image's ``width``/``height``; a raw run's
none, only its outputs (``out_<name>`` columns); a plug-in's the fields it declares.

Memory stays bounded whatever the dataset size: rows wait in column buffers until
``rows_per_part`` rows (or ``max_buffer_bytes`` of saved outputs) are buffered, or
``flush_interval_s`` has passed, and are then written as one part. Each part is written
to ``.part-NNNNN.parquet.tmp``, fsync'd and renamed, so a part is whole or absent and a
crash loses at most the rows not yet written (``--resume`` runs those again).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from batchinfer.errors import OutputWriteError
from batchinfer.sink.atomic import write_error, write_table_atomically
from batchinfer.sink.columns import (
    BASE_FIELDS,
    CLASSIFY_FIELDS,
    TopKColumns,
    base_field_names,
    list_array,
    top_k,
    top_k_batch,
)
from batchinfer.sink.folder_handle import Folder
from batchinfer.sink.manifest import PREDICTIONS_DIR, RunManifest
from batchinfer.sink.rows import Row
from batchinfer.sink.storable import (
    RESULT_COLUMNS,
    as_error_rows,
    checked_array,
    meta_array,
    safe_text,
    text_array,
)

if TYPE_CHECKING:
    from batchinfer.tasks import Task

__all__ = [
    "CLASSIFY_FIELDS",
    "PredictionWriter",
    "TopKColumns",
    "base_field_names",
    "part_name",
    "prediction_schema",
    "safe_text",
    "top_k",
    "top_k_batch",
]

_meta_array = meta_array  # its old name here (tests/test_data_sources.py)

PART_GLOB = "part-*.parquet"
META_TOPK = b"batchinfer.topk"
META_OUTPUT_SHAPES = b"batchinfer.output_shapes"
META_TASK = b"batchinfer.task"  # every task's parts but classify's: b"detect", b"raw", ...

# Reading the clock on every add would cost more than the add itself at NPU rates;
# every few dozen adds is often enough for a 10 s flush interval (tqdm does the same).
_CLOCK_EVERY = 32

_DICTIONARY_COLUMNS = ["label_name", "node", "error"]
# Scalar columns filled straight from add()'s keyword arguments, in schema order.
_SCALAR_COLUMNS = [f.name for f in BASE_FIELDS]


def as_task(task: Task | str, class_names: Sequence[str] = ()) -> Task:
    """A task object for a name ("detect"), as a finished run's record makes it."""
    if not isinstance(task, str):
        return task
    from batchinfer.tasks import task_from_record

    return task_from_record({"task": task, "names": list(class_names)})


def part_name(number: int) -> str:
    """The file name of part ``number``: ``part-00042.parquet``."""
    return f"part-{number:05d}.parquet"


def part_number(path: Path) -> int:
    """The number in a ``part-NNNNN.parquet`` file name."""
    return int(path.name[len("part-") : -len(".parquet")])


def output_column(name: str) -> str:
    """The column that holds saved output ``name`` (flattened float32): ``out_<name>``."""
    return f"out_{name}"


def prediction_schema(
    topk: int = 5,
    save_outputs: Sequence[tuple[str, tuple[int, ...]]] | None = None,
    task: Task | str = "classify",
    meta: pa.StructType | None = None,
) -> pa.Schema:
    """The Arrow schema of a prediction part, with top-k and output shapes in its metadata.

    The base columns, then ``task``'s (a Task, or a task's name: module docstring), then
    the saved outputs; ``meta``: a list's other columns (batchinfer.data.listed), as a last
    struct column.
    """
    planned = as_task(task)
    fields = list(BASE_FIELDS) + planned.fields()
    metadata = {META_TOPK: str(topk).encode(), **planned.part_metadata()}
    if save_outputs:
        fields += [pa.field(output_column(n), pa.list_(pa.float32())) for n, _ in save_outputs]
        shapes = {name: [int(d) for d in shape] for name, shape in save_outputs}
        metadata[META_OUTPUT_SHAPES] = json.dumps(shapes).encode()
    if meta is not None:
        fields.append(pa.field("meta", meta))
    return pa.schema(fields, metadata=metadata)


class PredictionWriter:
    """Buffers prediction rows and writes them as atomic Parquet parts.

    Use as a context manager, or call :meth:`close`. Not thread-safe: one coordinator
    thread adds rows.
    """

    def __init__(
        self,
        out_dir: Path | None,
        *,
        topk: int = 5,
        save_outputs: Sequence[tuple[str, tuple[int, ...]]] | None = None,
        rows_per_part: int = 8192,
        first_part: int = 0,
        ledger: RunManifest | None = None,
        flush_interval_s: float = 10.0,
        max_buffer_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
        task: Task | str = "classify",
        class_names: Sequence[str] = (),
        meta: pa.StructType | None = None,
        folder: Folder | None = None,
    ) -> None:
        """``out_dir``: the run folder (parts go to its predictions/), None for none.
        ``folder``: that predictions/ folder held open (a run passes the one it opened
        when it began: every part is written and renamed inside it, whatever the path
        leads to by then); None opens it here."""
        if topk < 0 or rows_per_part < 1 or first_part < 0:
            raise ValueError("topk and first_part must be >= 0 and rows_per_part >= 1")
        names = [name for name, _ in save_outputs or ()]
        if len(set(names)) != len(names):
            raise ValueError(f"save_outputs names must be unique, got {names}")
        # None: no folder; the rows are taken as tables (take_table, the library's infer).
        self.directory = None if out_dir is None else Path(out_dir) / PREDICTIONS_DIR
        self._folder = folder
        self._own_folder = folder is None  # opened here: closed by close()
        if self.directory is not None and folder is None:
            try:
                Path(out_dir).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
                with Folder.open(Path(out_dir)) as out:  # type: ignore[arg-type]
                    self._folder = out.sub(PREDICTIONS_DIR, create=True)
            except OSError as exc:
                raise write_error(self.directory, exc) from exc
        self.topk = topk
        # ``class_names``: a detection run's, when the task is given by its name.
        self.task = as_task(task, class_names)
        self.schema = prediction_schema(topk, save_outputs, self.task, meta)
        # Columns an unstorable value nulls (batchinfer.sink.storable): the task's too.
        self._results = (*RESULT_COLUMNS, *(f.name for f in self.task.fields()))
        self._meta_type = meta
        self._outputs = [(n, tuple(s), math.prod(s)) for n, s in save_outputs or ()]
        self.rows_per_part = rows_per_part
        self.flush_interval_s = flush_interval_s
        self.max_buffer_bytes = max_buffer_bytes
        self._clock = clock
        self._next_part = first_part
        self._ledger = ledger
        self._rows_written = 0
        self._errors_written = 0
        self._parts_written: list[Path] = []
        self._closed = False
        self._adds_since_clock = 0
        self._last_write = clock()
        self._reset_buffers()

    # -- public -----------------------------------------------------------------------

    @property
    def rows_written(self) -> int:
        """Rows that are in parts on disk (buffered rows not included)."""
        return self._rows_written

    @property
    def errors_written(self) -> int:
        """Error rows that are in parts on disk."""
        return self._errors_written

    @property
    def rows_buffered(self) -> int:
        """Rows added but not yet written."""
        return self._rows

    @property
    def next_part(self) -> int:
        """The number the next part will get."""
        return self._next_part

    @property
    def parts_written(self) -> list[Path]:
        """Paths of the parts this writer has written, in order."""
        return list(self._parts_written)

    def add(self, **fields: object) -> None:
        """Buffer one row given as keyword arguments (the fields of :class:`Row`).

        Top-1 and top-k are derived from ``outputs`` when not given (the engine's collector
        gives them, computed for a whole batch at once).
        """
        row = Row(**{"id_bytes": None, **fields})  # type: ignore[arg-type]
        if row.error is None and row.pred is None and row.outputs:
            self.task.collect([row], self.topk)
        self.write([row])

    def write(self, rows: list[Row]) -> None:
        """Buffer rows (RowSink); writes a part when the buffer is full or the interval passed.

        On an error row the outputs are ignored: pred, top-k and saved outputs are null.
        If a triggered write fails, OutputWriteError is raised and the rows stay buffered.
        """
        if self._closed:
            raise ValueError("PredictionWriter is closed")
        done = 0
        while done < len(rows):
            chunk = rows[done : done + self.rows_per_part - self._rows]
            self._extend(chunk)
            done += len(chunk)
            if self.rows_buffered >= self.rows_per_part or self._bytes >= self.max_buffer_bytes:
                self.flush()
        self._adds_since_clock += len(rows)
        if self._adds_since_clock >= _CLOCK_EVERY:
            self._adds_since_clock = 0
            if self.rows_buffered and self._clock() - self._last_write >= self.flush_interval_s:
                self.flush()

    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        """RowSink: nothing to do, the schema was fixed when the writer was made."""

    def _extend(self, rows: list[Row]) -> None:
        """Append ``rows`` to the column buffers, all columns at once."""
        # Everything that can raise runs before the first append, so refused rows leave the
        # column buffers the same length.
        ok = [r.error is None for r in rows]
        saved = [
            self._saved_outputs(r.outputs if good else None)
            for r, good in zip(rows, ok, strict=True)
        ]
        self._bytes += self._task_columns.add(rows, ok)  # may refuse: before any append
        for name in _SCALAR_COLUMNS:
            self._cols[name].extend([getattr(r, name) for r in rows])
        if self._meta_type is not None:
            self._meta.extend(r.meta for r in rows)
        self._rows += len(rows)
        self._errors += ok.count(False)
        for i, column in enumerate(self._saved):
            flats = [row_saved[i] for row_saved in saved]
            column.extend(flats)
            self._bytes += sum(f.nbytes for f in flats if f is not None)

    def flush(self) -> Path | None:
        """Write the buffered rows as the next part; returns its path (None if nothing to write).

        Any failure raises OutputWriteError and keeps the rows, so calling flush() again
        after space is freed writes them. With a ledger, the part is recorded (rows and
        checksum) before it is renamed into place.
        """
        self._adds_since_clock = 0
        if not self.rows_buffered:
            self._last_write = self._clock()
            return None
        if self.directory is None or self._folder is None:
            raise ValueError("a PredictionWriter without a folder hands rows on by take_table")
        if self._ledger is not None:
            self._ledger.check_held()  # before the tmp file: OUT may be another run's now
        path = self.directory / part_name(self._next_part)
        table, errors = pa.table({}), 0

        def record(sha256: str) -> None:
            if self._ledger is not None:
                self._ledger.record_part(
                    path.name, rows=table.num_rows, errors=errors, sha256=sha256
                )

        try:
            table = self._table()  # a value Arrow refuses made its row an error row
            errors = table.num_rows - table.column("error").null_count
            # Dictionary encoding only where values repeat: on unique columns (index, id,
            # timings) it buys nothing, and its buffers grew the coordinator by ~6 MB per
            # 8,192-row part.
            write_table_atomically(
                table,
                path,
                before_rename=record,
                folder=self._folder,
                use_dictionary=_DICTIONARY_COLUMNS,
            )
        except OutputWriteError:
            raise
        except Exception as exc:  # the rows stay buffered; the disk or the data, said as such
            raise write_error(path, exc) from exc
        self._parts_written.append(path)
        self._next_part += 1
        self._rows_written += table.num_rows
        self._errors_written += errors
        self._reset_buffers()
        self._last_write = self._clock()
        return path

    def take_table(self) -> pa.Table:
        """The buffered rows as one table (the schema of a part), the buffers emptied."""
        table = self._table()
        self._reset_buffers()
        return table

    def close(self) -> None:
        """Write what is buffered; further adds raise. Calling it twice is harmless."""
        if not self._closed:
            self.flush()
            self._closed = True
            if self._own_folder and self._folder is not None:
                self._folder.close()

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # Keep what we have even when the run is failing or interrupted: it is what
        # --resume continues from. The original exception is the one to report.
        with contextlib.suppress(OutputWriteError):
            self.close()

    # -- internals --------------------------------------------------------------------

    def _reset_buffers(self) -> None:
        # Scalar columns are plain lists until the part is written: appending a batch of rows
        # to a list is cheap, and a part holds at most rows_per_part of them (a few MB).
        self._cols: dict[str, list] = {name: [] for name in _SCALAR_COLUMNS}
        # The task's columns (Task.columns: each row's payload, or classify's top-k).
        self._task_columns = self.task.columns()
        self._saved: list[list[np.ndarray | None]] = [[] for _ in self._outputs]
        self._meta: list[object] = []  # each row's Row.meta, when the schema has meta
        self._bytes = 0
        self._rows = 0
        self._errors = 0

    def _saved_outputs(self, outputs: Sequence[np.ndarray] | None) -> list[np.ndarray | None]:
        """The flattened outputs to save for one row (None on errors)."""
        saved: list[np.ndarray | None] = []
        for i, (name, shape, size) in enumerate(self._outputs):
            flat = None
            if outputs is not None:
                if i >= len(outputs):
                    raise ValueError(f"output {name!r} was asked to be saved but is missing")
                # A copy: the runtime may reuse its output buffers (reuse_outputs=True).
                flat = np.array(outputs[i], dtype=np.float32).reshape(-1)
                if flat.size != size:
                    raise ValueError(
                        f"output {name!r} has {flat.size} values, expected shape {shape}"
                    )
            saved.append(flat)
        return saved

    def _table(self) -> pa.Table:
        """The buffered rows as a part's table; a row holding a value Arrow cannot store
        is an error row in it (batchinfer.sink.storable)."""
        bad: dict[int, str] = {}  # row -> why a value of it cannot be stored
        arrays = []
        for f in self.schema:
            if f.name in self._cols:
                col = self._cols[f.name]
                text = pa.types.is_string(f.type) or pa.types.is_binary(f.type)
                arrays.append(
                    text_array(col, f.type) if text else checked_array(col, f.name, f.type, bad)
                )
        arrays += self._task_columns.arrays(bad)
        arrays += [list_array(chunks, pa.float32()) for chunks in self._saved]
        if self._meta_type is not None:
            arrays.append(meta_array(self._meta, self._meta_type, bad))
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        return as_error_rows(table, bad, self._results) if bad else table
