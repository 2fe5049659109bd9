"""The measuring observer: warm-up, windows, when to stop, CPU and condition samples.

It watches the engine's events (see batchinfer.engine.events) and keeps time with them:

    CoresReady(t) ──warm-up──► t_start ──window──► ... ──window──► t_end ──► finish()
                               CPU snapshot,        conditions at every     CPU snapshot
                               conditions           boundary; stop?         (then the engine
                                                                             drains)

(Started comes first: on one board items flow while core workers start.)

A window closes once the clock is ``grace`` past its end (rows of calls that ended before
the boundary may still be in a pipe); then :func:`verdict.should_stop` decides. When it
says stop, the measurement ends at that boundary: completions after it (the drain) are
kept for the plots but never counted. Everything runs in the engine's loop, so each event
costs a few appends; psutil and sysfs are read only at the start, at boundaries and at the
end. The clock and the readers are injected, so tests drive it with scripted events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchinfer.bench.conditions import Probe
from batchinfer.bench.cpu import CpuSampler, CpuSnapshot
from batchinfer.bench.options import BenchOptions
from batchinfer.bench.verdict import should_stop
from batchinfer.bench.windows import SampleLog
from batchinfer.engine import events as ev

#: How far past a window's end the clock must be before the window is judged.
GRACE_S = 0.05


class BenchObserver:
    """Measures one engine run (see the module docstring)."""

    def __init__(
        self,
        opts: BenchOptions,
        cpu: CpuSampler,
        probe: Probe,
        finish: Callable[[], None],
    ) -> None:
        self.opts = opts
        self.cpu = cpu
        self.probe = probe
        self.finish = finish
        self.grace_s = min(GRACE_S, 0.1 * opts.window_s)
        self.log = SampleLog()
        self.error_times: list[float] = []
        self.first_errors: list[tuple[float, str]] = []
        self._kept_errors = [0, 0]  # how many first_errors came before, and while, measuring
        self.phase = "starting"  # starting | warmup | measuring | done
        self.t_started: float | None = None
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.counts: list[int] = []  # completions per window so far
        self.closed = 0  # windows judged
        self.readings: list[dict[str, Any]] = []  # conditions while measuring
        self.runnable: list[int | None] = []  # runnable tasks at each boundary
        self.cpu_started: CpuSnapshot | None = None
        self.cpu_start: CpuSnapshot | None = None
        self.cpu_end: CpuSnapshot | None = None
        self.stopped: str | None = None
        self.failures: list[str] = []  # restarts and retired cores while measuring

    # ------------------------------------------------------------------ events
    def notify(self, event: object) -> None:
        if isinstance(event, ev.RowsDone):
            self._rows(event.rows)
            self._tick(event.t)
        elif isinstance(event, ev.Dispatched):
            self._tick(event.t)
        elif isinstance(event, ev.ChildReady):
            self.cpu.track(event.kind, event.key, event.pid, late=self.phase == "measuring")
        elif isinstance(event, ev.Started):
            self.t_started = event.t
        elif isinstance(event, ev.CoresReady) and self.phase == "starting":
            # Items flow while core workers still start (from Started); the warm-up, the
            # run's ramp, is counted from when every core is up.
            self.t_start = event.t + self.opts.warmup_s
            self.cpu_started = self.cpu.snapshot()
            self.phase = "warmup"
            self._tick(event.t)
        elif isinstance(event, ev.Stopping):
            self.end_early(event.reason)
        elif (
            isinstance(event, (ev.Restarted, ev.CoreRetired, ev.Recycling))
            and self.phase == "measuring"
        ):  # a recycled worker's core pauses while its successor loads the model
            what = {ev.Restarted: "restarted", ev.CoreRetired: "retired"}.get(
                type(event), "recycled"
            )
            self.failures.append(f"core {event.core} {what} ({event.reason})")

    def _rows(self, rows: list) -> None:
        self.log.add_rows(rows)
        # t_start is set once the warm-up begins; rows count only while measuring.
        t_start = self.t_start if self.phase == "measuring" else None
        window_s, counts = self.opts.window_s, self.counts
        for row in rows:
            if row.error is not None:
                self.error_times.append(row.t_done)
                # The first three of the warm-up and the first three measured (the
                # verdict names one of these), whose errors may all come first.
                measured = t_start is not None and row.t_done >= t_start
                if self._kept_errors[measured] < 3:
                    self._kept_errors[measured] += 1
                    self.first_errors.append((row.t_done, row.error))
            elif t_start is not None and row.t_done >= t_start:
                w = int((row.t_done - t_start) / window_s)
                if w >= len(counts):
                    counts.extend([0] * (w + 1 - len(counts)))
                counts[w] += 1

    def _tick(self, now: float) -> None:
        t_start = self.t_start
        if t_start is None:  # before CoresReady: no warm-up yet, nothing to time
            return
        if self.phase == "warmup" and now >= t_start:
            self.cpu_start = self.cpu.snapshot()
            self.readings.append(self.probe())
            self.phase = "measuring"
            self._count_early_rows(t_start)
        if self.phase != "measuring":
            return
        w = self.opts.window_s
        closed = self.closed
        while now >= t_start + (closed + 1) * w + self.grace_s:
            closed += 1
        if closed == self.closed:
            return
        self.readings.append(self.probe())
        self.runnable.append(self.cpu.read_runnable())
        # Judge each newly closed window in turn: a late event may close several at once.
        for n in range(self.closed + 1, closed + 1):
            counts = (self.counts + [0] * n)[:n]
            rates = [c / w for c in counts]
            if should_stop(self.opts, n * w, sum(counts), rates):
                self.closed = n
                self._end(t_start + n * w)
                return
        self.closed = closed

    def _count_early_rows(self, t_start: float) -> None:
        """Rows that completed after t_start but arrived before the measurement began."""
        samples = self.log.freeze()
        late = samples.t_done[samples.t_done >= t_start]
        for t in late:
            w = int((t - t_start) / self.opts.window_s)
            if w >= len(self.counts):
                self.counts.extend([0] * (w + 1 - len(self.counts)))
            self.counts[w] += 1

    def _end(self, t_end: float) -> None:
        self.t_end = t_end
        self.cpu_end = self.cpu.snapshot(memory=True)
        self.phase = "done"
        self.finish()

    # ------------------------------------------------------------------ early ends
    def end_early(self, reason: str) -> None:
        """The run is stopping before the measurement ended: keep the whole windows."""
        if self.phase == "done":
            return
        self.stopped = reason
        if self.phase == "measuring" and self.t_start is not None:  # (measuring: it is set)
            now = self.cpu.clock()
            whole = int(max(0.0, now - self.t_start) / self.opts.window_s)
            self.closed = whole
            self.readings.append(self.probe())
            self._end(self.t_start + whole * self.opts.window_s)
        else:
            self.phase = "done"
            self.finish()
