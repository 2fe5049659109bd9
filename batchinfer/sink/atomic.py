"""Whole-or-absent file writes: write a hidden tmp file, fsync it, then os.replace it.

Every file the sink leaves in OUT goes through here, so a crash or a full disk leaves
either the previous version or the new one, never half a file. A leftover
``.NAME.tmp`` is harmless; ``prepare_resume`` sweeps the ones under predictions/.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import OutputWriteError
from batchinfer.messages import setting


def tmp_path_for(path: Path) -> Path:
    """The hidden sibling ``.NAME.tmp`` that ``path`` is written to before the rename."""
    return path.with_name(f".{path.name}.tmp")


def write_error(path: Path, exc: BaseException) -> OutputWriteError:
    """An OutputWriteError whose one sentence names the file, the cause and the remedy."""
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return OutputWriteError(
        f"Could not write {path} ({reason}); free disk space or fix permissions, "
        + ("then run again with " + setting("output.resume"))
        + " to continue where the run stopped."
    )


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """The hex SHA-256 of the file at ``path`` (OSError if it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomically(
    path: Path,
    write: Callable[[BinaryIO], object],  # what it returns is not used
    before_rename: Callable[[Path], None] | None = None,
) -> None:
    """Write ``path`` whole or not at all; ``write`` fills the open tmp file.

    ``before_rename(tmp)`` runs once the tmp file is complete and synced, before it takes
    ``path``'s name: the prediction writer records the part's checksum there, so a part
    can never be on disk under its name without its record. Any exception from ``write``
    or ``before_rename`` removes the tmp file; OSError becomes OutputWriteError.
    """
    tmp = tmp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from exc
        raise
    fsync_dir(path.parent)


def write_table_atomically(
    table: pa.Table,
    path: Path,
    before_rename: Callable[[Path], None] | None = None,
    **parquet_options: Any,
) -> None:
    """Write ``table`` as Parquet to ``path`` whole or not at all (OutputWriteError on OSError).

    ``parquet_options`` go to ``pyarrow.parquet.write_table``.
    """
    # Looked up at call time so tests can monkeypatch pq.write_table to simulate ENOSPC.
    write_atomically(
        path, lambda f: pq.write_table(table, f, **parquet_options), before_rename=before_rename
    )


def write_bytes_atomically(data: bytes, path: Path) -> None:
    """Write ``data`` to ``path`` whole or not at all (OutputWriteError on OSError)."""
    write_atomically(path, lambda f: f.write(data))
