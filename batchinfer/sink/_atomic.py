"""Whole-or-absent file writes: write a hidden tmp file, fsync it, then os.replace it.

Every file the sink leaves in OUT goes through here, so a crash or a full disk leaves
either the previous version or the new one, never half a file. A leftover
``.NAME.tmp`` is harmless; ``prepare_resume`` sweeps the ones under predictions/.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import OutputWriteError


def tmp_path_for(path: Path) -> Path:
    """The hidden sibling ``.NAME.tmp`` that ``path`` is written to before the rename."""
    return path.with_name(f".{path.name}.tmp")


def write_error(path: Path, exc: OSError) -> OutputWriteError:
    """An OutputWriteError whose one sentence names the file, the cause and the remedy."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputWriteError(
        f"Could not write {path} ({reason}); free disk space or fix permissions, "
        "then run again with --resume to continue where the run stopped."
    )


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` whole or not at all; ``write`` fills the open tmp file.

    Raises OutputWriteError (and removes the tmp file) on any OSError.
    """
    tmp = tmp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from exc
    fsync_dir(path.parent)


def write_table_atomically(table: pa.Table, path: Path, **parquet_options: Any) -> None:
    """Write ``table`` as Parquet to ``path`` whole or not at all (OutputWriteError on OSError).

    ``parquet_options`` go to ``pyarrow.parquet.write_table``.
    """
    # Looked up at call time so tests can monkeypatch pq.write_table to simulate ENOSPC.
    write_atomically(path, lambda f: pq.write_table(table, f, **parquet_options))


def write_bytes_atomically(data: bytes, path: Path) -> None:
    """Write ``data`` to ``path`` whole or not at all (OutputWriteError on OSError)."""
    write_atomically(path, lambda f: f.write(data))
