"""A scripted worker pool for the engine loop's tests: no processes, no Ray, no sleeping.

:class:`FakePool` implements :class:`batchinfer.engine.pools.WorkerPool`. Time is a
:class:`FakeClock` that only the pool moves: ``wait(timeout_s)`` jumps to the next scripted
happening (a worker up, an item done, a crash) or, when there is none that soon, by the
whole timeout. So a test says "item 3 takes 2 s" or "the loop stalls for 10 s" and asserts
on times exactly, never on the wall clock.

What happens is scripted per key and per item:

- ``starts``: key -> what each start of its worker does, in order (the last repeats):
  :class:`Up` (a WorkerUp after ``after_s``, with outputs and a canary), :class:`FailsToStart`
  (a WorkerRetired with a CoreReason) or :class:`DiesStarting` (a WorkerLost, nothing held);
- ``items``: item index -> what each inference of it does, in order (the last repeats), or
  one callable (index, key, nth inference of that item) -> behaviour: :class:`Succeed`,
  :class:`Fail` (inference returns an error text), :class:`Crash` (the worker dies: a
  WorkerLost naming every item inside inference then, culprits unknown), :class:`Hang`
  (nothing, until ``check`` finds it past the inference timeout: a WorkerLost naming it);
- ``reads``: item index -> what each read of it does (sources that need readers):
  :class:`Read` or :class:`ReaderDies` (a ReaderLost with the item as culprit);
- ``at(t, event)``: any event, returned by the first ``wait`` that reaches ``t``;
  ``stall(t, gap_s)``: the loop's clock jumps by ``gap_s`` at ``t`` (a suspended process);
  ``shift`` moves every pending happening and deadline by the gap, as the real pools do.

A key's worker infers ``instances`` items at once (the rest it holds queue behind them).
Every call the loop makes is recorded in ``calls`` as a tuple, with item indexes rather
than slots: ("send_work", key, [indexes], now), ("send_reads", reader, [indexes], now),
("start_worker", key, now), ("retire", key), ("recycle", key, now), ("restart_reader",
reader), ("shift", gap_s), ("stopping",), ("close", hard). Workers' memory is scripted with ``at(t,
WorkerMemory(key, mb))``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchinfer.data.dataset import Item
from batchinfer.engine.pools import (
    ItemRead,
    ItemResult,
    ItemsDone,
    ItemsRead,
    Layout,
    PoolEvent,
    PoolReport,
    ReaderLost,
    ReaderUp,
    RunState,
    Where,
    WorkerLost,
    WorkerRetired,
    WorkerUp,
)
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.stats import CoreKey, CoreStatsRecorder

#: The fake model's one output: ten class scores.
OUTPUTS = [((1, 10), "float32")]


class FakeClock:
    """The loop's clock; only the pool (and the test) moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- what a start does
@dataclass(frozen=True)
class Up:
    after_s: float = 0.0
    canary: Any = None  # the canary outputs the worker reports (None: not compared)
    sdk: str = "fake-1.0"


@dataclass(frozen=True)
class FailsToStart:
    reason: CoreReason
    after_s: float = 0.0
    quiet: bool = False


@dataclass(frozen=True)
class DiesStarting:
    what: str = "worker process exited during start-up"
    after_s: float = 0.0


Start = Up | FailsToStart | DiesStarting


# ---------------------------------------------------------------- what an inference does
@dataclass(frozen=True)
class Succeed:
    after_s: float = 0.01


@dataclass(frozen=True)
class Fail:
    error: str = "inference returned None"
    after_s: float = 0.01


@dataclass(frozen=True)
class Crash:
    after_s: float = 0.01
    what: str = "worker process crashed (killed by SIGKILL)"


@dataclass(frozen=True)
class Hang:
    pass


Behaviour = Succeed | Fail | Crash | Hang


# ---------------------------------------------------------------- what a read does
@dataclass(frozen=True)
class Read:
    after_s: float = 0.01
    error: str | None = None


@dataclass(frozen=True)
class ReaderDies:
    what: str = "died (killed by SIGKILL)"
    after_s: float = 0.01


ReadBehaviour = Read | ReaderDies


def _nth(script: Any, n: int) -> Any:
    """The n-th (0-based) entry of a script: one behaviour, or a list whose last repeats."""
    if isinstance(script, (list, tuple)):
        return script[min(n, len(script) - 1)]
    return script


@dataclass
class _Running:
    slot: int
    index: int
    instance: int
    t0: float
    deadline: float
    behaviour: Behaviour


@dataclass
class _Worker:
    """One key's worker as the fake sees it; ``generation`` tells its happenings from those
    of a worker that was lost or retired since."""

    key: int
    generation: int = 0
    up: bool = False
    queue: deque[tuple[int, int]] = field(default_factory=deque)  # (slot, index) held
    running: dict[int, _Running] = field(default_factory=dict)  # instance -> what it infers


@dataclass
class _Reader:
    generation: int = 0
    queue: deque[tuple[int, int]] = field(default_factory=deque)  # (slot, index) to read
    busy: bool = False


class FakePool:
    """A scripted :class:`~batchinfer.engine.pools.WorkerPool` (see the module docstring)."""

    def __init__(
        self,
        clock: FakeClock,
        keys: Sequence[int] = (0, 1, 2),
        *,
        instances: int = 1,
        slots: int = 16,
        readers: int = 0,
        capacity: int | None = None,
        inference_timeout_s: float = 60.0,
        starts: Mapping[int, Start | Sequence[Start]] | None = None,
        items: Mapping[int, Behaviour | Sequence[Behaviour]]
        | Callable[[int, int, int], Behaviour]
        | None = None,
        reads: Mapping[int, ReadBehaviour | Sequence[ReadBehaviour]] | None = None,
        where: Callable[[int], Where] | None = None,
        place: Callable[[int], CoreKey] | None = None,
        physical: Callable[[int], Hashable] | None = None,
        nodes: tuple[str, ...] = (),
    ) -> None:
        self.clock = clock
        place = place or (lambda key: key)
        self.layout = Layout(
            keys=tuple(keys),
            instances=instances,
            capacity=capacity,
            slots=slots,
            readers=readers,
            places=tuple(dict.fromkeys(place(k) for k in keys)),
            place=place,
            physical=physical,
        )
        self.nodes = nodes
        self._where = where or (lambda key: Where(core=key))
        self.timeout_s = inference_timeout_s
        self._starts = dict(starts or {})
        self._items = items if items is not None else {}
        self._reads = dict(reads or {})
        self.outputs: dict[int, list[np.ndarray]] = {}
        self.calls: list[tuple] = []
        self.workers = {k: _Worker(k) for k in keys}
        self.readers = [_Reader() for _ in range(readers)]
        self.started: dict[int, int] = {}  # key -> starts so far
        self.inferences: dict[int, int] = {}  # item index -> inferences started
        self.read_count: dict[int, int] = {}  # item index -> reads started
        self.closed_at: float | None = None  # the clock when close() was called
        # Happenings: (time, order, wakes, action); an action returns the events it makes.
        self._heap: list[tuple[float, int, bool, Callable[[], list[PoolEvent]]]] = []
        self._order = itertools.count()
        self._pid = itertools.count(1000)

    # ---------------------------------------------------------------- scripting
    def at(self, t: float, event: PoolEvent) -> None:
        """Return ``event`` from the first ``wait`` that reaches clock time ``t``."""
        self._schedule(t, lambda: [event])

    def stall(self, t: float, gap_s: float) -> None:
        """At clock time ``t`` the loop stops running for ``gap_s`` (its clock jumps)."""

        def jump() -> list[PoolEvent]:
            self.clock.now += gap_s
            return []

        self._schedule(t, jump, wakes=True)

    def of(self, name: str) -> list[tuple]:
        """The recorded calls named ``name``."""
        return [c for c in self.calls if c[0] == name]

    # ---------------------------------------------------------------- WorkerPool
    def where(self, key: int) -> Where:
        return self._where(key)

    def setup(self, stats: CoreStatsRecorder, now: float) -> None:
        for key in self.layout.keys:
            self._start(key, now)
        for r in range(len(self.readers)):
            self.at(now, ReaderUp(r, next(self._pid)))

    def fill(self, slot: int, item: Item) -> None:
        pass  # the fake model needs no inputs

    def send_reads(self, reader: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        self.calls.append(("send_reads", reader, [it.index for _, it in items], now))
        while len(self.readers) <= reader:  # a reader the script added (ReaderAdded)
            self.readers.append(_Reader())
        self.readers[reader].queue.extend((slot, it.index) for slot, it in items)
        self._read_next(reader, now)

    def send_work(self, key: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        self.calls.append(("send_work", key, [it.index for _, it in items], now))
        worker = self.workers[key]
        assert worker.up, f"items sent to key {key}, whose worker is not up"
        worker.queue.extend((slot, it.index) for slot, it in items)
        self._infer_next(worker, now)

    def wait(self, timeout_s: float, run: RunState) -> list[PoolEvent]:
        deadline = self.clock.now + timeout_s
        while self._heap and self._heap[0][0] <= deadline:
            t = self._heap[0][0]
            self.clock.now = max(self.clock.now, t)
            events: list[PoolEvent] = []
            while self._heap and self._heap[0][0] <= self.clock.now:
                _, _, wakes, action = heapq.heappop(self._heap)
                events += action()
                if wakes:
                    return events  # a stall: the loop sees its gap before anything else
            if events:
                return events
        self.clock.now = max(self.clock.now, deadline)
        return []

    def check(
        self, now: float, run: RunState, *, stopping: bool, exhausted: bool
    ) -> list[PoolEvent]:
        """Hangs: a worker with an item past its deadline is killed; its loss names it."""
        events: list[PoolEvent] = []
        for worker in self.workers.values():
            hung = [r for r in worker.running.values() if r.deadline <= now]
            if hung:
                culprits = frozenset(r.index for r in hung)
                events.append(
                    self._lose(worker, f"hung for more than {self.timeout_s:g} s", culprits)
                )
        return events

    def stopping(self) -> None:
        self.calls.append(("stopping",))

    def shift(self, gap_s: float) -> None:
        self.calls.append(("shift", gap_s))
        self._heap = [(t + gap_s, o, w, a) for t, o, w, a in self._heap]
        heapq.heapify(self._heap)
        for worker in self.workers.values():
            for r in worker.running.values():
                r.t0 += gap_s
                r.deadline += gap_s

    def start_worker(self, key: int, now: float) -> None:
        self.calls.append(("start_worker", key, now))
        self._start(key, now)

    def recycle(self, key: int, now: float) -> None:
        """The loop drained the key's worker: it must hold nothing; a new one starts."""
        self.calls.append(("recycle", key, now))
        worker = self.workers[key]
        assert not worker.queue and not worker.running, f"key {key} recycled holding items"
        self._forget(worker)
        self._start(key, now)

    def restart_reader(self, reader: int) -> None:
        self.calls.append(("restart_reader", reader))
        self.at(self.clock.now, ReaderUp(reader, next(self._pid)))

    def retire(self, key: int) -> None:
        self.calls.append(("retire", key))
        self._forget(self.workers[key])

    def close(self, hard: bool) -> None:
        self.calls.append(("close", hard))
        assert self.closed_at is None, "close() called twice"
        self.closed_at = self.clock.now
        for worker in self.workers.values():
            self._forget(worker)
        self._heap.clear()

    def report(self) -> PoolReport:
        return PoolReport(backend={"name": "fake"}, cpu_s={})

    # ---------------------------------------------------------------- mechanics
    def _schedule(
        self, t: float, action: Callable[[], list[PoolEvent]], wakes: bool = False
    ) -> None:
        """``wakes``: the first ``wait`` that runs it returns right after (a stall)."""
        heapq.heappush(self._heap, (t, next(self._order), wakes, action))

    def _live(self, worker: _Worker, action: Callable[[], list[PoolEvent]]):
        """``action``, unless the worker it was meant for was lost or retired since."""
        generation = worker.generation

        def run() -> list[PoolEvent]:
            return action() if worker.generation == generation else []

        return run

    def _start(self, key: int, now: float) -> None:
        worker = self.workers[key]
        n = self.started.get(key, 0)
        self.started[key] = n + 1
        start: Start = _nth(self._starts.get(key, Up()), n)

        def happen() -> list[PoolEvent]:
            if isinstance(start, Up):
                worker.up = True
                return [WorkerUp(key, next(self._pid), start.sdk, OUTPUTS, start.canary)]
            if isinstance(start, FailsToStart):
                self._forget(worker)
                return [WorkerRetired(key, start.reason, start.quiet)]
            return [self._lose(worker, start.what, frozenset())]

        self._schedule(now + start.after_s, self._live(worker, happen))

    def _behaviour(self, index: int, key: int) -> Behaviour:
        n = self.inferences.get(index, 0)
        self.inferences[index] = n + 1
        if callable(self._items):
            return self._items(index, key, n)
        return _nth(self._items.get(index, Succeed()), n)

    def _infer_next(self, worker: _Worker, now: float) -> None:
        """Start what the worker holds on its free instances."""
        free = [i for i in range(self.layout.instances) if i not in worker.running]
        while worker.queue and free:
            (slot, index), instance = worker.queue.popleft(), free.pop(0)
            behaviour = self._behaviour(index, worker.key)
            run = _Running(slot, index, instance, now, now + self.timeout_s, behaviour)
            worker.running[instance] = run
            if not isinstance(behaviour, Hang):
                self._schedule(now + behaviour.after_s, self._live(worker, self._ends(worker, run)))

    def _ends(self, worker: _Worker, run: _Running) -> Callable[[], list[PoolEvent]]:
        def end() -> list[PoolEvent]:
            b = run.behaviour
            if isinstance(b, Crash):
                return [self._lose(worker, b.what, None)]
            del worker.running[run.instance]
            now = self.clock.now
            error = b.error if isinstance(b, Fail) else None
            if error is None:
                scores = np.zeros((1, 10), np.float32)
                scores[0, run.index % 10] = 1.0
                self.outputs[run.slot] = [scores]
            self._infer_next(worker, now)
            return [ItemsDone(worker.key, [ItemResult(run.slot, run.instance, run.t0, now, error)])]

        return end

    def _lose(self, worker: _Worker, what: str, culprits: frozenset[int] | None) -> WorkerLost:
        working = frozenset(r.index for r in worker.running.values())
        self._forget(worker)
        return WorkerLost(worker.key, what, working, culprits)

    def _forget(self, worker: _Worker) -> None:
        """The worker is gone: what it held is the scheduler's again, its happenings void."""
        worker.generation += 1
        worker.up = False
        worker.queue.clear()
        worker.running.clear()

    def _read_next(self, reader: int, now: float) -> None:
        r = self.readers[reader]
        if r.busy or not r.queue:
            return
        slot, index = r.queue.popleft()
        n = self.read_count.get(index, 0)
        self.read_count[index] = n + 1
        behaviour: ReadBehaviour = _nth(self._reads.get(index, Read()), n)
        r.busy = True
        generation = r.generation

        def done() -> list[PoolEvent]:
            if r.generation != generation:
                return []
            r.busy = False
            if isinstance(behaviour, ReaderDies):
                r.generation += 1
                r.queue.clear()
                return [ReaderLost(reader, behaviour.what, slot)]
            self._read_next(reader, self.clock.now)
            return [ItemsRead(reader, [ItemRead(slot, behaviour.after_s * 1e3, behaviour.error)])]

        self._schedule(now + behaviour.after_s, done)
