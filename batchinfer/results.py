"""Reading a run folder: the public reader of batchinfer's output contract.

    from batchinfer.results import read_run
    run = read_run("runs/20261202-140021")
    run.manifest.status, run.predictions().num_rows, run.core_stats()
    run.boxes()  # a detection run: one row per box (id, class_id, label, score, x1..y2)

The output folder holds ``manifest.json``, ``predictions/part-*.parquet``,
``core_stats.parquet`` and ``timeline.parquet`` (docs/reference/output.md lists every column). Only
the prediction parts the manifest vouches for are read, so a stray file never adds rows.
Works on a folder whose run is still going (what is on disk so far).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchinfer.errors import OutputTamperedError, RunFailedError, UsageError
from batchinfer.sink.manifest import PART_RE, RunManifest, predictions_dir, regular_file
from batchinfer.sink.predictions import prediction_schema
from batchinfer.sink.stats import CORE_STATS_FILE, TIMELINE_FILE

__all__ = [
    "Manifest",
    "RunFolderReader",
    "boxes_table",
    "read_boxes",
    "read_manifest_typed",
    "read_predictions",
    "read_run",
]


@dataclass(frozen=True)
class Manifest:
    """The main facts of a run's manifest.json, typed; everything else is in ``raw``."""

    run_id: str
    status: str  # running | complete | interrupted | failed
    command: str | None
    model: str
    model_sha256: str
    backend: str
    cores: tuple[int, ...]
    instances_per_core: int
    dataset_root: str
    dataset_items: int
    started_at: str | None
    finished_at: str | None
    error: str | None
    counts: dict[str, int]
    invocations: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False)
    task: str = "classify"  # classify | detect | raw (runs before tasks existed: classify)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        dataset = data.get("dataset") or {}
        return cls(
            run_id=data.get("run_id", ""),
            status=data.get("status", "unknown"),
            command=data.get("command"),
            model=data.get("model", ""),
            model_sha256=data.get("model_sha256", ""),
            backend=data.get("backend", ""),
            cores=tuple(data.get("cores") or ()),
            instances_per_core=int(data.get("instances_per_core") or 1),
            dataset_root=dataset.get("root", ""),
            dataset_items=int(dataset.get("items") or 0),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            error=data.get("error"),
            counts=dict(data.get("counts") or {}),
            invocations=tuple(data.get("invocations") or ()),
            warnings=tuple(data.get("warnings") or ()),
            raw=data,
            task=(data.get("task") or {}).get("task", "classify"),
        )


def read_manifest_typed(out_dir: Path | str) -> Manifest:
    """The manifest of a run folder (UsageError when the folder is not one)."""
    return Manifest.from_json(RunManifest.load(Path(out_dir)).data)


def _part_paths(out_dir: Path) -> list[Path]:
    """The live parts the manifest vouches for; without a manifest (a bare predictions/
    folder), every part-NNNNN.parquet there. A symlink, a folder under a part's name, or a
    ledger naming a file outside predictions/ raises OutputTamperedError: nothing is read."""
    directory = predictions_dir(out_dir)
    try:
        manifest = RunManifest.load(out_dir)
    except OutputTamperedError:
        raise
    except UsageError:
        if not directory.is_dir():
            return []
        names = sorted(n for n in os.listdir(directory) if PART_RE.match(n))
        return [directory / n for n in names if regular_file(directory / n, out_dir)]
    live = {n for n, p in manifest.parts.items() if p["state"] == "live"}
    return [path for name, path in sorted(manifest.part_files().items()) if name in live]


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RunFailedError(f"{path} cannot be read ({exc}).") from exc


def read_predictions(out_dir: Path | str, columns: list[str] | None = None) -> pa.Table:
    """Every prediction row of a run folder, sorted by index (empty table if none)."""
    parts = _part_paths(Path(out_dir))
    if not parts:
        schema = prediction_schema(task=_task(Path(out_dir)))
        return schema.empty_table() if columns is None else schema.empty_table().select(columns)
    wanted = None if columns is None else list(dict.fromkeys(["index", *columns]))
    table = pa.concat_tables([_read(p, wanted) for p in parts], promote_options="default")
    table = table.take(pc.sort_indices(table, sort_keys=[("index", "ascending")]))
    return table if columns is None else table.select(columns)


def _task(out_dir: Path) -> str:
    with contextlib.suppress(UsageError):
        return (RunManifest.load(out_dir).data.get("task") or {}).get("task", "classify")
    return "classify"


_BOX_COLUMNS = ["class_id", "label", "score", "x1", "y1", "x2", "y2"]


def boxes_table(predictions: pa.Table) -> pa.Table:
    """A detection run's predictions with one row per box: ``index``, ``id`` and the box's
    fields (class_id, label, score, x1, y1, x2, y2; original-image pixels). Rows without
    boxes (none found, or an error) add none."""
    if "boxes" not in predictions.column_names:
        raise UsageError("these predictions have no boxes column: they are not a detection run's.")
    boxes = predictions.column("boxes").combine_chunks()
    parents = boxes.value_parent_indices()
    values = boxes.flatten()
    head = predictions.select(["index", "id"]).take(parents)
    # StructArray.flatten applies the slice's offset (StructArray.field would not).
    children = dict(zip([f.name for f in values.type], values.flatten(), strict=True))
    columns = [children[name] for name in _BOX_COLUMNS]
    return pa.table([*head.columns, *columns], names=["index", "id", *_BOX_COLUMNS])


def read_boxes(out_dir: Path | str) -> pa.Table:
    """Every box of a detection run, one row each, in item order (see :func:`boxes_table`)."""
    return boxes_table(read_predictions(out_dir, ["index", "id", "boxes"]))


def _by_invocation(path: Path, invocation: int | None) -> pa.Table:
    table = _read(path)
    if invocation is None or "invocation" not in table.column_names:
        return table
    if invocation < 0:
        present = table.column("invocation").to_pylist()
        if not present:
            return table
        invocation = max(present)
    return table.filter(pc.equal(table["invocation"], invocation))


class RunFolderReader:
    """A run folder, read lazily (see the module docstring)."""

    def __init__(self, out_dir: Path | str) -> None:
        self.path = Path(out_dir)
        self.manifest = read_manifest_typed(self.path)

    def predictions(self, columns: list[str] | None = None) -> pa.Table:
        return read_predictions(self.path, columns)

    def boxes(self) -> pa.Table:
        """A detection run's boxes, one row each (:func:`boxes_table`)."""
        return read_boxes(self.path)

    def core_stats(self, invocation: int | None = -1) -> pa.Table:
        """One row per core and a total row (core null); by default the last invocation's
        (``invocation=None``: every invocation's rows)."""
        return _by_invocation(self.path / CORE_STATS_FILE, invocation)

    def timeline(self, invocation: int | None = -1) -> pa.Table:
        """Completions per core per second; by default the last invocation's."""
        return _by_invocation(self.path / TIMELINE_FILE, invocation)


def read_run(out_dir: Path | str) -> RunFolderReader:
    """A reader for the run folder ``out_dir`` (UsageError when it is not one)."""
    return RunFolderReader(out_dir)
