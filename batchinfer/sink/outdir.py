"""The output folder: may this run use it, who holds it, and clearing only what is ours.

Rules (see docs/reference/output.md):
- A folder is continued (``resume``) or cleared (``overwrite``) only when its manifest.json
  is one a batchinfer run wrote (:func:`~batchinfer.sink.manifest.is_run_manifest`).
  Clearing removes the files that manifest lists (its parts, stats, timeline, itself) and
  our tmp leftovers, never anything else: a user's notes, sources or ``.git`` stay.
- OUT may not be the dataset, lie inside it, or contain it.
- One run at a time holds OUT: an ``flock`` on the folder itself (its own descriptor),
  taken before anything in OUT changes and held until the run's last write. Deleting a
  file cannot undo it, as it could the old lock on ``OUT/.batchinfer.lock`` (still taken
  too, and still naming the holder). The OS drops it when the process dies, however it
  dies, so a crashed run never leaves a stale lock. Before each write the run checks that
  OUT is still the folder it locked (:meth:`OutLock.check`): one deleted, moved or
  replaced under it stops the run (exit 3) instead of mixing into another run's folder.
- The lock's descriptor is also OUT held open (:attr:`OutLock.folder`): the run writes and
  deletes inside it and OUT/predictions/ (opened once), never through a path looked up
  again, so a folder swapped for a symbolic link meanwhile is never written through
  (:func:`clear_run`; :func:`swapped_message` says what changed).

:func:`inspect_out`, :func:`check_out` and :func:`check_out_unlocked` only read;
:class:`OutLock` and :func:`clear_run` change things, and run only after every check of
the configuration has passed. These are the parts;
:class:`batchinfer.sink.output_folder.OutputFolder` puts them in order for a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from batchinfer.errors import (
    OutputExistsError,
    OutputLockedError,
    OutputLostError,
    OutputTamperedError,
    UsageError,
)
from batchinfer.flocks import take_flock
from batchinfer.messages import setting
from batchinfer.sink.atomic import tmp_path_for, write_error
from batchinfer.sink.folder_handle import Folder, identity
from batchinfer.sink.manifest import (
    MANIFEST_FILE,
    PART_RE,
    RunManifest,
    opened_out,
    predictions_dir,
    read_manifest,
    regular_in,
)
from batchinfer.sink.out_lock import (  # re-exported: the lock's probe lives there
    LOCK_FILE,
    _read_holder,
    lock_holder,
    locked_message,
)
from batchinfer.sink.stats import CORE_STATS_FILE, TIMELINE_FILE

_RUN_FILES = (CORE_STATS_FILE, TIMELINE_FILE)


@dataclass(frozen=True)
class OutFolder:
    """What is at OUT now: ``absent``, ``empty``, a batchinfer ``run``, or ``foreign``."""

    path: Path
    state: str
    manifest: RunManifest | None = None
    why_foreign: str = ""


def inspect_out(path: Path) -> OutFolder:
    """Look at OUT without changing it (OutputExistsError when it is a file)."""
    path = Path(os.path.abspath(path))
    if not path.exists():
        return OutFolder(path, "absent")
    if not path.is_dir():
        raise OutputExistsError(
            setting("output.out")
            + f" {path} is a file, not a folder; pass the path of a folder to write "
            "results to."
        )
    try:
        entries = [e for e in os.listdir(path) if e != LOCK_FILE]
    except OSError as exc:
        raise OutputExistsError(
            setting("output.out")
            + f" {path} cannot be read ({exc.strerror}); pass an output folder you "
            "can write to."
        ) from exc
    if not entries:
        return OutFolder(path, "empty")
    if MANIFEST_FILE not in entries:
        return OutFolder(path, "foreign", why_foreign=f"it holds no {MANIFEST_FILE}")
    try:
        manifest = RunManifest.load(path)
    except OutputTamperedError:
        raise  # ours, but its ledger names files we never wrote: say which
    except UsageError:
        with contextlib.suppress(UsageError):
            read_manifest(path)
            return OutFolder(
                path, "foreign", why_foreign=f"its {MANIFEST_FILE} was not written by batchinfer"
            )
        return OutFolder(path, "foreign", why_foreign=f"its {MANIFEST_FILE} cannot be read")
    return OutFolder(path, "run", manifest)


def check_separate(out: Path, dataset: Path) -> None:
    """UsageError when OUT is the dataset folder, inside it, or contains it."""
    o, d = Path(os.path.realpath(out)), Path(os.path.realpath(dataset))
    if o == d:
        where = "is the dataset folder"
    elif d in o.parents:
        where = "is inside the dataset folder"
    elif o in d.parents:
        where = "contains the dataset folder"
    else:
        return
    raise UsageError(
        setting("output.out")
        + f" {out} {where} ({dataset}); results and the dataset must not mix, "
        "so choose an output folder outside the dataset."
    )


def check_out(folder: OutFolder, *, overwrite: bool, resume: bool) -> None:
    """Refuse an OUT this run may not use (UsageError, exit 2); changes nothing.

    Whether another run holds OUT is not asked here: the run's front door refused a held
    OUT first of all (out_lock.refuse_if_held), and taking the lock (:class:`OutLock`)
    refuses one again. Planning, which looks without the lock, asks through
    :func:`check_out_unlocked`.
    """
    path = folder.path
    _check_flags(overwrite=overwrite, resume=resume)
    if folder.state == "run":
        if not (overwrite or resume):
            raise OutputExistsError(
                f"output folder {path} already holds a run; pass "
                + setting("output.resume")
                + " to continue it, "
                + setting("output.overwrite")
                + " to replace it, or another "
                + setting("output.out")
                + "."
            )
        if overwrite:
            _check_predictions_are_ours(folder)
            _check_victims(folder)
    elif folder.state == "foreign":
        if resume:
            raise UsageError(
                setting("output.resume")
                + f": {path} is not a batchinfer run ({folder.why_foreign}), so "
                "there is nothing to continue; pass the output folder of an earlier run."
            )
        if overwrite:
            raise OutputExistsError(
                f"output folder {path} exists and is not a batchinfer run "
                f"({folder.why_foreign}), so "
                + setting("output.overwrite")
                + " deletes nothing in it; pass another "
                + setting("output.out")
                + "."
            )
        raise OutputExistsError(
            f"output folder {path} already exists and is not empty; pass another "
            + setting("output.out")
            + "."
        )


def _check_flags(*, overwrite: bool, resume: bool) -> None:
    if overwrite and resume:
        raise UsageError(
            setting("output.overwrite")
            + " and "
            + setting("output.resume")
            + " contradict each other (replace the run, or continue it); pass one of them."
        )


def check_out_unlocked(folder: OutFolder, *, overwrite: bool, resume: bool) -> OutFolder:
    """:func:`check_out` for a look taken without OUT's lock (planning's): the folder as
    judged. Changes nothing.

    Another run may be making OUT while we look: it holds the lock from before anything
    but the lock file appears in OUT (:meth:`OutLock.acquire`, then predictions/, then its
    manifest), so what we saw may be its folder half made. A refusal is therefore checked
    against the lock: held now, OUT is in use (OutputLockedError naming the holder); free
    now, a run that held it when we looked has ended since, so OUT is looked at again and
    judged as it is now. An OUT that passes needs no such check: :meth:`OutLock.acquire`
    and the look under it come before anything is changed.
    """
    _check_flags(overwrite=overwrite, resume=resume)
    try:
        check_out(folder, overwrite=overwrite, resume=resume)
        return folder
    except UsageError as refused:
        refuse_if_in_use(folder.path, refused)
    now = inspect_out(folder.path)
    check_out(now, overwrite=overwrite, resume=resume)
    return now


def refuse_if_in_use(path: Path, refused: UsageError) -> None:
    """OutputLockedError naming the holder, instead of ``refused`` (a refusal of what a
    look without the lock saw in OUT ``path``), when another run holds OUT now."""
    holder = lock_holder(path)
    if holder is not None:
        raise OutputLockedError(locked_message(path, holder)) from refused


def _check_predictions_are_ours(folder: OutFolder) -> None:
    directory = predictions_dir(folder.path)
    with contextlib.suppress(OSError):
        listed = folder.manifest.parts if folder.manifest else {}
        strays = [
            n
            for n in sorted(os.listdir(directory))
            if n not in listed and not (PART_RE.match(n) or _is_tmp(n))
        ]
        if strays:
            raise OutputExistsError(
                f"{directory} holds {strays[0]!r}, which no batchinfer run wrote, so "
                + setting("output.overwrite")
                + " would leave it among the new results; move it out, then "
                "run again."
            )


def _is_tmp(name: str) -> bool:
    return name.startswith(".part-") and name.endswith(".parquet.tmp")


def _victims(
    folder: OutFolder, out: Folder, predictions: Folder | None
) -> list[tuple[Folder, str]]:
    """What clearing ``folder`` deletes, as (folder held open, name), every one checked
    first (OutputTamperedError).

    The ledger's names were checked when the manifest was loaded; here each file is
    checked to be a regular file directly in OUT or OUT/predictions/ (a symlink or a
    folder under one of our names was planted: refused, so nothing at all is deleted).
    """
    assert folder.state == "run" and folder.manifest is not None
    victims: list[tuple[Folder, str]] = []
    if predictions is not None:
        victims += [(predictions, n) for n in folder.manifest.parts_in(predictions)]
        victims += [(predictions, n) for n in predictions.names() if _is_tmp(n)]
    for name in _RUN_FILES:
        victims += [(out, name), (out, tmp_path_for(Path(name)).name)]
    victims.append((out, tmp_path_for(Path(MANIFEST_FILE)).name))
    return [(where, n) for where, n in victims if regular_in(where, n, folder.path)]


def _check_victims(folder: OutFolder) -> None:
    """:func:`_victims` before anything is locked (planning's look): only reads."""
    with opened_out(folder.path) as (out, predictions):
        try:
            _victims(folder, out, predictions)
        except OSError as exc:
            raise write_error(folder.path, exc) from exc


def clear_run(folder: OutFolder, out: Folder, predictions: Folder | None) -> None:
    """Delete what the run in ``folder`` wrote, and only that (the lock file stays).

    ``out`` and ``predictions``: OUT and OUT/predictions/ held open (the run's handles):
    names are deleted inside them, so a folder swapped for a link meanwhile loses nothing.
    Everything is checked before the first file goes (:func:`_victims`); predictions/
    itself stays, for the run to write into.
    """
    try:
        victims = _victims(folder, out, predictions)
    except OSError as exc:
        raise write_error(folder.path, exc) from exc
    for where, name in victims:
        try:
            where.unlink(name)
        except OSError as exc:
            raise write_error(where.path / name, exc) from exc
    # The manifest goes last: until then the folder is still recognisably ours.
    try:
        out.unlink(MANIFEST_FILE)
    except OSError as exc:
        raise write_error(out.path / MANIFEST_FILE, exc) from exc
    if predictions is not None:
        predictions.fsync()
    out.fsync()


def swapped_message(path: Path, out: Folder, predictions: Folder) -> str:
    """Why a run stopped when OUT/predictions/ is no longer the folder it opened: what
    the name holds now, and where the run's parts went (for OutputLostError, exit 3)."""
    name = predictions.path.name
    try:
        st = out.lstat(name)
        target = os.readlink(name, dir_fd=out.fd) if st and stat.S_ISLNK(st.st_mode) else ""
    except OSError:
        st, target = None, ""
    if st is None:
        now = "was deleted or moved away"
    elif target:
        now = f"was replaced by a symbolic link to {target}"
    elif stat.S_ISDIR(st.st_mode):
        now = "was replaced by another folder"
    else:
        now = "was replaced by a file"
    moved = predictions.now_at()
    if moved and moved != os.fspath(predictions.path):
        then = (
            f"its parts are in {moved}: remove what took its place, move that folder back "
            f"to {predictions.path}, then "
            "continue the run with "
            + setting("output.resume")
            + " "
            + setting("output.out")
            + f" {path}."
        )
    else:
        then = "start it again with " + setting("output.overwrite") + "."
    return (
        f"{predictions.path} {now} while this run wrote to it, so the run stopped and wrote "
        f"nothing more (nothing outside {path} was written or deleted); " + then
    )


def unmakeable(path: Path, exc: OSError) -> OutputExistsError:
    """The usage error for an output folder that cannot be made or opened, before anything
    is written (a run's OUT, an evaluation's folders).

    Not a write error: nothing has started, so "run again with --resume" cannot help.
    """
    if os.path.islink(path) and not os.path.exists(path):
        return OutputExistsError(
            f"the output folder {path} is a symbolic link to {os.path.realpath(path)}, "
            "which does not exist; make that folder first, or choose another output folder."
        )
    return OutputExistsError(
        f"the output folder {path} cannot be made or opened ({exc.strerror or exc}); "
        "choose a folder you can write to."
    )


class OutLock:
    """An exclusive ``flock`` on OUT itself and on ``OUT/.batchinfer.lock``; the OS drops
    both if we die (see the module docstring).

    The folder's lock is what excludes a second run: it lives on the folder's inode, which
    no ``rm`` inside OUT can take away. The file lock is kept for the holder's details and
    for older versions; where a folder cannot be locked (EINVAL, ENOLCK, EBADF on some
    network filesystems) it is the only one, and :meth:`check` then also verifies that the
    lock file is still the one locked.
    """

    def __init__(self, path: Path, command: str | None = None) -> None:
        self.path = Path(path)
        self.command = command
        self._fd: int | None = None
        self._dir_fd: int | None = None
        self._dir_locked = False
        self._folder: tuple[int, int] | None = None
        self._file: tuple[int, int] | None = None

    def acquire(self) -> None:
        """Create OUT if needed and take the lock; OutputLockedError naming the holder."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise unmakeable(self.path, exc) from exc
        try:
            self._dir_locked = take_flock(dir_fd, fcntl.LOCK_EX)
            if not self._dir_locked:
                raise OutputLockedError(locked_message(self.path, lock_holder(self.path) or {}))
        except OSError:
            self._dir_locked = False  # folders cannot be locked here: the file lock alone
        except BaseException:
            os.close(dir_fd)
            raise
        self._dir_fd = dir_fd
        try:
            self._lock_file()
        except BaseException:
            self.release()
            raise
        self._folder = identity(os.fstat(dir_fd))

    def _lock_file(self) -> None:
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(LOCK_FILE, flags, 0o644, dir_fd=self._dir_fd)
        except OSError as exc:
            raise write_error(self.path / LOCK_FILE, exc) from exc
        try:
            if not take_flock(fd, fcntl.LOCK_EX):
                raise OutputLockedError(locked_message(self.path, _read_holder(fd)))
        except OSError as exc:
            os.close(fd)
            raise write_error(self.path / LOCK_FILE, exc) from exc
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._file = identity(os.fstat(fd))
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": self.command,
        }
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)

    @property
    def folder(self) -> Folder:
        """OUT as the lock holds it open: what the run writes into (module docstring)."""
        assert self._dir_fd is not None, "acquire() first"
        return Folder(self._dir_fd, self.path, owned=False)

    def check(self) -> None:
        """OutputLostError (exit 3) unless OUT is still the folder this lock holds.

        Called before every write of the run: a folder deleted, moved or replaced (by
        another run that then locked the new folder) must get none of this run's files.
        """
        if self._folder is None:
            return
        try:
            now = identity(os.stat(self.path))
        except OSError:
            now = None
        lost = now != self._folder
        if not lost and not self._dir_locked:
            try:
                lost = identity(os.lstat(self.path / LOCK_FILE)) != self._file
            except OSError:
                lost = True
        if lost:
            moved = self._now_at()
            then = (
                f"it is now {moved}: continue it there with "
                + setting("output.resume")
                + " "
                + setting("output.out")
                + f" {moved}."
                if moved
                else "find the folder it was moved to and continue it there with "
                + setting("output.resume")
                + ", or start again."
            )
            raise OutputLostError(
                f"output folder {self.path} was deleted, moved or replaced while this run "
                "wrote to it, so the run stopped and wrote nothing more there (another run "
                "may be using that path now); " + then
            )

    def _now_at(self) -> str | None:
        """Where the locked folder is now, when it was moved (Linux's /proc), else None."""
        if self._dir_fd is None:
            return None
        try:
            where = os.readlink(f"/proc/self/fd/{self._dir_fd}")
        except OSError:
            return None
        gone = where.endswith(" (deleted)") or where == os.fspath(self.path)
        return None if gone else where

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race with a waiting run)."""
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = None
        self._folder = self._file = None

    def __enter__(self) -> OutLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
