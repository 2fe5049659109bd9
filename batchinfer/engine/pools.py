"""The one interface between the engine loop and what runs its items.

The loop (loop.py, :class:`batchinfer.engine.Engine`) holds the policy: admission, which
worker gets an item, retries and error rows (scheduler.py), rows and statistics
(collector.py), start-up, retirement and restart texts, time (gaps when the loop itself did
not run), draining and stopping. A pool holds the mechanics of one kind of worker and owns
its workers' state; no other module writes it:

- :class:`batchinfer.engine.board.pool.BoardPool`: one core-worker process per NPU core of this
  board, reader processes, inputs and outputs in shared memory;
- :class:`batchinfer.cluster.pool.RayPool`: one Ray actor per runtime instance of each
  core of each node, read tasks, inputs and outputs as Ray objects.

Keys. The scheduler knows workers by key. On a board a key is an NPU core; on a cluster it
is one actor (instance i of core c of node n). :class:`Layout` says how many keys there are
and what each stands for; readers are numbered 0.. (reader processes, or read lanes).

PROTOCOL (loop ⇄ pool), all on the loop's thread, all times on the loop's clock:

    loop                                              pool
    Engine(plan, source, sink, pool=...) ──layout──►  Layout (read once, before setup)
    setup(stats, now) ──────────────────────────────► starts every worker (and reader)
    fill(slot, item)           (sources in memory)    the item's tensors into its slot
    send_reads(reader, [(slot, item)], now)           these items are to be read
    send_work(key, [(slot, item)], now)               these items are to be inferred
    wait(timeout_s, run) ◄─────────────────────────── events, in the order they happened
    check(now, run) ◄──────────────────────────────── events found by looking: a worker
                                                      that did not start in time
                                                      (WorkerRetired), workers lost with
                                                      their node (WorkerLost), the ready
                                                      workers' memory now and then
                                                      (WorkerMemory), a reader added or
                                                      to close (ReaderAdded, ReaderClosing:
                                                      the loop tells the scheduler). A
                                                      hung worker is killed here; its
                                                      WorkerLost comes from wait()
    shift(gap_s)                                      the loop was not running: move clocks
    stopping()                 (a stop request)       the run drains: start no new worker
    start_worker(key, now)     (after a back-off)     start the key's worker again
    recycle(key, now)          (it holds no item)     replace the key's worker: stop it,
                                                      start a new one; its WorkerUp comes
                                                      from wait() (a pool that sends no
                                                      WorkerMemory is never asked)
    retire(key)                (never again)          stop it for good, drop what it holds
    close(hard)                                       stop everything (hard: kill at once)

Events (pool → loop) are the NamedTuples below. Every slot sent with ``send_work`` comes
back exactly once: in an :class:`ItemsDone` of its key, or as held by a worker that is then
lost (:class:`WorkerLost`) or retired (:class:`WorkerRetired`), after which the scheduler
gives it back; likewise every slot sent with ``send_reads`` comes back in an
:class:`ItemsRead` or with a :class:`ReaderLost`. A pool never decides what is retried or
charged: it reports what it saw (which items were inside inference when a worker died,
which one hung) and the scheduler decides.

A pool reads the run's state only through ``run`` (:class:`RunState`, the scheduler's
read-only view) in ``wait`` and ``check``: whether the workers wait for input, whether
start-up is over, which slots are free again, the readers' numbers; it never holds the
scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar, overload

from batchinfer.data.dataset import Item
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.stats import CoreKey, CoreStatsRecorder

if TYPE_CHECKING:
    from batchinfer.tasks import Decoded


@dataclass(frozen=True)
class Layout:
    """What the loop builds its scheduler and statistics from (read before ``setup``)."""

    keys: tuple[int, ...]  # the scheduler's worker keys
    instances: int  # runtime instances behind one key (k on a board, 1 per Ray actor)
    capacity: int | None  # items a key may hold at once; None: the scheduler's default
    slots: int  # items in flight at most
    readers: int  # readers to start with (0: the source fills slots itself)
    places: tuple[CoreKey, ...]  # what the statistics count per: cores, (node, core)s
    place: Callable[[int], CoreKey]  # key -> its place in ``places``
    physical: Callable[[int], Hashable] | None = None  # keys that share a core (retries)


T = TypeVar("T")


class SetUp(Generic[T]):
    """A part of a pool that exists once ``setup`` made it (the statistics, shared memory):
    ``stats = SetUp[CoreStatsRecorder]()`` reads ``self._stats``, which ``__init__`` sets to
    None and ``setup`` to the part. Reading it before ``setup`` is a bug in the caller, not
    a run's failure, hence the assert."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = f"_{name}"

    @overload
    def __get__(self, pool: None, owner: type) -> SetUp[T]: ...
    @overload
    def __get__(self, pool: object, owner: type) -> T: ...
    def __get__(self, pool: object | None, owner: type) -> SetUp[T] | T:
        if pool is None:
            return self
        part: T | None = getattr(pool, self.attr)
        assert part is not None, "the pool is not set up"
        return part


class Where(NamedTuple):
    """How events and texts name a key: its NPU core and node (None on one board), and
    the instance when a key is one of several runtime instances of a core (the loop says
    "core 2", "core 2 of node b", "core 2 of node b (instance 1)")."""

    core: int
    node: str | None = None
    instance: int | None = None


# ---------------------------------------------------------------- events: pool -> loop
class WorkerUp(NamedTuple):
    """The key's worker is ready for items (its model loaded, its canary inferred)."""

    key: int
    pid: int
    sdk_version: str | None
    outputs: list  # [(shape, dtype)] of the model's outputs
    canary: Any = None  # the canary's outputs; None: not compared (engine/canary.py)
    # Its own memory (MB) as it came up, before any item: the recycling policy's first
    # sample (engine/recycling.py); None where the pool does not watch memory (Ray).
    rss_mb: float | None = None


class WorkerRetired(NamedTuple):
    """The key's worker will not come back (its runtime refused the model, it failed to
    start, its node left): the loop retires the key; the slots it held go back.
    ``quiet``: the pool said why already (one warning for a whole node)."""

    key: int
    reason: CoreReason
    quiet: bool = False


class WorkerLost(NamedTuple):
    """The key's worker died or was killed (crash, hang); ``what`` says how. ``working``:
    indexes of the items that were inside inference then; ``culprits``: the ones known to
    have caused it (a hang names them), None when any of ``working`` may have."""

    key: int
    what: str
    working: frozenset[int]
    culprits: frozenset[int] | None = None


class WorkerMemory(NamedTuple):
    """The key's worker's own memory now, in MB (RSS less shared pages: recycling.py)."""

    key: int
    rss_mb: float


class ReaderUp(NamedTuple):
    """A reader process is up (observers account CPU by pid); read lanes send none."""

    reader: int
    pid: int


class ItemResult(NamedTuple):
    """One item inferred. Times are on the loop's clock; ``decoded``: what the worker's task
    decoder made of it (batchinfer/tasks Decoded), None when the task decodes in the
    coordinator. Outputs, when kept, are in the pool's output store."""

    slot: int
    instance: int
    t0: float
    t1: float
    error: str | None
    decoded: Decoded | None = None


class ItemsDone(NamedTuple):
    key: int
    results: list[ItemResult]


class ItemRead(NamedTuple):
    """One slot a reader finished: its decode's milliseconds, and why it failed, if it did."""

    slot: int
    read_ms: float
    error: str | None


class ItemsRead(NamedTuple):
    """Reader ``reader`` finished these slots."""

    reader: int
    items: list[ItemRead]


class ReaderLost(NamedTuple):
    """A reader died or hung; ``culprit``: the slot it was decoding, if known."""

    reader: int
    what: str
    culprit: int | None = None


class ReaderAdded(NamedTuple):
    """The pool started reader ``reader`` (a new number, or a closed reader's again): the
    scheduler gives it reads from now on."""

    reader: int


class ReaderClosing(NamedTuple):
    """Fewer readers are enough: the scheduler gives ``reader`` no new reads; the pool
    stops it once it holds none (RunState.held_by_reader)."""

    reader: int


class Said(NamedTuple):
    """Something the pool wants the user to know (a node left, a node's set-up failed)."""

    message: str


PoolEvent = (
    WorkerUp
    | WorkerRetired
    | WorkerLost
    | WorkerMemory
    | ItemsDone
    | ReaderUp
    | ItemsRead
    | ReaderLost
    | ReaderAdded
    | ReaderClosing
    | Said
)


class RunState(Protocol):
    """What a pool may read of the run's state, passed by the loop in ``wait`` and
    ``check`` (the scheduler's read-only view: run_view.py's RunView)."""

    def starved(self) -> bool:
        """A runtime instance has nothing to infer and no item is READY."""

    def started(self) -> bool:
        """Every key is up or retired, and one is up."""

    def released(self, slots: Iterable[int]) -> list[int]:
        """Those of ``slots`` that are free again."""

    def indexes(self) -> set[int]:
        """The indexes of the items in slots."""

    def readers(self) -> int:
        """Reader numbers in use, open or closing (the next new reader's number)."""

    def open_readers(self) -> list[int]:
        """Readers that take new reads."""

    def closing_readers(self) -> list[int]:
        """Readers that get no new reads (ReaderClosing): stopped once they hold none."""

    def held_by_reader(self, reader: int) -> int:
        """Slots sent (or to be sent) to ``reader`` and not read yet."""


@dataclass
class PoolReport:
    """What the pool says of the run once it is closed (EngineResult's fields)."""

    backend: dict[str, Any]
    cpu_s: dict[str, float]  # CPU seconds by role; empty where not measured
    peak_rss_mb: float = 0.0


class WorkerPool(Protocol):
    """What runs the engine's items (see the module docstring for the protocol)."""

    layout: Layout
    #: Where the model's outputs of a slot are kept for the collector (a SlotRegion, or a
    #: dict of slot -> outputs); set before the first WorkerUp is returned.
    outputs: Any
    #: The cluster's nodes taking part, known after ``setup``; () on one board.
    nodes: tuple[str, ...]

    def where(self, key: int) -> Where: ...

    def setup(self, stats: CoreStatsRecorder, now: float) -> None:
        """Start every worker and reader; ``stats`` gets the workers' busy time (set_busy,
        add_busy). What to send comes with each call (send_reads, send_work), what the pool
        may read of the run with ``wait`` and ``check`` (RunState)."""

    def fill(self, slot: int, item: Item) -> None:
        """Sources that need no reader: put ``item``'s tensors into ``slot``."""

    def send_reads(self, reader: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        """Read each item into its slot (``items``: (slot, item))."""

    def send_work(self, key: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        """Infer each item of its slot (``items``: (slot, item))."""

    def wait(self, timeout_s: float, run: RunState) -> list[PoolEvent]:
        """What happened, waiting at most ``timeout_s`` for the first event (``run``: the
        state the turn waits in, e.g. whether the workers wait for input)."""

    def check(
        self, now: float, run: RunState, *, stopping: bool, exhausted: bool
    ) -> list[PoolEvent]:
        """Called every turn: find hung workers and readers (kill them: their loss comes
        back from ``wait``); return what is found by looking rather than heard (a worker
        that did not start in time, workers lost with their node); adapt readers (not
        when ``stopping``; demand is measured until the source is ``exhausted``): a reader
        started or to close comes back as ReaderAdded or ReaderClosing; free what released
        slots held (``run.released``)."""

    def shift(self, gap_s: float) -> None:
        """The loop was not running for ``gap_s``: not held against workers or readers."""

    def stopping(self) -> None:
        """The run is stopping (the items in flight finish, then ``close``): a worker being
        recycled gets no successor."""

    def start_worker(self, key: int, now: float) -> None:
        """Start the key's worker again (after WorkerLost and the scheduler's back-off)."""

    def recycle(self, key: int, now: float) -> None:
        """Replace the key's worker, which holds no item (the loop drained it: it grew,
        recycling.py): stop it, then start a new one, whose WorkerUp comes from ``wait``."""

    def restart_reader(self, reader: int) -> None:
        """Start reader ``reader`` again after ReaderLost (a read lane: nothing to do)."""

    def retire(self, key: int) -> None:
        """The key takes no more items: stop its worker for good, forget what it held."""

    def close(self, hard: bool) -> None:
        """Stop every worker and reader (ask, then kill; ``hard``: kill at once) and free
        what the pool made (segments, actors). Called once, also after errors."""

    def report(self) -> PoolReport: ...
