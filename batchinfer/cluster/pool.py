"""The Ray pool: the engine loop's workers are Ray actors on the NPU cores of a cluster.

    loop ──send_reads──► read lanes (read tasks, reads.py) ──ItemsRead / ReaderLost──► loop
    loop ──send_work───► CoreActor.infer calls (actors.py) ──ItemsDone / WorkerLost──► loop

:class:`RayPool` implements :class:`batchinfer.engine.pools.WorkerPool`: the engine loop
(engine/loop.py) holds the policy (admission, retries, error rows, restart back-offs,
retirement texts), this pool carries it out on Ray and reports what it saw. What runs on
the nodes, and its protocol, is in actors.py; the nodes' set-up, where actors and read
tasks run, and the watch on the nodes are in nodes.py (:class:`ClusterNodes`).

Keys: one per actor, i.e. per runtime instance: key k is instance i of core c of node n
(``where(k)``). The layout's ``physical`` tells the scheduler which keys share a core, so a
retry still goes to another core; rows and stats name (node, core) through ``place``.

Items travel as Ray objects: a read task (or ``ray.put`` for tensors in memory, ``fill``)
makes one object per item; an actor call takes the objects of its items as arguments, so
Ray moves each tensor straight from where it was made to the node that infers it. The pool
holds references only (dropped once the slot is released), and the model's outputs come
back in the call's result (``outputs``, by slot, for the collector).

Failure policy (scheduler.py's single-board policy, carried onto Ray):
- Actors are made with ``max_restarts=-1, max_task_retries=0``: Ray restarts an actor whose
  process died and never runs a call twice; the scheduler decides what is retried, where,
  and when an item becomes an error row.
- An actor runs its calls one at a time, in order, so when it dies (crash, kill) its oldest
  unfinished call was being inferred: its items are the WorkerLost's ``working`` (culprits
  unknown). The scheduler charges a lone item an attempt; several items are charged none
  and become suspects, each of which the scheduler then sends alone to an empty key (a
  call of one item), so that a second death names its item. The actor's later calls go
  back uncharged. MAX_CRASHES_IN_ROW deaths in a row retire it (``ray.kill``, no restart).
- A call that runs longer than the inference timeout for each item it holds is hung: the
  actor is killed (Ray restarts it) and that counts as its death.
- A dead actor takes items again once the scheduler's back-off has passed
  (``start_worker``) and its ``start()`` answered (Ray has restarted it by then; while Ray
  says it is still restarting, it is asked again); no answer within the start-up timeout
  retires it (WorkerRetired from ``check``).
- A node that leaves (the GCS no longer lists it alive) is said once, and its actors are
  retired quietly; their items go back uncharged and the run goes on with the other nodes.
  A node whose set-up fails is left out the same way (nodes.py).
- The cluster itself is lost when its GCS gives no answer for nodes.py's _GCS_LOST_S (each
  question is bounded by GCS_TIMEOUT_S): ``check`` (or ``wait``) raises ClusterLostError,
  the run stops at once and ends ``interrupted`` (ClusterEngine), so the rows done so far
  are written and ``--resume`` continues it.
- Reads: read lanes stand for reader processes (reads.py); a read task that dies or hangs
  is a ReaderLost.
- The loop's own gaps (``shift``) are not held against actors and read tasks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchinfer.cluster.actors import CallResult
from batchinfer.cluster.busy import BusyUnion
from batchinfer.cluster.connect import NodeInfo, import_ray
from batchinfer.cluster.nodes import ClusterNodes, check_data_mode, short
from batchinfer.cluster.reads import READ_ITEMS, Lane, MemoryItems, ReadLanes, ReadTask
from batchinfer.data.dataset import Item
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.pools import (
    ItemResult,
    ItemsDone,
    Layout,
    PoolEvent,
    PoolReport,
    RunState,
    SetUp,
    Where,
    WorkerLost,
    WorkerRetired,
    WorkerUp,
)
from batchinfer.engine.queue_depth import QUEUED_PER_INSTANCE
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.states import CoreStatus
from batchinfer.engine.watchdog import HangLimit
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.stats import CoreStatsRecorder

log = logging.getLogger("batchinfer")

#: Items per actor call at most: one call costs the driver ~0.3 ms (measured here), so
#: items share it; a call of one item is sent whenever only one is ready.
CALL_ITEMS = 4
_PROBE_AGAIN_S = 0.25


@dataclass
class _Call:
    ref: Any
    slots: list[int]
    indexes: list[int]  # the slots' items
    epoch: int


@dataclass
class _Actor:
    key: int
    node: NodeInfo
    core: int
    instance: int
    handle: Any = None
    state: CoreStatus = CoreStatus.STARTING
    calls: deque[_Call] = field(default_factory=deque)
    epoch: int = 0  # calls of an earlier epoch went back when the actor died
    probe: Any = None  # the pending start() call
    probe_deadline: float = 0.0
    probe_again_at: float | None = None  # Ray is still restarting it: ask again then
    last_progress: float = 0.0
    kill_reason: str | None = None  # why this pool killed it (a hang)

    @property
    def where(self) -> tuple[str, int]:
        return self.node.name, self.core


class RayPool:
    """Ray actors, read tasks and objects of a run (see the module docstring).

    ``nodes``: the nodes to use (``RayConnection.nodes()``); ``data``: where read tasks run,
    ``head`` (on ``head_node_id``, the node this process is on: the dataset is there
    only) or ``shared`` (on every node: each mounts the dataset at the same path).
    ``ray``: the ray module (tests give a scripted one).
    """

    stats = SetUp[CoreStatsRecorder]()

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        nodes: Sequence[NodeInfo],
        *,
        data: str = "head",
        head_node_id: str | None = None,
        call_items: int = CALL_ITEMS,
        clock: Callable[[], float] = time.monotonic,
        ray: Any = None,
    ) -> None:
        check_data_mode(data)
        self.ray = ray if ray is not None else import_ray()
        self.plan = plan
        self.source = source
        self.clock = clock
        self.rel = plan.reliability
        # A batch-N model's calls carry whole batches (the actor packs N items to a
        # runtime call, actors.py): call_items rounded up to a multiple of N.
        self.call_items = -(-max(1, call_items) // plan.batch) * plan.batch
        self.cluster_nodes = ClusterNodes(
            self.ray, plan, nodes, data, head_node_id, clock=clock, retire_node=self._retire_node
        )
        places = self.cluster_nodes.places()
        self.actors = [_Actor(key, n, c, i) for key, (n, c, i) in enumerate(places)]
        cores = sorted({a.where for a in self.actors}, key=lambda w: (w[0], w[1]))
        per_call = QUEUED_PER_INSTANCE * self.call_items
        lanes = self.cluster_nodes.lanes_wanted() if source.needs_reader else 0
        slots = len(self.actors) * (per_call + self.call_items) + lanes * READ_ITEMS * 2
        self.layout = Layout(
            keys=tuple(range(len(self.actors))),
            instances=plan.batch,  # item lanes of an actor: 1 instance x N (EnginePlan.item_lanes)
            capacity=per_call,
            slots=slots,
            readers=lanes,
            places=tuple(cores),
            place=lambda key: self.actors[key].where,
            physical=lambda key: self.actors[key].where,
        )
        self.outputs: dict[int, Any] = {}
        self.nodes: tuple[str, ...] = ()
        self.reads: ReadLanes | None = None
        self._busy = {w: BusyUnion(plan.instances_per_core) for w in cores}
        self._events: list[PoolEvent] = []  # found in setup(): the first wait() returns them
        # ref -> what it answers: ("call", actor, call), ("read", lane, task), ("probe", ...)
        self._waiting: dict[Any, tuple[str, Any, Any]] = {}
        self._input_refs: dict[int, Any] = {}
        self._memory: MemoryItems | None = None  # a source without readers
        self._stats: CoreStatsRecorder | None = None

    def where(self, key: int) -> Where:
        actor = self.actors[key]
        return Where(actor.core, actor.node.name, actor.instance)

    # ------------------------------------------------------------------ set-up
    def setup(self, stats: CoreStatsRecorder, now: float) -> None:
        self._stats = stats
        ray = self.ray
        self._events += self.cluster_nodes.begin(self.source)
        self.nodes = self.cluster_nodes.names
        for actor in self.actors:
            actor.handle = self.cluster_nodes.core_actor(actor.node, actor.core)
            if actor.handle is not None:  # else retired with its node
                self.start_worker(actor.key, now)
        lanes = self.cluster_nodes.lanes(self.layout.readers)
        self.reads = ReadLanes(
            ray,
            lanes,
            self.plan.preprocess,
            self.source.kind,
            HangLimit.decode(self.rel),
        )
        self._prefill()

    def _prefill(self) -> None:
        if not self.source.needs_reader:
            self._memory = MemoryItems(
                self.ray, self.source, self.plan.preprocess, self.layout.slots
            )

    def start_worker(self, key: int, now: float) -> None:
        """Ask the actor to start (make its instance, infer the canary): its WorkerUp comes
        when it answers; after a death, Ray has restarted its process meanwhile."""
        self._probe(self.actors[key], now)

    def _probe(self, actor: _Actor, now: float, again: bool = False) -> None:
        actor.state = CoreStatus.STARTING
        shape, dtype = self.plan.preprocess.shape, self.plan.preprocess.dtype
        actor.probe = actor.handle.start.remote(shape, dtype)
        actor.probe_again_at = None
        if not again:
            actor.probe_deadline = now + self.rel.startup_timeout_s
        self._waiting[actor.probe] = ("probe", actor, actor.probe)

    def recycle(self, key: int, now: float) -> None:
        """Refused: this pool reports no WorkerMemory, so the loop never drains an actor to
        recycle it (--max-worker-rss-mb and --recycle-after act on one board only)."""
        raise NotImplementedError("Ray actors are not recycled: the pool reports no memory")

    def stopping(self) -> None:
        """Nothing to do: actors are not recycled."""

    def restart_reader(self, reader: int) -> None:
        """A read lane needs no restart: its next task starts when it is sent reads."""

    # ------------------------------------------------------------------ sending
    def fill(self, slot: int, item: Item) -> None:
        assert self._memory is not None, "a source without readers"
        self._input_refs[slot] = self._memory.put(slot, item)

    def send_reads(self, reader: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        assert self.reads is not None
        lane = self.reads.lanes[reader]
        self._submitted(lane, self.reads.send(lane, items, now))

    def _submitted(self, lane: Lane, task: ReadTask | None) -> None:
        if task is not None:
            self._waiting[task.meta] = ("read", lane, task)

    def send_work(self, key: int, items: Sequence[tuple[int, Item]], now: float) -> None:
        """Calls of up to ``call_items`` items (a suspect comes alone: the scheduler sends
        it to an empty key and nothing else with it)."""
        actor = self.actors[key]
        if not actor.calls:
            actor.last_progress = now  # it was idle: its clock starts now
        n = self.call_items
        for i in range(0, len(items), n):
            chunk = [slot for slot, _ in items[i : i + n]]
            indexes = [item.index for _, item in items[i : i + n]]
            ref = actor.handle.infer.remote(indexes, *[self._input_refs[s] for s in chunk])
            call = _Call(ref, chunk, indexes, actor.epoch)
            actor.calls.append(call)
            self._waiting[ref] = ("call", actor, call)

    # ------------------------------------------------------------------ events
    def wait(self, timeout_s: float, run: RunState) -> list[PoolEvent]:
        events, self._events = self._events, []
        refs = list(self._waiting)
        ready: list = []
        if refs:
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=0 if events else timeout_s)
            if ready:
                ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        elif not events:
            time.sleep(timeout_s)  # nothing Ray could answer: only the clock moves
        for ref in ready:
            entry = self._waiting.pop(ref, None)
            if entry is None:
                continue  # dropped while handling an earlier one (its actor died)
            kind, owner, what = entry
            try:
                value = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                events += self._on_failure(kind, owner, what, exc)
            else:
                events += self._on_value(kind, owner, what, value)
        return events

    def _on_value(self, kind: str, owner: Any, what: Any, value: Any) -> list[PoolEvent]:
        if kind == "call":
            return self._on_results(owner, what, value)
        if kind == "read":
            return self._on_read(owner, what, value)
        return self._on_started(owner, what, value)

    def _on_failure(self, kind: str, owner: Any, what: Any, exc: Exception) -> list[PoolEvent]:
        if kind == "call":
            return self._on_actor_death(owner, what, exc)
        if kind == "read":
            return self._on_read_failed(owner, what, exc)
        actor: _Actor = owner
        if what is not actor.probe or actor.state != CoreStatus.STARTING:
            return []
        actor.probe = None
        if isinstance(exc, self.ray.exceptions.ActorUnavailableError):
            actor.probe_again_at = self.clock() + _PROBE_AGAIN_S  # still restarting
            return []
        reason = CoreReason.of(f"its actor failed to start ({short(exc)})")
        return [self._retired(actor, reason)]

    def _on_started(self, actor: _Actor, probe: Any, info: dict) -> list[PoolEvent]:
        if probe is not actor.probe or actor.state != CoreStatus.STARTING:
            return []
        actor.probe = None
        if "init_failed" in info:
            return [self._retired(actor, info["init_failed"])]
        actor.state = CoreStatus.READY
        actor.last_progress = self.clock()
        outputs = [(tuple(s), "float32") for s, _ in info["outputs"]]
        # The canary is compared per core: its instance 0 speaks for it.
        canary = info["canary"] if actor.instance == 0 else None
        return [WorkerUp(actor.key, info["pid"], info.get("sdk_version"), outputs, canary)]

    def _on_results(self, actor: _Actor, call: _Call, value: list[CallResult]) -> list[PoolEvent]:
        if call.epoch != actor.epoch:
            return []  # the actor died meanwhile and its items went back already
        with contextlib.suppress(ValueError):
            actor.calls.remove(call)
        now = self.clock()
        actor.last_progress = now
        self._busy[actor.where].add(actor.instance, [(r.t0, r.t1) for r in value])
        self._report_busy(actor)
        results = []
        for slot, r in zip(call.slots, value, strict=True):
            if r.error is None:
                self.outputs[slot] = r.outputs
            done = now - r.before_return_s  # the node's clock is not ours: place its times on ours
            t_start = done - (r.t1 - r.t0)
            results.append(ItemResult(slot, actor.instance, t_start, done, r.error, r.decoded))
        return [ItemsDone(actor.key, results)]

    def _report_busy(self, actor: _Actor, final: bool = False) -> None:
        where = actor.where
        idle = {a.instance for a in self.actors if a.where == where and not a.calls}
        self.stats.set_busy(where, self._busy[where].seconds(idle, final))

    def _on_actor_death(self, actor: _Actor, call: _Call, exc: Exception) -> list[PoolEvent]:
        if call.epoch != actor.epoch or actor.state == CoreStatus.RETIRED:
            return []
        if self.cluster_nodes.gone(actor.node):
            return self.cluster_nodes.lost_node(actor.node)
        what = actor.kill_reason or f"actor process crashed ({type(exc).__name__})"
        actor.kill_reason = None
        # Calls run one at a time, in order: the oldest one was being inferred.
        oldest = actor.calls[0] if actor.calls else call
        working = frozenset(oldest.indexes)
        self._drop_calls(actor)
        self._report_busy(actor)
        actor.state = CoreStatus.DOWN
        return [WorkerLost(actor.key, what, working)]

    def _drop_calls(self, actor: _Actor) -> None:
        for c in actor.calls:
            self._waiting.pop(c.ref, None)
        actor.calls.clear()
        actor.epoch += 1
        if actor.probe is not None:
            self._waiting.pop(actor.probe, None)
            actor.probe = None
        actor.probe_again_at = None

    def _on_read(self, lane: Lane, task: ReadTask, meta: list) -> list[PoolEvent]:
        assert self.reads is not None
        ready, read = self.reads.done(lane, task, meta)
        for slot, array in ready:
            self._input_refs[slot] = array
        self._submitted(lane, self.reads.next(lane, self.clock()))
        return [read] if read is not None else []

    def _on_read_failed(self, lane: Lane, task: ReadTask, exc: Exception) -> list[PoolEvent]:
        assert self.reads is not None
        lost = self.reads.failed(lane, task, exc, self.cluster_nodes.lane_gone(lane.node_id))
        return [lost] if lost is not None else []

    # ------------------------------------------------------------------ checks
    def check(
        self, now: float, run: RunState, *, stopping: bool, exhausted: bool
    ) -> list[PoolEvent]:
        """Hangs (killed: their deaths come from ``wait``), start-up timeouts, probes to
        repeat, and the nodes (once a second); the objects of released slots are dropped."""
        self._forget_released(run)
        events: list[PoolEvent] = []
        limit = HangLimit.inference(self.rel)
        for actor in self.actors:
            if actor.state == CoreStatus.STARTING and now > actor.probe_deadline:
                reason = CoreReason.of(
                    f"it did not start within {self.rel.startup_timeout_s:g} s (the start-up "
                    "timeout)"
                )
                events.append(self._retired(actor, reason))
            elif actor.state == CoreStatus.STARTING and actor.probe_again_at is not None:
                if now >= actor.probe_again_at:
                    self._probe(actor, now, again=True)
            elif actor.calls and actor.kill_reason is None:
                held = len(actor.calls[0].slots)
                if limit.of(held).passed(actor.last_progress, now):
                    index = actor.calls[0].indexes[0]
                    item = f"item {index}" if held == 1 else f"a call of {held} items"
                    actor.kill_reason = limit.of(held).hung(f"inference of {item}", "actor")
                    with contextlib.suppress(Exception):
                        self.ray.kill(actor.handle, no_restart=False)
        if self.reads is not None:
            self.reads.check_hangs(now)
        return events + self.cluster_nodes.watch(now)

    def _forget_released(self, run: RunState) -> None:
        """Drop the objects of slots whose item is done (so Ray can free them)."""
        for table in (self._input_refs, self.outputs):
            for slot in run.released(table):
                del table[slot]
        if self.reads is not None and self.reads.alone:
            self.reads.forget(run.indexes())

    def shift(self, gap_s: float) -> None:
        for actor in self.actors:
            actor.last_progress += gap_s
            actor.probe_deadline += gap_s
        if self.reads is not None:
            self.reads.shift(gap_s)

    def _retire_node(self, node: NodeInfo, why: str) -> list[PoolEvent]:
        """Retire ``node``'s actors quietly (it takes no part from now on: nodes.py)."""
        return [
            self._retired(actor, CoreReason.of(why), quiet=True)
            for actor in self.actors
            if actor.node.node_id == node.node_id and actor.state != CoreStatus.RETIRED
        ]

    # ------------------------------------------------------------------ ending
    def _retired(self, actor: _Actor, reason: CoreReason, quiet: bool = False) -> WorkerRetired:
        self._stop_for_good(actor)
        return WorkerRetired(actor.key, reason, quiet)

    def retire(self, key: int) -> None:
        self._stop_for_good(self.actors[key])

    def _stop_for_good(self, actor: _Actor) -> None:
        if actor.state == CoreStatus.RETIRED:
            return
        self._drop_calls(actor)
        self._kill(actor)
        actor.state = CoreStatus.RETIRED
        if self._stats is not None:
            self._report_busy(actor)

    def _kill(self, actor: _Actor) -> None:
        if actor.handle is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle, no_restart=True)

    def close(self, hard: bool) -> None:
        """Stop the actors (asked first unless ``hard``) and read tasks, then undo each
        node's set-up."""
        if self.reads is not None:
            self.reads.cancel()
        made = [a for a in self.actors if a.handle is not None]
        live = [a.handle for a in made if a.state != CoreStatus.RETIRED and not hard]
        self.cluster_nodes.end(live, [a.handle for a in made])
        for actor in self.actors:
            actor.calls.clear()
            if self._stats is not None:
                self._report_busy(actor, final=True)
        self._waiting.clear()
        self._input_refs.clear()
        if self._memory is not None:
            self._memory.clear()
        self.outputs.clear()

    def report(self) -> PoolReport:
        return PoolReport(self.plan.backend.describe(), {})
