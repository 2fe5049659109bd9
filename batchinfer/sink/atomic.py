"""Whole-or-absent file writes: write a hidden tmp file, fsync it, then rename it.

Every file the sink leaves in OUT goes through here, so a crash or a full disk leaves
either the previous version or the new one, never half a file. A leftover
``.NAME.tmp`` is harmless; ``prepare_resume`` sweeps the ones under predictions/.

The tmp file is made, and renamed, inside a folder held open (folder_handle.Folder): a run
passes the handles it opened when it began, so a folder swapped for a link meanwhile gets
nothing. Without one, the path's folder is opened for the one write.

A failure is said as what it is (:func:`write_error`): a full disk or a refused
permission is the disk's, a value Parquet cannot hold is the data's, never the other way.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import OutputWriteError
from batchinfer.messages import setting
from batchinfer.sink.folder_handle import Folder

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)

#: What a value Arrow or Parquet cannot hold raises (not the disk's fault).
DATA_ERRORS: tuple[type[BaseException], ...] = (
    OverflowError,
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    TypeError,
    ValueError,
)


def tmp_path_for(path: Path) -> Path:
    """The hidden sibling ``.NAME.tmp`` that ``path`` is written to before the rename."""
    return path.with_name(f".{path.name}.tmp")


def write_error(path: Path, exc: BaseException) -> OutputWriteError:
    """An OutputWriteError whose one sentence names the file, the cause and the remedy.

    An OSError is the disk's (full, refused, failing); anything else is a value the
    writer could not store (:func:`data_error`), which no amount of disk space fixes.
    """
    if not isinstance(exc, OSError):
        return data_error(path, exc)
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in _FULL:
        remedy = "free disk space"
    elif exc.errno in _REFUSED:
        remedy = "make the folder writable"
    else:
        remedy = "check the disk and the folder"
    return OutputWriteError(
        f"Could not write {path} ({reason}); {remedy}, then run again with "
        + setting("output.resume")
        + " to continue where the run stopped."
    )


def data_error(path: Path, exc: BaseException) -> OutputWriteError:
    """The OutputWriteError of a write refused for its data, not for the disk."""
    reason = str(exc) or type(exc).__name__
    return OutputWriteError(
        f"Could not write {path}: its rows hold a value the Parquet writer cannot store "
        f"({type(exc).__name__}: {reason}); the disk is not the cause. This is a batchinfer "
        "bug (such a row should have become an error row): please report it with this line."
    )


def write_atomically(
    path: Path,
    write: Callable[[BinaryIO], object],  # what it returns is not used
    before_rename: Callable[[str], None] | None = None,
    *,
    folder: Folder | None = None,
) -> None:
    """Write ``path`` whole or not at all; ``write`` fills the open tmp file.

    ``folder``: the folder ``path`` is in, held open (the tmp file is made and renamed in
    it, whatever ``path`` leads to now); None opens ``path``'s folder for this write.
    ``before_rename(sha256)`` runs once the tmp file is complete and synced, with its
    checksum, before it takes ``path``'s name: the prediction writer records the part
    there, so a part can never be on disk under its name without its record. Any
    exception from ``write`` or ``before_rename`` removes the tmp file; OSError becomes
    OutputWriteError.
    """
    if folder is None:
        try:
            here = Folder.open(path.parent)
        except OSError as exc:
            raise write_error(path, exc) from exc
        with here:
            return write_atomically(path, write, before_rename, folder=here)
    name, tmp = path.name, tmp_path_for(path).name
    try:
        with folder.create(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(folder.sha256(tmp))
        folder.replace(tmp, name)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from exc
        raise
    folder.fsync()


def write_table_atomically(
    table: pa.Table,
    path: Path,
    before_rename: Callable[[str], None] | None = None,
    *,
    folder: Folder | None = None,
    **parquet_options: Any,
) -> None:
    """Write ``table`` as Parquet to ``path`` whole or not at all (OutputWriteError on OSError).

    ``folder`` as for :func:`write_atomically`; ``parquet_options`` go to
    ``pyarrow.parquet.write_table``.
    """
    # Looked up at call time so tests can monkeypatch pq.write_table to simulate ENOSPC.
    write_atomically(
        path,
        lambda f: pq.write_table(table, f, **parquet_options),
        before_rename=before_rename,
        folder=folder,
    )


def write_bytes_atomically(data: bytes, path: Path, *, folder: Folder | None = None) -> None:
    """Write ``data`` to ``path`` whole or not at all (OutputWriteError on OSError)."""
    write_atomically(path, lambda f: f.write(data), folder=folder)
