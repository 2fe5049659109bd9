"""The Ray pool's side of the pool protocol (engine/pools.py), over a scripted Ray: which
events an actor's death, a hang, a start-up timeout and a node that leaves become, and
how items are sent. No cluster: the tests answer each actor call themselves."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from runs import config, fast_sim

pytest.importorskip("ray.util.scheduling_strategies")  # the pool places actors with it

from batchinfer.cluster.actors import CallResult, NodeHost
from batchinfer.cluster.connect import NodeInfo
from batchinfer.cluster.pool import RayPool
from batchinfer.data.dataset import Item
from batchinfer.engine.planning.plan import model_input, plan_engine
from batchinfer.engine.pools import (
    ItemsDone,
    Said,
    Where,
    WorkerLost,
    WorkerRetired,
    WorkerUp,
)
from batchinfer.engine.run_view import RunView
from batchinfer.engine.scheduler import Scheduler
from batchinfer.engine.sources import SyntheticSource
from batchinfer.runtime.backends import make_backend
from batchinfer.sink.stats import CoreStatsRecorder


class _RayError(Exception):
    pass


class _ActorDiedError(_RayError):
    pass


class _ActorUnavailableError(_RayError):
    pass


class _Exceptions:
    RayError = _RayError
    ActorDiedError = _ActorDiedError
    ActorUnavailableError = _ActorUnavailableError


class _Ref:
    """An object ref the test answers (``answer``, ``fail``)."""

    def __init__(self, method: str, args: tuple, value: Any = None, done: bool = False) -> None:
        self.method, self.args = method, args
        self.value, self.error, self.done = value, None, done

    def answer(self, value: Any) -> None:
        self.value, self.done = value, True

    def fail(self, error: Exception) -> None:
        self.error, self.done = error, True


class _Handle:
    """A Ray actor handle: each ``handle.method.remote(*args)`` is a ref kept in ``calls``."""

    def __init__(self, ray: _Ray, cls: type, args: tuple, options: dict) -> None:
        self.ray, self.cls, self.args, self.options = ray, cls, args, options
        self.calls: list[_Ref] = []
        self.node = options["scheduling_strategy"].node_id

    def __getattr__(self, method: str) -> Any:
        handle = self

        class _Method:
            @staticmethod
            def remote(*args: Any) -> _Ref:
                # A node host's set-up and every stop answer at once; the rest waits.
                done = method in ("begin", "end", "stop")
                ref = _Ref(method, args, value=handle.args[0] if done else None, done=done)
                if method == "begin" and handle.node in handle.ray.failing:
                    ref.fail(RuntimeError("Traceback (most recent call last):\nOSError: disk full"))
                handle.calls.append(ref)
                return ref

        return _Method


class _Remote:
    def __init__(self, ray: _Ray, cls: type, options: dict) -> None:
        self.ray, self.cls, self._options = ray, cls, options

    def options(self, **options: Any) -> _Remote:
        return _Remote(self.ray, self.cls, {**self._options, **options})

    def remote(self, *args: Any) -> _Handle:
        handle = _Handle(self.ray, self.cls, args, self._options)
        self.ray.handles.append(handle)
        return handle


class _Ray:
    """What of Ray the pool uses, scripted: refs are answered by the test."""

    exceptions = _Exceptions

    def __init__(self, alive: set[str], failing: set[str]) -> None:
        self.alive = alive  # node ids the GCS lists alive
        self.failing = failing  # node ids whose host's set-up fails
        self.handles: list[_Handle] = []
        self.killed: list[tuple[_Handle, bool]] = []

    def remote(self, *args: Any, **options: Any) -> Any:
        if args:
            return _Remote(self, args[0], options)
        return lambda cls: _Remote(self, cls, options)

    def put(self, value: Any) -> _Ref:
        return _Ref("put", (), value, done=True)

    def get(self, ref: _Ref, timeout: float | None = None) -> Any:
        assert ref.done, "the pool gets only refs that are ready"
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list, num_returns: int = 1, timeout: float | None = None) -> tuple:
        ready = [r for r in refs if r.done][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def kill(self, handle: _Handle, no_restart: bool = True) -> None:
        self.killed.append((handle, no_restart))

    def nodes(self) -> list[dict]:
        return [{"NodeID": n, "Alive": True} for n in self.alive]

    def actors(self, core: int, node: str) -> list[_Handle]:
        return [
            h
            for h in self.handles
            if h.cls.__name__ == "CoreActor" and h.args[1] == core and h.node == node
        ]


_INFO = {"sdk_version": "2.3.2", "outputs": [((1, 10), "float32")], "canary": ["c"], "pid": 7}
# Ray's node ids are 28 bytes in hex.
NODES = [NodeInfo(name, name * 56, "10.0.0.1", (0, 1)) for name in "ab"]


class _Run:
    """A pool over the scripted Ray, set up as the engine loop sets it up."""

    def __init__(
        self, demo_kit, nodes=NODES, cores=(0, 1), failing=(), batch=1, **settings: Any
    ) -> None:
        cfg = config(dataset=demo_kit.dataset, model=demo_kit.models["digits"],
                     backend="sim", sim=fast_sim(), cores=cores, **settings)  # fmt: skip
        backend = make_backend(cfg.model, cfg.runtime)
        shape, dtype = model_input(cfg.model, cfg)
        plan = plan_engine(cfg, backend, shape, dtype, kind="")
        plan = dataclasses.replace(plan, batch=batch)  # as planning sets it for a batch-N model
        self.ray = _Ray({n.node_id for n in nodes}, set(failing))
        self.now = 0.0
        self.pool = RayPool(plan, SyntheticSource(), nodes, call_items=2, clock=lambda: self.now,
                            ray=self.ray)  # fmt: skip
        layout = self.pool.layout
        self.scheduler = Scheduler(
            layout.slots, layout.keys, layout.instances, layout.readers, max_attempts=2,
            physical=layout.physical, capacity=layout.capacity,
        )  # fmt: skip
        self.view = RunView(self.scheduler)
        self.stats = CoreStatsRecorder(layout.places, 1)
        self.pool.setup(self.stats, self.now)

    def start(self, key: int) -> list:
        """Answer the key's pending start() call; the events that follow."""
        (probe,) = [r for r in self.handle(key).calls if r.method == "start" and not r.done]
        probe.answer(_INFO)
        return self.pool.wait(0.0, self.view)

    def handle(self, key: int) -> _Handle:
        where = self.pool.where(key)
        node = next(n.node_id for n in NODES if n.name == where.node)
        return self.ray.actors(where.core, node)[where.instance or 0]

    def calls(self, key: int) -> list[_Ref]:
        return [r for r in self.handle(key).calls if r.method == "infer" and not r.done]

    def items(self, slots: list[int]) -> list[tuple[int, Item]]:
        """(slot, item) of each slot, as the loop sends them."""
        return [(s, self.scheduler.flight(s).item) for s in slots]

    def admit(self, n: int) -> dict[int, list[int]]:
        for i in range(n):
            item = Item(i, "", f"synthetic/{i}", None, None)
            self.pool.fill(self.scheduler.admit(item, self.now, needs_reader=False), item)
        sent = self.scheduler.dispatch(self.now)
        for key, slots in sent.items():
            self.pool.send_work(key, self.items(slots), self.now)
        return sent


def test_the_layout_has_a_key_per_actor_and_names_its_core_and_node(demo_kit):
    run = _Run(demo_kit)
    layout = run.pool.layout
    assert layout.keys == (0, 1, 2, 3) and layout.instances == 1
    assert layout.places == (("a", 0), ("a", 1), ("b", 0), ("b", 1))
    assert run.pool.where(2) == Where(0, "b", 0) and layout.physical(2) == ("b", 0)
    assert run.pool.nodes == ("a", "b")


def test_a_node_whose_set_up_fails_is_left_out_and_makes_no_actors(demo_kit):
    run = _Run(demo_kit, failing={"b" * 56})
    said, *retired = run.pool.wait(0.0, run.view)  # found in setup(): the first wait() says them
    assert said == Said("node b is left out: its set-up failed (OSError: disk full).")
    assert [(e.key, e.quiet) for e in retired] == [(2, True), (3, True)]
    assert {str(e.reason.said([0])) for e in retired} == {"its node's set-up failed"}
    assert run.pool.nodes == ("a",)
    assert run.ray.actors(0, "b" * 56) == [] and len(run.ray.actors(0, "a" * 56)) == 1
    run.pool.close(hard=False)
    hosts = {h.node: [r.method for r in h.calls] for h in run.ray.handles if h.cls is NodeHost}
    assert hosts == {"a" * 56: ["begin", "end"], "b" * 56: ["begin"]}  # b's is not undone


def test_an_actor_up_sends_its_canary_of_instance_0_and_takes_calls_of_a_few_items(demo_kit):
    run = _Run(demo_kit, nodes=NODES[:1], cores=(0,), instances_per_core=2)
    (up,) = run.start(0)
    assert up == WorkerUp(0, 7, "2.3.2", [((1, 10), "float32")], ["c"])
    (up,) = run.start(1)
    assert up.key == 1 and up.canary is None  # the core's canary is compared once
    run.scheduler.life.core_ready(0)
    sent = run.admit(5)
    assert [len(c.args[0]) for c in run.calls(0)] == [2, 2, 1]  # call_items=2
    first = run.calls(0)[0]
    run.now = 10.0
    # t0, t1 on the node's clock
    first.answer(
        [
            CallResult(100.0, 100.5, 0.25, None, ["o0"], None),
            CallResult(100.5, 100.75, 0, "bad", None, None),
        ]
    )
    (done,) = run.pool.wait(0.0, run.view)
    assert isinstance(done, ItemsDone) and done.key == 0
    a, b = done.results
    assert (a.slot, a.t0, a.t1, a.error) == (sent[0][0], 9.25, 9.75, None)  # on the loop's clock
    assert (b.slot, b.t1, b.error) == (sent[0][1], 10.0, "bad")
    assert run.pool.outputs == {sent[0][0]: ["o0"]}


def test_a_batch_n_models_calls_carry_whole_batches_and_an_actor_has_n_item_lanes(demo_kit):
    run = _Run(demo_kit, nodes=NODES[:1], cores=(0,), batch=4)
    assert run.pool.call_items == 4  # call_items=2, rounded up to the batch
    assert (run.pool.layout.instances, run.pool.layout.capacity) == (4, 24)
    assert run.handle(0).args[-1] == 4  # the actor packs its calls' items 4 to a call
    run.start(0)
    run.scheduler.life.core_ready(0)
    run.admit(10)
    assert [len(c.args[0]) for c in run.calls(0)] == [4, 4, 2]


def test_an_actor_death_names_the_items_of_its_oldest_call_and_a_suspect_comes_back_alone(
    demo_kit,
):
    run = _Run(demo_kit, nodes=NODES[:1], cores=(0,))
    run.start(0)
    run.scheduler.life.core_ready(0)
    run.admit(5)
    calls = run.calls(0)
    for call in calls:  # Ray fails every pending call of a dead actor
        call.fail(_ActorDiedError("died"))
    (lost,) = run.pool.wait(0.0, run.view)
    oldest = frozenset(calls[0].args[0])
    assert lost == WorkerLost(0, "actor process crashed (_ActorDiedError)", oldest, None)
    # The scheduler makes both items suspects; each is sent alone once the actor is back.
    loss = run.scheduler.life.core_lost(0, set(lost.working), lost.what, run.now)
    assert loss.finished == []
    run.now = loss.restart_at
    for key in run.scheduler.life.restarts_due(run.now):
        run.pool.start_worker(key, run.now)
    assert [e.key for e in run.start(0)] == [0]  # up again
    run.scheduler.life.core_ready(0)
    sent = run.scheduler.dispatch(run.now)
    run.pool.send_work(0, run.items(sent[0]), run.now)
    (call,) = run.calls(0)
    assert len(sent[0]) == 1 and list(call.args[0]) == [min(oldest)]


def test_a_hung_call_kills_its_actor_and_its_death_says_so(demo_kit):
    run = _Run(demo_kit, nodes=NODES[:1], cores=(0,), timeout_s=2.0)
    run.start(0)
    run.scheduler.life.core_ready(0)
    run.admit(1)
    run.now = 1.9
    assert run.pool.check(run.now, run.view, stopping=False, exhausted=False) == []
    run.now = 2.1
    assert run.pool.check(run.now, run.view, stopping=False, exhausted=False) == []
    assert run.ray.killed == [(run.handle(0), False)]  # Ray restarts it
    (call,) = run.calls(0)
    call.fail(_ActorDiedError("killed"))
    (lost,) = run.pool.wait(0.0, run.view)
    assert lost.what == (
        "inference of item 0 hung for more than 2 s (the inference timeout); actor killed"
    )
    assert lost.working == {0}


def test_an_actor_that_does_not_start_in_time_is_retired_and_the_loop_is_not_blamed(demo_kit):
    run = _Run(demo_kit, nodes=NODES[:1], cores=(0, 1), startup_timeout_s=5.0)
    run.start(0)
    run.now = 4.0
    run.pool.shift(3.0)  # the loop itself was not running for 3 s of it
    run.now = 7.5
    assert run.pool.check(run.now, run.view, stopping=False, exhausted=False) == []
    run.now = 8.5
    (retired,) = run.pool.check(run.now, run.view, stopping=False, exhausted=False)
    assert isinstance(retired, WorkerRetired) and (retired.key, retired.quiet) == (1, False)
    assert str(retired.reason.said([1])) == ("it did not start within 5 s (the start-up timeout)")
    assert (run.handle(1), True) in run.ray.killed


def test_a_node_that_leaves_is_said_once_and_its_actors_retired_quietly(demo_kit):
    run = _Run(demo_kit)
    for key in run.pool.layout.keys:
        run.start(key)
    run.ray.alive.discard("b" * 56)
    said, *retired = run.pool.check(run.now, run.view, stopping=False, exhausted=False)
    assert said == Said(
        "node b left the cluster: its cores are retired and their items go to the other nodes."
    )
    assert [(e.key, e.quiet) for e in retired] == [(2, True), (3, True)]
    assert {str(e.reason.said([0])) for e in retired} == {"its node left the cluster"}
    run.now = 2.0
    said_again = run.pool.check(run.now, run.view, stopping=False, exhausted=False)
    assert said_again == []  # said once
    run.pool.retire(2)  # what the loop does next: nothing more happens
    assert run.ray.killed == [(run.handle(2), True), (run.handle(3), True)]
