"""The engine: one loop that routes events between a worker pool, the scheduler and the
collector, whatever runs the items (this board's processes, a Ray cluster's actors).

    source ──admit──► scheduler ──reads──► pool (readers) ──ItemsRead──┐
                          ▲  └──dispatch──► pool (workers) ──ItemsDone──┤
                          └──────────── release ◄── collector ◄─────────┘──► sink, stats,
                                                                          observers

The pool (pools.py: the interface and its protocol; board/pool.py, cluster/pool.py) carries out
and reports; everything that is policy is here or in the scheduler, once: admission, which
worker gets an item, retries and error rows, start-up (items flow while workers start;
retirements during start-up said once for cores that failed alike), restarts after a
back-off, retirement texts, recycling workers that grow (recycling.py), stopping (a first
request drains, a second stops at once), and the result. The loop owns time: it passes
``now`` to the scheduler and the pool, and notices when it was itself not running (Ctrl-Z,
a frozen VM), so workers are not blamed for the gap. The slot life cycle and shutdown
order are in the NOTE of slots.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from batchinfer.data.dataset import Item
from batchinfer.engine import events as ev
from batchinfer.engine.board.pool import BoardPool
from batchinfer.engine.canary import Canary
from batchinfer.engine.collector import Collector, nonfinite_warning
from batchinfer.engine.core_life import CoreLoss
from batchinfer.engine.core_texts import (
    alike,
    cores_of,
    held_text,
    label,
    no_core_text,
    nodes_of,
    nodes_text,
    place_text,
    reader_deaths,
    worker_text,
)
from batchinfer.engine.planning.interface import EnginePlan, EngineResult
from batchinfer.engine.plumbing.fd_limit import too_many_files
from batchinfer.engine.pools import (
    ItemResult,
    ItemsDone,
    ItemsRead,
    PoolEvent,
    ReaderAdded,
    ReaderClosing,
    ReaderLost,
    ReaderUp,
    Said,
    WorkerLost,
    WorkerMemory,
    WorkerPool,
    WorkerRetired,
    WorkerUp,
)
from batchinfer.engine.recycling import Recycler
from batchinfer.engine.run_view import RunView
from batchinfer.engine.scheduler import ReaderDeathsExceeded, Scheduler
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.states import CoreStatus
from batchinfer.errors import BatchinferError, NoCoreError, RunFailedError
from batchinfer.messages import Message, as_message
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.rows import RowSink
from batchinfer.sink.stats import CoreKey, CoreStatsRecorder

#: The longest the loop waits for events before it checks hangs, restarts and readers.
TICK_S = 0.1
#: A gap between two turns of the loop longer than this (plus the tick) means the loop was
#: not running (Ctrl-Z, a frozen VM): that time is not held against workers.
SUSPENDED_S = 1.0


class HardStop(Exception):
    """A second stop request: stop at once."""


class Engine:
    """Runs items from a source through a worker pool into a sink (module docstring).

    ``pool``: what runs the items; None: this board's processes (:class:`BoardPool`).
    ``tick_s``: the longest wait for events; tests give a scripted pool and clock.
    """

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: RowSink,
        observers: Sequence[ev.Observer] = (),
        stats: CoreStatsRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = TICK_S,
        pool: WorkerPool | None = None,
    ) -> None:
        self.plan = plan
        self.source = source
        self.sink = sink
        self.observers = list(observers)
        self.clock = clock
        self.rel = plan.reliability
        self.pool: WorkerPool = pool if pool is not None else BoardPool(plan, source, clock=clock)
        layout = self.pool.layout
        self.scheduler = Scheduler(
            layout.slots,
            layout.keys,
            layout.instances,
            layout.readers,
            self.rel.max_attempts,
            physical=layout.physical,
            name=lambda key: place_text(self.pool.where(key)),
            capacity=layout.capacity,
        )
        self.view = RunView(self.scheduler)  # what the pool may read of the run
        self.stats = stats or CoreStatsRecorder(layout.places, plan.instances_per_core)

        def place(key: int) -> tuple[str | None, int]:
            where = self.pool.where(key)
            return where.node, where.core

        self.collector = Collector(
            self.scheduler, sink, self.stats, self.notify, plan.topk, clock,
            place=place, task=plan.task,
        )  # fmt: skip
        # The canary is compared per place (a core of a node), named as the texts name it.
        self._places: list[CoreKey] = list(layout.places)
        names = {layout.place(k): place_text(self.pool.where(k)) for k in layout.keys}
        self.canary = Canary(name=lambda i: names[self._places[i]])
        self._tick_s = tick_s
        # Workers that grow are replaced between items (recycling.py: when, and how).
        self.recycler = Recycler(
            self.rel, self.scheduler, self.pool, self.stats, self.warn, self.notify, self._name
        )
        self.warnings: list[Message] = []
        self.sdk_versions: dict[int | str, str | None] = {}
        self.stop_reason: str | None = None
        self.hard_stop = False
        self._drain_until = 0.0
        self._last_turn = 0.0
        self._items: Iterator[Item] = iter(())
        self._exhausted = False
        self._opened = False  # the sink, by the first worker that came up
        self._retired_for: dict[int, CoreReason] = {}  # key -> why it was retired
        # Start-up: keys that have not yet come up or failed; retirements meanwhile are
        # said when it is over (_say_held_retirements), once for keys that failed alike.
        self._first: set[int] = set()
        self._starting = False
        self._held: dict[int, CoreReason] = {}

    # ------------------------------------------------------------------ observers
    def notify(self, event: object) -> None:
        for observer in self.observers:
            observer.notify(event)

    def warn(self, message: str) -> None:
        # Kept and sent with its settings as references (batchinfer.messages): a front end
        # renders them, and whatever writes a warning unrendered writes field names.
        said = as_message(message)
        self.warnings.append(said)
        self.notify(ev.Warned(said))

    def request_stop(self, reason: str) -> None:
        """Stop gracefully (items in flight finish); a second call stops at once.

        Safe in a signal handler: it only sets flags the loop acts on between events.
        """
        if self.stop_reason is not None:
            self.hard_stop = True
            return
        self.stop_reason = reason

    # ------------------------------------------------------------------ the run
    def run(self) -> EngineResult:
        """Run until the source is exhausted and every item has its row, or a stop."""
        status = "complete"
        error: BatchinferError | None = None
        try:
            self.pool.setup(self.stats, self.clock())
            self._start()
            self._loop()
            status = "interrupted" if self.stop_reason else "complete"
        except HardStop:
            status = "interrupted"
        except ReaderDeathsExceeded as e:
            status, error = "failed", reader_deaths(self.scheduler.reader_deaths, e)
        except BatchinferError as e:
            status, error = "failed", e
        except OSError as e:  # out of file descriptors: one sentence, not a traceback
            error = too_many_files(e)
            if error is None:
                raise
            status = "failed"
        finally:
            self.pool.close(self.hard_stop)
        nonfinite = nonfinite_warning(self.collector.detect)
        if nonfinite is not None:  # said by every front end: run, bench, eval, infer
            self.warn(nonfinite)
        report = self.pool.report()
        return EngineResult(
            status=status,
            error=error,
            counts=dict(self.collector.counts),
            stats=self.stats,
            warnings=self.warnings,
            sdk_versions=self.sdk_versions,  # type: ignore[arg-type]
            retired_cores=self._retired_places(),  # type: ignore[arg-type]
            backend=report.backend,
            collect_s=self.collector.collect_s,
            cpu_s=report.cpu_s,
            detect=dict(self.collector.detect),
            peak_rss_mb=report.peak_rss_mb,
        )

    def _retired_places(self) -> list[int | str]:
        """The places (cores; cores of nodes) every key of which was retired."""
        keys: dict[CoreKey, list[int]] = {}
        for key in self.pool.layout.keys:
            keys.setdefault(self.pool.layout.place(key), []).append(key)
        out: list[int | str] = []
        for place in self._places:
            if all(self.scheduler.cores[k].state == CoreStatus.RETIRED for k in keys[place]):
                out.append(label(self.pool.where(keys[place][0])))
        return out

    # ------------------------------------------------------------------ start-up
    def _start(self) -> None:
        """Open the source and let items flow while the workers start; return once every
        worker is up or retired, with the canaries compared (or once every item has its
        row).

        Readers read from the first moment and each worker is sent items as soon as it is
        up (the scheduler dispatches to ready keys only), so a slow-starting core costs the
        others nothing and the first rows come when the first core is up (unless the plan
        says ``cores_start_together``). The statistics' clock starts at the first dispatch.
        """
        self._items = iter(self.source)
        alive = sorted({self.pool.where(k).core for k in self.scheduler.alive_cores()})
        self.notify(
            ev.Started(
                self.source.total,
                tuple(alive),
                self.plan.backend.name,
                self.plan.instances_per_core,
                self.clock(),
                nodes=self.pool.nodes,
            )
        )
        self._first = set(self.scheduler.alive_cores())
        self._starting = True
        try:
            while self._first:
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
        if not self._first:
            self.notify(ev.CoresReady(self.clock()))

    def _check_some_core_alive(self) -> None:
        if not self.scheduler.alive_cores():
            # The error says the retirements held back during start-up (each is in the
            # result's warnings too): cores that failed alike are said once, here.
            self._held.clear()
            nodes = nodes_of(self.pool.where, self.pool.layout.keys)  # on a cluster: tried
            where = f" on {nodes_text(nodes)}" if nodes else ""
            why = no_core_text(
                self._retired_for, len(self.pool.layout.keys), self.pool.where, self.warnings
            )
            raise NoCoreError(f"no NPU core could be started{where}: " + why)

    def _say_held_retirements(self) -> None:
        """Say the cores retired while the others started, once for cores that failed
        alike ("cores 0, 2 retired: ..."), now that it is known some core is up."""
        held, self._held = self._held, {}
        for reason, keys in alike(held).items():
            cores = cores_of(self.pool.where, keys)
            if len(keys) == 1:
                message = f"{self._name(keys[0])} retired: " + reason.said(cores)
            else:  # on a cluster, keys of one core number are that core of several nodes
                message = held_text(reason, cores, nodes_of(self.pool.where, keys))
            self.notify(ev.Warned(message))  # in self.warnings, one per core

    def _name(self, key: int) -> str:
        return worker_text(self.pool.where(key))

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            if self.stop_reason is not None and not self.scheduler.stopping:
                self.scheduler.stop()
                self.pool.stopping()
                self._drain_until = self.clock() + self.rel.drain_timeout_s
                self.notify(ev.Stopping(self.stop_reason))
                self.warn(
                    f"{self.stop_reason}: finishing the items in flight (at most "
                    f"{self.rel.drain_timeout_s:g} s); press Ctrl-C again to stop at once."
                )
            if not self.scheduler.stopping:
                self._admit()
                self._send_work()
            if self._finished():
                self.collector.flush()  # rows still waiting for a batch (a stop came meanwhile)
                return
            self._turn()
            if not self.scheduler.alive_cores():
                raise RunFailedError(
                    "every NPU core was retired after repeated failures"
                    + (" or because its node left" if self.pool.nodes else "")
                    + ", so the run cannot go on; see the warnings above, then resume the run."
                )

    def _finished(self) -> bool:
        if self.scheduler.stopping:
            return not self.scheduler.in_flight() or self.clock() > self._drain_until
        return self._exhausted and not self.scheduler.busy()

    def _admit(self) -> None:
        now = self.clock()
        needs_reader = self.source.needs_reader
        while self.scheduler.can_admit() and not self._exhausted:
            item = next(self._items, None)
            if item is None:
                self._exhausted = True
                return
            slot = self.scheduler.admit(item, now, needs_reader)
            if not needs_reader:
                self.pool.fill(slot, item)

    def _send_work(self) -> None:
        now = self.clock()
        flight = self.scheduler.flight
        # The pool is given each slot's item: it never looks in the scheduler for them.
        for reader, slots in self.scheduler.take_reads().items():
            self.pool.send_reads(reader, [(slot, flight(slot).item) for slot in slots], now)
        for key, slots in self.scheduler.dispatch(now).items():
            self.stats.mark_dispatch(now)
            self.pool.send_work(key, [(slot, flight(slot).item) for slot in slots], now)
            where = self.pool.where(key)
            self.notify(ev.Dispatched(where.core, len(slots), now, node=where.node))

    def _turn(self) -> None:
        """One turn: wait for events, handle them, write rows, check hangs and restarts."""
        for event in self.pool.wait(self.collector.wait_s(self.clock(), self._tick_s), self.view):
            self._on_event(event)
        if self.hard_stop:
            self.collector.flush()
            raise HardStop
        now = self.clock()
        self.collector.flush_due(now)
        gap = now - self._last_turn if self._last_turn else 0.0
        self._last_turn = now
        if gap >= SUSPENDED_S + self._tick_s:
            self.pool.shift(gap)
            self._drain_until = max(self._drain_until, now + self.rel.drain_timeout_s)
        stopping = self.scheduler.stopping
        for event in self.pool.check(now, self.view, stopping=stopping, exhausted=self._exhausted):
            self._on_event(event)
        for key in self.scheduler.life.restarts_due(now):
            self.pool.start_worker(key, now)
        self.recycler.due(now)

    # ------------------------------------------------------------------ events
    def _on_event(self, event: PoolEvent) -> None:
        match event:
            case ItemsDone(key, results):
                self._on_done(key, results)
            case ItemsRead() | ReaderUp() | ReaderLost() | ReaderAdded() | ReaderClosing():
                self._on_reader(event)
            case WorkerUp():
                self._on_worker_up(event)
            case WorkerRetired(key, reason, quiet):
                self._retire(key, reason, quiet)
            case WorkerLost():
                self._on_worker_lost(event)
            case WorkerMemory(key, rss_mb):
                self.recycler.memory(key, rss_mb)
            case Said(message):
                self.warn(message)

    def _on_reader(self, event: PoolEvent) -> None:
        s = self.scheduler
        match event:
            case ItemsRead(_reader, items):
                now = self.clock()
                for slot, read_ms, error in items:
                    finished = s.loaded(slot, read_ms, error, now)
                    if finished is not None:
                        self.collector.error(finished)
            case ReaderUp(reader, pid):
                self.notify(ev.ChildReady("reader", reader, pid))
            case ReaderLost(reader, what, culprit):
                for finished in s.reader_lost(reader, culprit, what):
                    self.collector.error(finished)
                if not s.stopping:
                    self.pool.restart_reader(reader)
                    self.warn(f"reader {reader} {what}; started a new one.")
            case ReaderAdded(reader):  # the pool's reader scaling: the scheduler follows
                s.open_reader(reader)
            case ReaderClosing(reader):
                s.close_reader(reader)

    def _on_done(self, key: int, results: list[ItemResult]) -> None:
        self.recycler.done(key, len(results))
        for r in results:
            finished = self.scheduler.done(key, r.slot, r.error)
            if finished is None:
                continue
            if finished.error is None:
                self.collector.success(r.slot, key, r.instance, r.t0, r.t1, r.decoded)
            else:
                self.collector.error(finished)

    def _on_worker_up(self, up: WorkerUp) -> None:
        key, where = up.key, self.pool.where(up.key)
        self._first.discard(key)
        self.recycler.up(key)
        if up.rss_mb is not None:  # its size before any item: "from the start" is this
            self.recycler.memory(key, up.rss_mb)
        self.sdk_versions[label(where)] = up.sdk_version
        if not self._opened:
            self._opened = True
            self.sink.open(up.outputs)
            self.collector.outputs = self.pool.outputs
        self.scheduler.life.core_ready(key)
        kind = "worker" if where.node is None else "actor"
        self.notify(ev.ChildReady(kind, where.core, up.pid, node=where.node))
        if self.rel.canary and up.canary is not None:
            place = self._places.index(self.pool.layout.place(key))
            for message in self.canary.add(place, up.canary):
                self.warn(message)

    def _retire(self, key: int, reason: CoreReason, quiet: bool = False) -> None:
        """``key`` will not come back (it failed to start, its node left)."""
        self._first.discard(key)
        if self.scheduler.cores[key].state == CoreStatus.RETIRED:
            return
        self.scheduler.life.core_retired(key)
        self.pool.retire(key)
        self._retired_for[key] = reason
        where = self.pool.where(key)
        said = reason.said([where.core])
        if not quiet:
            message = f"{self._name(key)} retired: " + said
            if self._starting:
                # Recorded now, said when start-up is over: if every core fails alike, the
                # run's error says it once instead of a line per core before it.
                self.warnings.append(as_message(message))
                self._held[key] = reason
            else:
                self.warn(message)
        self.notify(ev.CoreRetired(where.core, said, node=where.node))

    def _on_worker_lost(self, lost: WorkerLost) -> None:
        key, what = lost.key, lost.what
        self._first.discard(key)
        if self.scheduler.cores[key].state == CoreStatus.RETIRED:
            return  # WorkerRetired said why already
        culprits = set(lost.culprits) if lost.culprits is not None else None
        loss: CoreLoss = self.scheduler.life.core_lost(
            key, set(lost.working), what, self.clock(), culprits
        )
        for finished in loss.finished:
            self.collector.error(finished)
        name, where = self._name(key), self.pool.where(key)
        if self.scheduler.stopping:
            # Stopping: nothing is restarted, and the items it held are left for a resume.
            self.warn(f"{name}: {what} while the run was stopping; not restarted.")
            return
        self.stats.add_restart(self.pool.layout.place(key))
        if loss.restart_at is None:
            self.pool.retire(key)
            self.warn(
                f"{name} retired after {self.scheduler.cores[key].crashes_in_row} crashes in "
                f"a row (last: {what}); the run goes on with the other cores."
            )
            self.notify(ev.CoreRetired(where.core, what, node=where.node))
        else:
            delay = loss.restart_at - self.clock()
            blame = " (blamed on the item, not the core)" if loss.blamed_items else ""
            self.warn(f"{name}: {what}{blame}; restarting it in {delay:.2g} s.")
            self.notify(ev.Restarted(where.core, what, delay, node=where.node))
