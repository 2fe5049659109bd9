"""The collector: each item's one row, built in batches and handed to the sink.

Results arrive in batches (a worker's ``done`` message holds whatever finished meanwhile);
the collector turns each batch into rows (a task that decodes in the coordinator fills
them in one go: classification's one vectorised top-k, Task.collect), gives them to the sink,
the per-core statistics and the observers, and only then frees their slots (the rows'
outputs are views of the slots' output regions until the sink has taken them).

Rows wait a little before they are flushed (:meth:`Collector.flush_due`): a flush has a fixed
cost (a top-k call, a sink write, the statistics, the observers) worth several rows, and
results arrive a few at a time. They wait only while their slots are not needed (what is
READY or being read covers the room the cores have) and for at most ``FLUSH_AGE_S``, up to
``FLUSH_ROWS`` rows; once no other item is on its way, or the run is stopping, they go at once.

The scheduler's cores are core numbers on one board; a cluster driver (batchinfer.cluster)
schedules on keys of its own and gives ``place``, which says which node and core a key is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batchinfer.data.dataset import Item
from batchinfer.data.video.dataset import frame_columns
from batchinfer.engine.events import RowsDone
from batchinfer.engine.flights import Finished, Flight
from batchinfer.engine.scheduler import Scheduler
from batchinfer.engine.slots import SlotRegion
from batchinfer.messages import Message, setting
from batchinfer.sink.rows import Row, RowSink
from batchinfer.sink.stats import CoreStatsRecorder
from batchinfer.tasks import Decoded, Task

if TYPE_CHECKING:
    import numpy as np

# At most this many rows, or this old (seconds since the first of them arrived), wait.
FLUSH_ROWS = 64
FLUSH_AGE_S = 0.02


class Collector:
    """Builds rows for finished items and hands them on (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        sink: RowSink,
        stats: CoreStatsRecorder,
        notify: Callable[[object], None],
        topk: int,
        clock: Callable[[], float] = time.monotonic,
        place: Callable[[int], tuple[str | None, int]] | None = None,
        task: Task | None = None,
    ) -> None:
        from batchinfer.tasks.classify import Classify

        self.scheduler = scheduler
        # The run's task (None: classify, as before tasks): it fills the rows from their
        # outputs here when it does not decode in the workers (Task.collect).
        self.task = task if task is not None else Classify()
        self.place = place or (lambda core: (None, core))
        self.sink = sink
        self.stats = stats
        self.notify = notify
        self.topk = topk
        self.clock = clock
        self.outputs: SlotRegion | None = None
        self._successes: list[tuple[int, int, int, float, float, Decoded | None]] = []
        self._errors: list[Finished] = []
        self._since = 0.0  # when the oldest pending row arrived (while any is pending)
        self.counts = {"succeeded": 0, "errors": 0, "input_errors": 0}
        self.collect_s = 0.0
        # Tasks decoding in the workers: items decoded, the CPU seconds the workers spent
        # decoding (what bench reports as post-processing), and the task's own figures
        # (Task.figures: a detection run's boxes kept, NaN/inf candidates dropped).
        self.detect: dict[str, float] = {}

    def success(
        self,
        slot: int,
        core: int,
        instance: int,
        t0: float,
        t1: float,
        decoded: Decoded | None = None,
    ) -> None:
        """An item inferred; ``decoded``: what the worker's task decoder made of it."""
        if not self.pending:
            self._since = self.clock()
        self._successes.append((slot, core, instance, t0, t1, decoded))

    def error(self, finished: Finished) -> None:
        if not self.pending:
            self._since = self.clock()
        self._errors.append(finished)

    @property
    def pending(self) -> bool:
        return bool(self._successes or self._errors)

    def flush_due(self, now: float) -> None:
        """Flush if the pending rows should not wait longer (see the module docstring)."""
        if not self.pending:
            return
        s = self.scheduler
        waiting = len(self._successes) + len(self._errors)
        others = len(s.flights) - len(s.free) - waiting  # items still on their way
        # Due when wait_s says so, by the same expression: with ``now - since < AGE`` a
        # clock that stops exactly at since + AGE (wait_s' deadline) could be told to wait
        # 0 s for rows that are not yet due, by a rounding, for ever.
        if (
            waiting < FLUSH_ROWS
            and self._since + FLUSH_AGE_S - now > 0
            and not s.stopping
            and others
            and not s.slots_wanted()
        ):
            return
        self.flush()

    def wait_s(self, now: float, longest: float) -> float:
        """How long the loop may wait for events before pending rows are due (<= longest)."""
        if not self.pending or self.outputs is None:  # none can be written yet (flush)
            return longest
        return min(longest, max(0.0, self._since + FLUSH_AGE_S - now))

    def flush(self) -> None:
        """Write every pending row, then free their slots.

        Not before the sink is open: it opens when the first core worker reports its output
        shapes, and items flow while workers start, so an error row (a file that cannot be
        read) may be ready before any core is."""
        if not self.pending or self.outputs is None:
            return
        t_start = time.perf_counter()
        now = self.clock()
        rows = self._success_rows() + [self._error_row(f, now) for f in self._errors]
        self.sink.write(rows)
        self.stats.record_rows(rows)
        self.notify(RowsDone(rows, now))
        for slot, *_ in self._successes:
            self.scheduler.release(slot)
        for f in self._errors:
            self.scheduler.release(f.slot)
        self.counts["succeeded"] += len(self._successes)
        self.counts["errors"] += len(self._errors)
        self.counts["input_errors"] += sum(f.attempt == 0 for f in self._errors)
        self._successes.clear()
        self._errors.clear()
        self.collect_s += time.perf_counter() - t_start

    def _success_rows(self) -> list[Row]:
        if not self._successes:
            return []
        assert self.outputs is not None  # a success means a worker attached the outputs
        views = [self.outputs[slot] for slot, *_ in self._successes]
        rows = []
        flights, place = self.scheduler.flights, self.place
        for i, (slot, key, instance, t0, t1, decoded) in enumerate(self._successes):
            flight = flights[slot]
            assert flight is not None  # DONE until released, below
            item = flight.item
            node, core = place(key)
            rows.append(
                _item_row(
                    item,
                    flight,
                    node,
                    core,
                    instance=instance,
                    attempt=len(flight.failures) + 1,
                    latency_ms=(t1 - t0) * 1e3,
                    wait_ms=max(0.0, (t0 - flight.t_ready) * 1e3),
                    error=None,
                    outputs=views[i] or None,
                    t_done=t1,
                    payload=None if decoded is None else decoded.payload,
                )
            )
        if self._successes[0][5] is not None:
            self._count_decoded()
        elif rows[0].outputs:
            self.task.collect(rows, self.topk)
        return rows

    def _count_decoded(self) -> None:
        d, figures = self.detect, self.task.figures
        for *_, decoded in self._successes:
            if decoded is None:
                continue
            d["items"] = d.get("items", 0) + 1
            d["cpu_s"] = d.get("cpu_s", 0.0) + decoded.cpu_s
            for key, value in figures(decoded.payload).items():
                d[key] = d.get(key, 0) + value

    def _error_row(self, f: Finished, now: float) -> Row:
        flight = self.scheduler.flight(f.slot)
        item = flight.item
        node, core = (None, None) if f.core is None else self.place(f.core)
        error = f.error
        # A list's item knows its line (data/listed.py ListedItem): an error of reading its
        # file (no core was involved) names the line, as a malformed row's error does.
        where = getattr(item, "where", None)
        if where and f.core is None and error and not error.startswith(where):
            error = where + ": " + error  # a Message stays one (its settings rendered later)
        return _item_row(
            item,
            flight,
            node,
            core,
            instance=None,
            attempt=f.attempt,
            latency_ms=None,
            wait_ms=None,
            error=error,
            t_done=now,
        )


def _item_row(
    item: Item,
    flight: Flight,
    node: str | None,
    core: int | None,
    *,
    instance: int | None,
    attempt: int,
    latency_ms: float | None,
    wait_ms: float | None,
    error: str | None,
    t_done: float,
    outputs: list[np.ndarray] | None = None,
    payload: Any = None,
) -> Row:
    """An item's row: what comes from the item, its flight and where it ran, and how it
    went. Named parameters, not ``**kwargs``: this runs once per item in the coordinator,
    and a dict of keywords cost ~1 us more a row (timeit)."""
    frame, time_s = frame_columns(item)
    return Row(
        index=item.index,
        id=item.id,
        id_bytes=item.id_bytes,
        label=item.label,
        label_name=item.label_name,
        core=core,
        instance=instance,
        attempt=attempt,
        latency_ms=latency_ms,
        read_ms=flight.read_ms,
        wait_ms=wait_ms,
        error=error,
        outputs=outputs,
        t_done=t_done,
        node=node,
        meta=item.columns,
        frame=frame,
        time_s=time_s,
        payload=payload,
    )


def nonfinite_warning(detect: dict[str, float]) -> Message | None:
    """What a detection run says at its end when the model's outputs were not finite: the
    candidates dropped for a NaN or infinite score or box, and in how many images. Without
    it, a detector whose outputs are all NaN gave every image 0 boxes and a clean
    "complete" (only the manifest's ``detect.nonfinite_dropped`` knew)."""
    dropped = int(detect.get("nonfinite", 0))
    if not dropped:
        return None
    items, decoded = int(detect.get("nonfinite_items", 0)), int(detect.get("items", 0))
    return (
        f"the detector's outputs were NaN or infinite: {dropped:,} candidate box"
        f"{'es' if dropped != 1 else ''} dropped as non-finite in {items:,} of {decoded:,} "
        "images, whose rows have those boxes missing (none at all where every candidate "
        "was); check the model's conversion and its input normalisation ("
        + setting("preprocess.mean")
        + ", "
        + setting("preprocess.std")
        + ")."
    )
