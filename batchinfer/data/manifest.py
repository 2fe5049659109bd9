"""List files: the rows of a ``.txt``, ``.csv``, ``.jsonl`` or ``.parquet`` manifest, streamed.

- ``.txt``: one path a line (blank lines and ``#`` comments skipped); a line ``PATH LABEL``
  whose last word is an integer gives that label (ImageNet's ``val.txt``).
- ``.csv``: a header row naming a ``path`` column, optional ``id`` and ``label``, any
  others (carried as text). A line whose field count differs from the header's, or that
  the CSV parser refuses, is an error row naming the line.
- ``.jsonl``: one JSON object a line with ``path``, optional ``id``, ``label``, any other
  keys (their types inferred from the values). A line that is not a JSON object is an
  error row.
- ``.parquet``: a ``path`` column (text), optional ``id`` (text or integer), ``label``
  (integer or text), any others (carried with their Parquet types); read in record
  batches, never whole.

Paths are relative to the list file's folder (or to ``image_root`` when given). Rows are
the tuples of :mod:`batchinfer.data.listed`; the file is read again for each pass.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from batchinfer.data.dataset import VIDEO_EXTENSIONS
from batchinfer.data.listed import Row, Scan, item_id, sha256_of_file
from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.whole_file import NESTING_ERRORS, open_regular
from batchinfer.errors import DatasetError

#: Extensions (lower case) read as list files, and their form.
FORMS = {".txt": "txt", ".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
#: Columns with a meaning; every other column is carried into the predictions' ``meta``.
RESERVED = ("path", "id", "label")
#: The longest line of a text list, in characters (a line names one item: a path of at
#: most 4,096 bytes and a few columns).
LINE_BOUND = 1 << 20
#: Rows per Parquet record batch (memory stays a few batches, whatever the file's size).
PARQUET_BATCH = 8192
#: Rows per record batch when a Parquet list is scanned (three columns at most).
SCAN_BATCH = 65536


class _ListFile:
    """What the forms share: the file, its base folder, its content hash."""

    form = ""

    def __init__(self, file: Path, base: Path | None = None) -> None:
        self.file = file
        self.source = str(file)
        self.base = base if base is not None else file.parent

    def check(self) -> None:
        # A FIFO would block the reads below, and /dev/zero never end: a regular file only.
        os.close(open_regular(self.file, "The list file", hint="give a list file"))

    def content_sha256(self) -> str:
        return sha256_of_file(self.file)

    def declared_meta(self) -> Any:
        return None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[TextIO]:
        """The file as text, its lines bounded (:class:`_LineBounded`); its decoding and
        reading errors as DatasetErrors."""
        try:
            raw = _LineBounded(open(self.file, "rb", buffering=0), self.file)  # noqa: SIM115
            with io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8-sig", newline="") as f:
                yield f
        except UnicodeDecodeError as exc:
            raise DatasetError(
                f"The list file {self.file} is not UTF-8 text (byte {exc.start} of a block); "
                "save it as UTF-8."
            ) from None
        except OSError as exc:
            raise DatasetError(f"Cannot read {self.file} ({exc.strerror or exc}).") from None

    def __iter__(self) -> Iterator[Row]:
        with self._reading() as f:
            yield from self._rows(f)

    def _rows(self, f: TextIO) -> Iterator[Row]:
        """The rows of the form read from ``f``, the open file (forms that read it as
        text lines; the others have an ``__iter__`` of their own)."""
        raise NotImplementedError


class _LineBounded(io.RawIOBase):
    """A list file's bytes, refused once a line runs past LINE_BOUND bytes: a file with no
    line end (or one huge line) would otherwise be read into memory whole by the line
    iterator. Checked per block read (a few kB), not per line, so a million-line list costs
    nothing more (``readline(limit)`` per line cost 60 % of a CSV scan)."""

    def __init__(self, raw: io.FileIO, file: Path) -> None:
        super().__init__()
        self._raw, self._file = raw, file
        self._offset = 0  # bytes read so far
        self._line_start = 0  # offset of the line being read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        if not data:
            return 0
        n = len(data)
        buffer[:n] = data
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last >= 0:
            self._line_start = self._offset + last + 1
        self._offset += n
        if self._offset - self._line_start > LINE_BOUND:
            raise DatasetError(
                f"The list file {self._file} has a line longer than {LINE_BOUND:,} bytes "
                f"(from byte {self._line_start}); a line names one item (a path and a few "
                "columns)."
            )
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class TxtList(_ListFile):
    form = "txt"

    @staticmethod
    def _rows(f: TextIO) -> Iterator[Row]:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            label = None
            head, _, last = text.rpartition(" ")
            if not head:
                head, _, last = text.rpartition("\t")
            if head and last.isdecimal() and last.isascii():
                # The label as written: checked (its range too) where every form's is.
                text, label = head.rstrip(), last
            yield (f"line {n}", text, None, label, None, None)


class CsvList(_ListFile):
    form = "csv"

    def _header(self, reader: Any) -> list[str]:
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise DatasetError(f"The header of {self.file} cannot be read ({exc}).") from None
        names = [h.strip() for h in header or []]
        if "path" not in names:
            shown = ", ".join(names[:8]) or "nothing"
            raise DatasetError(
                f"The CSV list {self.file} has no path column (its header names {shown}); "
                "its first line must name the columns, one of them path."
            )
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise DatasetError(f"The CSV list {self.file} names the column {twice[0]!r} twice.")
        return names

    def check(self) -> None:
        super().check()
        with self._reading() as f:
            self._header(csv.reader(f))

    def declared_meta(self) -> Any:
        import pyarrow as pa

        with self._reading() as f:
            others = [n for n in self._header(csv.reader(f)) if n not in RESERVED]
        return pa.struct([pa.field(n, pa.string()) for n in others]) if others else None

    def __iter__(self) -> Iterator[Row]:
        return self.rows()

    def rows(self, columns: bool = True) -> Iterator[Row]:
        """The rows; without their other ``columns`` when False (a scan's cheaper read)."""
        with self._reading() as f:
            yield from self._csv_rows(csv.reader(f), columns)

    def _csv_rows(self, reader: Any, columns: bool) -> Iterator[Row]:
        header = self._header(reader)
        width = len(header)
        at_path, at_id = header.index("path"), header.index("id") if "id" in header else None
        at_label = header.index("label") if "label" in header else None
        others = [(i, n) for i, n in enumerate(header) if n not in RESERVED]
        last_failed = -1
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                n = reader.line_num
                if n == last_failed:  # the parser cannot get past it
                    why = f"{self.file} cannot be read past line {n} ({exc})."
                    raise DatasetError(why) from None
                last_failed = n
                yield (f"line {n}", None, None, None, None, f"the CSV parser refused it ({exc})")
                continue
            n = reader.line_num
            if not fields or (len(fields) == 1 and not fields[0].strip() and width > 1):
                continue  # a blank line
            written_id = None
            if at_id is not None and at_id < len(fields):
                written_id = fields[at_id].strip() or None
            if len(fields) != width:
                why = f"it has {len(fields)} fields where the header has {width}"
                yield (f"line {n}", None, written_id, None, None, why)
                continue
            carried = {name: fields[i] for i, name in others} if columns and others else None
            label = fields[at_label] if at_label is not None else None
            yield (f"line {n}", fields[at_path].strip(), written_id, label, carried, None)


class JsonlList(_ListFile):
    form = "jsonl"

    def check(self) -> None:
        super().check()
        with self._reading() as f:
            self._check_first(f)

    def _check_first(self, f: TextIO) -> None:
        for line in f:
            if not line.strip():
                continue
            try:
                first = json.loads(line)
            except (ValueError, *NESTING_ERRORS):
                return  # the first line's own error row says it
            if isinstance(first, dict) and "path" not in first:
                keys = ", ".join(list(first)[:8]) or "no key"
                raise DatasetError(
                    f"The JSON-lines list {self.file} has no path column (its first object "
                    f"has {keys}); give each line a path."
                )
            return

    @staticmethod
    def _rows(f: TextIO) -> Iterator[Row]:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield (where, None, None, None, None, f"it is not valid JSON ({exc.msg})")
                continue
            except ValueError as exc:  # an integer of more than 4,300 digits
                yield (where, None, None, None, None, f"it cannot be read ({parse_problem(exc)})")
                continue
            except NESTING_ERRORS:
                yield (where, None, None, None, None, "it nests JSON deeper than it can be read")
                continue
            if not isinstance(obj, dict):
                yield (where, None, None, None, None, "it is not a JSON object")
                continue
            path = obj.pop("path", None)
            written_id = obj.pop("id", None)
            label = obj.pop("label", None)
            error = None if path is not None else "it has no path"
            yield (where, path, written_id, label, obj or None, error)


class ParquetList(_ListFile):
    """A Parquet list, read ``batch_rows`` rows at a time (``scan_rows`` when scanned)."""

    form = "parquet"

    def __init__(
        self,
        file: Path,
        base: Path | None = None,
        *,
        batch_rows: int = PARQUET_BATCH,
        scan_rows: int = SCAN_BATCH,
    ) -> None:
        super().__init__(file, base)
        self.batch_rows, self.scan_rows = batch_rows, scan_rows

    def _schema(self) -> Any:
        import pyarrow.parquet as pq

        try:
            return pq.read_schema(self.file)
        except Exception as exc:  # pyarrow's errors for a file that is not Parquet vary
            raise DatasetError(f"{self.file} is not a readable Parquet file ({exc}).") from None

    def check(self) -> None:
        import pyarrow as pa

        super().check()
        schema = self._schema()
        names = schema.names
        if "path" not in names:
            shown = ", ".join(names[:8]) or "none"
            raise DatasetError(
                f"The Parquet list {self.file} has no path column (its columns: {shown})."
            )
        wanted: dict[str, tuple[str, tuple[Callable[[pa.DataType], bool], ...]]] = {
            "path": ("text", (pa.types.is_string, pa.types.is_large_string)),
            "id": ("text or integers", (pa.types.is_string, pa.types.is_large_string,
                   pa.types.is_integer)),
            "label": ("integers or class names", (pa.types.is_integer, pa.types.is_string,
                      pa.types.is_large_string)),
        }  # fmt: skip
        for name, (what, tests) in wanted.items():
            if name in names:
                t = schema.field(name).type
                if not any(test(t) for test in tests):
                    raise DatasetError(
                        f"The {name} column of {self.file} is of type {t}; it must hold {what}."
                    )

    def declared_meta(self) -> Any:
        import pyarrow as pa

        # Dictionary-encoded columns (pandas categoricals) are read as their values.
        fields = [
            f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
            for f in self._schema()
            if f.name not in RESERVED
        ]
        return pa.struct(fields) if fields else None

    def scan(self, scan: Scan, progress: Callable[[int], None] | None = None) -> None:
        """Fill ``scan`` column-wise, a record batch at a time: what the row-by-row read
        finds, at a fraction of its cost (only the ids become Python objects, for their
        hashes)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        columns = [c for c in RESERVED if c in self._schema().names]
        with pq.ParquetFile(self.file) as f:
            for batch in f.iter_batches(batch_size=self.scan_rows, columns=columns):
                first, n = scan.count, batch.num_rows
                path = batch.column("path")
                empty = pc.fill_null(pc.equal(path, ""), True)
                bad = pc.sum(empty).as_py() or 0
                if bad and scan.first_bad is None:
                    at = first + pc.index(empty, True).as_py() + 1
                    scan.first_bad = f"row {at}: its path is empty"
                written = pc.cast(batch.column("id"), pa.string()) if "id" in columns else None
                if written is not None and not written.null_count:
                    # Every row has its id (the usual manifest): hashed without a look at
                    # the paths, which would cost a Python string each (a third of a scan).
                    scan.hashes.extend(array("q", map(hash, written.to_pylist())))
                else:
                    paths = path.to_pylist()
                    ids = [None] * n if written is None else written.to_pylist()
                    base = scan.base
                    scan.hashes.extend(
                        hash(i)
                        if i is not None
                        else hash(item_id(None, p, f"row {first + k + 1}", base))
                        for k, (i, p) in enumerate(zip(ids, paths, strict=True))
                    )
                good = pc.invert(empty)
                npy = pc.and_(good, pc.ends_with(pc.utf8_lower(pc.fill_null(path, "")), ".npy"))
                scan.npy += pc.sum(npy).as_py() or 0
                lower = pc.utf8_lower(pc.fill_null(path, ""))
                for ext in VIDEO_EXTENSIONS:
                    scan.video += pc.sum(pc.and_(good, pc.ends_with(lower, ext))).as_py() or 0
                if "label" in columns:
                    for value in pc.unique(pc.filter(batch.column("label"), good)).to_pylist():
                        scan.label(value, f"rows {first + 1}-{first + n}")
                scan.count += n
                scan.bad += bad
                if progress is not None:
                    progress(scan.count)

    def __iter__(self) -> Iterator[Row]:
        import pyarrow.parquet as pq

        names = self._schema().names
        others = [n for n in names if n not in RESERVED]
        n = 0
        with pq.ParquetFile(self.file) as f:
            for batch in f.iter_batches(batch_size=self.batch_rows):
                data = batch.to_pydict()
                paths = data["path"]
                ids = data.get("id") or [None] * len(paths)
                labels = data.get("label") or [None] * len(paths)
                extra = [data[name] for name in others]
                for i, path in enumerate(paths):
                    n += 1
                    columns = (
                        {name: col[i] for name, col in zip(others, extra, strict=True)}
                        if others
                        else None
                    )
                    error = None if path else "its path is empty"
                    yield (f"row {n}", path, ids[i], labels[i], columns, error)


_CLASSES = {"txt": TxtList, "csv": CsvList, "jsonl": JsonlList, "parquet": ParquetList}


def list_form(path: str) -> str | None:
    """The form of a list file named ``path`` (by its extension), or None."""
    dot = path.rfind(".")
    return FORMS.get(path[dot:].lower()) if dot >= 0 else None


def list_entries(file: Path, base: Path | None = None) -> _ListFile:
    """The rows of the list file ``file`` (its form from the extension); relative paths
    read against ``base`` (default: the file's folder)."""
    form = list_form(str(file))
    if form is None:
        raise DatasetError(f"{file} is not a list file ({', '.join(FORMS)}).")
    return _CLASSES[form](file, base)
