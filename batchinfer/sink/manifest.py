"""OUT/manifest.json: what ran, on what, with which model, and how it ended.

The manifest is written several times during a run (at start with status "running",
at the end with the counts and final status), always atomically, so a reader sees a
whole JSON document or the previous one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import ModelError, UsageError
from batchinfer.sink._atomic import write_bytes_atomically

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "batchinfer-run"
MANIFEST_VERSION = 1


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


def write_manifest(out_dir: Path, manifest: dict) -> Path:
    """Write OUT/manifest.json atomically (indent 2, sorted keys); returns its path."""
    text = json.dumps(manifest, indent=2, sort_keys=True, default=_to_json) + "\n"
    path = Path(out_dir) / MANIFEST_FILE
    write_bytes_atomically(text.encode(), path)
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

    @classmethod
    def new(cls, out_dir: Path, **fields: Any) -> RunManifest:
        """A manifest for a fresh run folder (not written until :meth:`save`)."""
        data = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, "parts": {}}
        data.update(fields)
        return cls(out_dir, data)

    @classmethod
    def load(cls, out_dir: Path) -> RunManifest:
        """The manifest of an existing run folder; UsageError when it is not one of ours."""
        data = read_manifest(out_dir)
        if not is_run_manifest(data):
            raise UsageError(
                f"{Path(out_dir) / MANIFEST_FILE} was not written by a batchinfer run (or by "
                "an older version), so it is neither continued nor replaced; choose another "
                "output folder."
            )
        return cls(out_dir, data)

    def save(self) -> None:
        """Write the manifest atomically (OutputWriteError when the disk refuses)."""
        write_manifest(self.out, self.data)

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
            f"Model file {path} cannot be read ({exc.strerror or exc}); check the {{model}} path."
        ) from None
    return digest.hexdigest()
