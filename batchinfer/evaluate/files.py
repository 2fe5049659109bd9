"""Whole-or-absent writes of the evaluation's files (tmp, fsync, rename), eval's messages.

The sink's writer (batchinfer.sink._atomic) does the work; only its message, which
speaks of resuming a run, is replaced by one that fits an evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import OutputWriteError
from batchinfer.sink._atomic import write_atomically


def _failed(path: Path, exc: BaseException) -> OutputWriteError:
    cause = exc.__cause__ if isinstance(exc, OutputWriteError) and exc.__cause__ else exc
    reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return OutputWriteError(
        f"Could not write {path} ({reason}); free disk space or fix the permissions of the "
        "job's output folders, then run the evaluation again."
    )


def _write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, write)
    except (OSError, OutputWriteError) as exc:
        raise _failed(path, exc) from exc


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (its folder is created)."""
    _write(path, lambda f: f.write(data))


def write_json(path: Path, data: Any) -> None:
    write_bytes(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode())


def write_table(path: Path, table: pa.Table) -> None:
    """Write ``table`` as Parquet to ``path`` whole or not at all."""
    _write(path, lambda f: pq.write_table(table, f))
