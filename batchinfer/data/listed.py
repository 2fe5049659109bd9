"""Datasets named by a list rather than found in a folder: a list file (.txt, .csv, .jsonl,
.parquet; see :mod:`batchinfer.data.manifest`), a COCO JSON, an Ultralytics data.yaml, a
glob. Each is an :class:`Entries`: a re-readable stream of rows; :class:`ListedDataset`
turns rows into Items, as the folder's Dataset does, so the engine, resume and the
fingerprint see no difference.

A row is a tuple ``(where, path, id, label, columns, error)``: where it is in the list
("line 7", "row 7", "image 7"), the path as written (relative to the list's base folder or
absolute), the ``id`` and ``label`` values as written (None when absent), the other
columns (a dict, or None), and why the row cannot name a file (None when it can). Tuples,
not objects: a list may have millions of rows, and each is made twice (scan and run).

Opening a list reads it once (:func:`open_listed`): rows are counted, ids checked unique
(8 bytes a row: their hashes, sorted, then the few colliding ones confirmed by name), the
kind (images or .npy) and the labels found, and the types of the other columns inferred
when the list does not declare them. Nothing is kept per row, so memory stays flat;
each run reads the list again, lazily, as the engine takes items.

Ids: the ``id`` column when there is one, else the path as written (``./`` dropped, or
relative to the base folder when an absolute path lies under it), else the row's place
("line 7") for a row with no path. They must be unique: a resume matches rows by id.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from array import array
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from batchinfer.data.classes import FROM_LABEL_NAMES, FROM_LABEL_NUMBERS, ClassMap
from batchinfer.data.dataset import VIDEO_EXTENSIONS, Dataset, Item, Skipped
from batchinfer.data.found import check_some_exist
from batchinfer.data.list_columns import (
    class_map_of,
    coercer,
    label_value,
    meta_type_of,
    value_tag,
)
from batchinfer.data.preprocess import BAD_ROW
from batchinfer.errors import DatasetError


def is_video(path: str) -> bool:
    """Whether ``path`` names a video file (by its extension)."""
    return os.path.splitext(path)[1].lower() in VIDEO_EXTENSIONS


#: (where, path, id, label, columns, error): see the module docstring.
Row = tuple[str, "str | None", object, object, "dict[str, Any] | None", "str | None"]

#: Forms whose relative paths are read against a base folder (the list's, the image root).
_BASED_FORMS = frozenset(("txt", "csv", "jsonl", "parquet", "coco", "yaml"))

#: Duplicate ids named in the error.
_DUPLICATES_SHOWN = 3


class Entries(Protocol):
    """A list's rows, readable again and again (picklable: it goes with the Dataset)."""

    #: "txt", "csv", "jsonl", "parquet", "coco", "yaml", "glob"
    form: str
    #: what the list was given as (its file, or the pattern)
    source: str
    #: the folder relative paths are read against
    base: Path

    def check(self) -> None:
        """DatasetError for a list that cannot be read at all (no path column, ...)."""

    def __iter__(self) -> Iterator[Row]: ...

    def content_sha256(self) -> str:
        """sha256 of the list's content (its file's bytes; for a glob, the names found)."""
        ...

    def declared_meta(self) -> Any:
        """The Arrow struct type of the other columns when the list declares their types
        (Parquet), else None (they are inferred from the values)."""
        ...


def sha256_of_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise DatasetError(f"Cannot read {path} ({exc.strerror or exc}).") from exc
    return digest.hexdigest()


def item_id(written_id: object, path: str | None, where: str, base: str) -> str:
    """A row's item id (see the module docstring)."""
    if written_id is not None:
        return str(written_id)
    if not path:
        return where
    if os.path.isabs(path):
        if path.startswith(base + os.sep):
            return path[len(base) + 1 :].replace(os.sep, "/")
        return path
    return posixpath.normpath(path.replace(os.sep, "/"))


# ----------------------------------------------------------------------------- dataset
@dataclass(frozen=True)
class ListedItem(Item):
    """An item of a list, which knows its place in the list ("line 12 of list.csv"): an
    error row about reading its file starts with it (engine/collector.py), so that a
    missing file is found in the list as a malformed row is. Readers never see it."""

    where: str | None = None


class ListedDataset(Dataset):
    """A dataset named by a list (module docstring). ``root`` is the base folder relative
    paths are read against; :attr:`location` is the list itself."""

    def __init__(
        self,
        entries: Entries,
        *,
        kind: str,
        class_map: ClassMap,
        count: int,
        bad_rows: int,
        first_bad: str | None,
        meta_type: Any,
    ) -> None:
        super().__init__(
            root=entries.base,
            kind=kind,
            class_map=class_map,
            count=count,
            skipped=Skipped(),
            listing_sha256=entries.content_sha256(),
        )
        self.entries = entries
        self.form = entries.form
        # COCO files, data.yamls and globs name few files, and not their state: stat them.
        self.stat_files = entries.form in ("coco", "yaml", "glob")
        self.meta_type = meta_type
        #: rows that name no file (malformed lines): error rows, counted when opened
        self.bad_rows = bad_rows
        self.first_bad = first_bad

    def check_found(self) -> None:
        # Only where paths are read against a folder the user may have got wrong: a glob's
        # files were found, and paths given to infer() are the caller's (error rows).
        if self.form in _BASED_FORMS:
            rows = (row[1] for row in self.entries if row[5] is None)
            check_some_exist(self.form, self.entries.source, str(self.root), rows)

    @property
    def location(self) -> str:
        return self.entries.source

    def __repr__(self) -> str:
        return (
            f"ListedDataset(form={self.form!r}, source={self.location!r}, kind={self.kind!r}, "
            f"items={len(self)}, classes={len(self.classes)})"
        )

    def notes(self) -> tuple[list[str], list[str]]:
        lines, warnings = super().notes()
        lines.insert(0, f"dataset: {self.form} list {self.location}, {len(self)} rows")
        if self.bad_rows:
            warnings.append(
                f"{self.bad_rows} row(s) of {self.location} name no file they can be read "
                f"from (first: {self.first_bad}); each becomes an error row."
            )
        return lines, warnings

    def manifest_json(self) -> dict[str, object]:
        record = super().manifest_json()
        record.update(
            form=self.form,
            source=self.location,
            bad_rows=self.bad_rows,
            columns=[f.name for f in self.meta_type] if self.meta_type is not None else [],
        )
        return record

    def paths_of(self, ids: Collection[str]) -> dict[str, str]:
        """One pass over the list for a few items' paths (ids need not be paths here)."""
        wanted, found = set(ids), {}
        base = str(self.root)
        for where, path, written_id, _, _, error in self.entries:
            ident = item_id(written_id, path, where, base)
            if ident in wanted and error is None and path:
                found[ident] = os.path.join(base, path)
        return found

    def item_paths(self) -> Iterator[str]:
        for _, path in self.item_files():
            if path is not None:
                yield path

    def item_files(self) -> Iterator[tuple[bytes, str | None]]:
        base = str(self.root)
        for where, path, written_id, _, _, error in self.entries:
            key = item_id(written_id, path, where, base).encode("utf-8", "surrogateescape")
            ok = error is None and path and self._kind_error(path) is None
            yield key, path if ok else None

    def _kind_error(self, path: str) -> str | None:
        if is_video(path) != (self.kind == "video"):
            what = "a video" if is_video(path) else "not a video"
            return f"{path} is {what}, and the list's items are {self.kind}"
        is_npy = path.lower().endswith(".npy")
        if is_npy != (self.kind == "npy"):
            what = "a .npy tensor" if is_npy else "not a .npy tensor"
            return f"{path} is {what}, and the list's items are {self.kind}"
        return None

    def iter_from(self, skip: Callable[[bytes], bool] | None = None) -> Iterator[Item]:
        base = str(self.root)
        labels = self.class_map.labels
        names = self.class_map.names
        numbered = self.class_map.source != FROM_LABEL_NAMES
        coerce = coercer(self.meta_type)
        for index, (where, path, written_id, label, columns, error) in enumerate(self.entries):
            id_text = item_id(written_id, path, where, base)
            if skip is not None and skip(id_text.encode("utf-8", "surrogateescape")):
                continue
            if error is None and not path:
                error = "the row has no path"
            if error is None:
                error = self._kind_error(path)  # type: ignore[arg-type]
            value = label_value(label, where, self.location)
            label_index: int | None = None
            label_name: str | None = None
            if isinstance(value, str):
                label_index, label_name = labels.get(value), value
            elif value is not None and numbered:
                label_index = value
                by_file = self.class_map.source != FROM_LABEL_NUMBERS and value < len(names)
                label_name = names[value] if by_file else str(value)
            place = f"{where} of {self.location}"
            yield ListedItem(
                index=index,
                path=(
                    f"{BAD_ROW}{place}: {error}" if error is not None else os.path.join(base, path)  # type: ignore[arg-type]
                ),
                id=id_text,
                label=label_index,
                label_name=label_name,
                columns=coerce(columns),
                where=place,
            )


class Scan:
    """What one read of a list finds (see :func:`open_listed`); a list form may fill it
    its own faster way (``Entries.scan``, e.g. Parquet's column-wise read)."""

    def __init__(self, source: str, base: str) -> None:
        self.source, self.base = source, base
        self.count = self.bad = self.npy = self.video = 0
        self.first_bad: str | None = None
        self.hashes = array("q")  # hash() of each row's item id, in order
        self.numbers: set[int] = set()
        self.names: set[str] = set()
        self.tags: dict[str, set[str]] = {}  # column -> kinds of value seen (_tag)
        self._labels: set[object] = set()  # label values already checked

    def label(self, value: object, where: str) -> None:
        value = label_value(value, where, self.source)
        if isinstance(value, str):
            self.names.add(value)
        elif value is not None:
            self.numbers.add(value)

    def row(self, row: Row, infer: bool) -> None:
        """Count one row (the usual row costs a few hundred nanoseconds: lists are long)."""
        where, path, written_id, label, columns, error = row
        self.count += 1
        if path is not None and type(path) is not str:
            raise DatasetError(
                f"The path column of {self.source} holds {path!r} at {where}; a path is text."
            )
        if type(written_id) is str:
            ident = written_id
        elif written_id is None:
            ident = item_id(None, path, where, self.base)
        elif type(written_id) is int:
            ident = str(written_id)
        else:
            raise DatasetError(
                f"The id column of {self.source} holds {written_id!r} at {where}; an id is "
                "text or an integer."
            )
        self.hashes.append(hash(ident))
        if error is not None or not path:
            self.bad += 1
            self.first_bad = self.first_bad or f"{where}: {error or 'no path'}"
            return
        if path.endswith((".npy", ".NPY")):
            self.npy += 1
        elif is_video(path):
            self.video += 1
        if label is not None:
            try:
                known = label in self._labels
            except TypeError:  # a list or dict (JSON): label_value says why it is wrong
                known = False
            if not known:
                self.label(label, where)
                self._labels.add(label)
        if infer and columns:
            for name, v in columns.items():
                seen = self.tags.setdefault(name, set())
                if v is not None:
                    seen.add(value_tag(v))


def open_listed(
    entries: Entries,
    *,
    labels_file: Path | str | None = None,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 10_000,
) -> ListedDataset:
    """Read the list once (module docstring) and return its dataset; DatasetError (exit 2)
    for a list that cannot be used: no path column, ids that repeat, a column of the wrong
    type, no rows."""
    entries.check()
    source = entries.source
    declared = entries.declared_meta()
    scan = Scan(source, str(entries.base))
    fast = getattr(entries, "scan", None)
    if fast is not None:
        fast(scan, progress)
    else:
        infer = declared is None
        rows = getattr(entries, "rows", None)  # rows(columns=False): what a scan needs
        for row in rows(columns=infer) if rows is not None else entries:
            scan.row(row, infer)
            if progress is not None and scan.count % progress_every == 0:
                progress(scan.count)
    if progress is not None:
        progress(scan.count)
    if not scan.count:
        raise DatasetError(f"The list {source} has no rows; it must name at least one item.")
    _check_unique(entries, scan.hashes)
    good, npy = scan.count - scan.bad, scan.npy
    for n, what in ((npy, ".npy tensors"), (scan.video, "videos")):
        if n and n != good:
            raise DatasetError(
                f"The list {source} names {n} {what} and {good - n} other files; keep "
                "one kind of item per list."
            )
    kinds = {npy: "npy", scan.video: "video"}
    return ListedDataset(
        entries,
        kind=kinds.get(good, "images") if good else "images",
        class_map=class_map_of(scan.numbers, scan.names, labels_file, source),
        count=scan.count,
        bad_rows=scan.bad,
        first_bad=scan.first_bad,
        meta_type=declared if declared is not None else meta_type_of(scan.tags),
    )


def _check_unique(entries: Entries, hashes: array) -> None:
    """DatasetError naming the first ids that repeat (hash collisions are confirmed)."""
    values = np.frombuffer(hashes, dtype=np.int64) if len(hashes) else np.empty(0, np.int64)
    ordered = np.sort(values)
    same = ordered[1:][ordered[1:] == ordered[:-1]]
    if not same.size:
        return
    suspects = set(same.tolist())
    base = str(entries.base)
    seen: dict[str, str] = {}
    repeats: dict[str, list[str]] = {}
    for where, path, written_id, *_ in entries:
        ident = item_id(written_id, path, where, base)
        if hash(ident) not in suspects:
            continue
        if ident in seen:
            repeats.setdefault(ident, [seen[ident]]).append(where)
        else:
            seen[ident] = where
    if not repeats:
        return
    shown = "; ".join(
        f"{ident!r} ({' and '.join(places[:2])})"
        for ident, places in list(repeats.items())[:_DUPLICATES_SHOWN]
    )
    extra = len(repeats) - _DUPLICATES_SHOWN
    more = f" and {extra} more" if extra > 0 else ""
    column = "id column" if any(row[2] is not None for row in entries) else "paths"
    raise DatasetError(
        f"The list {entries.source} gives the same item id twice: {shown}{more}; ids (its "
        f"{column}) must be unique, since results are matched to items by id."
    )


class PathList:
    """Entries held in memory: the files a COCO JSON, a data.yaml or a glob names (their
    lists are small next to a manifest's, and were read whole anyway)."""

    def __init__(
        self,
        form: str,
        source: str,
        base: Path,
        paths: list[str],
        places: str = "entry",
        columns: list[dict[str, Any]] | None = None,
        sha256: str | None = None,
    ) -> None:
        self.form, self.source, self.base = form, source, base
        self.paths = paths
        self.places = places
        self.columns = columns
        self._sha256 = sha256

    def check(self) -> None:
        pass

    def __iter__(self) -> Iterator[Row]:
        columns = self.columns
        for i, path in enumerate(self.paths):
            yield (
                f"{self.places} {i + 1}",
                path,
                None,
                None,
                None if columns is None else columns[i],
                None,
            )

    def content_sha256(self) -> str:
        if self._sha256 is not None:
            return self._sha256
        digest = hashlib.sha256()
        for path in self.paths:
            digest.update(os.fsencode(path) + b"\0")
        return digest.hexdigest()

    def declared_meta(self) -> Any:
        return None
