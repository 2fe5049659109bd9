"""What ``--resume`` continues from: the successful rows already in OUT/predictions/.

``prepare_resume`` makes the folder consistent before a resumed run appends to it:
leftover tmp files go, error rows (and, should they ever exist, duplicate rows) are
removed from their parts so those items run again and still appear exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchinfer.errors import RunFailedError
from batchinfer.sink._atomic import fsync_dir, write_error, write_table_atomically
from batchinfer.sink.predictions import PART_GLOB, PREDICTIONS_DIR, part_number, prediction_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumeState:
    """What is already done: sorted indices of successful rows, and where new parts start."""

    done: np.ndarray
    next_part: int
    dropped_errors: int
    dropped_duplicates: int = 0

    def is_done(self, index: int) -> bool:
        """True when item ``index`` already has a successful row on disk."""
        pos = int(np.searchsorted(self.done, index))
        return pos < self.done.size and int(self.done[pos]) == index

    def done_mask(self, indices: np.ndarray) -> np.ndarray:
        """A boolean mask over ``indices``: True where the item is already done."""
        indices = np.asarray(indices, dtype=np.int64)
        if not self.done.size:
            return np.zeros(indices.shape, bool)
        pos = np.minimum(np.searchsorted(self.done, indices), self.done.size - 1)
        return self.done[pos] == indices


def _parts(directory: Path) -> list[Path]:
    """The part files in ``directory``, in part-number order."""
    return sorted(directory.glob(PART_GLOB), key=part_number)


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RunFailedError(
            f"Prediction part {path} cannot be read ({exc}); delete it and run --resume "
            "again to redo its items."
        ) from exc


def prepare_resume(out_dir: Path) -> ResumeState:
    """Clean OUT/predictions/ for a resumed run and return what is already done.

    Removes ``.part-*.tmp`` leftovers, rewrites parts that hold error rows or duplicate
    rows without them (atomically; a part left empty is deleted), and returns the
    sorted successful indices, the next free part number and how many rows it dropped.
    """
    directory = Path(out_dir) / PREDICTIONS_DIR
    if not directory.is_dir():
        return ResumeState(np.empty(0, np.int64), next_part=0, dropped_errors=0)
    try:
        for tmp in directory.glob(".part-*.tmp"):
            tmp.unlink()
    except OSError as exc:
        raise write_error(directory, exc) from exc

    parts = _parts(directory)
    ok_masks: list[np.ndarray] = []
    ok_indices: list[np.ndarray] = []
    for path in parts:
        cols = _read(path, ["index", "error"])
        ok = cols.column("error").is_null().to_numpy(zero_copy_only=False)
        ok_masks.append(ok)
        ok_indices.append(cols.column("index").to_numpy()[ok].astype(np.int64, copy=False))

    # Duplicates should never exist; if they do, the first part's row wins.
    all_ok = np.concatenate(ok_indices) if ok_indices else np.empty(0, np.int64)
    done, first = np.unique(all_ok, return_index=True)
    duplicate = np.ones(all_ok.size, bool)
    duplicate[first] = False
    dropped_duplicates = int(duplicate.sum())
    if dropped_duplicates:
        log.warning(
            "%d duplicate prediction rows found under %s; kept the first of each",
            dropped_duplicates,
            directory,
        )

    dropped_errors = 0
    start = 0
    for path, ok in zip(parts, ok_masks, strict=True):
        n_ok = int(ok.sum())
        keep = ok.copy()
        keep[np.flatnonzero(ok)] = ~duplicate[start : start + n_ok]
        start += n_ok
        dropped_errors += int(ok.size - n_ok)
        if keep.all():
            continue
        if not keep.any():
            try:
                path.unlink()
            except OSError as exc:
                raise write_error(path, exc) from exc
            fsync_dir(directory)
            continue
        table = _read(path)
        write_table_atomically(table.filter(pa.array(keep)), path)

    next_part = part_number(parts[-1]) + 1 if parts else 0
    return ResumeState(done, next_part, dropped_errors, dropped_duplicates)


def read_predictions(out_dir: Path) -> pa.Table:
    """Every prediction row under OUT/predictions/, sorted by index (empty table if none)."""
    parts = _parts(Path(out_dir) / PREDICTIONS_DIR)
    if not parts:
        return prediction_schema().empty_table()
    tables = [_read(path) for path in parts]
    table = pa.concat_tables(tables, promote_options="default")
    return table.take(pc.sort_indices(table, sort_keys=[("index", "ascending")]))
