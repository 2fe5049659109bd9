"""Who holds an output folder's lock: a probe that changes nothing and imports little.

The lock itself is :class:`batchinfer.sink.outdir.OutLock` (see that module's docstring).
This part only reads, and needs nothing but the standard library, so a run can refuse a
held OUT first of all: before it imports the engine and pyarrow, launches its fork
server, opens the model or lists the dataset (:func:`refuse_if_held`). The run still
looks again once it holds the lock, as OUT can change between planning and running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from batchinfer.errors import OutputLockedError
from batchinfer.flocks import try_flock
from batchinfer.messages import Message, setting

LOCK_FILE = ".batchinfer.lock"


def refuse_if_held(path: Path) -> None:
    """OutputLockedError naming the holder when another run holds OUT ``path``'s lock."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    holder = lock_holder(path)
    if holder is not None:
        raise OutputLockedError(locked_message(path, holder))


def _is_held(fd: int) -> bool:
    """True when another open file holds a lock on ``fd``'s file (probing changes nothing)."""
    try:
        if not try_flock(fd, fcntl.LOCK_SH):
            return True
    except OSError:
        return False  # cannot be locked here at all (some network filesystems)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def lock_holder(path: Path) -> dict | None:
    """Who holds OUT's lock now (pid, command, ...), or None when nobody does. Only reads.

    Held means the folder's own lock, or the lock file's (older versions, and filesystems
    where a folder cannot be locked). The holder's details come from the lock file: {} if
    it was deleted.
    """
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        held = _is_held(dir_fd)
    finally:
        os.close(dir_fd)
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {} if held else None
    try:
        return _read_holder(fd) if held or _is_held(fd) else None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "{}")
        if isinstance(data, dict):
            return data
    return {}


def locked_message(path: Path, holder: dict) -> Message:
    who = ", ".join(
        f"{k} {holder[k]}" for k in ("pid", "host", "started_at") if holder.get(k) is not None
    )
    command = holder.get("command")
    what = f"another batchinfer run ({who or 'holder unknown'})"
    if command:
        what += f": {command}"
    return (
        f"output folder {path} is in use by {what}; wait for it to finish, or pass another "
        + setting("output.out")
        + "."
    )
