"""The one engine loop against the two real pools: this board's processes (BoardPool,
default tier) and Ray actors on a local two-node cluster (RayPool, ``-m ray``).

test_loop.py checks the loop's policy against a scripted pool and a fake clock; this
module checks that both real pools give the loop what that policy needs, with the same
assertions for each: every item one row, an item that crashes its worker every time one
error row (and no other item charged), and a stop mid-run an interrupted result in which
no item has two rows. Nothing here asserts a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from conftest import guard_leaks, local_ray_cluster
from runs import config, fast_sim

from batchinfer.engine import Engine, EnginePlan
from batchinfer.engine import events as ev
from batchinfer.engine.planning.plan import model_input, plan_engine
from batchinfer.engine.sources import ArraySource
from batchinfer.runtime.backends import make_backend
from batchinfer.sink.rows import MemorySink

CORES = (0, 1, 2)
N = 60
CRASHING = 17  # the item whose every inference kills its worker (sim fault crash:item=I)

MakeEngine = Callable[..., Engine]


class _Watch:
    """Keeps the rows as they are done; asks the engine to stop after ``stop_after`` rows."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.engine: Engine | None = None
        self.rows = 0

    def notify(self, event: object) -> None:
        if isinstance(event, ev.RowsDone):
            self.rows += len(event.rows)
            if self.stop_after is not None and self.rows >= self.stop_after:
                assert self.engine is not None
                self.engine.request_stop("a test")


@pytest.fixture(scope="module", params=["board", pytest.param("ray", marks=pytest.mark.ray)])
def pool(request) -> Iterator[str]:
    """Which pool: module-scoped, so the Ray cluster starts once, before any case's leak
    guard, and the board's cases run first."""
    if request.param == "ray":
        pytest.importorskip("ray")
        for _cluster in local_ray_cluster(CORES):  # started; stopped and checked after
            yield request.param
    else:
        yield request.param


@pytest.fixture(autouse=True)
def no_leaks(pool):
    """conftest's guard; on Ray, the module cluster's processes are spared (checked when it
    stops)."""
    yield from guard_leaks(spare_descendants=pool == "ray")


@pytest.fixture
def make_engine(pool) -> MakeEngine:
    """The one Engine over the pool: the board's processes, or actors on the module cluster."""
    if pool == "board":
        return lambda plan, source, sink, observers: Engine(plan, source, sink, observers)
    import ray

    from batchinfer.cluster import ClusterEngine
    from batchinfer.cluster.connect import npu_nodes

    nodes = npu_nodes(ray.nodes())
    return lambda plan, source, sink, observers: ClusterEngine(plan, source, sink, nodes, observers)


def _plan(demo_kit, *faults: str) -> EnginePlan:
    cfg = config(dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
                 sim=fast_sim(*faults, npu_ms=1), cores=CORES, startup_timeout_s=60.0,
                 inference_timeout_s=30.0)  # fmt: skip
    shape, dtype = model_input(cfg.model, cfg)
    plan = plan_engine(cfg, make_backend(cfg.model, cfg.runtime), shape, dtype, kind="")
    # A board state of this run's own (fault counters, the emulated board's cores).
    return dataclasses.replace(plan, backend=plan.backend.for_run())


def _arrays(plan: EnginePlan, n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shape, dtype = plan.preprocess.shape, plan.preprocess.dtype
    return [rng.integers(0, 255, shape).astype(dtype) for _ in range(n)]


def _run(make_engine: MakeEngine, plan: EnginePlan, watch: _Watch | None = None):
    sink = MemorySink()
    watch = watch or _Watch()
    engine = make_engine(plan, ArraySource(_arrays(plan)), sink, [watch])
    watch.engine = engine
    try:
        result = engine.run()
    finally:
        plan.backend.end_run()
    return result, sink.rows


def test_every_item_is_one_row(make_engine, demo_kit):
    result, rows = _run(make_engine, _plan(demo_kit))
    assert result.status == "complete" and result.error is None
    assert sorted(r.index for r in rows) == list(range(N))
    assert all(r.error is None and r.pred is not None for r in rows)
    assert result.counts["succeeded"] == N
    assert {r.core for r in rows} <= set(CORES)


def test_an_item_that_crashes_its_worker_every_time_is_one_error_row(make_engine, demo_kit):
    """Its worker dies on it on each attempt; it is charged each time (it was the one
    running), and the items in flight with it are retried, never charged."""
    plan = _plan(demo_kit, f"crash:item={CRASHING}")
    result, rows = _run(make_engine, plan)
    assert result.status == "complete"
    assert sorted(r.index for r in rows) == list(range(N))
    errors = {r.index: r for r in rows if r.error is not None}
    assert list(errors) == [CRASHING], {i: r.error for i, r in errors.items()}
    failures = errors[CRASHING].error.split("; ")
    assert len(failures) == plan.reliability.max_attempts
    assert all("crashed" in f for f in failures), errors[CRASHING].error
    assert result.counts["succeeded"] == N - 1


def test_a_stop_mid_run_is_interrupted_and_no_item_has_two_rows(make_engine, demo_kit):
    watch = _Watch(stop_after=N // 4)
    result, rows = _run(make_engine, _plan(demo_kit), watch)
    assert result.status == "interrupted"
    indices = [r.index for r in rows]
    assert len(indices) == len(set(indices)), "an item has two rows"
    assert N // 4 <= len(indices) < N  # stopped: the items in flight finished, no more began
    assert set(indices) <= set(range(N))
