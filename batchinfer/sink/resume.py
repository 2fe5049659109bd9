"""What ``--resume`` continues from: the successful rows already in OUT/predictions/.

Nothing in OUT is trusted because it is there. ``prepare_resume`` first checks, without
changing anything, that every file under predictions/ is a part this run wrote and that
its bytes are the ones the manifest's ledger recorded when it was written (sha256; see
``RunManifest``); an unknown, copied or damaged file stops the resume with one sentence.
Only then does it make the folder consistent: leftover tmp files and retired parts go,
error rows (and, should they ever exist, duplicate rows) are removed so those items run
again and still appear exactly once. Rows are matched to dataset items by their id (the
exact file name), never by position, so no row can describe another file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import RunFailedError, UsageError
from batchinfer.sink.atomic import write_error, write_table_atomically
from batchinfer.sink.folder_handle import Folder
from batchinfer.sink.manifest import (
    MANIFEST_FILE,
    PART_RE,
    RunManifest,
    opened_out,
    regular_in,
)
from batchinfer.sink.predictions import part_name

log = logging.getLogger(__name__)

__all__ = ["PART_RE", "ResumeState", "prepare_resume", "verify_parts"]

_TMP_RE = re.compile(r"\.part-[0-9]{5,}\.parquet\.tmp\Z")


def id_key(id: str, id_bytes: bytes | None) -> bytes:
    """The exact name of an item as bytes: what rows and dataset items are matched by."""
    return id_bytes if id_bytes is not None else id.encode("utf-8")


def key_hashes(keys: Iterable[bytes]) -> np.ndarray:
    """64-bit hashes of item keys (8 bytes an item in memory, whatever the name's length)."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "little") for k in keys),
        np.uint64,
    )


@dataclass(frozen=True)
class ResumeState:
    """What is already done, and where new parts start."""

    done_keys: np.ndarray  # sorted unique key hashes of items with a successful row
    done_indices: np.ndarray  # their dataset indices, for counting within --limit
    next_part: int
    dropped_errors: int
    dropped_duplicates: int = 0

    def is_done(self, key: bytes) -> bool:
        """True when the item named ``key`` (see :func:`id_key`) already has a successful row."""
        h = key_hashes([key])[0]
        pos = int(np.searchsorted(self.done_keys, h))
        return pos < self.done_keys.size and self.done_keys[pos] == h

    def done_below(self, n: int) -> int:
        """How many done items have an index below ``n`` (the run's --limit)."""
        return int((self.done_indices < n).sum())


def _part_number(name: str) -> int:
    return int(PART_RE.match(name).group(1))  # type: ignore[union-attr]


def _listing(manifest: RunManifest, predictions: Folder | None) -> tuple[list[str], list[str]]:
    """(part names in order, tmp leftovers); UsageError for anything else in predictions/,
    OutputTamperedError for a symlink or folder under a part's name (or as predictions/)."""
    if predictions is None:
        return [], []
    directory = predictions.path
    try:
        manifest.parts_in(predictions)
        names = predictions.names()
    except OSError as exc:
        raise write_error(directory, exc) from exc
    unknown = [n for n in names if not PART_RE.match(n) and not _TMP_RE.match(n)]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:3]) + (" ..." if len(unknown) > 3 else "")
        raise UsageError(
            f"{directory} holds {shown}, which no batchinfer run wrote; move it out of that "
            "folder (nothing was changed), then resume again."
        )
    for name in names:
        regular_in(predictions, name, manifest.out)
    parts = sorted((n for n in names if PART_RE.match(n)), key=_part_number)
    return parts, [n for n in names if _TMP_RE.match(n)]


def _verify(manifest: RunManifest, parts: list[str], predictions: Folder | None) -> list[str]:
    """Check every part against the ledger; return the retired ones. Changes nothing."""
    retired = []
    for name in parts:
        assert predictions is not None  # parts were listed in it
        path = predictions.path / name
        record = manifest.parts.get(name)
        if record is None:
            raise UsageError(
                f"{path} is not recorded in {manifest.out / MANIFEST_FILE}, so this run did not "
                "write it (a copy, or a file from another run); move it out of that folder "
                "(nothing was changed), then resume again."
            )
        try:
            sha = predictions.sha256(name)
        except OSError as exc:
            raise RunFailedError(f"Cannot read {path} ({exc.strerror or exc}).") from exc
        if sha != record["sha256"]:
            raise UsageError(
                f"{path} does not match the checksum recorded when it was written (it was "
                "changed or damaged); move it out of that folder (nothing was changed) and resume "
                "again: its items will be run again."
            )
        if record["state"] == "retired":
            retired.append(name)
    return retired


def verify_parts(manifest: RunManifest) -> None:
    """Raise UsageError when predictions/ holds a file the ledger does not vouch for.

    Only reads (and hashes every part): planning calls it, so a refused --resume leaves
    OUT exactly as it was; :func:`prepare_resume` checks again under OUT's lock.
    """
    with _opened(manifest) as predictions:
        parts, _ = _listing(manifest, predictions)
        _verify(manifest, parts, predictions)


@contextlib.contextmanager
def _opened(manifest: RunManifest) -> Iterator[Folder | None]:
    """OUT/predictions/ opened for one use (None when absent), for callers without a run."""
    with opened_out(manifest.out) as (_, predictions):
        yield predictions


def _unlink(predictions: Folder, name: str) -> None:
    try:
        predictions.unlink(name)
    except OSError as exc:
        raise write_error(predictions.path / name, exc) from exc


def prepare_resume(manifest: RunManifest, predictions: Folder | None = None) -> ResumeState:
    """Verify and clean OUT/predictions/ for a resumed run; return what is already done.

    ``predictions``: OUT/predictions/ held open (the run's handle): every part is read,
    written and deleted inside it (None: opened here for this call).

    Raises UsageError, before changing anything, when predictions/ holds a file the
    ledger does not vouch for. Then removes tmp leftovers and retired parts, forgets
    ledger records whose file is gone, rewrites parts holding error or duplicate rows
    without them (as new parts, through the ledger), and returns the done items.
    """
    if predictions is None:
        with _opened(manifest) as opened:
            return _prepare(manifest, opened)
    return _prepare(manifest, predictions)


def _prepare(manifest: RunManifest, predictions: Folder | None) -> ResumeState:
    """:func:`prepare_resume` inside ``predictions`` (None: there is no predictions/)."""
    parts, tmps = _listing(manifest, predictions)
    if predictions is None:
        for name in list(manifest.parts):
            manifest.forget_part(name, save=False)
        manifest.save()
        return ResumeState(np.empty(0, np.uint64), np.empty(0, np.int64), 0, 0)
    directory = predictions.path
    retired = _verify(manifest, parts, predictions)

    for name in tmps:
        _unlink(predictions, name)
    for name in retired:
        _unlink(predictions, name)
    live = [n for n in parts if n not in retired]
    for name in list(manifest.parts):
        if name not in live:
            manifest.forget_part(name, save=False)
    manifest.save()

    next_part = max((_part_number(n) for n in parts), default=-1) + 1
    keys: list[np.ndarray] = []
    indices: list[np.ndarray] = []
    oks: list[np.ndarray] = []
    for name in live:
        cols = _read(predictions, name, ["index", "id", "id_bytes", "error"])
        ok = cols.column("error").is_null().to_numpy(zero_copy_only=False)
        ids, raw = cols.column("id").to_pylist(), cols.column("id_bytes").to_pylist()
        oks.append(ok)
        keys.append(
            key_hashes(id_key(i, b) for i, b, good in zip(ids, raw, ok, strict=True) if good)
        )
        indices.append(cols.column("index").to_numpy()[ok].astype(np.int64, copy=False))

    # Duplicates should never exist; if they do, the first part's row wins.
    all_keys = np.concatenate(keys) if keys else np.empty(0, np.uint64)
    all_indices = np.concatenate(indices) if indices else np.empty(0, np.int64)
    done_keys, first = np.unique(all_keys, return_index=True)
    duplicate = np.ones(all_keys.size, bool)
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
    for name, ok in zip(live, oks, strict=True):
        n_ok = int(ok.sum())
        keep = ok.copy()
        keep[np.flatnonzero(ok)] = ~duplicate[start : start + n_ok]
        start += n_ok
        dropped_errors += int(ok.size - n_ok)
        if keep.all():
            continue
        if keep.any():
            table = _read(predictions, name).filter(pa.array(keep))
            new = part_name(next_part)
            next_part += 1

            def record(
                sha256: str, new: str = new, table: pa.Table = table, name: str = name
            ) -> None:
                manifest.replace_part(name, new, rows=table.num_rows, errors=0, sha256=sha256)

            write_table_atomically(table, directory / new, before_rename=record, folder=predictions)
        _unlink(predictions, name)
        manifest.forget_part(name)

    return ResumeState(
        done_keys=done_keys,
        done_indices=all_indices[first],
        next_part=next_part,
        dropped_errors=dropped_errors,
        dropped_duplicates=dropped_duplicates,
    )


def _read(predictions: Folder, name: str, columns: list[str] | None = None) -> pa.Table:
    path = predictions.path / name
    try:
        with predictions.open_read(name) as f:
            return pq.read_table(f, columns=columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RunFailedError(
            f"Prediction part {path} cannot be read ({exc}); move it out of that folder and run "
            "resume again to redo its items."
        ) from exc
