"""Whole-or-absent writes of the evaluation's files (tmp, fsync, rename), eval's messages,
and how eval knows the report and summary it may replace.

The sink's writer (batchinfer.sink.atomic) does the work; only its message, which
speaks of resuming a run, is replaced by one that fits an evaluation.

The report and the summary go where the job says (``output.report``, ``output.summary``),
which may be a path holding someone's file. Eval replaces such a path only when it holds a
file eval wrote, known by its mark: :data:`REPORT_MARK` (a generator meta tag in the
page's first line) and :data:`SUMMARY_MARK` (the summary file's first line, an HTML
comment that Markdown renderers hide). Anything else there (a file without the mark, a
folder, a symlink, a FIFO) is refused before anything runs (:func:`not_ours`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import OutputWriteError
from batchinfer.sink.atomic import write_atomically


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


#: In the first line of every report page eval writes.
REPORT_MARK = '<meta name=generator content="batchinfer eval">'
#: The first line of every summary file eval writes.
SUMMARY_MARK = "<!-- written by batchinfer eval, which replaces this file at each evaluation -->"
_HEAD_BYTES = 1024


def not_ours(path: Path, mark: str) -> str | None:
    """Why eval may not replace ``path``; None when nothing is there or eval wrote it.

    Never blocks: the path is opened only once it is known to be a regular file, and
    without following a symlink (a FIFO swapped in meanwhile opens non-blocking).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return "exists and is not a regular file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            head = os.read(fd, _HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if mark.encode() not in head.split(b"\n", 1)[0]:
        return "exists and was not written by batchinfer eval"
    return None
