"""The engine: a small loop that routes events between the pool, the scheduler and the collector.

    source ──admit──► scheduler ──reads──► pool (readers) ──loaded──┐
                          ▲  └──dispatch──► pool (workers) ──done───┤
                          └──────────── release ◄── collector ◄─────┘──► sink, stats, observers

The loop owns time: it passes ``now`` to the scheduler, reads the status board to find hung
children, and notices when it was itself not running (Ctrl-Z, a frozen VM), so children are
not blamed for the gap. The slot life cycle and shutdown order are in the NOTE of slots.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence

from batchinfer.data.dataset import Item
from batchinfer.data.feeds import FROM_COLUMN
from batchinfer.engine import events as ev
from batchinfer.engine.canary import Canary
from batchinfer.engine.collector import Collector
from batchinfer.engine.fd_limit import check_fd_limit
from batchinfer.engine.interface import EnginePlan, EngineResult
from batchinfer.engine.memory import RunMemory
from batchinfer.engine.pool import Child, ChildPool, Exited, Message
from batchinfer.engine.protocol import (
    Attach,
    Done,
    Failed,
    FromReader,
    FromWorker,
    Infer,
    InitFailed,
    Initialised,
    Loaded,
    Read,
    ReaderReady,
    Stop,
    WorkerReady,
)
from batchinfer.engine.reader_scaling import ReaderScaler
from batchinfer.engine.run_loop import EngineLoop, HardStop
from batchinfer.engine.scheduler import (
    CoreLoss,
    ReaderDeathsExceeded,
    Scheduler,
)
from batchinfer.engine.slots import (
    SlotRegion,
    StatusBoard,
    sweep_dead_segments,
)
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.spawn import start_reader, start_worker
from batchinfer.engine.states import ChildState, CoreStatus
from batchinfer.engine.usage import Usage
from batchinfer.engine.watchdog import Watchdog
from batchinfer.errors import NoCoreError, RunFailedError
from batchinfer.messages import Message as Said
from batchinfer.messages import as_message, join, setting
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.rows import RowSink
from batchinfer.sink.stats import CoreStatsRecorder

log = logging.getLogger("batchinfer")

#: The longest the loop waits for events before it checks hangs, restarts and readers.
TICK_S = 0.1
#: How much nicer than the coordinator readers run once the cores are seen well fed.
READER_NICENESS = 10
_CHECK_EVERY_S = 0.05
_JOIN_TIMEOUT_S = 5.0


class Engine(EngineLoop):
    """Runs items from a source through the NPU cores into a sink (see the module docstring)."""

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: RowSink,
        observers: Sequence[ev.Observer] = (),
        stats: CoreStatsRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = TICK_S,
        make_scaler: Callable[[int, int, float], ReaderScaler] = ReaderScaler,
    ) -> None:
        """``tick_s`` and ``make_scaler`` (minimum, maximum readers, start time -> the
        scaler) are the loop's tuning: tests give a scripted scaler, a longer tick."""
        self.plan = plan
        self.source = source
        self.sink = sink
        self.observers = list(observers)
        self.clock = clock
        self.rel = plan.reliability
        readers = plan.readers if source.needs_reader else 0
        self._max_readers = max(readers, plan.max_readers) if source.needs_reader else 0
        self.scheduler = Scheduler(
            plan.slots, plan.cores, plan.instances_per_core, readers, self.rel.max_attempts
        )
        self.stats = stats or CoreStatsRecorder(plan.cores, plan.instances_per_core)
        self.collector = Collector(
            self.scheduler, sink, self.stats, self.notify, plan.topk, clock,
            classify=plan.classifies,
        )  # fmt: skip
        self.pool = ChildPool(clock)
        self.watchdog = Watchdog(self.rel, self._board_rows, self._held_by, tick_s)
        self.canary = Canary()
        self.usage = Usage()
        self.warnings: list[Said] = []
        self._retired_for: dict[int, CoreReason] = {}  # core -> why it was retired
        # Retirements during start-up, said when it is over (_say_held_retirements).
        self._starting = False
        self._held: dict[int, str] = {}
        self.sdk_versions: dict[int, str | None] = {}
        self.stop_reason: str | None = None
        self.hard_stop = False
        self._drain_until = 0.0
        self._next_check = 0.0
        self._items = iter(())  # type: ignore[var-annotated]
        self._exhausted = False
        self._readers_n = readers
        # The manifest columns that feed model inputs (sent with each item to its reader).
        self._columns = tuple(f.column for f in plan.feeds if f.source == FROM_COLUMN)
        # With runtime.readers fixed (or one CPU) the count stays, but the scaler's windows
        # still decide the readers' priority (_yield_to_workers).
        least = 1 if self._max_readers > readers else readers
        self.scaler = make_scaler(least, self._max_readers, clock()) if readers else None
        self._tick_s = tick_s
        self.backend = plan.backend
        self.inputs: SlotRegion | None = None
        self.outputs: SlotRegion | None = None
        self.board: StatusBoard | None = None
        self.memory: RunMemory | None = None

    # ------------------------------------------------------------------ the run
    def run(self) -> EngineResult:
        """Run until the source is exhausted and every item has its row, or a stop."""
        self.backend.sweep()
        sweep_dead_segments()
        self.backend = self.plan.backend.for_run()
        status, error = self._drive()
        return EngineResult(
            status=status,
            error=error,
            counts=dict(self.collector.counts),
            stats=self.stats,
            warnings=self.warnings,
            sdk_versions=self.sdk_versions,
            retired_cores=[
                c for c, s in self.scheduler.cores.items() if s.state == CoreStatus.RETIRED
            ],
            backend=self.backend.describe(),
            collect_s=self.collector.collect_s,
            cpu_s=self.usage.cpu_by_role(),
            detect=dict(self.collector.detect),
            peak_rss_mb=self.usage.peak_rss_mb,
        )

    def _reader_deaths(self, e: ReaderDeathsExceeded) -> RunFailedError:
        return RunFailedError(
            f"reader processes died {self.scheduler.reader_deaths} times without a file "
            f"to blame (last: {e}); the machine may be out of memory: run with fewer "
            + setting("runtime.readers")
            + " or "
            + setting("runtime.slots")
            + ", then resume."
        )

    def _setup(self) -> None:
        plan = self.plan
        check_fd_limit(len(plan.cores) + self._max_readers)  # before any process or segment
        self.pool.open()  # the fork server imports while the segments are made
        self.memory = RunMemory(
            plan.slots,
            plan.input_layout,
            plan.cores,
            plan.instances_per_core,
            self._max_readers,
            geometry=plan.detects,
        )
        self.inputs, self.board = self.memory.inputs, self.memory.board
        for core in self.plan.cores:
            self._start_worker(core)
        for reader in range(self._readers_n):
            self._start_reader(reader)
        self.source.prefill(lambda slot: self.inputs[slot], self.plan.slots)

    def _start_worker(self, core: int) -> Child:
        return start_worker(self.pool, self.plan, self.memory, self.backend, core)

    def _start_reader(self, reader: int) -> Child:
        child = start_reader(
            self.pool, self.plan, self.memory, self.source.kind, reader, self.source.column_base
        )
        if self.source.kind in ("npy", "npz"):
            # Loading a tensor is a copy into its slot, never what the cores wait for: such
            # a reader yields to the core workers from the start.
            self._yield(child)
        return child

    def _start(self) -> None:
        """Open the source and let items flow while the core workers start; return once
        every core worker is ready or retired, with the canaries compared (or once every
        item has its row).

        Readers decode from the first moment and each core is sent items as soon as it is
        ready (the scheduler dispatches to ready cores only), so a slow-starting core costs
        the others nothing and the first rows come when the first core is up (unless the
        plan says ``cores_start_together``). The statistics' clock starts at the first
        dispatch, the run's CPU accounting here.
        """
        self.usage.started()
        self._items = iter(self.source)
        self.notify(
            ev.Started(
                self.source.total,
                self.plan.cores,
                self.backend.name,
                self.plan.instances_per_core,
                self.clock(),
            )
        )
        first = {c.key: c for c in self.pool.live("worker")}
        self._starting = True
        try:
            while starting := any(c.state == ChildState.STARTING for c in first.values()):
                if self._exhausted and not self.scheduler.busy():
                    break  # every item has its row: a core still starting is not waited for
                self._check_some_core_alive()
                if self.stop_reason is not None:
                    break
                if not self.plan.cores_start_together:
                    self._admit()
                    self._send_work()
                self._turn()
        finally:
            self._starting = False
        if self.stop_reason is None:
            self._check_some_core_alive()
        self._say_held_retirements()
        if self.stop_reason is not None:
            return
        for message in self.canary.settle():  # the cores that did items, at least
            self.warn(message)
        if not starting:
            self.notify(ev.CoresReady(self.clock()))

    def _check_some_core_alive(self) -> None:
        if not self.scheduler.alive_cores():
            # The error says the retirements held back during start-up (each is in the
            # manifest's warnings too): cores that failed alike are said once, here.
            self._held.clear()
            raise NoCoreError("no NPU core could be started: " + self._why_no_core())

    def _why_no_core(self) -> str:
        # Cores that all failed the same way (a model the runtime refuses, a missing driver)
        # are said once, without the advice to leave one core out, which cannot help.
        retired = self._retired_for
        if len(retired) > 1 and len(self.plan.cores) == len(retired):
            groups = _alike(retired)
            if len(groups) == 1:
                ((reason, cores),) = groups.items()
                return _for_cores(reason, cores, advice=False)
        return join("; ", self.warnings) or "every worker exited during start-up"

    def _say_held_retirements(self) -> None:
        """Say the cores retired while the others started, once for cores that failed
        alike ("cores 0, 2 retired: ..."), now that it is known some core is up."""
        held, self._held = self._held, {}
        for reason, cores in _alike(held).items():
            if len(cores) == 1:
                message = f"core {cores[0]} retired: " + reason.said(cores)
            else:
                every = ", ".join(map(str, cores))
                message = f"cores {every} retired: " + _for_cores(reason, cores, advice=True)
            self.notify(ev.Warned(message))  # in self.warnings, one per core

    def _turn(self) -> None:
        """One turn: wait for events, handle them, write rows, check hangs and restarts."""
        starved = self.scaler is not None and self._starved()  # while we wait, below
        for event in self.pool.poll(self.collector.wait_s(self.clock(), self._tick_s)):
            if isinstance(event, Message):
                self._on_message(event.child, event.body)
            else:
                self._on_exit(event)
        if self.hard_stop:
            self.collector.flush()
            raise HardStop
        now = self.clock()
        self.collector.flush_due(now)
        if self.scaler is not None and not self._exhausted:
            self.scaler.observe(now, starved)
        if now < self._next_check:
            return
        # Hangs and restarts are checked a few times a second, not on every turn: at
        # thousands of items a second a turn comes every millisecond.
        self._next_check = now + _CHECK_EVERY_S
        live = self.pool.live()
        self.usage.sample(now)
        if self.watchdog.tick(now, live):
            self._drain_until = max(self._drain_until, now + self.rel.drain_timeout_s)
        for child, reason in self.watchdog.hung(now, live, self.board.snapshot()):
            self.pool.kill(child, reason)
        for core in self.scheduler.restarts_due(now):
            self._start_worker(core)
        if self.scaler is not None and not self.scheduler.stopping:
            self._scale_readers(now)

    def _starved(self) -> bool:
        """A runtime instance has nothing to infer and no item is READY: the cores wait for
        the readers. (Not "a core has room": a core is refilled long before it runs dry, so
        with room to spare and its instances busy it waits for nothing; counted that way,
        8x8 PNGs that one reader decodes far faster than the cores consume looked starved
        10-18 % of the time.)"""
        s, k = self.scheduler, self.plan.instances_per_core
        return not s.ready and any(
            c.state == CoreStatus.READY and len(c.inflight) < k for c in s.cores.values()
        )

    def _scale_readers(self, now: float) -> None:
        """Grow or shrink the readers from what the run measures (reader_scaling.py).

        Starvation is observed in ``_turn``, every turn: the state before a turn's events,
        held for the time the turn waited for them.
        """
        s = self.scheduler
        for reader in list(s.closing):
            child = self._child("reader", reader)
            if child is not None and not s.held_by_reader(reader) and not child.killed_for:
                child.killed_for = "stopped: fewer readers are enough"
                self.pool.send(child, Stop())
        open_readers = s.open_readers()
        change = self.scaler.decide(now, len(open_readers), self.usage.idle_cpus)
        if change > 0:
            # A stopped reader's number (and board row) is used again; else a new one, up
            # to the rows the board has.
            free = [r for r in sorted(s.closing) if self._child("reader", r) is None]
            if free or len(s.unsent) < self._max_readers:
                reader = free[0] if free else s.add_reader()
                s.closing.discard(reader)
                self._start_reader(reader)
                log.info("reader %d started: decoding was the bottleneck", reader)
        elif change < 0 and len(open_readers) > 1:
            s.close_reader(open_readers[-1])
        if self.scaler.fed:
            self._yield_to_workers()

    def _yield_to_workers(self) -> None:
        """Lower the readers' priority now that the cores are seen well fed
        (reader_scaling.py says why and when)."""
        for child in self.pool.live("reader"):
            self._yield(child)

    def _yield(self, reader: Child) -> None:
        """Lower a reader's priority below the coordinator's (once: it cannot be raised)."""
        if reader.yielding:
            return
        reader.yielding = True
        self._lower(reader.proc.pid)  # None: not forked yet; lowered when it is ready

    @staticmethod
    def _lower(pid: int | None) -> None:
        if pid is not None:
            lower = min(19, os.getpriority(os.PRIO_PROCESS, 0) + READER_NICENESS)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, lower)

    def _finished(self) -> bool:
        if super()._finished():
            self.collector.flush()  # rows still waiting for a batch (a stop came meanwhile)
            return True
        return False

    def _admit(self) -> None:
        now = self.clock()
        while self.scheduler.can_admit() and not self._exhausted:
            item = next(self._items, None)
            if item is None:
                self._exhausted = True
                return
            slot = self.scheduler.admit(item, now, self.source.needs_reader)
            if not self.source.needs_reader:
                self.source.fill(item, self.inputs[slot])

    def _send_work(self) -> None:
        now = self.clock()
        for reader, slots in self.scheduler.take_reads().items():
            child = self._child("reader", reader)
            if child is None:
                continue  # being restarted: reader_lost has re-queued its slots already
            if not self.scheduler.held_by_reader(reader) - len(slots):
                child.last_progress = now  # it was idle: its clock starts now
            items = [self.scheduler.flight(s).item for s in slots]
            tasks = [
                (s, it.index, it.path, it.id, it.member, self._column_values(it))
                for s, it in zip(slots, items, strict=True)
            ]
            self.pool.send(child, Read(tasks))
        for core, slots in self.scheduler.dispatch(now).items():
            child = self._child("worker", core)
            if len(self.scheduler.cores[core].inflight) == len(slots):
                child.last_progress = now
            self.stats.mark_dispatch(now)
            tasks = [(s, self.scheduler.flight(s).item.index) for s in slots]
            self.pool.send(child, Infer(tasks))
            self.notify(ev.Dispatched(core, len(slots), now))

    def _column_values(self, item: Item) -> tuple | None:
        """The item's values of the columns that feed model inputs (engine.feeds), in feed
        order; None when no input is fed from a column. Missing ones are None: the reader
        makes them the item's error row."""
        if not self._columns:
            return None
        columns = item.columns or {}
        return tuple(columns.get(column) for column in self._columns)

    def _child(self, kind: str, key: int) -> Child | None:
        for child in reversed(self.pool.children):  # the newest incarnation first
            if child.key == key and child.kind == kind and child.state != ChildState.GONE:
                return child
        return None

    # ------------------------------------------------------------------ messages
    def _on_message(self, child: Child, msg: FromReader | FromWorker) -> None:
        now = self.clock()
        child.last_progress = now
        match msg:
            case Loaded(items, cpu_s):
                child.cpu_s = cpu_s
                if self.scaler is not None:
                    self.scaler.decoded(sum(m[2] for m in items) / 1e3)
                for slot, _index, read_ms, error in items:
                    finished = self.scheduler.loaded(slot, read_ms, error, now)
                    if finished is not None:
                        self.collector.error(finished)
            case Done(results, busy_s, cpu_s):
                for slot, _index, instance, t0, t1, error, *boxes in results:
                    finished = self.scheduler.done(child.key, slot, error)
                    if finished is None:
                        continue
                    if finished.error is None:
                        self.collector.success(slot, child.key, instance, t0, t1, *boxes)
                    else:
                        self.collector.error(finished)
                child.busy_s, child.cpu_s = busy_s, cpu_s
                self.stats.set_busy(child.key, busy_s)
            case ReaderReady() | WorkerReady():
                child.state, child.deadline = ChildState.READY, None
                child.cpu_s = child.cpu_at_ready = msg.cpu_s
                if child.yielding:
                    self._lower(msg.pid)  # it was to yield before its pid was known
                self.notify(ev.ChildReady(child.kind, child.key, msg.pid))
                if isinstance(msg, WorkerReady):
                    self._on_worker_ready(child, msg)
            case Initialised():
                child.phase = (
                    f"the canary inference took longer than {self.rel.inference_timeout_s:g} s "
                    "(the inference timeout)"
                )
                child.deadline = now + self.rel.inference_timeout_s
            case InitFailed(reason):
                self.scheduler.core_retired(child.key)
                self._retire(child.key, reason)
            case Failed(text):
                self._on_failed(child, text)

    def _on_worker_ready(self, child: Child, info: WorkerReady) -> None:
        self.sdk_versions[child.key] = info.sdk_version
        if self.outputs is None:
            shapes = [(tuple(s), "float32") for s, _ in info.outputs]
            # A detection run's workers send boxes, not outputs: no output slots to fill
            # unless the rows store the raw outputs too.
            keep = not self.plan.detects or self.plan.save_outputs
            self.outputs = self.memory.create_outputs(shapes if keep else [])
            self.collector.outputs = self.outputs
            self.sink.open(shapes)
        self.pool.send(child, Attach(self.outputs.spec))
        self.scheduler.core_ready(child.key)
        if self.rel.canary:
            for message in self.canary.add(child.key, info.canary):
                self.warn(message)

    def _on_failed(self, child: Child, text: str) -> None:
        """A start-up exception with its traceback: shown once, then the child exits."""
        last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        if not any(text in w for w in self.warnings):
            log.debug("%s failed to start:\n%s", child.name, text)
        child.killed_for = f"failed to start ({last})"
        if child.kind == "worker":
            self.scheduler.core_retired(child.key)
            self._retire(child.key, CoreReason.of(f"its worker failed to start:\n{text.rstrip()}"))

    def _retire(self, core: int, reason: CoreReason) -> None:
        self._retired_for[core] = reason
        message = f"core {core} retired: " + reason.said([core])
        if self._starting:
            # Recorded now, said when start-up is over: if every core fails alike, the run's
            # error says it once instead of a line per core before it.
            self.warnings.append(as_message(message))
            self._held[core] = reason
        else:
            self.warn(message)
        self.notify(ev.CoreRetired(core, reason.said([core])))

    # ------------------------------------------------------------------ deaths
    def _on_exit(self, event: Exited) -> None:
        child = event.child
        self.usage.child_gone(child)
        died = "died" if child.kind == "reader" else "worker process crashed"
        code = "unknown" if event.exitcode is None else event.exitcode  # its server is gone
        what = child.killed_for or f"{died} (exit code {code})"
        rows = self._board_rows(child)
        working = [(int(i), t) for i, t in self.board.snapshot()[rows] if t > 0]
        self.board.rows[rows] = 0.0
        if child.kind == "reader":
            self._on_reader_exit(child, working, what)
        else:
            self._on_worker_exit(child, {i for i, _ in working}, what, child.hung_items)

    def _board_rows(self, child: Child) -> slice:
        if child.kind == "worker":
            return self.memory.worker_rows(child.key)
        row = self.memory.reader_row(child.key)
        return slice(row, row + 1)

    def _held_by(self, child: Child) -> int:
        if child.kind == "worker":
            return len(self.scheduler.cores[child.key].inflight)
        return len(self.scheduler.reading[child.key])  # sent to it (unsent ones wait here)

    def _on_reader_exit(self, child: Child, working: list, what: str) -> None:
        if child.key in self.scheduler.closing and not self.scheduler.held_by_reader(child.key):
            return  # stopped because fewer readers are enough: nothing to redo
        culprit = None
        if working:
            index = working[0][0]
            for slot in self.scheduler.reading[child.key]:
                if self.scheduler.flight(slot).item.index == index:
                    culprit = slot
                    what += f" while decoding {self.scheduler.flight(slot).item.id}"
        for finished in self.scheduler.reader_lost(child.key, culprit, what):
            self.collector.error(finished)
        if not self.scheduler.stopping:
            self._start_reader(child.key)
            self.warn(f"reader {child.key} {what}; started a new one.")

    def _on_worker_exit(
        self, child: Child, working: set[int], what: str, culprits: set[int] | None
    ) -> None:
        if self.scheduler.cores[child.key].state == CoreStatus.RETIRED:
            return  # InitFailed or Failed already said why
        self.stats.add_busy(child.key, child.busy_s)  # carried over from this incarnation
        self.stats.set_busy(child.key, 0.0)
        loss: CoreLoss = self.scheduler.core_lost(child.key, working, what, self.clock(), culprits)
        for finished in loss.finished:
            self.collector.error(finished)
        if self.scheduler.stopping:
            # Stopping: nothing is restarted, and the items it held are left for a resume.
            self.warn(f"core {child.key}: {what} while the run was stopping; not restarted.")
            return
        self.stats.add_restart(child.key)
        if loss.restart_at is None:
            self.warn(
                f"core {child.key} retired after {self.scheduler.cores[child.key].crashes_in_row} "
                f"crashes in a row (last: {what}); the run goes on with the other cores."
            )
            self.notify(ev.CoreRetired(child.key, what))
        else:
            delay = loss.restart_at - self.clock()
            blame = " (blamed on the item, not the core)" if loss.blamed_items else ""
            self.warn(f"core {child.key}: {what}{blame}; restarting it in {delay:.2g} s.")
            self.notify(ev.Restarted(child.key, what, delay))

    # ------------------------------------------------------------------ shutdown
    def _close(self) -> None:
        """Shutdown steps 3-4 of the NOTE in slots.py; the sink is closed by the caller."""
        for child in self.pool.live():
            self.usage.child_gone(child)  # its last report: stopped children send no more
        self.pool.close(self.hard_stop, _JOIN_TIMEOUT_S)
        self.usage.add_startup(self.pool.server_cpu_s)
        if self.memory is not None:
            self.memory.close()
        self.backend.end_run()


def _alike(reasons: dict[int, CoreReason]) -> dict[CoreReason, list[int]]:
    """Cores grouped by reason: a reason names its core by a mark, so cores that failed
    alike have equal reasons."""
    groups: dict[CoreReason, list[int]] = {}
    for core in sorted(reasons):
        groups.setdefault(reasons[core], []).append(core)
    return groups


def _for_cores(reason: CoreReason, cores: list[int], *, advice: bool) -> Said:
    """A reason from :func:`_alike` said of ``cores``: with ``advice``, to leave them out
    where the reason advised it (not when every core failed: it cannot help then)."""
    text = reason.said(cores, advice=advice)
    if reason.names_core:
        return text
    every = f"core {cores[0]}" if len(cores) == 1 else f"cores {', '.join(map(str, cores))}"
    return f"{every}: " + text
