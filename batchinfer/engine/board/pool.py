"""The board's worker pool: one core-worker process per NPU core, reader processes, and
the run's shared memory (input and output slots, the status board).

It implements :class:`batchinfer.engine.pools.WorkerPool` for the engine loop (loop.py):
the loop decides, this pool carries out and reports. It owns its children's state
(plumbing/children.py's :class:`Child`: pipes, deadlines, progress, CPU) and translates
their messages (protocol.py; what each child does is in reader.py and worker.py) into the
pool events the loop handles. The slot life cycle and shutdown order are in the NOTE of slots.py.

What only a board has lives here too:
- hangs are read from the status board (watchdog.py: which instance hung, since when);
- readers grow and shrink with demand and yield to the core workers once those are seen
  well fed (reader_scaling.py), judged from what the run measures and the loop's
  RunState; a reader started or to close is told to the loop (ReaderAdded,
  ReaderClosing), which tells the scheduler;
- CPU and memory of every child are accounted by role (plumbing/usage.py), and each ready
  core worker's own memory is reported to the loop (WorkerMemory, every RSS_EVERY_S), which
  decides when one is recycled (recycling.py). A recycled worker is asked to stop; its new
  incarnation starts once it has exited (never two on one core: they share its rows of
  the status board), or once the watchdog killed it for not stopping in time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence

from batchinfer.data.dataset import Item
from batchinfer.data.feeds import FROM_COLUMN
from batchinfer.engine.board.spawn import start_reader, start_worker
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.plumbing.children import Child, ChildPool, Exited, Message
from batchinfer.engine.plumbing.fd_limit import check_fd_limit
from batchinfer.engine.plumbing.memory import RunMemory
from batchinfer.engine.plumbing.usage import Usage
from batchinfer.engine.pools import (
    ItemRead,
    ItemResult,
    ItemsDone,
    ItemsRead,
    Layout,
    PoolEvent,
    PoolReport,
    ReaderAdded,
    ReaderClosing,
    ReaderLost,
    ReaderUp,
    RunState,
    Said,
    SetUp,
    Where,
    WorkerLost,
    WorkerMemory,
    WorkerRetired,
    WorkerUp,
)
from batchinfer.engine.protocol import (
    Attach,
    Done,
    Failed,
    Infer,
    InferTask,
    InitFailed,
    Initialised,
    Loaded,
    Read,
    ReaderReady,
    ReadTask,
    Stop,
    WorkerReady,
)
from batchinfer.engine.reader_scaling import ReaderScaler
from batchinfer.engine.slots import SlotRegion, StatusBoard, sweep_dead_segments
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.states import ChildState
from batchinfer.engine.watchdog import Watchdog
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.stats import CoreStatsRecorder

log = logging.getLogger("batchinfer")

#: How much nicer than the coordinator readers run once the cores are seen well fed.
READER_NICENESS = 10
#: Hangs, restarts and readers are checked this often, not on every turn of the loop: at
#: thousands of items a second a turn comes every millisecond.
CHECK_EVERY_S = 0.05
#: How often each core worker's memory is read (WorkerMemory, for recycling.py's policy).
RSS_EVERY_S = 0.25
_JOIN_TIMEOUT_S = 5.0


class BoardPool:
    """Child processes and shared memory of a run on this board (see the module docstring).

    ``make_scaler`` (fewest, most readers, start time -> the scaler) is the readers'
    tuning: tests give a scripted one.
    """

    memory = SetUp[RunMemory]()
    inputs = SetUp[SlotRegion]()
    board = SetUp[StatusBoard]()
    stats = SetUp[CoreStatsRecorder]()

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        make_scaler: Callable[[int, int, float], ReaderScaler] = ReaderScaler,
    ) -> None:
        self.plan = plan
        self.source = source
        self.clock = clock
        self.rel = plan.reliability
        readers = plan.readers if source.needs_reader else 0
        self._max_readers = max(readers, plan.max_readers) if source.needs_reader else 0
        self.layout = Layout(
            keys=tuple(plan.cores),
            instances=plan.item_lanes,  # a batch-N model's instances take N items each
            capacity=None,
            slots=plan.slots,
            readers=readers,
            places=tuple(plan.cores),
            place=lambda core: core,
        )
        self.nodes: tuple[str, ...] = ()
        self.children = ChildPool(clock)
        self.watchdog = Watchdog(self.rel, self._board_rows)
        self.usage = Usage()
        # With runtime.readers fixed (or one CPU) the count stays, but the scaler's windows
        # still decide the readers' priority (_yield_to_workers).
        least = 1 if self._max_readers > readers else readers
        self.scaler = make_scaler(least, self._max_readers, clock()) if readers else None
        self.backend = plan.backend
        # The manifest columns that feed model inputs (sent with each item to its reader).
        self._columns = tuple(
            f.column for f in plan.feeds if f.source == FROM_COLUMN and f.column is not None
        )
        self._next_check = 0.0
        self._next_memory = 0.0
        self._recycling: dict[int, Child] = {}  # id -> a worker asked to stop, to be replaced
        self._starved = False
        self._stopping = False  # the loop drains: a recycled worker gets no successor
        self._retired: set[int] = set()  # keys the loop retired
        self._started = False  # the scaler was told that start-up is over
        self.outputs: SlotRegion | None = None
        self._memory: RunMemory | None = None
        self._inputs: SlotRegion | None = None
        self._board: StatusBoard | None = None
        self._stats: CoreStatsRecorder | None = None

    def where(self, key: int) -> Where:
        return Where(key)

    # ------------------------------------------------------------------ set-up
    def setup(self, stats: CoreStatsRecorder, now: float) -> None:
        self._stats = stats
        plan = self.plan
        # Segments and runtimes a killed earlier run left behind, then this run's backend.
        plan.backend.sweep()
        sweep_dead_segments()
        self.backend = plan.backend.for_run()
        check_fd_limit(len(plan.cores) + self._max_readers)  # before any process or segment
        self.children.open()  # the fork server imports while the segments are made
        self._memory = RunMemory(
            plan.slots,
            plan.input_layout,
            plan.cores,
            plan.item_lanes,  # board rows per core: one per item a call may hold
            self._max_readers,
            geometry=plan.letterboxes,
        )
        self._inputs, self._board = self.memory.inputs, self.memory.board
        for core in plan.cores:
            self.start_worker(core, now)
        for reader in range(self.layout.readers):
            self._start_reader(reader)
        inputs = self.inputs
        self.source.prefill(lambda slot: inputs[slot], plan.slots)
        self.usage.started()  # the coordinator's CPU from here on is the run's

    def start_worker(self, key: int, now: float) -> None:
        start_worker(self.children, self.plan, self.memory, self.backend, key)

    def restart_reader(self, reader: int) -> None:
        self._start_reader(reader)

    def _start_reader(self, reader: int) -> Child:
        child = start_reader(
            self.children,
            self.plan,
            self.memory,
            self.source.kind,
            reader,
            self.source.column_base,
        )
        if self.source.light_reads:
            # Loading the item is a copy into its slot, never what the cores wait for: such
            # a reader yields to the core workers from the start.
            self._yield(child)
        return child

    # ------------------------------------------------------------------ sending
    def fill(self, slot: int, item: Item) -> None:
        self.source.fill(item, self.inputs[slot])

    def send_reads(self, reader: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        child = self._child("reader", reader)
        if child is None:
            return  # being restarted: reader_lost has re-queued its slots already
        child.sent(items, now)
        tasks = [
            ReadTask(slot, it.index, it.path, it.id, it.member, self._column_values(it))
            for slot, it in items
        ]
        self.children.send(child, Read(tasks))

    def send_work(self, key: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        child = self._child("worker", key)
        if child is None:
            return  # cannot happen: the scheduler dispatches to ready cores only
        child.sent(items, now)
        self.children.send(child, Infer([InferTask(slot, it.index) for slot, it in items]))

    def _column_values(self, item: Item) -> tuple | None:
        """The item's values of the columns that feed model inputs (engine.feeds), in feed
        order; None when no input is fed from a column. Missing ones are None: the reader
        makes them the item's error row."""
        if not self._columns:
            return None
        columns = item.columns or {}
        return tuple(columns.get(column) for column in self._columns)

    def _child(self, kind: str, key: int) -> Child | None:
        for child in reversed(self.children.children):  # the newest incarnation first
            if child.key == key and child.kind == kind and child.state != ChildState.GONE:
                return child
        return None

    # ------------------------------------------------------------------ events
    def wait(self, timeout_s: float, run: RunState) -> list[PoolEvent]:
        # Starvation is the state before the events, held for the time the turn waited.
        self._starved = self.scaler is not None and run.starved()
        events: list[PoolEvent] = []
        for event in self.children.poll(timeout_s):
            if isinstance(event, Message):
                said = self._on_message(event.child, event.body)
            else:
                said = self._on_exit(event)
            if said is not None:
                events.append(said)
        return events

    def _on_message(self, child: Child, msg: tuple) -> PoolEvent | None:
        """A child's message (FromReader, FromWorker) as the event it means, if any."""
        now = self.clock()
        child.last_progress = now
        match msg:
            case Loaded(items, cpu_s):
                child.cpu_s = cpu_s
                child.heard(items)
                if self.scaler is not None:
                    self.scaler.decoded(sum(r.read_ms for r in items) / 1e3)
                return ItemsRead(child.key, [ItemRead(r.slot, r.read_ms, r.error) for r in items])
            case Done(results, busy_s, cpu_s):
                child.busy_s, child.cpu_s = busy_s, cpu_s
                child.heard(results)
                self.stats.set_busy(child.key, busy_s)
                done = [
                    ItemResult(r.slot, r.instance, r.t0, r.t1, r.error, r.decoded) for r in results
                ]
                return ItemsDone(child.key, done)
            case ReaderReady() | WorkerReady():
                child.state, child.deadline = ChildState.READY, None
                child.cpu_s = child.cpu_at_ready = msg.cpu_s
                if child.yielding:
                    self._lower(msg.pid)  # it was to yield before its pid was known
                if isinstance(msg, ReaderReady):
                    return ReaderUp(child.key, msg.pid)
                return self._on_worker_ready(child, msg)
            case Initialised():
                child.phase = (
                    f"the canary inference took longer than {self.rel.inference_timeout_s:g} s "
                    "(the inference timeout)"
                )
                child.deadline = now + self.rel.inference_timeout_s
            case InitFailed(reason):
                return WorkerRetired(child.key, reason)
            case Failed(text):
                # A start-up exception with its traceback: said once, then the child exits.
                last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
                log.debug("%s failed to start:\n%s", child.name, text)
                child.killed_for = f"failed to start ({last})"
                if child.kind == "worker":
                    reason = CoreReason.of(f"its worker failed to start:\n{text.rstrip()}")
                    return WorkerRetired(child.key, reason)
        return None

    def _on_worker_ready(self, child: Child, info: WorkerReady) -> WorkerUp:
        shapes = [(tuple(s), "float32") for s, _ in info.outputs]
        if self.outputs is None:
            # Workers that decode send the task's payload, not outputs: no output slots to
            # fill unless the rows store the raw outputs too.
            keep = self.plan.copies_outputs
            self.outputs = self.memory.create_outputs(shapes if keep else [])
        self.children.send(child, Attach(self.outputs.spec))
        rss_mb = self.usage.worker_memory_mb(info.pid)  # before its first item
        return WorkerUp(child.key, info.pid, info.sdk_version, shapes, info.canary, rss_mb)

    def _on_exit(self, event: Exited) -> PoolEvent | None:
        child = event.child
        self.usage.child_gone(child)
        died = "died" if child.kind == "reader" else "worker process crashed"
        code = "unknown" if event.exitcode is None else event.exitcode  # its server is gone
        what = child.killed_for or f"{died} (exit code {code})"
        board = self.board
        rows = self._board_rows(child)
        working = [(int(i), t) for i, t in board.snapshot()[rows] if t > 0]
        board.rows[rows] = 0.0
        if child.kind == "reader":
            if child.stopped and not child.held:
                return None  # stopped because fewer readers are enough: nothing to redo
            culprit = None
            if working:
                index = working[0][0]
                for slot, item in child.held.items():
                    if item.index == index:
                        culprit = slot
                        what += f" while decoding {item.id}"
            return ReaderLost(child.key, what, culprit)
        if child.key not in self._retired:
            self.stats.add_busy(child.key, child.busy_s)  # carried over from this incarnation
            self.stats.set_busy(child.key, 0.0)
        if self._recycling.pop(id(child), None) is not None:
            # Recycled: it held no item, so nothing is lost; its successor starts now.
            if not self._stopping:
                self.start_worker(child.key, self.clock())
            return None if child.killed_for is None else Said(f"{child.name}: {what}.")
        return WorkerLost(child.key, what, frozenset(i for i, _ in working), child.hung_items)

    # ------------------------------------------------------------------ checks
    def check(
        self, now: float, run: RunState, *, stopping: bool, exhausted: bool
    ) -> list[PoolEvent]:
        if self.scaler is not None and not exhausted:
            self.scaler.observe(now, self._starved)
        if now < self._next_check:
            return []
        self._next_check = now + CHECK_EVERY_S
        live = self.children.live()
        self.usage.sample(now)
        for child, reason, items in self.watchdog.hung(now, live, self.board.snapshot()):
            child.hung_items = items
            self.children.kill(child, reason)  # its exit comes back from wait()
        events: list[PoolEvent] = []
        if now >= self._next_memory:
            self._next_memory = now + RSS_EVERY_S
            events = self._worker_memory(live)
        if self.scaler is not None and not stopping:
            if not self._started and self._all_ready(run):
                self._started = True
                self.scaler.started(now, self.usage.idle_cpus)
            events += self._scale_readers(now, run)
        return events

    def _worker_memory(self, live: list[Child]) -> list[PoolEvent]:
        """Each ready core worker's own memory (not one being recycled or killed)."""
        workers = [c for c in live if c.kind == "worker" and id(c) not in self._recycling]
        return [WorkerMemory(key, mb) for key, mb in self.usage.workers_memory(workers)]

    def recycle(self, key: int, now: float) -> None:
        """Ask the key's worker to stop (it holds no item); the watchdog kills it if it has
        not exited by ``_JOIN_TIMEOUT_S``; its successor starts when it is gone (_on_exit)."""
        child = self._child("worker", key)
        if child is None:
            self.start_worker(key, now)  # gone already: nothing to wait for
            return
        self._recycling[id(child)] = child
        if child.killed_for is None:
            child.phase = f"its worker did not stop within {_JOIN_TIMEOUT_S:g} s of being recycled"
            child.deadline = now + _JOIN_TIMEOUT_S
            self.children.send(child, Stop())

    def _all_ready(self, run: RunState) -> bool:
        """Every core is up (or retired) and every reader ready: start-up is over."""
        return run.started() and all(
            r.state == ChildState.READY for r in self.children.live("reader")
        )

    def shift(self, gap_s: float) -> None:
        self.watchdog.resumed(self.clock())
        for child in self.children.live():
            child.last_progress += gap_s
            if child.deadline is not None:
                child.deadline += gap_s

    def _board_rows(self, child: Child) -> slice:
        if child.kind == "worker":
            return self.memory.worker_rows(child.key)
        row = self.memory.reader_row(child.key)
        return slice(row, row + 1)

    # ------------------------------------------------------------------ readers
    def _scale_readers(self, now: float, run: RunState) -> list[PoolEvent]:
        """Grow or shrink the readers from what the run measures (reader_scaling.py): stop
        the closing readers that hold nothing; a reader started, or one to close, is told
        to the loop (ReaderAdded, ReaderClosing), whose scheduler gives it reads or not."""
        assert self.scaler is not None
        closing = run.closing_readers()
        for reader in closing:
            child = self._child("reader", reader)
            if child is not None and not run.held_by_reader(reader) and not child.killed_for:
                child.killed_for = "stopped: fewer readers are enough"
                child.stopped = True
                self.children.send(child, Stop())
        open_readers = run.open_readers()
        change = self.scaler.decide(now, len(open_readers), self.usage.idle_cpus)
        events: list[PoolEvent] = []
        if change > 0:
            # A stopped reader's number (and board row) is used again; else a new one, up
            # to the rows the board has.
            free = [r for r in closing if self._child("reader", r) is None]
            if free or run.readers() < self._max_readers:
                reader = free[0] if free else run.readers()
                self._start_reader(reader)
                log.info("reader %d started: decoding was the bottleneck", reader)
                events.append(ReaderAdded(reader))
        elif change < 0 and len(open_readers) > 1:
            events.append(ReaderClosing(open_readers[-1]))
        if self.scaler.fed:
            for child in self.children.live("reader"):
                self._yield(child)
        return events

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

    # ------------------------------------------------------------------ ending
    def stopping(self) -> None:
        self._stopping = True

    def retire(self, key: int) -> None:
        self._retired.add(key)
        child = self._child("worker", key)
        if child is not None and child.killed_for is None:
            self.children.kill(child, "retired")  # it exits anyway after InitFailed

    def close(self, hard: bool) -> None:
        """Shutdown steps 3-4 of the NOTE in slots.py; the sink is closed by the caller."""
        for child in self.children.live():
            self.usage.child_gone(child)  # its last report: stopped children send no more
        self.children.close(hard, _JOIN_TIMEOUT_S)
        self.usage.add_startup(self.children.server_cpu_s)
        if self._memory is not None:
            self._memory.close()
        self.backend.end_run()

    def report(self) -> PoolReport:
        return PoolReport(self.backend.describe(), self.usage.cpu_by_role(), self.usage.peak_rss_mb)
