"""OUT/manifest.json: what ran, on what, with which model, and how it ended.

The manifest is written several times during a run (at start with status "running",
at the end with the counts and final status), always atomically, so a reader sees a
whole JSON document or the previous one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError, OutputTamperedError, UsageError
from batchinfer.messages import setting
from batchinfer.sink.atomic import write_bytes_atomically, write_error
from batchinfer.sink.folder_handle import Folder

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "batchinfer-run"
MANIFEST_VERSION = 1

#: The only names a part ledger may hold (what ``part_name`` makes): ASCII digits, no
#: separator, no "..", no trailing newline (``\Z``, not ``$``), so a name joined to
#: predictions/ can only ever be a file directly inside it.
PART_RE = re.compile(r"part-([0-9]{5,})\.parquet\Z")
PART_STATES = ("live", "retired")
_SHOWN = 300  # characters of a hostile name or record shown in a message

#: The run folder's folder of prediction parts (written by sink/predictions.py).
PREDICTIONS_DIR = "predictions"


def _to_json(value: Any) -> Any:
    """JSON-able form of the values json cannot serialise itself (numpy, paths, ...)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"manifest value of type {type(value).__name__} is not JSON-serialisable")


def write_manifest(out_dir: Path, manifest: dict, *, folder: Folder | None = None) -> Path:
    """Write OUT/manifest.json atomically (indent 2, sorted keys); returns its path.

    ``folder``: OUT held open (a run's), written inside whatever the path leads to now."""
    text = json.dumps(manifest, indent=2, sort_keys=True, default=_to_json) + "\n"
    path = Path(out_dir) / MANIFEST_FILE
    write_bytes_atomically(text.encode(), path, folder=folder)
    return path


def read_manifest(out_dir: Path) -> dict:
    """The manifest of an output folder; UsageError when it is missing or not valid JSON."""
    path = Path(out_dir) / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"{path} does not exist, so {out_dir} is not a batchinfer output folder; "
            "choose another output folder."
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"{path} cannot be read ({exc}), so {out_dir} is not a batchinfer run this "
            "version can continue or replace; choose another output folder."
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object; choose another output folder.")
    return data


def is_run_manifest(data: object) -> bool:
    """True when ``data`` is a manifest a batchinfer run wrote (its format field says so).

    A folder is only ever continued (--resume) or cleared (--overwrite) when its
    manifest.json passes this check: another tool's manifest.json is not ours.
    """
    return (
        isinstance(data, dict)
        and data.get("format") == MANIFEST_FORMAT
        and data.get("format_version") == MANIFEST_VERSION
        and isinstance(data.get("parts"), dict)
    )


def _record_problem(name: object, record: object) -> str | None:
    """Why a ledger entry is not one batchinfer wrote, or None when it is."""
    if not isinstance(name, str) or not PART_RE.match(name):
        return "is not a name batchinfer writes (part-NNNNN.parquet, directly in predictions/)"
    if not isinstance(record, dict):
        return "has a record that is not a JSON object"
    counts = [record.get("rows"), record.get("errors")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return "has rows or errors that are not counts"
    if not isinstance(record.get("sha256"), str):
        return "has no sha256 checksum"
    if record.get("state") not in PART_STATES:
        return f"has a state that is neither {' nor '.join(PART_STATES)}"
    return None


def check_ledger(out_dir: Path, parts: dict) -> None:
    """OutputTamperedError (exit 2) naming the first ledger entry batchinfer did not write.

    Every reader of a run folder goes through :meth:`RunManifest.load`, which calls this:
    a name like ``../../.ssh/authorized_keys`` or ``/etc/passwd`` is refused before any
    code joins it to a path, so nothing outside OUT/predictions/ is deleted or read.
    """
    for name, record in parts.items():
        problem = _record_problem(name, record)
        if problem is not None:
            raise OutputTamperedError(
                f"{Path(out_dir) / MANIFEST_FILE} lists {_shown(name)} as a prediction part, "
                f"which {problem}: the manifest was edited or damaged, so nothing in {out_dir} "
                "was deleted, continued or read; move that folder aside and pass another "
                + setting("output.out")
                + "."
            )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def regular_file(path: Path, out_dir: Path) -> bool:
    """True when ``path`` is a regular file, False when nothing is there.

    Anything else (a symlink, even to a file; a folder; a device) raises
    OutputTamperedError: batchinfer writes only regular files into a run folder, so such
    an entry was put there by someone else and is neither read nor deleted.
    """
    mode = _mode(path)
    return mode is not None and _regular(mode, path, out_dir)


def _mode(path: Path) -> int | None:
    """What is at ``path`` (a link not followed), None when nothing is."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise write_error(path, exc) from exc


def regular_in(folder: Folder, name: str, out_dir: Path) -> bool:
    """:func:`regular_file` for ``name`` inside ``folder`` (held open: not looked up by
    path, so a folder swapped for a link meanwhile is not followed)."""
    try:
        st = folder.lstat(name)
    except OSError as exc:
        raise write_error(folder.path / name, exc) from exc
    return st is not None and _regular(st.st_mode, folder.path / name, out_dir)


def _regular(mode: int, path: Path, out_dir: Path) -> bool:
    if stat.S_ISREG(mode):
        return True
    what = (
        "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a folder"
        if stat.S_ISDIR(mode)
        else "not a regular file"
    )
    raise OutputTamperedError(
        f"{path} is {what}, which batchinfer never writes there, so nothing in {out_dir} was "
        f"deleted, continued or read; move {path.name} out of that folder, then run again."
    )


def predictions_dir(out_dir: Path) -> Path:
    """OUT/predictions/ when it is a real folder or absent (OutputTamperedError otherwise:
    a symlink there would send every part name to another folder)."""
    directory = Path(out_dir) / PREDICTIONS_DIR
    mode = _mode(directory)
    if mode is None or stat.S_ISDIR(mode):
        return directory
    raise _not_a_folder(directory, mode, out_dir)


def _not_a_folder(directory: Path, mode: int, out_dir: Path) -> OutputTamperedError:
    what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
    return OutputTamperedError(
        f"{directory} is {what}, which batchinfer never makes, so nothing in {out_dir} was "
        f"deleted, continued or read; move it out of that folder, then run again."
    )


def open_predictions(out: Folder, *, create: bool = False) -> Folder | None:
    """OUT/predictions/ held open (made first when ``create``), None when absent;
    OutputTamperedError when it is a symbolic link or not a folder (never followed)."""
    directory = out.path / PREDICTIONS_DIR
    try:
        return out.sub(PREDICTIONS_DIR, create=create)
    except FileNotFoundError:
        return None
    except OSError as exc:
        st = out.lstat(PREDICTIONS_DIR)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise _not_a_folder(directory, st.st_mode, out.path) from None
        raise write_error(directory, exc) from exc


@contextlib.contextmanager
def opened_out(path: Path) -> Iterator[tuple[Folder, Folder | None]]:
    """OUT and OUT/predictions/ held open for one use (predictions None when absent), both
    closed after; OutputWriteError when OUT cannot be opened."""
    try:
        out = Folder.open(path)
    except OSError as exc:
        raise write_error(path, exc) from exc
    with out:
        predictions = open_predictions(out)
        try:
            yield out, predictions
        finally:
            if predictions is not None:
                predictions.close()


class RunManifest:
    """manifest.json of one run folder: kept in memory, written whole on every change.

    It is also the folder's ledger of prediction parts (``parts``: file name -> rows,
    errors, sha256, state). The prediction writer records a part *before* renaming it
    into place, so a part on disk under its name always has a record whose checksum
    vouches for every byte; ``prepare_resume`` trusts nothing else (see resume.py).
    A part being replaced (resume drops error rows) is first marked ``retired``, so a
    crash in the middle leaves files that can still be told apart.
    """

    def __init__(self, out_dir: Path, data: dict) -> None:
        self.out = Path(out_dir)
        self.data = data
        #: Called before every write into OUT (the run's :meth:`OutLock.check`): raises
        #: when OUT is no longer the folder the run locked.
        self.guard: Callable[[], None] | None = None
        #: OUT held open (a run's, from when it began): the manifest is written inside it.
        self.folder: Folder | None = None

    @classmethod
    def new(cls, out_dir: Path, **fields: Any) -> RunManifest:
        """A manifest for a fresh run folder (not written until :meth:`save`)."""
        data = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, "parts": {}}
        data.update(fields)
        return cls(out_dir, data)

    @classmethod
    def load(cls, out_dir: Path) -> RunManifest:
        """The manifest of an existing run folder; UsageError when it is not one of ours,
        OutputTamperedError when its ledger names a file batchinfer never writes."""
        data = read_manifest(out_dir)
        if not is_run_manifest(data):
            raise UsageError(
                f"{Path(out_dir) / MANIFEST_FILE} was not written by a batchinfer run (or by "
                "an older version), so it is neither continued nor replaced; choose another "
                "output folder."
            )
        check_ledger(out_dir, data["parts"])
        return cls(out_dir, data)

    def check_held(self) -> None:
        """Raise (OutputLostError) when OUT is no longer the folder this run locked."""
        if self.guard is not None:
            self.guard()

    def save(self) -> None:
        """Write the manifest atomically (OutputWriteError when the disk refuses)."""
        self.check_held()
        write_manifest(self.out, self.data, folder=self.folder)

    def update(self, **fields: Any) -> None:
        """Set top-level fields and save."""
        self.data.update(fields)
        self.save()

    # -- the part ledger --------------------------------------------------------------
    @property
    def parts(self) -> dict[str, dict]:
        """File name (under predictions/) -> {rows, errors, sha256, state}."""
        return self.data["parts"]

    def record_part(self, name: str, *, rows: int, errors: int, sha256: str) -> None:
        """Record a part that is about to be renamed into place, and save."""
        self.parts[name] = {"rows": rows, "errors": errors, "sha256": sha256, "state": "live"}
        self.save()

    def replace_part(self, old: str, new: str, *, rows: int, errors: int, sha256: str) -> None:
        """Record ``new`` and retire ``old`` in one save (resume rewriting a part)."""
        self.parts[old]["state"] = "retired"
        self.record_part(new, rows=rows, errors=errors, sha256=sha256)

    def forget_part(self, name: str, save: bool = True) -> None:
        """Drop a part's record (its file is gone)."""
        self.parts.pop(name, None)
        if save:
            self.save()

    def parts_in(self, predictions: Folder) -> list[str]:
        """:meth:`part_files` for OUT/predictions/ held open: the names on disk."""
        return [name for name in self.parts if regular_in(predictions, name, self.out)]

    def part_files(self) -> dict[str, Path]:
        """The parts the ledger names that are on disk, by name, each checked to be a
        regular file directly inside a real OUT/predictions/ (OutputTamperedError if not)."""
        directory = predictions_dir(self.out)
        real = os.path.realpath(directory)
        found = {}
        for name in self.parts:
            path = directory / name
            if regular_file(path, self.out):
                # Already implied by the name and the checks above; kept as the last word.
                if os.path.dirname(os.path.realpath(path)) != real:
                    raise OutputTamperedError(f"{path} is not inside {directory}.")
                found[name] = path
        return found

    def rows_on_disk(self) -> tuple[int, int]:
        """(rows, error rows) in the live parts this ledger vouches for."""
        live = [p for p in self.parts.values() if p["state"] == "live"]
        return sum(p["rows"] for p in live), sum(p["errors"] for p in live)


def model_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """The hex SHA-256 of the file at ``path``, read in chunks (ModelError if unreadable)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                digest.update(chunk)
    except OSError as exc:
        raise ModelError(
            f"Model file {path} cannot be read ({exc.strerror or exc}); check the "
            + setting("model")
            + " path."
        ) from None
    return digest.hexdigest()
