"""One run's output folder, from planning's first look to the run's last write.

:class:`OutputFolder` owns OUT for a run; the engine calls it at two points, before the
run (:meth:`~OutputFolder.begin`) and after it (:meth:`~OutputFolder.finish`), and
planning builds it (:meth:`~OutputFolder.look`, :meth:`~OutputFolder.accept`):

    look (planning, reads only)  resume without OUT? inspect OUT; OUT apart from the
      │                          dataset; may this run use it (new, --resume, --overwrite)
    accept(fingerprint)          --resume: the same run (fingerprint), parts intact; reads only
      │
    begin ── PLANNED → RUNNING   take OUT's lock, then look again under it (OUT can change
      │                          between planning and running: another run may have made,
      │                          finished or changed a run there); clear it (--overwrite:
      │                          only files a run wrote) or verify and clean it (--resume);
      │                          the manifest says "running"; rows go to :attr:`rows`
    finish ─ RUNNING → FINISHED  last rows, stats, timeline, the manifest's final state;
                                 the lock is released (so is it by :meth:`release`, which
                                 an engine that raised reaches through ``with``)

Nothing in OUT changes before ``begin`` holds the lock. From then on OUT (the lock's
descriptor) and OUT/predictions/ are held open, every file is written, renamed and deleted
inside them (folder_handle.py), and every write first checks that their names still lead
to them (:meth:`OutputFolder.check_held`): a swap stops the run, exit 3. The parts: outdir.py
(looking, the lock, clearing), fingerprint.py, resume.py, run_folder.py (the row sink and
manifest while the run lasts).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchinfer.errors import (
    BatchinferError,
    ConfigError,
    OutputLostError,
    OutputTamperedError,
    OutputWriteError,
    UsageError,
)
from batchinfer.messages import setting
from batchinfer.options import OutputOptions
from batchinfer.sink.fingerprint import check_resume_fingerprint
from batchinfer.sink.folder_handle import Folder
from batchinfer.sink.manifest import RunManifest, open_predictions
from batchinfer.sink.outdir import (
    OutFolder,
    OutLock,
    check_out,
    check_out_unlocked,
    check_separate,
    clear_run,
    inspect_out,
    refuse_if_in_use,
    swapped_message,
)
from batchinfer.sink.predictions import PREDICTIONS_DIR
from batchinfer.sink.resume import ResumeState, prepare_resume, verify_parts
from batchinfer.sink.run_folder import RunEnd, RunFolder

if TYPE_CHECKING:
    from batchinfer.tasks import Task


class Stage(enum.Enum):
    """Where an output folder is in its run's life (see the module docstring)."""

    PLANNED = "planned"  # looked at; nothing taken, nothing changed
    RUNNING = "running"  # locked and claimed; the manifest says "running"
    FINISHED = "finished"  # last writes done (or refused), lock released


class OutputFolder:
    """OUT for one run: checked, locked, claimed, written, finished (module docstring)."""

    def __init__(
        self, path: Path, output: OutputOptions, found: OutFolder, command: str | None = None
    ) -> None:
        self.path = Path(path)
        self.output = output
        self.found = found  # what the last look saw (planning's, then begin's under the lock)
        self.command = command
        self.fingerprint: dict[str, Any] | None = None
        self.stage = Stage.PLANNED
        self._lock: OutLock | None = None
        # OUT (the lock's) and OUT/predictions/, held open from begin() to release().
        self._out: Folder | None = None
        self._predictions: Folder | None = None
        self._rows: RunFolder | None = None
        self._done: ResumeState | None = None

    # -- planning: reads only -----------------------------------------------------------
    @classmethod
    def look(
        cls,
        path: Path,
        output: OutputOptions,
        *,
        dataset: Path | None = None,
        command: str | None = None,
    ) -> OutputFolder:
        """Planning's look at OUT ``path``: refuse one this run may not use. Changes nothing.

        ``output``: the run's output options (``out`` None: ``path`` is a new default
        folder). ``dataset``: the dataset's folder, when it is one (results written into a
        listed folder would be items). Raises ConfigError, UsageError or OutputExistsError
        (exit 2), OutputLockedError when OUT is refused while another run holds it (one
        started with this one may be making it: outdir.check_out_unlocked). The run's
        front door refused a held OUT before anything slow
        (``refuse_if_held``: the ``run`` command, :func:`batchinfer.engine.run`), and
        :meth:`begin` asks again under the lock.
        """
        path = Path(os.path.abspath(Path(path).expanduser()))
        if output.resume and output.out is None:
            raise ConfigError(
                setting("output.resume")
                + " needs "
                + setting("output.out")
                + ": the folder of the run to continue "
                "(without it a new folder would be made, and everything run again).",
                "output.resume",
            )
        found = inspect_out(path)
        if dataset is not None:
            check_separate(found.path, Path(dataset).expanduser())
        # Without the lock: a refusal of a folder another run is making says it is in use.
        found = check_out_unlocked(found, overwrite=output.overwrite, resume=output.resume)
        return cls(found.path, output, found, command)

    def accept(self, fingerprint: dict[str, Any]) -> None:
        """Take this run's fingerprint (written into the manifest by :meth:`begin`); for a
        ``--resume``, UsageError unless the run in OUT was made with the same one and every
        part under predictions/ is one its ledger vouches for. Reads only. Planning's too,
        without the lock: a refusal while another run holds OUT says it is in use."""
        self.fingerprint = fingerprint
        if self.output.resume and self.found.manifest is not None:
            try:
                self._same_run(self.found)
                verify_parts(self.found.manifest)
            except UsageError as refused:
                refuse_if_in_use(self.path, refused)
                raise

    def _same_run(self, found: OutFolder) -> None:
        assert self.fingerprint is not None, "accept() comes before the run"
        if found.state == "run" and found.manifest is not None:
            recorded = found.manifest.data.get("fingerprint")
            check_resume_fingerprint(found.path, recorded, self.fingerprint)

    # -- before the run ---------------------------------------------------------------------
    def begin(
        self,
        fields: dict[str, Any],
        *,
        save_outputs: bool,
        task: Task | str = "classify",
        class_names: tuple[str, ...] = (),
        meta: Any = None,
    ) -> OutputFolder:
        """Lock OUT, look again under the lock, clear or resume it, and write the manifest
        as "running" with ``fields`` (and the fingerprint); returns itself, a context
        manager that releases the lock. The rest of the arguments say what rows hold
        (:class:`RunFolder`). Raises as :meth:`look` does when OUT changed since planning,
        OutputLockedError when another run took it first; OUT's lock is not held then.
        """
        if self.stage is Stage.RUNNING:
            raise RuntimeError(f"{self.path} is already running: begin() comes once a run")
        assert self.fingerprint is not None, "accept() comes before begin()"
        lock = OutLock(self.path, command=self.command)
        self._lock = lock
        try:
            lock.acquire()
            self._out = lock.folder
            continued = self._claim(self._out)
            self._rows = RunFolder.begin(
                self.path,
                continued,
                {**fields, "fingerprint": self.fingerprint},
                topk=self.output.topk,
                part_rows=self.output.part_rows,
                first_part=self._done.next_part if self._done is not None else 0,
                guard=self.check_held,
                save_outputs=save_outputs,
                task=task,
                class_names=class_names,
                meta=meta,
                out=self._out,
                predictions=self._predictions,
            )
        except BaseException:
            self.release()
            raise
        self.stage = Stage.RUNNING
        return self

    def _claim(self, out: Folder) -> RunManifest | None:
        """The second look, under the lock, then clear (--overwrite) or verify and clean
        (--resume): the manifest being continued, or None for a new run.

        OUT/predictions/ is opened here, once (made if need be): from now on every file
        of the run is written, renamed and deleted inside ``out`` and it, never through
        a path that may lead elsewhere by then (:meth:`check_held` tells a swap)."""
        opts = self.output
        found = self.found = inspect_out(self.path)
        check_out(found, overwrite=opts.overwrite, resume=opts.resume)
        continued, self._done = None, None
        try:
            predictions = open_predictions(out, create=True)
        except OutputTamperedError:
            raise
        except OutputWriteError as e:
            cause = e.__cause__
            raise OutputWriteError(
                f"output folder {self.path} is not writable "
                f"({getattr(cause, 'strerror', None) or cause}); pass an "
                + setting("output.out")
                + " you can write to."
            ) from e
        assert predictions is not None  # made when absent
        self._predictions = predictions
        if found.state == "run" and opts.overwrite:
            clear_run(found, out, predictions)
        elif found.state == "run" and opts.resume:
            self._same_run(found)
            continued = found.manifest
            assert continued is not None  # a folder in state "run" has its manifest read
            continued.guard, continued.folder = self.check_held, out
            self._done = prepare_resume(continued, predictions)
        return continued

    def check_held(self) -> None:
        """OutputLostError (exit 3) unless OUT is still the folder this run locked and
        OUT/predictions/ the folder it opened: run before every write of the run."""
        if self._lock is None:
            return
        self._lock.check()
        predictions, out = self._predictions, self._out
        if (
            predictions is not None
            and out is not None
            and not predictions.still_at(PREDICTIONS_DIR, out)
        ):
            raise OutputLostError(swapped_message(self.path, out, predictions))

    # -- while the run lasts ------------------------------------------------------------------
    @property
    def rows(self) -> RunFolder:
        """The run's row sink (between :meth:`begin` and :meth:`finish`)."""
        assert self._rows is not None and self.stage is Stage.RUNNING, "begin() first"
        return self._rows

    @property
    def invocation(self) -> int:
        """0 for the run itself, 1 for its first resume, ..."""
        return self.rows.invocation

    def done_below(self, n: int) -> int:
        """How many of the first ``n`` dataset items earlier invocations already did."""
        return 0 if self._done is None else self._done.done_below(n)

    def skip(self) -> Callable[[bytes], bool] | None:
        """The dataset source's ``skip``: True for an item already done (None: none is)."""
        done = self._done
        return done.is_done if done is not None and np.size(done.done_keys) else None

    def earlier(self, key: str) -> Any:
        """What the manifest recorded under ``key`` before this invocation (None if not)."""
        return self.rows.manifest.data.get(key)

    # -- after the run --------------------------------------------------------------------------
    def finish(self, end: RunEnd) -> tuple[str, BatchinferError | None, dict[str, int]]:
        """Write the last rows, stats, timeline and manifest (:meth:`RunFolder.finish`), then
        release OUT: (status, error, counts on disk)."""
        try:
            return self.rows.finish(end)
        finally:
            self.release()

    def release(self) -> None:
        """Drop OUT's lock (no-op when not held); the stage is FINISHED if it was RUNNING."""
        if self._predictions is not None:
            self._predictions.close()
            self._predictions = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        self._out = None
        if self.stage is Stage.RUNNING:
            self.stage = Stage.FINISHED

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
