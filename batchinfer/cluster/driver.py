"""The Ray driver: the engine's scheduler, collector and failure policy over a Ray cluster.

    source ──admit──► Scheduler ──reads──► read tasks (Ray) ──────loaded──┐
                        ▲  └──dispatch──► CoreActor.infer calls (Ray) ──done──┤
                        └──────────── release ◄── Collector ◄────────────────┘──► sink, stats,
                                                                                observers
:class:`ClusterEngine` has the interface of :class:`batchinfer.engine.Engine` (a source, a
row sink, observers, ``run()``, ``request_stop()``) and emits the same events, so the main
job, bench and eval run on a cluster by choosing this engine. What runs on the nodes, and
its protocol, is in actors.py.

Keys: the scheduler's "cores" are actors, one per runtime instance: key k is instance i of
core c of node n. ``Scheduler(physical=...)`` knows which keys share a physical core, so a
retry still goes to another core; rows and stats name (node, core) through the collector's
``place``.

Items travel as Ray objects: a read task (or ``ray.put`` for tensors in memory) makes one
object per item; an actor call takes the objects of its items as arguments, so Ray moves
each tensor straight from where it was made to the node that infers it. The driver holds
references only, and the model's outputs come back in the call's result.

Failure policy (scheduler.py's single-board policy, carried onto Ray):
- Actors are made with ``max_restarts=-1, max_task_retries=0``: Ray restarts an actor whose
  process died and never runs a call twice; the scheduler decides what is retried, where,
  and when an item becomes an error row.
- An actor runs its calls one at a time, in order, so when it dies (crash, kill) its oldest
  unfinished call was being inferred. A call of one item charges that item one attempt (as
  a worker death charges the item inside inference()); a call of several charges none,
  and each of its items is sent alone next time, so that a second death names its item.
  The actor's later calls go back uncharged. ``core_lost`` blames items or the actor as
  on one board; MAX_CRASHES_IN_ROW deaths in a row retire it (``ray.kill``, no restart).
- A call that runs longer than the inference timeout for each item it holds is hung: the
  actor is killed (Ray restarts it) and that counts as its death.
- A dead actor takes items again once the scheduler's back-off has passed and its
  ``start()`` answered (Ray has restarted it by then); no answer within the start-up
  timeout retires it.
- A node that leaves (the GCS no longer lists it alive) has its actors retired; their
  items go back uncharged and the run goes on with the other nodes.
- The cluster itself is lost when its GCS gives no answer for _GCS_LOST_S (each question is
  bounded by GCS_TIMEOUT_S): the run stops at once with ClusterLostError and ends
  ``interrupted``, so the rows done so far are written and ``--resume`` continues it.
- Reads: read lanes stand for reader processes (reads.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchinfer.cluster.actors import CoreActor, NodeHost, model_files
from batchinfer.cluster.busy import BusyUnion
from batchinfer.cluster.connect import (
    GCS_TIMEOUT_S,
    ClusterLostError,
    NodeInfo,
    check_shared_dataset,
    import_ray,
    live_node_ids,
)
from batchinfer.cluster.reads import READ_ITEMS, Lane, ReadLanes, ReadTask
from batchinfer.cluster.resources import core_resource
from batchinfer.engine import events as ev
from batchinfer.engine.canary import Canary
from batchinfer.engine.collector import Collector
from batchinfer.engine.interface import EnginePlan, EngineResult
from batchinfer.engine.run_loop import EngineLoop, HardStop
from batchinfer.engine.scheduler import (
    QUEUED_PER_INSTANCE,
    ReaderDeathsExceeded,
    Scheduler,
)
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.states import CoreStatus
from batchinfer.errors import NoCoreError, RunFailedError, UsageError
from batchinfer.messages import Message, join, setting
from batchinfer.runtime.backends import Backend
from batchinfer.sink.rows import RowSink
from batchinfer.sink.stats import CoreStatsRecorder, place_name

log = logging.getLogger("batchinfer")

DATA_MODES = ("head", "shared")
#: Items per actor call at most: one call costs the driver ~0.3 ms (measured here), so
#: items share it; a call of one item is sent whenever only one is ready.
CALL_ITEMS = 4
_TICK_S = 0.1
_NODE_CHECK_S = 1.0
_STOP_WAIT_S = 2.0
_PROBE_AGAIN_S = 0.25
# The GCS gave no answer for this long: the cluster is lost (Ray itself waits 60 s, then
# ends the process, leaving the run folder unfinished).
_GCS_LOST_S = 5.0
# The driver itself was not running for this long (Ctrl-Z, a frozen VM): that time is
# not held against actors and read tasks.
_GAP_S = 1.0


@dataclass
class _Call:
    ref: Any
    slots: list[int]
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
    epoch: int = 0
    probe: Any = None
    probe_deadline: float = 0.0
    probe_again_at: float | None = None  # Ray is still restarting it: ask again then
    last_progress: float = 0.0
    kill_reason: str | None = None

    @property
    def where(self) -> tuple[str, int]:
        return self.node.name, self.core


class ClusterEngine(EngineLoop):
    """Runs items from a source through the NPU cores of a Ray cluster into a sink.

    ``nodes``: the nodes to use (``RayConnection.nodes()``); ``data``: where read tasks run,
    ``head`` (on ``head_node_id``, the node this process is on: the dataset is there
    only) or ``shared`` (on every node: each mounts the dataset at the same path).
    """

    ALL_RETIRED = (
        "every NPU core of the cluster was retired after repeated failures or because its "
        "node left, so the run cannot go on; see the warnings above, then resume the run."
    )

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: RowSink,
        nodes: Sequence[NodeInfo],
        observers: Sequence[ev.Observer] = (),
        stats: CoreStatsRecorder | None = None,
        *,
        data: str = "head",
        head_node_id: str | None = None,
        call_items: int = CALL_ITEMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if data not in DATA_MODES:
            raise UsageError(
                setting("ray_data") + f" must be one of {', '.join(DATA_MODES)}, not {data!r}."
            )
        self.ray = import_ray()
        self.plan = plan
        self.source = source
        self.sink = sink
        self.observers = list(observers)
        self.clock = clock
        self.rel = plan.reliability
        self.data = data
        self.head_node_id = head_node_id
        self.call_items = max(1, call_items)
        self.nodes = [n for n in nodes if set(n.cores) & set(plan.cores)]
        if not self.nodes:
            raise NoCoreError(
                "no node of the Ray cluster declares the NPU cores to use "
                f"({', '.join(str(c) for c in plan.cores)}) as resources npu_core_N; start "
                "each board with ray start --resources (see docs/guide/ray.md)."
            )
        k = plan.instances_per_core
        where = [
            (n, c, i) for n in self.nodes for c in plan.cores if c in n.cores for i in range(k)
        ]
        self.actors = [_Actor(key, n, c, i) for key, (n, c, i) in enumerate(where)]
        self.places = sorted({a.where for a in self.actors}, key=lambda w: (w[0], w[1]))
        per_call = QUEUED_PER_INSTANCE * self.call_items
        lanes = self._lanes_wanted() if source.needs_reader else 0
        self.reads: ReadLanes | None = None
        slots = len(self.actors) * (per_call + self.call_items) + lanes * READ_ITEMS * 2
        self.scheduler = Scheduler(
            slots,
            range(len(self.actors)),
            1,
            lanes,
            self.rel.max_attempts,
            physical=lambda key: self.actors[key].where,
            name=lambda key: "core {1} of node {0}".format(*self.actors[key].where),
        )
        for state in self.scheduler.cores.values():
            state.capacity = per_call
        self.stats = stats or CoreStatsRecorder(self.places, k)
        self.collector = Collector(
            self.scheduler,
            sink,
            self.stats,
            self.notify,
            plan.topk,
            clock,
            place=lambda key: self.actors[key].where,
            classify=plan.classifies,
        )
        self.collector.outputs = self._outputs = {}  # type: ignore[assignment]
        names = [f"core {c} of node {n}" for n, c in self.places]
        self.canary = Canary(name=names.__getitem__)
        self._busy = {w: BusyUnion(k) for w in self.places}
        self.hosts: dict[str, Any] = {}
        self.backends: dict[str, Backend] = {}
        self.lost_nodes: set[str] = set()
        self.warnings: list[Message] = []
        self.sdk_versions: dict[str, str | None] = {}
        self.stop_reason: str | None = None
        self.hard_stop = False
        self._drain_until = 0.0
        self._items = iter(())  # type: ignore[var-annotated]
        self._exhausted = False
        self._waiting: dict[Any, tuple[str, Any, Any]] = {}
        self._input_refs: dict[int, Any] = {}
        self._slot_ref: dict[int, Any] = {}  # synthetic sources: one object per slot
        self._buffers: list[list[np.ndarray]] = []
        self._alone: set[int] = set()  # items to infer alone (they were in a call that died)
        self._opened = False
        self._next_node_check = 0.0
        self._gcs_silent_since: float | None = None
        self._last_turn = 0.0

    # ------------------------------------------------------------------ the run
    def run(self) -> EngineResult:
        """Run until the source is exhausted and every item has its row, or a stop."""
        status, error = self._drive()
        if isinstance(error, ClusterLostError):
            status = "interrupted"  # what is written stands; --resume continues it
        retired = sorted(
            {a.where for a in self.actors}
            - {a.where for a in self.actors if a.state != CoreStatus.RETIRED}
        )
        return EngineResult(
            status=status,
            error=error,
            counts=dict(self.collector.counts),
            stats=self.stats,
            warnings=self.warnings,
            sdk_versions=self.sdk_versions,  # type: ignore[arg-type]
            retired_cores=[place_name(n, c) for n, c in retired],  # type: ignore[misc]
            backend=self.plan.backend.describe(),
            collect_s=self.collector.collect_s,
        )

    def _reader_deaths(self, e: ReaderDeathsExceeded) -> RunFailedError:
        return RunFailedError(
            f"read tasks died {self.scheduler.reader_deaths} times without a file to blame "
            f"(last: {e}); the nodes may be out of memory: run with fewer "
            + setting("runtime.readers")
            + ", "
            "then resume."
        )

    def _lanes_wanted(self) -> int:
        readers = self.plan.readers
        return readers * len(self.nodes) if self.data == "shared" else max(2, readers)

    def _setup(self) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

        dataset = getattr(self.source, "dataset", None)
        if self.source.needs_reader and self.data == "shared" and dataset is not None:
            check_shared_dataset(self.nodes, dataset, self.rel.startup_timeout_s)
        host_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeHost)
        files = ray.put(model_files(self.plan.backend.model))  # for nodes without the model
        begins = {}
        for node in self.nodes:
            host = host_cls.options(scheduling_strategy=Affinity(node.node_id, soft=False))
            self.hosts[node.node_id] = handle = host.remote(self.plan.backend)
            begins[node.node_id] = handle.begin.remote(files)
        limit = self.rel.startup_timeout_s
        for node in self.nodes:
            try:
                backend = ray.get(begins[node.node_id], timeout=limit)
            except Exception as e:  # the node cannot take part; the others may
                self.warn(f"node {node.name} is left out: its set-up failed ({_short(e)}).")
                continue
            self.backends[node.node_id] = backend
        actor_cls = ray.remote(CoreActor)
        # A detection run's actors decode their outputs into boxes (actors.py).
        self._task = self.plan.task if self.plan.detects else None
        k = self.plan.instances_per_core
        shape, dtype = self.plan.preprocess.shape, self.plan.preprocess.dtype
        now = self.clock()
        for actor in self.actors:
            backend = self.backends.get(actor.node.node_id)
            if backend is None:
                actor.state = CoreStatus.RETIRED
                self.scheduler.core_retired(actor.key)
                continue
            actor.handle = actor_cls.options(
                num_cpus=0,
                resources={core_resource(actor.core): 1.0 / k},
                scheduling_strategy=Affinity(actor.node.node_id, soft=False),
                max_restarts=-1,
                max_task_retries=0,
            ).remote(
                backend,
                actor.core,
                self.plan.preprocess.layout,
                self._task,
                self.plan.save_outputs,
            )
            self._probe(actor, now)
        head, lanes = self.head_node_id, []
        for lane in range(len(self.scheduler.unsent)):
            if self.data == "head" and head is not None:
                lanes.append((Affinity(head, soft=False), head))
            elif self.data == "shared":
                node_id = self.nodes[lane % len(self.nodes)].node_id
                lanes.append((Affinity(node_id, soft=True), node_id))
            else:
                lanes.append(("DEFAULT", None))
        self.reads = ReadLanes(
            ray,
            self.scheduler,
            lanes,
            self.plan.preprocess,
            self.source.kind,
            self.rel.decode_timeout_s,
        )
        self._prefill(shape, dtype)

    def _prefill(self, shape: tuple[int, ...], dtype: str) -> None:
        if self.source.needs_reader:
            return
        slots = len(self.scheduler.flights)
        self._buffers = [[np.zeros(shape, np.dtype(dtype))] for _ in range(slots)]
        self.source.prefill(lambda slot: self._buffers[slot], slots)
        if type(self.source).fill is ItemSource.fill:  # the slots' tensors never change
            self._slot_ref = {s: self.ray.put(b[0]) for s, b in enumerate(self._buffers)}

    def _start(self) -> None:
        """Wait until every actor is ready or retired; then compare canaries."""
        while any(a.state == CoreStatus.STARTING for a in self.actors):
            if not self._alive():
                break
            if self.stop_reason is not None:
                return
            self._turn()
        for message in self.canary.settle():
            self.warn(message)
        if not self._alive():
            reasons = join("; ", self.warnings) or "every actor failed to start"
            raise NoCoreError("no NPU core of the cluster could be started: " + reasons)
        self._items = iter(self.source)
        self.notify(
            ev.Started(
                self.source.total,
                tuple(sorted({a.core for a in self.actors if a.state != CoreStatus.RETIRED})),
                self.plan.backend.name,
                self.plan.instances_per_core,
                self.clock(),
                nodes=tuple(n.name for n in self.nodes if n.node_id in self.backends),
            )
        )
        self.notify(ev.CoresReady(self.clock()))

    def _alive(self) -> bool:
        return any(a.state != CoreStatus.RETIRED for a in self.actors)

    # ------------------------------------------------------------------ sending
    def _admit(self) -> None:
        now = self.clock()
        while self.scheduler.can_admit() and not self._exhausted:
            item = next(self._items, None)
            if item is None:
                self._exhausted = True
                return
            slot = self.scheduler.admit(item, now, self.source.needs_reader)
            if self.source.needs_reader:
                continue
            if self._slot_ref:
                self._input_refs[slot] = self._slot_ref[slot]
            else:
                self.source.fill(item, self._buffers[slot])
                self._input_refs[slot] = self.ray.put(self._buffers[slot][0])

    def _send_work(self) -> None:
        now = self.clock()
        if self.reads is not None:
            for lane, task in self.reads.send(now):
                self._waiting[task.meta] = ("read", lane, task)
        for key, slots in self.scheduler.dispatch(now).items():
            actor = self.actors[key]
            if not actor.calls:
                actor.last_progress = now  # it was idle: its clock starts now
            self.stats.mark_dispatch(now)
            for chunk in self._calls_of(slots):
                indexes = [self.scheduler.flight(s).item.index for s in chunk]
                ref = actor.handle.infer.remote(indexes, *[self._input_refs[s] for s in chunk])
                call = _Call(ref, chunk, actor.epoch)
                actor.calls.append(call)
                self._waiting[ref] = ("call", actor, call)
            self.notify(ev.Dispatched(actor.core, len(slots), now, node=actor.node.name))

    def _calls_of(self, slots: list[int]) -> list[list[int]]:
        """Calls for these slots: items under suspicion alone, the others a few at a time."""
        alone = [s for s in slots if self.scheduler.flight(s).item.index in self._alone]
        rest = [s for s in slots if self.scheduler.flight(s).item.index not in self._alone]
        n = self.call_items
        return [[s] for s in alone] + [rest[i : i + n] for i in range(0, len(rest), n)]

    def _probe(self, actor: _Actor, now: float, again: bool = False) -> None:
        actor.state = CoreStatus.STARTING
        shape, dtype = self.plan.preprocess.shape, self.plan.preprocess.dtype
        actor.probe = actor.handle.start.remote(shape, dtype)
        actor.probe_again_at = None
        if not again:
            actor.probe_deadline = now + self.rel.startup_timeout_s
        self._waiting[actor.probe] = ("probe", actor, actor.probe)

    # ------------------------------------------------------------------ one turn
    def _turn(self) -> None:
        """Wait for results, handle them, write rows, check hangs, restarts and nodes."""
        ray = self.ray
        refs = list(self._waiting)
        ready: list = []
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=_TICK_S)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            time.sleep(_TICK_S)
        for ref in ready:
            entry = self._waiting.pop(ref, None)
            if entry is None:
                continue  # dropped while handling an earlier one (its actor died)
            kind, owner, what = entry
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._on_failure(kind, owner, what, exc)
            else:
                self._on_value(kind, owner, what, value)
        self.collector.flush()
        self._forget_released()
        if self.hard_stop:
            raise HardStop
        now = self.clock()
        self._not_held_against(now)
        self._check_hangs(now)
        for key in self.scheduler.restarts_due(now):
            self._probe(self.actors[key], now)
        for actor in self.actors:
            if actor.probe_again_at is not None and now >= actor.probe_again_at:
                self._probe(actor, now, again=True)
        if now >= self._next_node_check:
            self._next_node_check = now + _NODE_CHECK_S
            self._check_nodes()

    def _on_value(self, kind: str, owner: Any, what: Any, value: Any) -> None:
        if kind == "call":
            self._on_results(owner, what, value)
        elif kind == "read":
            self._on_read(owner, what, value)
        else:
            self._on_started(owner, what, value)

    def _on_failure(self, kind: str, owner: Any, what: Any, exc: Exception) -> None:
        if kind == "call":
            self._on_actor_death(owner, what, exc)
        elif kind == "read":
            self._on_read_failed(owner, what, exc)
        elif what is owner.probe and owner.state == CoreStatus.STARTING:
            owner.probe = None
            if isinstance(exc, self.ray.exceptions.ActorUnavailableError):
                owner.probe_again_at = self.clock() + _PROBE_AGAIN_S  # still restarting
            else:
                self._retire(owner, f"its actor failed to start ({_short(exc)})")

    def _forget_released(self) -> None:
        """Drop the objects of slots whose item is done (so Ray can free them)."""
        flights = self.scheduler.flights
        for table in (self._input_refs, self._outputs):
            for slot in [s for s in table if flights[s] is None]:
                del table[slot]
        reads = self.reads.alone if self.reads is not None else set()
        if self._alone or reads:
            live = {f.item.index for f in flights if f is not None}
            self._alone &= live
            if self.reads is not None:
                self.reads.forget(live)

    # ------------------------------------------------------------------ actors
    def _on_started(self, actor: _Actor, probe: Any, info: dict) -> None:
        if probe is not actor.probe or actor.state != CoreStatus.STARTING:
            return
        actor.probe = None
        if "init_failed" in info:
            self._retire(actor, info["init_failed"])
            return
        node, core = actor.where
        self.sdk_versions[place_name(node, core)] = info.get("sdk_version")
        if not self._opened:
            self._opened = True
            self.sink.open([(tuple(s), "float32") for s, _ in info["outputs"]])
        actor.state = CoreStatus.READY
        actor.last_progress = self.clock()
        self.notify(ev.ChildReady("actor", core, info["pid"], node=node))
        self.scheduler.core_ready(actor.key)
        if self.rel.canary and actor.instance == 0:
            for message in self.canary.add(self.places.index(actor.where), info["canary"]):
                self.warn(message)

    def _on_results(self, actor: _Actor, call: _Call, value: tuple) -> None:
        if call.epoch != actor.epoch:
            return  # the actor died meanwhile and its items went back already
        with contextlib.suppress(ValueError):
            actor.calls.remove(call)
        now = self.clock()
        actor.last_progress = now
        self._busy[actor.where].add(actor.instance, [(t0, t1) for t0, t1, *_ in value])
        self._report_busy(actor)
        for slot, (t0, t1, after_s, error, outputs, *boxes) in zip(call.slots, value, strict=True):
            latency_s = t1 - t0
            finished = self.scheduler.done(actor.key, slot, error)
            if finished is None:
                continue
            if finished.error is not None:
                self.collector.error(finished)
                continue
            self._outputs[slot] = outputs
            done = now - after_s  # the node's clock is not ours: place its times on ours
            self.collector.success(slot, actor.key, actor.instance, done - latency_s, done, *boxes)

    def _report_busy(self, actor: _Actor, final: bool = False) -> None:
        where = actor.where
        idle = {a.instance for a in self.actors if a.where == where and not a.calls}
        self.stats.set_busy(where, self._busy[where].seconds(idle, final))

    def _on_actor_death(self, actor: _Actor, call: _Call, exc: Exception) -> None:
        if call.epoch != actor.epoch or actor.state == CoreStatus.RETIRED:
            return
        if self._node_gone(actor.node):
            self._node_lost(actor.node)
            return
        what = actor.kill_reason or f"actor process crashed ({type(exc).__name__})"
        actor.kill_reason = None
        oldest = actor.calls[0] if actor.calls else call
        flights = [self.scheduler.flight(s) for s in oldest.slots]
        charged: set[int] = set()
        if len(flights) == 1:
            charged = {flights[0].item.index}
        else:
            self._alone.update(f.item.index for f in flights)
        self._drop_calls(actor)
        self.stats.add_restart(actor.where)
        self._report_busy(actor)
        loss = self.scheduler.core_lost(actor.key, charged, what, self.clock())
        for finished in loss.finished:
            self.collector.error(finished)
        node, core = actor.where
        name = f"core {core} of node {node} (instance {actor.instance})"
        if loss.restart_at is None:
            crashes = self.scheduler.cores[actor.key].crashes_in_row
            self._kill(actor)
            actor.state = CoreStatus.RETIRED
            self.warn(
                f"{name} retired after {crashes} crashes in a row (last: {what}); the run "
                "goes on with the other cores."
            )
            self.notify(ev.CoreRetired(core, what, node=node))
            return
        actor.state = CoreStatus.DOWN
        if not self.scheduler.stopping:
            delay = loss.restart_at - self.clock()
            blame = " (blamed on the item, not the core)" if loss.blamed_items else ""
            self.warn(f"{name}: {what}{blame}; Ray restarts it, in use again in {delay:.2g} s.")
            self.notify(ev.Restarted(core, what, delay, node=node))

    def _drop_calls(self, actor: _Actor) -> None:
        for c in actor.calls:
            self._waiting.pop(c.ref, None)
        actor.calls.clear()
        actor.epoch += 1
        if actor.probe is not None:
            self._waiting.pop(actor.probe, None)
            actor.probe = None
        actor.probe_again_at = None

    def _retire(self, actor: _Actor, reason: str) -> None:
        """An actor that will not come back (it failed to start): its items go back."""
        self._drop_calls(actor)
        self._kill(actor)
        actor.state = CoreStatus.RETIRED
        self.scheduler.core_retired(actor.key)
        node, core = actor.where
        self.warn(f"core {core} of node {node} (instance {actor.instance}) retired: {reason}")
        self.notify(ev.CoreRetired(core, reason, node=node))

    def _kill(self, actor: _Actor) -> None:
        if actor.handle is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle, no_restart=True)

    def _check_hangs(self, now: float) -> None:
        limit = self.rel.inference_timeout_s
        for actor in self.actors:
            if actor.state == CoreStatus.STARTING and now > actor.probe_deadline:
                self._retire(
                    actor,
                    f"it did not start within {self.rel.startup_timeout_s:g} s (the start-up "
                    "timeout)",
                )
            elif actor.calls and actor.kill_reason is None:
                held = len(actor.calls[0].slots)
                if now - actor.last_progress > limit * held:
                    index = self.scheduler.flight(actor.calls[0].slots[0]).item.index
                    item = f"item {index}" if held == 1 else f"a call of {held} items"
                    actor.kill_reason = (
                        f"inference of {item} hung for more than {limit * held:g} s (the "
                        "inference timeout); actor killed"
                    )
                    with contextlib.suppress(Exception):
                        self.ray.kill(actor.handle, no_restart=False)
        if self.reads is not None:
            self.reads.check_hangs(now)

    def _not_held_against(self, now: float) -> None:
        gap = now - self._last_turn if self._last_turn else 0.0
        self._last_turn = now
        if gap < _GAP_S:
            return
        for actor in self.actors:
            actor.last_progress += gap
            actor.probe_deadline += gap
        if self.reads is not None:
            self.reads.shift(gap)
        self._drain_until += gap

    # ------------------------------------------------------------------ nodes
    def _node_gone(self, node: NodeInfo) -> bool:
        if node.node_id in self.lost_nodes:
            return True
        alive = self._live_nodes()
        return alive is not None and node.node_id not in alive

    def _check_nodes(self) -> None:
        alive = self._live_nodes()
        if alive is None:
            return
        for node in self.nodes:
            if node.node_id not in alive and node.node_id not in self.lost_nodes:
                self._node_lost(node)

    def _live_nodes(self) -> set[str] | None:
        """The live nodes' ids; None while the GCS is silent; ClusterLostError once it has
        been silent for _GCS_LOST_S."""
        alive = live_node_ids(self.ray, GCS_TIMEOUT_S)
        if alive is not None:
            self._gcs_silent_since = None
            return alive
        now = self.clock()
        if self._gcs_silent_since is None:
            self._gcs_silent_since = now - GCS_TIMEOUT_S  # asked that long ago
        silent = now - self._gcs_silent_since
        if silent >= _GCS_LOST_S:
            raise ClusterLostError(
                f"the Ray cluster stopped answering: its GCS{_gcs_address(self.ray)} (the "
                f"gcs_server of the head node) gave no answer for {silent:.0f} s"
            )
        return None

    def _node_lost(self, node: NodeInfo) -> None:
        """``node`` left the cluster: its actors are retired, their items go back uncharged."""
        if node.node_id in self.lost_nodes:
            return
        self.lost_nodes.add(node.node_id)
        cores = set()
        for actor in self.actors:
            if actor.node.node_id != node.node_id or actor.state == CoreStatus.RETIRED:
                continue
            self._drop_calls(actor)
            self._kill(actor)
            actor.state = CoreStatus.RETIRED
            self.scheduler.core_retired(actor.key)
            cores.add(actor.core)
        self.warn(
            f"node {node.name} left the cluster: its cores are retired and their items go to "
            "the other nodes."
        )
        for core in sorted(cores):
            self.notify(ev.CoreRetired(core, "its node left the cluster", node=node.name))

    # ------------------------------------------------------------------ reads
    def _on_read(self, lane: Lane, task: ReadTask, meta: list) -> None:
        assert self.reads is not None
        ready, errors = self.reads.done(lane, task, meta, self.clock())
        for slot, array in ready:
            self._input_refs[slot] = array
        for finished in errors:
            self.collector.error(finished)

    def _on_read_failed(self, lane: Lane, task: ReadTask, exc: Exception) -> None:
        assert self.reads is not None
        gone = lane.node_id is not None and any(
            n.node_id == lane.node_id and self._node_gone(n) for n in self.nodes
        )
        for finished in self.reads.failed(lane, task, exc, gone):
            self.collector.error(finished)

    # ------------------------------------------------------------------ shutdown
    def _close(self) -> None:
        """Stop the actors and read tasks, then undo each node's set-up."""
        ray = self.ray
        if self.reads is not None:
            self.reads.cancel()
        live = [a for a in self.actors if a.handle is not None and a.state != CoreStatus.RETIRED]
        stops = []
        for actor in live:
            with contextlib.suppress(Exception):
                stops.append(actor.handle.stop.remote())
        if stops:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=_STOP_WAIT_S)
        for actor in self.actors:
            self._kill(actor)
            self._report_busy(actor, final=True)
        ends = {}
        for node_id, host in self.hosts.items():
            if node_id in self.backends and node_id not in self.lost_nodes:
                with contextlib.suppress(Exception):
                    ends[node_id] = host.end.remote()
        if ends:
            with contextlib.suppress(Exception):
                ray.wait(list(ends.values()), num_returns=len(ends), timeout=_STOP_WAIT_S)
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)
        self._waiting.clear()
        self._input_refs.clear()
        self._slot_ref.clear()
        self._outputs.clear()


def _gcs_address(ray: Any) -> str:
    """`` at HOST:PORT``, or nothing when Ray does not say."""
    try:
        return f" at {ray.get_runtime_context().gcs_address}"
    except Exception:
        return ""


def _short(exc: BaseException) -> str:
    """The last line of an exception's text (Ray's carry the remote traceback)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
