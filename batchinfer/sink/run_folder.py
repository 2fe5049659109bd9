"""A run folder being written: its manifest, prediction parts, core stats and timeline.

The folder has been claimed first (locked, cleared or verified: outdir.claim). While the
run lasts, :class:`RunFolder` is its row sink: rows go to Parquet parts that the manifest's
ledger records. At the end, :meth:`RunFolder.finish` writes the stats, the timeline and the
manifest's final state, whatever happened: that is what ``resume`` continues from.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from batchinfer.errors import BatchinferError, OutputWriteError
from batchinfer.sink.folder_handle import Folder
from batchinfer.sink.manifest import RunManifest
from batchinfer.sink.predictions import PredictionWriter
from batchinfer.sink.rows import Row
from batchinfer.sink.stats import CoreStatsRecorder, write_core_stats, write_timeline

if TYPE_CHECKING:
    from batchinfer.tasks import Task


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunEnd(NamedTuple):
    """How a run ended, as :meth:`RunFolder.finish` records it."""

    status: str
    error: BatchinferError | None
    stats: CoreStatsRecorder
    counts: dict[str, int]
    fields: dict[str, Any]  # more top-level fields of the manifest


class RunFolder:
    """The run folder as a row sink, plus its manifest (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        manifest: RunManifest,
        *,
        topk: int,
        save_outputs: bool,
        part_rows: int,
        first_part: int,
        task: Task | str = "classify",
        class_names: tuple[str, ...] = (),
        meta: Any = None,
        out: Folder | None = None,
        predictions: Folder | None = None,
    ) -> None:
        self.path = Path(path)
        # OUT and OUT/predictions/ held open since the run began: every file is written
        # inside them (None: opened by path at each write, for callers without a run).
        self.out = out
        self.predictions = predictions
        self.manifest = manifest
        self.topk = topk
        self.save_outputs = save_outputs
        self.part_rows = part_rows
        self.first_part = first_part
        self.task = task
        self.class_names = class_names
        self.meta = meta  # the predictions' meta struct type (a list's columns), or None
        self.writer: PredictionWriter | None = None
        self.started = time.time()

    @classmethod
    def begin(
        cls,
        path: Path,
        continued: RunManifest | None,
        fields: dict[str, Any],
        *,
        topk: int,
        save_outputs: bool,
        part_rows: int,
        first_part: int = 0,
        guard: Callable[[], None] | None = None,
        task: Task | str = "classify",
        class_names: tuple[str, ...] = (),
        meta: Any = None,
        out: Folder | None = None,
        predictions: Folder | None = None,
    ) -> RunFolder:
        """Write the manifest as "running" (a new run, or the next invocation of ``continued``).

        ``guard`` (the run's check that OUT and predictions/ are still the folders it
        holds) runs before every write into the folder; ``out`` and ``predictions``: those
        folders held open, which every write goes into.
        """
        invocation = {
            "command": fields.get("command"),
            "started_at": _now(),
            "status": "running",
            "pid": fields.get("pid"),
        }
        if continued is None:
            manifest = RunManifest.new(
                path, run_id=uuid.uuid4().hex[:12], invocations=[invocation], **fields
            )
        else:
            manifest = continued
            manifest.data.setdefault("invocations", []).append(invocation)
            manifest.data.update(fields)
        manifest.guard = guard
        manifest.folder = out
        manifest.data.update(started_at=invocation["started_at"], status="running")
        manifest.save()
        return cls(
            path,
            manifest,
            topk=topk,
            save_outputs=save_outputs,
            part_rows=part_rows,
            first_part=first_part,
            task=task,
            class_names=class_names,
            meta=meta,
            out=out,
            predictions=predictions,
        )

    @property
    def invocation(self) -> int:
        """0 for the run itself, 1 for its first resume, ..."""
        return len(self.manifest.data["invocations"]) - 1

    # -- RowSink --------------------------------------------------------------------
    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        # The writer makes predictions/: not in a folder that took OUT's place meanwhile.
        self.manifest.check_held()
        self.writer = PredictionWriter(
            self.path,
            topk=self.topk,
            rows_per_part=self.part_rows,
            save_outputs=[(f"output{i}", shape) for i, (shape, _) in enumerate(outputs)]
            if self.save_outputs
            else None,
            first_part=self.first_part,
            ledger=self.manifest,
            task=self.task,
            class_names=self.class_names,
            meta=self.meta,
            folder=self.predictions,
        )

    def write(self, rows: list[Row]) -> None:
        assert self.writer is not None, "open() comes before the first row"
        self.writer.write(rows)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- the end ----------------------------------------------------------------------
    def finish(self, end: RunEnd) -> tuple[str, BatchinferError | None, dict[str, int]]:
        """Write the last rows, stats, timeline and manifest: (status, error, counts on disk).

        A write failure here (disk full) becomes the run's error unless it already had one.
        Nothing is written when OUT is no longer the folder this run locked.
        """
        status, error, stats, counts, fields = end
        try:
            self.manifest.check_held()
        except OutputWriteError as e:
            return "failed", error or e, counts
        try:
            self.close()
            write_core_stats(self.path, stats, folder=self.out)
            write_timeline(self.path, stats, folder=self.out)
        except OutputWriteError as e:
            error = error or e
            status = "failed"
        written = self.writer.rows_written if self.writer else 0
        errors = self.writer.errors_written if self.writer else 0
        on_disk, errors_on_disk = self.manifest.rows_on_disk()
        counts = {
            **counts,
            "written": written,
            "succeeded": written - errors,
            "errors": errors,
            "collected_not_written": counts.get("collected", written) - written,
            "rows_on_disk": on_disk,
            "errors_on_disk": errors_on_disk,
        }
        counts.pop("collected", None)
        finished = _now()
        self.manifest.data["invocations"][-1].update(
            status=status, finished_at=finished, counts=counts
        )
        try:
            self.manifest.update(
                status=status,
                error=None if error is None else str(error),
                finished_at=finished,
                wall_s=round(time.time() - self.started, 3),
                counts=counts,
                **fields,
            )
        except OutputWriteError as e:
            error = error or e
            status = "failed"
        return status, error, counts
